"""Helpers for the Moshi backend tests: a tiny model directory, audio, and session drivers.

This module imports the model stack (the moshi extra, which the test command installs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from inference_worker.backend import SlotResult, SlotStep
from inference_worker.backends.moshi import MoshiBackend, SamplingParams, SlotTokens
from inference_worker.backends.moshi_tiny import write_tiny_moshi

FRAME = 1920


def audio(seed: int, frames: int) -> list[np.ndarray]:
    """``frames`` frames of quiet noise with a slow tone, float32 in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames * FRAME) / 24000
    wav = 0.3 * np.sin(2 * np.pi * (110 + 40 * seed) * t) + 0.05 * rng.standard_normal(t.size)
    return [chunk.astype(np.float32) for chunk in np.split(wav, frames)]


@dataclass
class Session:
    """One session's inputs, and what it got back, tick by tick of its own."""

    seed: int
    frames: int
    sample_seed: int = 0
    inputs: list[np.ndarray] = field(init=False)
    results: list[SlotResult] = field(default_factory=list)
    tokens: list[SlotTokens | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.inputs = audio(self.seed, self.frames)

    def next_step(self, slot: int) -> SlotStep:
        return SlotStep(slot=slot, pcm=self.inputs[len(self.results)])

    def record(self, backend: MoshiBackend, result: SlotResult) -> None:
        self.results.append(result)
        self.tokens.append(backend.last_tokens[result.slot])

    @property
    def done(self) -> bool:
        return len(self.results) == self.frames


def run_alone(backend: MoshiBackend, session: Session, slot: int = 0) -> Session:
    """Run ``session`` from start to end as the only session of ``backend``."""
    backend.open_slot(slot, seed=session.sample_seed)
    while not session.done:
        (result,) = backend.step([session.next_step(slot)])
        session.record(backend, result)
    backend.close_slot(slot)
    return session


def load(path: Path, max_slots: int, *, sampled: bool = False, **kwargs: object) -> MoshiBackend:
    """The backend on ``path``, greedy unless ``sampled`` (Kyutai's sampling parameters)."""
    sampling = SamplingParams() if sampled else SamplingParams.greedy()
    return MoshiBackend.load(path, max_slots=max_slots, sampling=sampling, **kwargs)  # type: ignore[arg-type]


def same_audio(a: np.ndarray, b: np.ndarray, atol: float = 1e-4) -> bool:
    """Equal lengths, samples within ``atol``.

    Batch shape changes float32 rounding in the decoder (seen: ~1e-5 on the tiny model, whose
    random weights reach ~13 before the [-1, 1] clip); 1e-4 is models.md §7.3's Mimi bound.
    """
    return a.shape == b.shape and bool(np.allclose(a, b, atol=atol, rtol=0))


def write_tiny(path: Path) -> Path:
    """A tiny random Moshi + Mimi + tokenizer in ``path``, written with ``save_pretrained``."""
    write_tiny_moshi(path, seed=0)
    return path


@contextlib.contextmanager
def seeded_one_thread() -> Iterator[None]:
    """Seeded torch on one thread, restored afterwards: the CI cores are shared, and
    oversubscribed BLAS threads spin (a test ran 10x slower on 2 threads next to another
    test process)."""
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
