"""Inference worker: per-session conversational state and model backends."""

from __future__ import annotations

from inference_worker.session_runner import SessionRunner

__all__ = ["SessionRunner"]
