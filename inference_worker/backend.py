"""The model backend interface, torch-free at its boundary.

One ``step`` is one model tick for a fixed set of slots (lockstep continuous batching, the
shape of Kyutai's ``LMGen`` and every batched duplex server): the worker owns the clock, hands
the backend exactly one input frame per listed slot, and gets exactly one result per listed
slot back. Slots not listed do not advance. Audio crosses the boundary as float32 numpy
arrays in [-1, 1], mono, at the backend's own rates, so tests can fake a backend without
torch and the worker never imports a model library.

Isolation is part of the contract: a slot's input is checked (length, finiteness) by the
worker before it reaches ``step``, and a backend must not let one slot's values change another
slot's output (no cross-talk), which the backends' tests assert.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from inference_worker.conversation.reports import ModelReport
from inference_worker.conversation.seed_settings import NO_SLOT_CONFIG, SlotConfig, VoicePrompt

__all__ = [
    "NO_SLOT_CONFIG",
    "Backend",
    "Compacting",
    "FrameSpec",
    "Resumable",
    "SlotConfig",
    "SlotResult",
    "SlotStep",
    "VideoFrame",
    "VoicePrompt",
    "silence",
]

Audio = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameSpec:
    """What one tick consumes and produces, fixed per backend.

    Attributes:
        in_rate: input sample rate (Hz).
        in_samples: input samples per slot per tick (Moshi: 1920 = 80 ms at 24 kHz).
        out_rate: output sample rate (Hz).
        out_samples: output samples per slot per tick (at most; a result may carry fewer).
        max_slots: slot ids are ``0 .. max_slots - 1``, allocated at load time.
        context_steps: how many of a slot's newest step records
            (:attr:`SlotResult.context`) another slot continues it from
            (:meth:`Resumable.resume_slot`); 0: its slots cannot be continued elsewhere, so a
            worker of this backend takes no checkpoints.
        whole_context_steps: of those, how many of the newest are kept whole; the older ones
            are kept as :meth:`Compacting.compact_record` makes them (0: all whole).
    """

    in_rate: int
    in_samples: int
    out_rate: int
    out_samples: int
    max_slots: int
    context_steps: int = 0
    whole_context_steps: int = 0

    @property
    def frame_seconds(self) -> float:
        """The tick period: one input frame's duration."""
        return self.in_samples / self.in_rate


@dataclass(frozen=True, slots=True, kw_only=True)
class VideoFrame:
    """One camera frame, with the audio unit it rode."""

    #: The image: JPEG or PNG bytes.
    image: bytes
    #: Where its append's audio starts on the session's input timeline, in milliseconds of
    #: the audio the model heard (0: its first sample); inside the step it comes with.
    at_ms: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotStep:
    """One slot's input for one tick."""

    slot: int
    #: float32 ``[in_samples]``; zeros when the client was late (the clock never waits).
    pcm: Audio
    #: The camera frames (in order) of the appends whose audio starts in this frame. Only a
    #: backend whose profile sees video gets any; empty on most steps.
    video: tuple[VideoFrame, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotResult:
    """One slot's output for one tick."""

    slot: int
    #: float32 ``[<= out_samples]``; empty while the model is still in its delay warm-up.
    pcm: Audio
    #: Decoded text produced this tick ("" for none/padding).
    text: str = ""
    #: What the model reported this tick besides its output, in the order it happened: the
    #: user's speech, transcript, its own turn starting, a barge-in, a failure. A
    #: :class:`~inference_worker.conversation.reports.TurnEnded` comes after the tick's output.
    reports: tuple[ModelReport, ...] = ()
    #: What this step added to the slot's context, in the backend's own encoding: the newest
    #: ``context_steps`` of them continue the slot elsewhere (:class:`Resumable`). Empty: the
    #: slot cannot be continued from this step (it holds what no record carries), or the
    #: backend's slots cannot be continued at all.
    context: bytes = b""


@runtime_checkable
class Backend(Protocol):
    """A model that steps many sessions together, one slot each."""

    spec: FrameSpec

    def open_slot(self, slot: int, config: SlotConfig = NO_SLOT_CONFIG) -> None:
        """Reset ``slot``'s state for a new session (other slots are untouched), configured
        as ``config`` says (the session's instructions, voice, voice prompt, temperature and
        the ``extra_body`` knobs the backend declares)."""

    def configure_slot(self, slot: int, config: SlotConfig) -> None:
        """The open ``slot``'s session accepted a ``session.update``: apply ``config`` from
        the next step on. What a backend cannot apply was refused before it got here (its
        profile's :class:`~inference_worker.conversation.seed_settings.ConfigSupport`), so this
        refuses nothing; a backend that raises fails that slot alone. Runs on the model
        thread, between steps."""

    def close_slot(self, slot: int) -> None:
        """Free ``slot``; its state may be garbage until the next ``open_slot``."""

    def stop_response(self, slot: int) -> None:
        """The open ``slot``'s session cancelled its response: drop what the slot would still
        say of it.

        Output the model already decided on but has not returned yet (delayed tokens, queued
        or half-played audio, text held back for detokenizing, an answer still being
        produced) is discarded, so the next ``step`` returns none of it. What the model heard
        stays: the session goes on in the same slot, and other slots are untouched. Emits no
        event: the cancel came from the client, which knows. A backend that cannot stop its
        model mid-turn drops what it can; the conversation core mutes the rest of the turn.
        Runs on the model thread, between steps.
        """

    def step(self, inputs: list[SlotStep]) -> list[SlotResult]:
        """Advance every listed slot by one tick, in one batched call.

        Runs on the worker's model thread, never on the event loop. Returns one result per
        input, in the same order.
        """


@runtime_checkable
class Resumable(Backend, Protocol):
    """A backend whose slot continues from another slot's context: a session moved to another
    worker (``docs/design/hand-over.md``) goes on as if it had never moved."""

    def resume_slot(self, slot: int, config: SlotConfig, context: Sequence[bytes]) -> None:
        """Open ``slot`` as the slot whose newest step records (:attr:`SlotResult.context`, at
        most ``spec.context_steps``, oldest first) are ``context`` was after its last step,
        configured as ``config`` says: its next step gives what that slot's next step would
        have given for the same input. No records: a fresh open.

        Raises:
            ValueError: a record this backend did not write (the slot stays closed).
        """


@runtime_checkable
class Compacting(Resumable, Protocol):
    """A resumable backend whose older step records shrink: a record carries what only the
    newest steps need (a codec's input, say), and what is left of an older one still
    continues the slot (``FrameSpec.whole_context_steps``)."""

    def compact_record(self, record: bytes) -> bytes:
        """``record`` as a checkpoint keeps it once ``whole_context_steps`` newer ones follow
        (a compact one as it is).

        Raises:
            ValueError: a record this backend did not write.
        """


def silence(samples: int) -> Audio:
    """``samples`` of silence, the frame a late client gets."""
    return np.zeros(samples, dtype=np.float32)
