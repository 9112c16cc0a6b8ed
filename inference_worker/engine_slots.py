"""What the frame engine (:mod:`inference_worker.engine`) hands out and reports, and what it
keeps per slot: a session's hold on a slot, where a moved session's slot resumes, what one
tick produced, and a slot's input on its way to the model."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inference_worker.audio_frames import (
    PCM_RATE,
    FrameOutput,
    LinearResampler,
    pcm16_to_float,
)
from inference_worker.backend import FrameSpec, VideoFrame

__all__ = ["Marks", "SlotHandle", "SlotInput", "SlotResume", "TickReport"]

Audio = np.ndarray[Any, np.dtype[np.float32]]
#: Camera frames at a sample position (at the backend's rate) from some frame's start.
Marks = list[tuple[int, tuple[bytes, ...]]]


@dataclass(frozen=True, slots=True)
class SlotHandle:
    """One session's hold on a slot: ``serial`` is unique per open, ``slot`` is reused;
    ``session_id`` names the session in the engine's log lines ("": not told)."""

    serial: int
    slot: int
    session_id: str = ""

    def log_ids(self) -> dict[str, str]:
        """What a log line about this slot carries (``extra=``): its session's id, if known."""
        return {"session_id": self.session_id} if self.session_id else {}


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotResume:
    """Where a slot opened for a moved session starts: as the slot it left was after its last
    step whose output the checkpoint reflects."""

    #: That slot's newest step records (``SlotResult.context``), oldest first.
    context: tuple[bytes, ...]
    #: The stops applied to it: its frames are stamped from there.
    epoch: int
    #: Its place on the session's input timeline, in frames.
    input_frames: int
    #: The pcm16 24 kHz audio it had been given and had not stepped: queued before the first
    #: step of the slot that continues it.
    unconsumed: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class TickReport:
    """What one tick produced, delivered on the event loop."""

    index: int
    #: When the tick was due (monotonic seconds) and how long its work took.
    scheduled: float
    seconds: float
    #: serial -> that slot's output.
    outputs: dict[int, FrameOutput] = field(default_factory=dict)
    #: Serials whose slot failed (the step raised, or opening or stopping the slot did).
    failed: tuple[int, ...] = ()
    error: str | None = None


class SlotInput:
    """One open slot's input: whole frames waiting, and the partial frame being filled."""

    __slots__ = ("carry", "frames", "out_resampler", "partial", "partial_len",
                 "partial_video", "passed", "resampler", "video")

    def __init__(self, spec: FrameSpec) -> None:
        self.frames: deque[Audio] = deque()
        # Camera frames by the place on the input timeline of the frame they go with, and the
        # sample their append's audio starts at (under the lock); and those for the partial
        # frame being filled, by their sample in it (the event loop's).
        self.video: deque[tuple[int, int, tuple[bytes, ...]]] = deque()
        self.partial_video: Marks = []
        # Frames of the session's input behind the model: stepped, dropped or cleared (under
        # the lock): the slot's place on the session's input timeline.
        self.passed = 0
        self.partial: list[Audio] = []
        self.partial_len = 0
        self.carry = b""  # an odd trailing byte of pcm16, completed by the next push
        self.resampler = LinearResampler(PCM_RATE, spec.in_rate)
        self.out_resampler = LinearResampler(spec.out_rate, PCM_RATE)

    def resampled(self, pcm16: bytes) -> Audio:
        """``pcm16`` (after the odd byte the last push left) at the backend's input rate."""
        data = self.carry + pcm16
        even = len(data) & ~1
        self.carry = data[even:]
        return self.resampler.process(pcm16_to_float(data[:even]))

    def video_at(self, place: int, in_rate: int) -> tuple[VideoFrame, ...]:
        """The camera frames of the frame at ``place`` on the input timeline, taken off the
        queue; those of frames before it (dropped with their audio) are dropped too."""
        seen: list[VideoFrame] = []
        while self.video and self.video[0][0] <= place:
            at, sample, images = self.video.popleft()
            if at == place:
                at_ms = sample * 1000 / in_rate
                seen += [VideoFrame(image=image, at_ms=at_ms) for image in images]
        return tuple(seen)
