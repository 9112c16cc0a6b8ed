"""I/O-free ordering of a log that is pushed live and read back on gaps.

Live delivery is a push; the log is the truth (DESIGN §2.5). A consumer feeds every pushed batch
and every batch read back from the log into one :class:`LogFollower`; it yields each index
exactly once and in order, drops what it already delivered, and says when a gap must be read
from the log. Losing a push therefore costs a read, never an entry.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["LogFollower"]


class LogFollower:
    """Tracks the next index a consumer expects (indices start at 1)."""

    __slots__ = ("next_index",)

    def __init__(self, delivered_up_to: int = 0) -> None:
        #: The next index to deliver; everything below it was delivered.
        self.next_index = delivered_up_to + 1

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
        return fresh, False
