"""Taking pushes off a queue without starving the loop.

The store's push connection hands over every push one socket read carries (hundreds from a
busy Redis), and a queue's ``get`` need not suspend while anything is queued: a consumer that
handles each push without suspending would run the whole backlog as one step of the event
loop, with heartbeats and lease renewals waiting behind it (a saturated worker was declared
lost so). Every consumer of pushes takes a turn of the loop (:func:`take_a_turn`) before each
push of a backlog: :class:`PushQueue` does it for them.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Generic, TypeVar

__all__ = ["PushQueue", "take_a_turn"]

T = TypeVar("T")


async def take_a_turn() -> None:
    """Let every other ready callback and task run once before the next push is handled."""
    await asyncio.sleep(0)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class PushQueue(Generic[T]):
    """A FIFO of pushes for one consumer, filled from the push connection's callback.

    One push arrives per relayed chunk, so this is on the relay's hot path: a deque and one
    waiter, with a quiet timer armed only while the consumer waits, cost a fraction of an
    ``asyncio.Queue`` (whose put and get take about ten Python calls between them).
    """

    def __init__(self) -> None:
        self._items: collections.deque[T] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: T) -> None:
        """Queue ``item``, waking the consumer."""
        self._items.append(item)
        if self._waiter is not None:
            _wake(self._waiter)

    def clear(self) -> None:
        """Drop every queued item."""
        self._items.clear()

    def qsize(self) -> int:
        """How many items wait."""
        return len(self._items)

    def empty(self) -> bool:
        """Whether no item waits."""
        return not self._items

    async def get(self, quiet_s: float | None = None) -> T | None:
        """The next item, waiting for one; with items queued, after one turn of the loop.
        ``None`` when ``quiet_s`` passes without a push (a consumer that polls on quiet)."""
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
