"""``bench worker``'s resume phase: what a moved session's slot costs the worker that adopts it.

A backend whose slots continue on another worker (``Resumable``, ``FrameSpec.context_steps``
above 0) hands a checkpoint its slot's newest step records; the adopter opens a slot from them
on its model thread, between two ticks, so every other session there waits for it. This
phase steps one slot for as many steps as a checkpoint carries, keeps their records as a
session does (the older ones compact, where the backend makes them so), then times opening
another slot from them a few times, and reports the records' size and the rebuild's time,
also in frames: the ticks the adopter's other sessions go without while it runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference_worker.backend import Backend

__all__ = ["RESUME_TRIES", "ResumeRow", "format_resume", "measure_resume"]

#: Rebuilds timed (the first included: a moved session's slot is rebuilt once).
RESUME_TRIES = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeRow:
    """One slot rebuilt from a checkpoint's records."""

    #: The records a checkpoint carries (``FrameSpec.context_steps``).
    records: int
    #: Their bytes in all, and the newest one's.
    records_bytes: int
    record_bytes: int
    #: Each rebuild's time, milliseconds.
    resume_ms: tuple[float, ...]
    #: The slowest, in frames: ticks the adopter's other sessions wait.
    frames_held_up: int


def measure_resume(backend: Backend, *,
                   sync: Callable[[], None] | None = None) -> ResumeRow | None:
    """Rebuild a slot from another's records ``RESUME_TRIES`` times (None: the backend's
    slots do not continue, or it has fewer than two)."""
    import numpy as np

    from inference_worker.backend import NO_SLOT_CONFIG, Compacting, Resumable, SlotStep

    spec = backend.spec
    if not spec.context_steps or spec.max_slots < 2 or not isinstance(backend, Resumable):
        return None
    rng = np.random.default_rng(0)
    records: list[bytes] = []
    backend.open_slot(0, NO_SLOT_CONFIG)
    try:
        for _ in range(spec.context_steps):
            # a client's PCM16, as the worker gives a slot 24 kHz input
            noise = np.round(1600 * rng.standard_normal(spec.in_samples)) / 32768
            pcm = noise.astype(np.float32)
            (result,) = backend.step([SlotStep(slot=0, pcm=pcm)])
            records.append(result.context)
    finally:
        backend.close_slot(0)
    # kept as a session's slot context keeps them: the newest whole, the older compact
    kept = records[-spec.context_steps:]
    whole = spec.whole_context_steps or len(kept)
    if isinstance(backend, Compacting) and len(kept) > whole:
        kept = [backend.compact_record(r) for r in kept[:-whole]] + kept[-whole:]
    times: list[float] = []
    for _ in range(RESUME_TRIES):
        if sync is not None:
            sync()
        started = time.perf_counter()
        backend.resume_slot(1, NO_SLOT_CONFIG, kept)
        if sync is not None:
            sync()
        times.append((time.perf_counter() - started) * 1000)
        backend.close_slot(1)
    frame_ms = spec.frame_seconds * 1000
    return ResumeRow(records=len(kept), records_bytes=sum(map(len, kept)),
                     record_bytes=len(kept[-1]), resume_ms=tuple(round(t, 3) for t in times),
                     frames_held_up=math.ceil(max(times) / frame_ms))


def format_resume(row: ResumeRow) -> str:
    """The phase's line."""
    return (f"resume: a slot rebuilt from its newest {row.records} step records"
            f" ({row.records_bytes / 1024:.1f} KiB, {row.record_bytes} B the newest) in"
            f" {min(row.resume_ms):.1f}-{max(row.resume_ms):.1f} ms: the adopter's other"
            f" sessions wait up to {row.frames_held_up} frame(s)")
