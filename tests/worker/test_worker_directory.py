"""The worker directory from the reaper's side: a worker is listed until a reaper finds it lost,
however it ended and however long ago it last beat (in process, real Redis)."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from gateway.metrics import GatewayMetrics
from gateway.reaper import reap_once
from inference_worker.settings import WorkerSettings
from inference_worker.worker import Worker
from store import Scripts
from store.directory import announce_worker, list_workers, listed_workers
from store.keys import WORKER_DIRECTORY, WorkerKeys, new_worker_id
from tests.store._support import redis_now_ms, wait_redis_clock_past


async def test_the_reaper_list_keeps_workers_that_beat_long_ago(redis_client: Redis) -> None:
    """Placement skips a worker whose deadline passed over a minute ago; the reaper's list
    still holds it (a worker that died while no reaper ran must still be declared lost)."""
    now = await redis_now_ms(redis_client)
    fresh, ancient = new_worker_id(), new_worker_id()
    await announce_worker(redis_client, fresh, now + 10_000)
    await announce_worker(redis_client, ancient, now - 3_600_000)
    assert await list_workers(redis_client, now) == [fresh]
    assert sorted(await listed_workers(redis_client)) == sorted([fresh, ancient])


async def test_a_drained_worker_stays_listed_until_a_reaper_finds_it_lost(
        redis_client: Redis) -> None:
    """A worker that stopped cleanly leaves its entry: once its heartbeat lapses a reaper
    marks its record lost (so the record expires instead of staying for ever) and drops the
    entry."""
    settings = WorkerSettings(backend="loopback", slots=1, heartbeat_interval_s=0.05,
                              heartbeat_ttl_s=0.2, drain_timeout_s=0.1)
    worker = Worker(settings, redis_client)
    task = asyncio.create_task(worker.run())
    record = WorkerKeys(worker.worker_id).record
    while await redis_client.zscore(WORKER_DIRECTORY, worker.worker_id) is None:
        assert not task.done(), "the worker stopped before registering"
        await asyncio.sleep(0.01)
    worker.stop()
    await asyncio.wait_for(task, 10)
    assert await redis_client.zscore(WORKER_DIRECTORY, worker.worker_id) is not None
    assert await redis_client.hget(record, "state") == b"draining"
    alive_until = await redis_client.hget(record, "alive_until")
    assert isinstance(alive_until, bytes)
    await wait_redis_clock_past(redis_client, int(alive_until))
    await reap_once(redis_client, Scripts(redis_client), GatewayMetrics())
    assert await redis_client.hget(record, "state") == b"lost"
    assert await redis_client.pttl(record) > 0
    assert await redis_client.zscore(WORKER_DIRECTORY, worker.worker_id) is None
