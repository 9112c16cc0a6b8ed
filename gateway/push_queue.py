"""The pushes waiting for one connection, bounded.

A client slower than its session would otherwise grow this queue without bound. Past the
limit, pushes are dropped and replaced by one ``None`` ("read the log"): the log is the truth,
so the connection catches up from it once it drains. A :class:`~store.pushes.LeaseMoved`
(``session.replaced``) is never dropped. Waiting, the quiet timer and the turn of the loop
before each push of a backlog are the store's :class:`~runtime.fairness.PushQueue`'s.
"""

from __future__ import annotations

from runtime.fairness import PushQueue
from store.pushes import LeaseMoved, Push

__all__ = ["BoundedPushQueue"]


class BoundedPushQueue(PushQueue[Push | None]):
    """A FIFO of pushes (``None`` = read the log) with a soft limit, for one consumer."""

    def __init__(self, limit: int = 256) -> None:
        super().__init__()
        self._limit = limit

    def put(self, item: Push | None) -> None:
        """Queue ``item``; past the limit queue one ``None`` instead and drop the rest."""
        size = len(self._items)  # not qsize(): one call fewer per relayed chunk
        if size >= self._limit and type(item) is not LeaseMoved:
            if size > self._limit:
                return  # a "read the log" marker is queued already
            item = None
        super().put(item)
