"""A session's own idle TTL: the ``idle_timeout_s`` of the session object a worker stores with
``session.updated`` becomes the record's idle TTL and moves its deadline (the seed's session
setting, checked by the worker)."""

from __future__ import annotations

from redis.asyncio import Redis

from contract.messages import SessionUpdated, encode_message
from store import Scripts
from store.answers import OutputAppend
from store.keys import WorkerKeys
from tests.store._support import (
    LONG_POLICY,
    assert_one_terminal,
    make_policy,
    open_session,
    reap_until_ended,
    redis_now_ms,
    register_worker,
    session_field,
    used_slots,
    wait_redis_clock_past,
)


async def _store_session(scripts: Scripts, session_id: str, session: dict[str, object]) -> None:
    (outcome,) = await scripts.append_output_many([OutputAppend(
        session_id=session_id, events=[encode_message(SessionUpdated(session=session))],
        session=session)])
    assert outcome == 1


async def test_a_session_object_sets_the_idle_ttl(scripts: Scripts, redis_client: Redis) -> None:
    """idle_timeout_s 0.05 in the stored session object: the session expires idle after
    50 ms, though the gateway's policy gave it 600 s; the deadline moved with it."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    assert await session_field(redis_client, sid, "idle_ms") == str(LONG_POLICY.idle_ttl_ms)
    await _store_session(scripts, sid, {"type": "realtime", "idle_timeout_s": 0.05})
    assert await session_field(redis_client, sid, "idle_ms") == "50"
    active_ms = int(await session_field(redis_client, sid, "active_ms") or 0)
    score = await redis_client.zscore(WorkerKeys(wid).deadlines, sid)
    assert score == active_ms + 50
    await wait_redis_clock_past(redis_client, active_ms + 50)
    assert await reap_until_ended(scripts, wid, 1) == 1
    await assert_one_terminal(redis_client, sid, "session.expired", "idle_ttl_expired")
    assert await used_slots(redis_client, wid) == 0


async def test_a_longer_idle_ttl_keeps_the_session(scripts: Scripts,
                                                   redis_client: Redis) -> None:
    """A session whose gateway policy gave it 1 ms, then asked for 600 s, is not due."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid, policy=make_policy(idle_ttl_ms=1))
    sid = opened.session_id
    await _store_session(scripts, sid, {"type": "realtime", "idle_timeout_s": 600})
    assert await session_field(redis_client, sid, "idle_ms") == "600000"
    now = await redis_now_ms(redis_client)
    score = await redis_client.zscore(WorkerKeys(wid).deadlines, sid)
    assert score is not None and score > now + 500_000
    await wait_redis_clock_past(redis_client, now + 2)
    assert (await scripts.reap(wid)).ended == 0
    assert await session_field(redis_client, sid, "state") == "attached"


async def test_a_session_object_without_it_leaves_the_ttl(scripts: Scripts,
                                                          redis_client: Redis) -> None:
    """A GA session object (no idle_timeout_s) changes nothing."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await _store_session(scripts, opened.session_id, {"type": "realtime", "instructions": ""})
    assert await session_field(redis_client, opened.session_id, "idle_ms") == str(
        LONG_POLICY.idle_ttl_ms)
