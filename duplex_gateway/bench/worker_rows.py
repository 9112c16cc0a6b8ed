"""A row of the worker bench's step phase: what both its phases read (the relay phase runs
beside the step phase's row at the same batch size)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BenchRow"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRow:
    """The step times of one batch size (milliseconds)."""

    batch: int
    steps: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    per_session_ms: float
    ratio_vs_b1: float | None
    fits_frame: bool
