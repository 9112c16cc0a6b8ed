"""The pushes waiting for one connection, bounded.

A client slower than its session would otherwise grow this queue without bound. Past the
limit, pushes are dropped and replaced by one ``None`` ("read the log"): the log is the truth,
so the connection catches up from it once it drains. A lease notice (``session.replaced``) is
never dropped.

One push arrives per output event of the session, so this is on the relay's hot path: a deque
and one waiter, with the quiet channel's timer armed only while the consumer waits, cost the
pump a fraction of an ``asyncio.Queue`` taken under an ``asyncio.timeout`` per notice.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from store.fairness import take_a_turn

__all__ = ["NoticeQueue"]


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class NoticeQueue:
    """A FIFO of push notices (``None`` = read the log) with a soft limit, for one consumer."""

    def __init__(self, limit: int = 256) -> None:
        self._items: collections.deque[list[Any] | None] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._limit = limit

    def put(self, notice: list[Any] | None) -> None:
        """Queue ``notice``; past the limit queue one ``None`` instead and drop the rest."""
        # Sliced, not indexed: a malformed notice (an empty list) is queued for the pump to
        # drop and log, not raised into the subscriber that delivers every session's pushes.
        lease_notice = notice is not None and notice[:1] == [b"r"]
        size = len(self._items)
        if size >= self._limit and not lease_notice:
            if size > self._limit:
                return  # a "read the log" marker is queued already
            notice = None
        self._items.append(notice)
        if self._waiter is not None:
            _wake(self._waiter)

    def clear(self) -> None:
        """Drop every queued notice: they came from a channel this connection has left."""
        self._items.clear()

    async def get(self, quiet_s: float | None = None) -> list[Any] | None:
        """The next notice, waiting for one; with notices queued, after one turn of the loop
        (:mod:`store.fairness`). ``None`` also when ``quiet_s`` passes without a push (the
        channel is quiet: read the log in case one was lost)."""
        if self._items:
            await take_a_turn()
            if self._items:  # unless cleared meanwhile
                return self._items.popleft()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        timer = None if quiet_s is None else loop.call_later(quiet_s, _wake, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        return self._items.popleft() if self._items else None

    def qsize(self) -> int:
        """How many notices wait."""
        return len(self._items)
