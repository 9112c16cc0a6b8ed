"""Taking pushes off a queue without starving the loop.

The store's push connection hands over every push one socket read carries (hundreds from a
busy Redis), and ``asyncio.Queue.get`` does not suspend while anything is queued: a consumer
that handles each push without suspending would run the whole backlog as one step of the event
loop, with heartbeats and lease renewals waiting behind it (a saturated worker was declared
lost so). Every consumer of pushes takes a turn of the loop (:func:`take_a_turn`) before each
push of a backlog: from an ``asyncio.Queue`` with :func:`next_fairly`.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

__all__ = ["next_fairly", "take_a_turn"]

T = TypeVar("T")


async def take_a_turn() -> None:
    """Let every other ready callback and task run once before the next push is handled."""
    await asyncio.sleep(0)


async def next_fairly(queue: asyncio.Queue[T]) -> T:
    """The queue's next item, waiting for one; with items queued, after one turn of the loop."""
    if not queue.empty():
        await take_a_turn()
    return await queue.get()
