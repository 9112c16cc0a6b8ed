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
