"""What the frame engine (:mod:`inference_worker.engine`) hands out and reports: a session's
hold on a slot, where a moved session's slot resumes, and what one tick produced."""

from __future__ import annotations

from dataclasses import dataclass, field

from inference_worker.audio_frames import FrameOutput

__all__ = ["SlotHandle", "SlotResume", "TickReport"]


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
