"""The pushes waiting for one connection, bounded.

A client slower than its session would otherwise grow this queue without bound. Past the
limit, pushes are dropped and replaced by one ``None`` ("read the log"): the log is the truth,
so the connection catches up from it once it drains. A lease notice (``session.replaced``) is
never dropped. Waiting, the quiet timer and the turn of the loop before each push of a backlog
are the store's :class:`~store.fairness.PushQueue`'s.
"""

from __future__ import annotations

from typing import Any

from store.fairness import PushQueue

__all__ = ["NoticeQueue"]


class NoticeQueue(PushQueue[list[Any] | None]):
    """A FIFO of push notices (``None`` = read the log) with a soft limit, for one consumer."""

    def __init__(self, limit: int = 256) -> None:
        super().__init__()
        self._limit = limit

    def put(self, item: list[Any] | None) -> None:
        """Queue ``item``; past the limit queue one ``None`` instead and drop the rest."""
        # Sliced, not indexed: a malformed notice (an empty list) is queued for the pump to
        # drop and log, not raised into the subscriber that delivers every session's pushes.
        lease_notice = item is not None and item[:1] == [b"r"]
        size = self.qsize()
        if size >= self._limit and not lease_notice:
            if size > self._limit:
                return  # a "read the log" marker is queued already
            item = None
        super().put(item)
