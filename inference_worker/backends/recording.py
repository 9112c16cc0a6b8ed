"""``recording``: the fake's echo, with eyes: a torch-free frame backend that sees video.

It steps like :class:`~inference_worker.backends.fake.FakeBackend` in ``echo`` mode (each
slot returns its previous tick's input) and takes the camera frames that ride an append
(:attr:`~inference_worker.backend.SlotStep.video`). It records every frame it received, in
order, with the audio frame it came with (:attr:`RecordingBackend.received`), and says so on
the wire: the echo of that audio frame carries the text ``<frame F unit U>`` for each of its
camera frames, where ``F`` is the first 16 hex digits of the image's SHA-256 and ``U`` where
the audio of the append it rode starts in the session's input, in whole milliseconds. A
client sees the text in the response's transcript, so a test through the gateway can check
that every frame arrived, in order, paired with the audio unit of its append.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import deque
from typing import Final

import numpy as np

from inference_worker.backend import NO_SLOT_CONFIG, SlotConfig, SlotResult, SlotStep, VideoFrame
from inference_worker.backends.fake import FakeBackend, FakeOptions

__all__ = ["RecordingBackend", "Seen", "describe"]

_DIGEST_HEX: Final = 16
# What a long-running worker keeps of what it saw: a test's worth.
_KEPT: Final = 10_000


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:_DIGEST_HEX]


def describe(frame: VideoFrame) -> str:
    """The text that names one camera frame and where its audio unit starts."""
    return f"<frame {_digest(frame.image)} unit {round(frame.at_ms)}>"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Seen:
    """One camera frame a slot received, with the audio frame it was stepped with."""

    slot: int
    frame: VideoFrame
    #: The pcm16 LE of the step's audio frame, as the model heard it.
    unit: bytes


class RecordingBackend(FakeBackend):
    """Echo per slot, recording every camera frame with its audio frame."""

    def __init__(self, *, max_slots: int = 16, options: FakeOptions | None = None) -> None:
        """Allocate ``max_slots`` echoing slots (``options.mode`` must be ``echo``).

        Raises:
            ValueError: another mode.
        """
        super().__init__(max_slots=max_slots, options=options)
        if self.options.mode != "echo":
            raise ValueError("the recording backend echoes: it takes no mode but 'echo'")
        # What a slot saw is not in the fake's step records: its slots cannot move.
        self.spec = dataclasses.replace(self.spec, context_steps=0)
        #: The camera frames received (the newest ones), in the order the slots stepped them.
        self.received: deque[Seen] = deque(maxlen=_KEPT)
        # The text each slot says with its next echoed frame: what it saw with that audio.
        self._said = [""] * max_slots

    def open_slot(self, slot: int, config: SlotConfig = NO_SLOT_CONFIG) -> None:
        """Reset ``slot``, forgetting what it saw."""
        super().open_slot(slot, config)
        self._said[slot] = ""

    def stop_response(self, slot: int) -> None:
        """Drop what ``slot`` would say next, the text of its frames with it."""
        super().stop_response(slot)
        self._said[slot] = ""

    def step(self, inputs: list[SlotStep]) -> list[SlotResult]:
        """One echo tick; each output carries the text of the frames seen with its audio."""
        results = super().step(inputs)
        for index, step in enumerate(inputs):
            said, self._said[step.slot] = self._said[step.slot], self._seen(step)
            if said:
                results[index] = dataclasses.replace(results[index],
                                                      text=results[index].text + said)
        return results

    def _seen(self, step: SlotStep) -> str:
        if not step.video:
            return ""
        unit = np.round(np.clip(step.pcm, -1.0, 1.0) * 32768.0).clip(-32768, 32767)
        pcm16 = unit.astype("<i2").tobytes()
        self.received.extend(Seen(slot=step.slot, frame=frame, unit=pcm16)
                             for frame in step.video)
        return "".join(describe(frame) for frame in step.video)
