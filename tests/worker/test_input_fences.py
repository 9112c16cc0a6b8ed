"""inference_worker.input_fences: which input pushes a worker applies as they are, and when a
session's fence counts as known. The worker's own behaviour, end to end, is in
``tests/worker/test_worker_fencing.py``."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from inference_worker.backends.registry import loopback_core
from inference_worker.input_fences import FenceKeeper, PushVerdict, fence_raised, verdict
from inference_worker.sessions import Session
from store.logs import SessionStart
from store.pushes import InputPushed
from tests.store._support import EPOCH


def session(fence: int | None) -> Session:
    served = Session(core=loopback_core("sess_w0.test"))
    served.input_fence = fence
    return served


def push(fence: int) -> InputPushed:
    return InputPushed("sess_w0.test", 1, [b"c"], None, fence)


@pytest.mark.parametrize(("known", "pushed", "expected"), [
    (4, 4, PushVerdict.APPLY),  # the holder the worker knows of
    (4, 2, PushVerdict.STALE),  # a writer whose lease a resume took: Redis refused it
    (5, 4, PushVerdict.STALE),  # ... or a detachment
    (4, 6, PushVerdict.READ_LOG),  # a fence no notice told of yet: the log says
    (None, 4, PushVerdict.READ_LOG),  # not known since a resubscription
    (4, 0, PushVerdict.READ_LOG),  # a push that names no fence
])
def test_the_verdict_on_a_push(known: int | None, pushed: int, expected: PushVerdict) -> None:
    assert verdict(session(known), push(pushed)) is expected


def test_a_fence_only_rises_and_an_unknown_one_stays_unknown() -> None:
    known = session(4)
    fence_raised(known, 5)
    fence_raised(known, 3)  # an older notice, read late
    assert known.input_fence == 5
    unknown = session(None)
    fence_raised(unknown, 6)  # notices before it may have been missed
    assert unknown.input_fence is None


def test_a_record_read_overtaken_by_a_resubscription_is_not_trusted(
        redis_client: Redis) -> None:
    """A read taken before the subscription came back may predate a raise whose notice was
    lost: its answer is dropped; one taken after is kept."""
    keeper = FenceKeeper(redis_client)
    served = session(4)
    reading = keeper.reading()
    keeper.resubscribed([served])
    assert served.input_fence is None
    keeper.learned(reading, served, SessionStart(epoch=EPOCH, model=None, input_fence=4))
    assert served.input_fence is None
    keeper.learned(keeper.reading(), served,
                   SessionStart(epoch=EPOCH, model=None, input_fence=6))
    assert served.input_fence == 6
