"""The store's push queue: unbounded, in order, a turn of the loop before each push of a
backlog (the gateway's bounded NoticeQueue builds on it: tests/gateway/test_notices.py)."""

from __future__ import annotations

import asyncio
import contextlib

from store.fairness import PushQueue


async def test_everything_put_comes_out_in_order_whatever_the_backlog() -> None:
    queue: PushQueue[int] = PushQueue()
    for item in range(1000):
        queue.put(item)
    assert queue.qsize() == 1000 and not queue.empty()
    assert [await queue.get() for _ in range(1000)] == list(range(1000))
    assert queue.empty()


async def test_a_backlog_gives_other_tasks_a_turn_before_each_item() -> None:
    """Counted, not timed: the consumer suspends once per queued item."""
    queue: PushQueue[int] = PushQueue()
    for item in range(50):
        queue.put(item)
    turns = 0

    async def other() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    start = turns
    for _ in range(50):
        await queue.get()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert turns - start >= 49


async def test_without_a_quiet_time_get_waits_for_the_next_push() -> None:
    queue: PushQueue[str] = PushQueue()
    getting = asyncio.create_task(queue.get())
    for _ in range(5):  # however many turns pass, nothing is answered without a push
        await asyncio.sleep(0)
    assert not getting.done()
    queue.put("push")
    assert await asyncio.wait_for(getting, 5) == "push"
