"""What a session's input log must keep for its checkpoints (docs/design/hand-over.md).

An adopter replays the input entries after a checkpoint and reads back the ones that hold
the input buffer's audio where the backend keeps it, so the worker trims no further than
either (:class:`InputHold`). What is held counts against the gateway's input bounds, so it is
bounded itself: past ``CHECKPOINT_HOLD_ENTRIES`` entries or ``CHECKPOINT_HOLD_BYTES`` of
commands the trim overtakes the checkpoint, which is then forfeit.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

__all__ = ["InputHold", "Mark", "SessionCheckpoints"]


@dataclass(frozen=True, slots=True)
class Mark:
    """One applied input entry: its ID's parts, the input audio heard before and once it was
    applied, and the bytes of commands applied before it."""

    fence: int
    index: int
    heard_before: int
    heard: int
    bytes_before: int


class InputHold:
    """The applied input entries a session's log must keep, from the oldest one held.

    Args:
        max_entries: entries held at most before the trim overtakes the checkpoint.
        max_bytes: bytes of commands held at most, the same way.
    """

    __slots__ = ("_heard", "_marks", "_max_bytes", "_max_entries", "_total_bytes", "keep")

    def __init__(self, *, max_entries: int, max_bytes: int) -> None:
        self._marks: deque[Mark] = deque()
        self._max_entries, self._max_bytes = max_entries, max_bytes
        self._total_bytes = 0
        self._heard = 0
        #: The last checkpoint's oldest entry to read back; None: none written, or forfeit.
        self.keep: Mark | None = None

    def resume(self, heard: int) -> None:
        """Continue a session taken over from a checkpoint: ``heard`` is the input audio heard
        before the first entry read back (:meth:`applied` follows for each)."""
        self._heard = heard

    def applied(self, fence: int, index: int, heard: int, size: int) -> None:
        """Entry ``<fence>-<index>`` (``size`` bytes) was applied; ``heard``: the input audio
        heard once it was (:attr:`ConversationCore.input_audio`)."""
        self._marks.append(Mark(fence, index, self._heard, heard, self._total_bytes))
        self._total_bytes += size
        self._heard = heard

    def buffer_start(self, heard: int, kept: int) -> Mark | None:
        """The entry that holds the first byte of the newest ``kept`` bytes of ``heard`` (the
        input buffer's, where the backend keeps them); None when ``kept`` is 0.

        Raises:
            LookupError: that entry is no longer held (the trim overtook it).
        """
        if kept == 0:
            return None
        start = heard - kept
        if not self._marks or self._marks[0].heard_before > start:
            raise LookupError("the input buffer's first entry is no longer held")
        for mark in self._marks:
            if mark.heard > start:
                return mark
        raise LookupError("the input buffer's first entry is no longer held")

    def at_end(self, fence: int, index: int, heard: int) -> Mark:
        """The mark of the last entry applied, ``<fence>-<index>``: what a checkpoint of a
        session with nothing to read back keeps (the commands after it are what is held)."""
        return Mark(fence, index, heard, heard, self._total_bytes)

    def trim_to(self, applied: int, heard: int, kept: int) -> tuple[int, bool]:
        """The index a trim may go to with ``applied`` applied (the entry there is kept), and
        whether it overtook the last checkpoint: no further than that checkpoint's oldest
        entry or the input buffer's first, unless what they hold is past the bounds; then
        ``applied``, and the checkpoint is forfeit. Forgets what no longer needs holding."""
        try:
            start = self.buffer_start(heard, kept)
        except LookupError:
            start = None
        held = [mark for mark in (self.keep, start) if mark is not None]
        if not held:
            self._forget_before(applied)
            return applied, False
        oldest = min(held, key=lambda mark: (mark.fence, mark.index))
        while self._marks and self._marks[0].index < oldest.index:
            self._marks.popleft()
        if (applied - oldest.index <= self._max_entries
                and self._total_bytes - oldest.bytes_before <= self._max_bytes):
            return min(applied, oldest.index), False
        overtaken = self.keep is not None
        self.keep = None
        self._forget_before(applied)
        return applied, overtaken

    def _forget_before(self, index: int) -> None:
        """Forget the entries before ``index``: the trim removes them. The entry at it stays
        in the log, and so does its mark: a checkpoint that needs only its audio back (a frame
        slot's input not stepped yet, which a client ahead of real time always leaves) can
        still be taken once what it held past the bounds has been consumed."""
        while self._marks and self._marks[0].index < index:
            self._marks.popleft()

    def oldest(self) -> Mark | None:
        """The oldest entry held (None: none)."""
        return self._marks[0] if self._marks else None

    def written(self, keep: Mark) -> None:
        """A checkpoint that keeps input from ``keep`` was written."""
        self.keep = keep


@dataclass
class SessionCheckpoints:
    """One session's checkpointing: what its last checkpoint reflects and what it holds."""

    hold: InputHold
    #: When its last checkpoint was written (or it was served here: monotonic seconds).
    written_at: float = field(default_factory=time.monotonic)
    #: The input index and event seq its last checkpoint reflects.
    applied: int = 0
    seq: int = 0
    #: Events were written since its last checkpoint: the next safe point takes one.
    events_since: bool = False
