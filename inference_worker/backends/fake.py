"""``fake``: a torch-free frame backend for worker tests and benchmarks.

It implements :class:`~inference_worker.backend.Backend` like a real frame model would:
fixed slots, one batched ``step`` per tick, per-slot state reset by ``open_slot``, and a
one-frame delay before the first output (a model's warm-up). Two behaviours:

* ``echo`` (default): each slot returns its own input of the previous tick, so a test can
  follow a marked frame through the engine and the core, and a slot that gets garbage can
  be checked for cross-talk.
* ``tone``: each slot speaks a 440 Hz burst of ``tone_frames`` frames, then keeps quiet for
  ``gap_frames``, again and again, with ``text`` on the burst's first frame and
  the end of its turn (``TurnEnded``) on its last one: a model that takes turns on its own.

``stop_response`` drops what a slot would say next: in echo mode the frame it would echo on
the next tick, in tone mode the rest of the burst (the slot jumps to the start of a gap).

Each step's record (:attr:`~inference_worker.backend.SlotResult.context`) is the slot's
whole state after it: its tick count and the frame it will echo next. So the newest record
alone continues a slot on another worker (:meth:`FakeBackend.resume_slot`), which then gives
exactly what the original would have: the hand-over's deterministic-continuation tests rest
on it.

``step_ms`` and ``per_slot_ms`` make every step sleep (a slow model, for admission tests and
for the batch-cost table of ``bench worker``).
"""

from __future__ import annotations

import dataclasses
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from inference_worker.backend import NO_SLOT_CONFIG, FrameSpec, SlotConfig, SlotResult, SlotStep
from inference_worker.conversation.reports import TurnEnded

__all__ = ["FakeBackend", "FakeOptions"]

_MODES: Final = ("echo", "tone")
_TONE_HZ: Final = 440.0
_TONE_AMPLITUDE: Final = 0.25
# A step record: the tick count (little-endian int64), then the next echo's float32 samples.
_TICKS: Final = struct.Struct("<q")


@dataclass(frozen=True, slots=True, kw_only=True)
class FakeOptions:
    """What ``DUPLEX_GATEWAY_BACKEND_OPTIONS`` may set for the fake backend."""

    mode: str = "echo"
    in_rate: int = 24000
    frame_ms: float = 80.0
    step_ms: float = 0.0
    per_slot_ms: float = 0.0
    tone_frames: int = 10
    gap_frames: int = 15
    text: str = ""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> FakeOptions:
        """Read ``key=value`` options (strings) into typed fields.

        Raises:
            ValueError: an unknown key, or a value of the wrong type or range.
        """
        defaults = cls()
        values: dict[str, Any] = {}
        for key, raw in options.items():
            if not hasattr(defaults, key):
                raise ValueError(f"unknown fake backend option {key!r}")
            values[key] = type(getattr(defaults, key))(raw)
        parsed = cls(**values)
        if parsed.mode not in _MODES:
            raise ValueError(f"fake backend mode must be one of {_MODES}, got {parsed.mode!r}")
        if parsed.in_rate <= 0 or parsed.frame_ms <= 0 or parsed.tone_frames <= 0:
            raise ValueError("fake backend rates and frame sizes must be positive")
        if parsed.gap_frames < 0:
            raise ValueError("fake backend gap_frames must not be negative")
        return parsed


class FakeBackend:
    """Echo or tone, per slot, with an optional artificial step cost."""

    def __init__(self, *, max_slots: int = 16, options: FakeOptions | None = None) -> None:
        """Allocate ``max_slots`` slots behaving as ``options`` say."""
        self.options = options or FakeOptions()
        samples = round(self.options.in_rate * self.options.frame_ms / 1000)
        self.spec = FrameSpec(in_rate=self.options.in_rate, in_samples=samples,
                              out_rate=self.options.in_rate, out_samples=samples,
                              max_slots=max_slots, context_steps=1)
        self._open = np.zeros(max_slots, dtype=bool)
        self._ticks = np.zeros(max_slots, dtype=np.int64)
        self._previous = np.zeros((max_slots, samples), dtype=np.float32)
        phase = 2 * np.pi * _TONE_HZ * np.arange(samples) / self.options.in_rate
        self._tone = (_TONE_AMPLITUDE * np.sin(phase)).astype(np.float32)
        #: Every ``step`` call's slot list, newest last (tests check the batching).
        self.batches: list[list[int]] = []
        #: Each slot's configurations since its last open, the open's first (tests check
        #: what a session's settings gave the backend).
        self.slot_configs: dict[int, list[SlotConfig]] = {}

    def open_slot(self, slot: int, config: SlotConfig = NO_SLOT_CONFIG) -> None:
        """Reset ``slot``: it is silent for one tick, then echoes or speaks from the start."""
        self.slot_configs[slot] = [config]
        self._open[slot] = True
        self._ticks[slot] = 0
        self._previous[slot] = 0.0

    def resume_slot(self, slot: int, config: SlotConfig, context: Sequence[bytes]) -> None:
        """Open ``slot`` as the slot whose newest record is ``context``'s last was.

        Raises:
            ValueError: that record is not one of a fake slot of this frame size.
        """
        if not context:
            self.open_slot(slot, config)
            return
        record = context[-1]
        if len(record) != _TICKS.size + self._previous[slot].nbytes:
            raise ValueError(f"a fake step record of {len(record)} bytes is not one of "
                             f"{self.spec.in_samples}-sample frames")
        (ticks,) = _TICKS.unpack_from(record)
        if ticks < 1:
            raise ValueError(f"a fake step record says {ticks} ticks")
        self.open_slot(slot, config)
        self._ticks[slot] = ticks
        self._previous[slot] = np.frombuffer(record, dtype="<f4", offset=_TICKS.size)

    def configure_slot(self, slot: int, config: SlotConfig) -> None:
        """Record ``config``: the fake's sound does not depend on it."""
        if not self._open[slot]:
            raise RuntimeError(f"slot {slot} configured while closed")
        self.slot_configs[slot].append(config)

    def close_slot(self, slot: int) -> None:
        """Free ``slot``."""
        self._open[slot] = False

    def stop_response(self, slot: int) -> None:
        """Drop what ``slot`` would say next: echo is silent for one tick; a tone burst ends at
        once, its slot keeping quiet for a whole gap from the next tick."""
        if not self._open[slot]:
            raise RuntimeError(f"slot {slot} stopped while closed")
        self._previous[slot] = 0.0
        if self.options.mode == "tone":
            self._ticks[slot] = self._gap_start(int(self._ticks[slot]))

    def step(self, inputs: list[SlotStep]) -> list[SlotResult]:
        """One tick for every listed slot, in one call (and one sleep, when slowed down)."""
        cost_ms = self.options.step_ms + self.options.per_slot_ms * len(inputs)
        if cost_ms > 0:
            time.sleep(cost_ms / 1000)  # the model's compute, simulated
        self.batches.append([s.slot for s in inputs])
        return [dataclasses.replace(self._step_one(s), context=self._record(s.slot))
                for s in inputs]

    def _record(self, slot: int) -> bytes:
        """The slot's state after its step: what continues it elsewhere."""
        echo: bytes = self._previous[slot].astype("<f4").tobytes()
        return _TICKS.pack(int(self._ticks[slot])) + echo

    def _step_one(self, step: SlotStep) -> SlotResult:
        slot = step.slot
        if not self._open[slot]:
            raise RuntimeError(f"slot {slot} stepped while closed")
        tick = int(self._ticks[slot])
        self._ticks[slot] += 1
        if self.options.mode == "echo":
            out = self._previous[slot].copy()
            self._previous[slot] = step.pcm
            if tick == 0:
                return SlotResult(slot=slot, pcm=np.zeros(0, dtype=np.float32))
            voiced = bool(np.any(out))
            return SlotResult(slot=slot, pcm=out, text=self.options.text if voiced else "")
        return self._tone_frame(slot, tick)

    def _gap_start(self, tick: int) -> int:
        """The first tick from ``tick`` on that begins a gap (tick 0 is the warm-up)."""
        first = max(tick, 1)
        period = self.options.tone_frames + self.options.gap_frames
        return first + (self.options.tone_frames - (first - 1)) % period

    def _tone_frame(self, slot: int, tick: int) -> SlotResult:
        if tick == 0:
            return SlotResult(slot=slot, pcm=np.zeros(0, dtype=np.float32))
        period = self.options.tone_frames + self.options.gap_frames
        position = (tick - 1) % period
        if position >= self.options.tone_frames:
            return SlotResult(slot=slot, pcm=np.zeros_like(self._tone))
        last = position == self.options.tone_frames - 1
        text = self.options.text if position == 0 else ""
        return SlotResult(slot=slot, pcm=self._tone.copy(), text=text,
                          reports=(TurnEnded(),) if last else ())
