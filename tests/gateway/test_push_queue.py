"""The per-connection push queue stays bounded and never drops a lease push (waiting, the
quiet timer and the turn of the loop are runtime's PushQueue's: tests/runtime/test_fairness.py)."""

from __future__ import annotations

from gateway.push_queue import BoundedPushQueue
from store.pushes import LeaseMoved, OutputPushed, Push


async def drain(queue: BoundedPushQueue) -> list[Push | None]:
    return [await queue.get() for _ in range(queue.qsize())]


async def test_under_the_limit_everything_is_kept_in_order() -> None:
    """Below the limit, pushes come out as they went in."""
    queue = BoundedPushQueue(limit=3)
    pushes: list[Push | None] = [OutputPushed(1, [b"a"]), None, OutputPushed(2, [b"b"])]
    for push in pushes:
        queue.put(push)
    assert await drain(queue) == pushes


async def test_past_the_limit_one_read_the_log_marker_replaces_the_rest() -> None:
    """Past the limit, one None is queued and later pushes are dropped."""
    queue = BoundedPushQueue(limit=2)
    for seq in range(1, 6):
        queue.put(OutputPushed(seq, [b"x"]))
    assert await drain(queue) == [OutputPushed(1, [b"x"]), OutputPushed(2, [b"x"]), None]


async def test_lease_pushes_are_never_dropped() -> None:
    """A session.replaced push gets through a full queue, also past its read-the-log marker."""
    queue = BoundedPushQueue(limit=1)
    for seq in range(1, 4):
        queue.put(OutputPushed(seq, [b"x"]))
    queue.put(LeaseMoved(2))
    queue.put(LeaseMoved(3))
    assert await drain(queue) == [OutputPushed(1, [b"x"]), None, LeaseMoved(2), LeaseMoved(3)]
