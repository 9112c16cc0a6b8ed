"""What a checkpoint keeps of a frame backend's session's engine slot: the backend's newest
step records, from which another worker's slot continues it (``docs/design/hand-over.md``).

The records come with the frames the session consumes, in order, so those kept are always
the steps whose output its core reflects; past the newest ``FrameSpec.whole_context_steps``
they are kept compact (``Compacting``). A checkpoint carries them where the slot holds no
change the core asked for and has not applied (a stop, a configuration) and the newest frame
consumed is of the core's epoch (:meth:`SlotContext.at`), with the count of the input bytes
the slot was given and has not stepped: the newest the session heard, which the adopter reads
back from the input log and gives its slot first.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from inference_worker.audio_frames import FrameOutput
from inference_worker.conversation.checkpoint import CoreState
from inference_worker.engine import Engine, SlotHandle

__all__ = ["SlotContext", "SlotPlace"]


@dataclass(frozen=True, slots=True)
class SlotPlace:
    """Where a slot is, as a checkpoint carries it."""

    #: Its newest step records, oldest first.
    records: tuple[bytes, ...]
    #: The bytes of input audio it was given and has not stepped: the newest heard.
    unconsumed: int


class SlotContext:
    """One session's slot as its checkpoints need it.

    Args:
        engine: the engine the slot is in.
        handle: the session's hold on it.
        records: those a moved session's slot resumed from, oldest first.
        epoch: the epoch of the newest frame consumed (None: none yet).
    """

    __slots__ = ("_compact", "_engine", "_epoch", "_handle", "_records")

    def __init__(self, engine: Engine, handle: SlotHandle, records: tuple[bytes, ...] = (),
                 epoch: int | None = None) -> None:
        self._engine, self._handle = engine, handle
        spec = engine.spec
        whole = spec.whole_context_steps or spec.context_steps
        # The newest records whole, the older ones compact: together at most context_steps.
        self._records: deque[bytes] = deque(maxlen=whole)
        self._compact: deque[bytes] = deque(maxlen=max(0, spec.context_steps - whole))
        for record in records[-spec.context_steps:] if spec.context_steps else ():
            self._keep(record)
        self._epoch = epoch

    def queued(self) -> int:
        """The bytes of input audio the slot holds unstepped now: what the session's input
        log must keep for its next checkpoint, besides its input buffer's."""
        return self._engine.queued_bytes(self._handle)

    def consumed(self, frame: FrameOutput) -> None:
        """The session's core consumed ``frame``."""
        self._keep(frame.context)
        self._epoch = frame.epoch

    def _keep(self, record: bytes) -> None:
        records = self._records
        if len(records) == records.maxlen and self._compact.maxlen:
            if records[0]:
                self._compact.append(self._engine.compact_record(records[0]))
            else:  # the slot cannot be continued across that step: what came before is moot
                self._compact.clear()
        records.append(record)

    @property
    def records(self) -> tuple[bytes, ...]:
        """The records kept, oldest first: the compact ones, then the newest whole."""
        return (*self._compact, *self._records)

    def at(self, state: CoreState) -> SlotPlace | None:
        """The records that continue the slot as ``state`` (the core's, just taken) leaves
        it; None where the slot has moved past it, holds what the core asked of it and it
        has not applied, or its newest step cannot be continued from (an empty record)."""
        if (self._epoch != state.model.epoch
                or not self._records or not self._records[-1]):
            return None  # moved past, or its newest step cannot be continued from
        unconsumed = self._engine.unconsumed(self._handle, state.model_input_ms)
        if unconsumed is None:
            return None
        return SlotPlace(self.records, unconsumed)
