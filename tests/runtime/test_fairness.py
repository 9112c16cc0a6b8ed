"""The store's push queue: unbounded, in order, a turn of the loop before each push of a
backlog, a quiet timer while the consumer waits (the gateway's BoundedPushQueue builds on
it: tests/gateway/test_push_queue.py)."""

from __future__ import annotations

import asyncio
import contextlib

from runtime.fairness import PushQueue


async def test_everything_put_comes_out_in_order_whatever_the_backlog() -> None:
    queue: PushQueue[int] = PushQueue()
    for item in range(1000):
        queue.put(item)
    assert queue.qsize() == 1000 and not queue.empty()
    assert [await queue.get() for _ in range(1000)] == list(range(1000))
    assert queue.empty()


async def test_a_backlog_comes_out_one_loop_turn_at_a_time() -> None:
    """Another task gets a turn between any two queued pushes (counted, not timed)."""
    queue: PushQueue[int] = PushQueue()
    for item in range(100):
        queue.put(item)
    turns = 0

    async def other_task() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(other_task())
    await asyncio.sleep(0)  # let it start
    start = turns
    assert [await queue.get() for _ in range(100)] == list(range(100))
    other.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await other
    assert turns - start >= 99, turns - start


async def test_without_a_quiet_time_get_waits_for_the_next_push() -> None:
    queue: PushQueue[str] = PushQueue()
    getting = asyncio.create_task(queue.get())
    for _ in range(5):  # however many turns pass, nothing is answered without a push
        await asyncio.sleep(0)
    assert not getting.done()
    queue.put("push")
    assert await asyncio.wait_for(getting, 5) == "push"


async def test_a_quiet_channel_answers_none() -> None:
    """With nothing pushed for quiet_s, get answers None (the pump reads the log), and a
    later push is still delivered."""
    queue: PushQueue[str] = PushQueue()
    assert await queue.get(quiet_s=0.01) is None
    queue.put("push")
    assert await queue.get(quiet_s=0.01) == "push"


async def test_a_push_wakes_a_waiting_consumer() -> None:
    """A consumer waiting for a push gets it as it is put, not when its quiet timer fires."""
    queue: PushQueue[str] = PushQueue()
    waiting = asyncio.create_task(queue.get(quiet_s=3600))
    await asyncio.sleep(0)  # let it start waiting
    assert not waiting.done()
    queue.put("push")
    assert await asyncio.wait_for(waiting, 5) == "push"


async def test_a_cancelled_consumer_leaves_the_queue_usable() -> None:
    """Cancelling a waiting get (the connection closed) loses no later push."""
    queue: PushQueue[str] = PushQueue()
    waiting = asyncio.create_task(queue.get(quiet_s=3600))
    await asyncio.sleep(0)
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    queue.put("push")
    assert queue.qsize() == 1
    assert await queue.get() == "push"


async def test_pushes_cleared_during_the_fair_turn_are_not_returned() -> None:
    """Pushes dropped (the connection left their channel) while the consumer took its turn
    of the loop are not handed out: the consumer waits for the next push."""
    queue: PushQueue[str] = PushQueue()
    queue.put("old channel")
    getting = asyncio.create_task(queue.get(quiet_s=3600))
    await asyncio.sleep(0)  # get takes its turn of the loop ...
    queue.clear()  # ... and the channel changes meanwhile
    await asyncio.sleep(0)
    assert not getting.done()
    queue.put("new channel")
    assert await asyncio.wait_for(getting, 5) == "new channel"
