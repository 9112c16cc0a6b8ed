"""The pushes waiting for one connection, bounded.

A client slower than its session would otherwise grow this queue without bound. Past the
limit, pushes are dropped and replaced by one ``None`` ("read the log"): the log is the truth,
so the connection catches up from it once it drains. A lease notice (``session.replaced``) is
never dropped.
"""

from __future__ import annotations

import asyncio
from typing import Any

from store.fairness import next_fairly

__all__ = ["NoticeQueue"]


class NoticeQueue:
    """A FIFO of push notices (``None`` = read the log) with a soft limit."""

    def __init__(self, limit: int = 256) -> None:
        self._queue: asyncio.Queue[list[Any] | None] = asyncio.Queue()
        self._limit = limit

    def put(self, notice: list[Any] | None) -> None:
        """Queue ``notice``; past the limit queue one ``None`` instead and drop the rest."""
        lease_notice = notice is not None and notice[0] == b"r"
        size = self._queue.qsize()
        if size >= self._limit and not lease_notice:
            if size > self._limit:
                return  # a "read the log" marker is queued already
            notice = None
        self._queue.put_nowait(notice)

    def clear(self) -> None:
        """Drop every queued notice: they came from a channel this connection has left."""
        while not self._queue.empty():
            self._queue.get_nowait()

    async def get(self) -> list[Any] | None:
        """The next notice, waiting for one (fairly: see :mod:`store.fairness`)."""
        return await next_fairly(self._queue)

    def qsize(self) -> int:
        """How many notices wait."""
        return self._queue.qsize()
