"""Inference worker: per-session conversational state and model backends.

Nothing is imported here: the model backends and the GPU check must import on a machine that
has torch and transformers but not the worker's Redis client.
"""

from __future__ import annotations

__all__: list[str] = []
