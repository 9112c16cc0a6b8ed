"""I/O-free ordering of a log that is pushed live and read back on gaps.

Live delivery is a push; the log is the truth (DESIGN §2.5). A consumer feeds every pushed batch
and every batch read back from the log into one :class:`LogFollower`; it yields each index
exactly once and in order, drops what it already delivered, and says when a gap must be read
from the log. Losing a push therefore costs a read, never an entry.

Entries offered again under indices already delivered are normally the same entries (a push
and a read overlap). A *different* entry under a delivered index means the log went back: a
Redis failover to a replica that lagged lost acknowledged writes, and the log numbers on from
where the replica stood. :meth:`LogFollower.rewound_at` tells the two apart, so the consumer
can say so instead of dropping the new entries as seen.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["REWIND_WINDOW", "LogFollower"]

#: Delivered entries remembered to recognise a rewound log. A failover loses what the replica
#: lagged behind by (milliseconds of writes), far fewer entries than this.
REWIND_WINDOW = 256


class LogFollower:
    """Tracks the next index a consumer expects (indices start at 1)."""

    __slots__ = ("_ring", "next_index")

    def __init__(self, delivered_up_to: int = 0) -> None:
        #: The next index to deliver; everything below it was delivered.
        self.next_index = delivered_up_to + 1
        # (index, hash() of the entry delivered there) at index % REWIND_WINDOW; made on first
        # delivery. A ring, not a dict: O(1) per entry on the hot path, no deletions.
        self._ring: list[tuple[int, int] | None] | None = None

    def offer(self, first: int, payloads: Sequence[bytes]) -> tuple[list[tuple[int, bytes]], bool]:
        """Offer entries ``first, first + 1, ...``.

        Returns:
            The entries that are new and in order (possibly none), and whether a gap lies
            before them, in which case nothing is delivered and the caller must read the log
            from :attr:`next_index` on.
        """
        if first > self.next_index:
            return [], True
        fresh = [
            (first + offset, payload)
            for offset, payload in enumerate(payloads)
            if first + offset >= self.next_index
        ]
        self.next_index += len(fresh)
        if fresh:
            ring = self._ring
            if ring is None:
                ring = self._ring = [None] * REWIND_WINDOW
            for index, payload in fresh:
                ring[index % REWIND_WINDOW] = (index, hash(payload))
        return fresh, False

    def rewound_at(self, first: int, payloads: Sequence[bytes]) -> int | None:
        """The first index below :attr:`next_index` at which ``payloads`` (from ``first``)
        differ from what was delivered, or None (duplicates, or nothing to compare)."""
        ring = self._ring
        if ring is None:
            return None
        for offset, payload in enumerate(payloads):
            index = first + offset
            if index >= self.next_index:
                return None
            seen = ring[index % REWIND_WINDOW]
            if seen is not None and seen[0] == index and seen[1] != hash(payload):
                return index
        return None

    def rewind(self, index: int) -> None:
        """Deliver again from ``index`` on: the log now holds other entries there.

        Remembered entries at or past ``index`` are never compared again before they are
        delivered anew (only indices below :attr:`next_index` are), which overwrites them.
        """
        self.next_index = index
