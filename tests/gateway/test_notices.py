"""The per-connection push queue stays bounded and never drops a lease notice."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gateway.notices import NoticeQueue


async def drain(queue: NoticeQueue) -> list[list[Any] | None]:
    return [await queue.get() for _ in range(queue.qsize())]


async def test_under_the_limit_everything_is_kept_in_order() -> None:
    """Below the limit, notices come out as they went in."""
    queue = NoticeQueue(limit=3)
    notices: list[list[Any] | None] = [[b"e", 1, [b"a"]], None, [b"e", 2, [b"b"]]]
    for notice in notices:
        queue.put(notice)
    assert await drain(queue) == notices


async def test_past_the_limit_one_read_the_log_marker_replaces_the_rest() -> None:
    """Past the limit, one None is queued and later pushes are dropped."""
    queue = NoticeQueue(limit=2)
    for seq in range(1, 6):
        queue.put([b"e", seq, [b"x"]])
    assert await drain(queue) == [[b"e", 1, [b"x"]], [b"e", 2, [b"x"]], None]


async def test_lease_notices_are_never_dropped() -> None:
    """A session.replaced notice gets through a full queue."""
    queue = NoticeQueue(limit=1)
    for seq in range(1, 4):
        queue.put([b"e", seq, [b"x"]])
    queue.put([b"r", 2])
    assert (await drain(queue))[-1] == [b"r", 2]


async def test_a_malformed_notice_is_queued_for_the_pump_not_raised() -> None:
    """An empty notice (no kind) goes to the consumer like any other, full queue or not: the
    pump drops and logs it; raising here would fail the subscriber's delivery instead."""
    queue = NoticeQueue(limit=1)
    queue.put([])
    queue.put([])
    queue.put([b"r", 3])
    assert await drain(queue) == [[], None, [b"r", 3]]


async def test_a_backlog_comes_out_one_loop_turn_at_a_time() -> None:
    """Another task gets a turn between any two queued notices (counted, not timed)."""
    queue = NoticeQueue(limit=100)
    for seq in range(100):
        queue.put([b"e", seq, [b"x"]])
    turns = 0

    async def other_task() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(other_task())
    await asyncio.sleep(0)  # let it start
    start = turns
    assert len(await drain(queue)) == 100
    other.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await other
    assert turns - start >= 99, turns - start


async def test_a_quiet_channel_answers_read_the_log() -> None:
    """With nothing pushed for quiet_s, get answers None (read the log), and a later push is
    still delivered."""
    queue = NoticeQueue()
    assert await queue.get(quiet_s=0.01) is None
    queue.put([b"e", 1, [b"a"]])
    assert await queue.get(quiet_s=0.01) == [b"e", 1, [b"a"]]


async def test_a_push_wakes_a_waiting_consumer() -> None:
    """A consumer waiting for a push gets it as it is put, not when its quiet timer fires."""
    queue = NoticeQueue()
    waiting = asyncio.create_task(queue.get(quiet_s=3600))
    await asyncio.sleep(0)  # let it start waiting
    assert not waiting.done()
    queue.put([b"r", 3])
    assert await asyncio.wait_for(waiting, 5) == [b"r", 3]


async def test_a_cancelled_consumer_leaves_the_queue_usable() -> None:
    """Cancelling a waiting get (the connection closed) loses no later notice."""
    queue = NoticeQueue()
    waiting = asyncio.create_task(queue.get(quiet_s=3600))
    await asyncio.sleep(0)
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    queue.put([b"e", 1, [b"a"]])
    assert queue.qsize() == 1
    assert await queue.get() == [b"e", 1, [b"a"]]


async def test_notices_cleared_during_the_fair_turn_are_not_returned() -> None:
    """Notices dropped (the connection left their channel) while the consumer took its turn
    of the loop are not handed out: the consumer waits for the next push."""
    queue = NoticeQueue()
    queue.put([b"e", 1, [b"old channel"]])
    getting = asyncio.create_task(queue.get(quiet_s=3600))
    await asyncio.sleep(0)  # get takes its turn of the loop ...
    queue.clear()  # ... and the channel changes meanwhile
    await asyncio.sleep(0)
    assert not getting.done()
    queue.put([b"e", 1, [b"new channel"]])
    assert await asyncio.wait_for(getting, 5) == [b"e", 1, [b"new channel"]]
