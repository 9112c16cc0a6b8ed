"""The worker directory (a placement hint) and the key layout it relies on."""

from __future__ import annotations

import dataclasses

import pytest
from redis.asyncio import Redis

from store import Scripts
from store.directory import WorkerLoad, announce_worker, forget_worker, list_workers, worker_loads
from store.keys import (
    SessionKeys,
    WorkerKeys,
    new_session_id,
    new_worker_id,
    worker_of_session,
)
from tests.store._support import (
    expire_heartbeat,
    open_session,
    reap_until_lost,
    redis_now_ms,
    register_worker,
)


def test_session_id_carries_its_worker() -> None:
    """A session id names its worker, and its keys share the worker's hash tag."""
    wid = new_worker_id()
    sid = new_session_id(wid)
    assert worker_of_session(sid) == wid
    keys = SessionKeys(sid)
    tag = "{" + wid + "}"
    for name in (keys.record, keys.input_log, keys.output_log, keys.output_channel,
                 keys.abandoned, keys.worker.record, keys.worker.sessions,
                 keys.worker.deadlines, keys.worker.input_channel):
        assert name.count("{") == 1 and tag in name, name
    assert new_session_id(wid) != sid
    assert new_worker_id() != wid


@pytest.mark.parametrize("bad", ["", "w123", "sess_x.y", "sess_w0123456789ab.short",
                                 "sess_w0123456789ab.0123456789abcdef0123456789abcdef.x"])
def test_foreign_ids_are_refused(bad: str) -> None:
    """Strings the store did not allocate are rejected, never mapped to some key."""
    with pytest.raises(ValueError):
        worker_of_session(bad)
    with pytest.raises(ValueError):
        SessionKeys(bad)


def test_foreign_worker_ids_are_refused() -> None:
    """Worker ids must be the store's own shape (they become hash tags)."""
    for bad in ("", "w{x}", "W0123456789ab", "w0123456789abc"):
        with pytest.raises(ValueError):
            WorkerKeys(bad)
        with pytest.raises(ValueError):
            new_session_id(bad)


def test_free_is_never_negative() -> None:
    """A worker that shrank below its use reports no free slot, not a negative count."""
    assert WorkerLoad(worker_id="w", state="live", slots=2, used=3).free == 0


async def test_list_announce_forget(redis_client: Redis) -> None:
    """Announced workers are listed until their deadline plus the linger; forget removes."""
    now = await redis_now_ms(redis_client)
    fresh, stale, ancient = new_worker_id(), new_worker_id(), new_worker_id()
    await announce_worker(redis_client, fresh, now + 10_000)
    await announce_worker(redis_client, stale, now - 1_000)
    await announce_worker(redis_client, ancient, now - 120_000)
    assert sorted(await list_workers(redis_client, now)) == sorted([fresh, stale])
    await forget_worker(redis_client, stale)
    assert await list_workers(redis_client, now) == [fresh]


async def test_worker_loads_orders_and_filters(scripts: Scripts, redis_client: Redis) -> None:
    """Most free slots first; lost and unknown workers are left out."""
    busy = await register_worker(scripts, slots=2)
    idle = await register_worker(scripts, slots=3)
    lost = await register_worker(scripts, slots=8)
    await open_session(scripts, busy)
    await open_session(scripts, idle)
    await expire_heartbeat(redis_client, scripts, lost)
    await reap_until_lost(scripts, lost)
    loads = await worker_loads(redis_client, [busy, lost, new_worker_id(), idle])
    assert all(load.since_ms > 0 and load.alive_until_ms > load.since_ms for load in loads)
    assert [dataclasses.replace(load, since_ms=0, alive_until_ms=0) for load in loads] == [
        WorkerLoad(worker_id=idle, state="live", slots=3, used=1, models=("loopback",)),
        WorkerLoad(worker_id=busy, state="live", slots=2, used=1, models=("loopback",))]
    assert [load.free for load in loads] == [2, 1]
    assert await worker_loads(redis_client, []) == []
