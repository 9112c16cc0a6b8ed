"""The per-connection push queue stays bounded and never drops a lease notice (waiting, the
quiet timer and the turn of the loop are the store's PushQueue's: tests/store/test_fairness.py)."""

from __future__ import annotations

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
