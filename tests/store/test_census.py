"""The census ``duplex-gateway status`` prints, and the heartbeat fields it reads (the backend
and the p99 tick time), on real servers."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from store import AttachmentHolder, Scripts
from store.census import (
    NO_ENGINE,
    Census,
    TickTime,
    WorkerCensus,
    decode_tick,
    encode_tick,
    take_census,
)
from store.directory import announce_worker
from store.keys import WorkerKeys, new_gateway_id, new_worker_id
from store.lua import WORKER_HEARTBEAT
from tests.store._support import (
    expire_heartbeat,
    open_session,
    reap_until_lost,
    redis_now_ms,
    register_worker,
    worker_field,
)

HOUR_MS = 3_600_000


async def listed_worker(client: Redis, scripts: Scripts, *, slots: int = 4,
                        backend: str = "", tick: TickTime = NO_ENGINE) -> str:
    """A fresh live worker, registered with ``backend`` and ``tick`` and in the directory."""
    worker_id = new_worker_id()
    beat = await scripts.worker_heartbeat(worker_id, slots=slots, ttl_ms=HOUR_MS,
                                          register=True, drain=False, backend=backend,
                                          tick=tick)
    await announce_worker(client, worker_id, beat.alive_until_ms)
    return worker_id


def by_id(census: Census) -> dict[str, WorkerCensus]:
    """The census's workers by id."""
    return {worker.worker_id: worker for worker in census.workers}


@pytest.mark.parametrize("tick", [NO_ENGINE, TickTime(engine=True, p99_ms=None),
                                  TickTime(engine=True, p99_ms=12.5)])
def test_tick_time_round_trips(tick: TickTime) -> None:
    """No engine, an idle engine and a p99 each come back as they were sent."""
    assert decode_tick(encode_tick(tick).encode()) == tick


def test_missing_or_foreign_tick_field_is_unknown() -> None:
    """A record without the field (an older worker) or with something no worker writes says
    nothing about an engine."""
    assert decode_tick(None) == TickTime(engine=None, p99_ms=None)
    assert decode_tick(b"fast") == TickTime(engine=None, p99_ms=None)


async def test_heartbeat_stores_backend_once_and_tick_time_on_every_beat(
    scripts: Scripts, redis_client: Redis,
) -> None:
    """Registration stores the backend and the tick p99; a renewal replaces the tick p99 (an
    idle engine, then no p99 at all) but never the backend."""
    worker_id = new_worker_id()
    await scripts.worker_heartbeat(worker_id, slots=4, ttl_ms=HOUR_MS, register=True,
                                   drain=False, backend="fake",
                                   tick=TickTime(engine=True, p99_ms=3.25))
    assert await worker_field(redis_client, worker_id, "backend") == "fake"
    assert await worker_field(redis_client, worker_id, "tick_p99_ms") == "3.250"
    await scripts.worker_heartbeat(worker_id, slots=4, ttl_ms=HOUR_MS, register=False,
                                   drain=False, backend="moshi",
                                   tick=TickTime(engine=True, p99_ms=None))
    assert await worker_field(redis_client, worker_id, "backend") == "fake"
    assert await worker_field(redis_client, worker_id, "tick_p99_ms") == "idle"
    await scripts.worker_heartbeat(worker_id, slots=4, ttl_ms=HOUR_MS, register=False,
                                   drain=False)
    assert await worker_field(redis_client, worker_id, "tick_p99_ms") == ""


async def test_an_older_workers_heartbeat_still_registers_and_renews(
    scripts: Scripts, redis_client: Redis,
) -> None:
    """The script called with the six arguments an older worker sends registers and renews
    it as before: live, no backend, its tick field left as it was; the census shows what it
    does not know as unknown."""
    old_beat = redis_client.register_script(WORKER_HEARTBEAT)
    worker_id = new_worker_id()
    record = WorkerKeys(worker_id).record
    state, alive_until = await old_beat(keys=[record], args=[3, HOUR_MS, 1, 0, 1, ""])
    assert state == b"live"
    await announce_worker(redis_client, worker_id, int(alive_until))
    assert await worker_field(redis_client, worker_id, "backend") is None
    assert await worker_field(redis_client, worker_id, "tick_p99_ms") is None
    worker = by_id(await take_census(redis_client))[worker_id]
    assert (worker.state, worker.backend, worker.slots) == ("live", None, 3)
    assert worker.tick == TickTime(engine=None, p99_ms=None)
    # A new-style beat, then an old-style renewal: the old one leaves the tick field alone.
    await scripts.worker_heartbeat(worker_id, slots=3, ttl_ms=HOUR_MS, register=False,
                                   drain=False, tick=TickTime(engine=True, p99_ms=7.0))
    state, _ = await old_beat(keys=[record], args=[3, HOUR_MS, 0, 1, 1, ""])
    assert state == b"draining"
    assert await worker_field(redis_client, worker_id, "tick_p99_ms") == "7.000"


async def test_census_counts_sessions_by_state_tenant_and_gateway(
    scripts: Scripts, redis_client: Redis,
) -> None:
    """Two workers: attached sessions count under their state, tenant and holding gateway;
    a detached one under its state and tenant only; a closed one not at all; each worker
    shows its backend, slots used and tick time."""
    fake = await listed_worker(redis_client, scripts, backend="fake",
                               tick=TickTime(engine=True, p99_ms=1.5))
    loop = await listed_worker(redis_client, scripts, slots=8, backend="loopback")
    one, two = (AttachmentHolder(gateway_id=new_gateway_id(), lease_ms=HOUR_MS)
                for _ in range(2))
    await open_session(scripts, fake, tenant="t-a", holder=one)
    await open_session(scripts, loop, tenant="t-a", holder=one)
    await open_session(scripts, loop, tenant="t-b", holder=two)
    detached = await open_session(scripts, loop, tenant="t-b", holder=two)
    assert await scripts.detach(detached.lease) == "ok"
    closed = await open_session(scripts, fake, tenant="t-c", holder=two)
    assert await scripts.close_session(closed.session_id, "client_close") == "ok"

    census = await take_census(redis_client)
    workers = by_id(census)
    assert set(workers) == {fake, loop}
    assert (workers[fake].backend, workers[fake].used, workers[fake].slots) == ("fake", 1, 4)
    assert workers[fake].tick == TickTime(engine=True, p99_ms=1.5)
    assert (workers[loop].backend, workers[loop].used, workers[loop].slots) == (
        "loopback", 3, 8)
    assert workers[loop].tick == NO_ENGINE
    assert dict(workers[fake].sessions.by_state) == {"attached": 1}
    assert dict(workers[loop].sessions.by_state) == {"attached": 2, "detached": 1}
    sessions = census.sessions
    assert sessions.total == 4
    assert dict(sessions.by_state) == {"attached": 3, "detached": 1}
    assert dict(sessions.by_tenant) == {"t-a": 2, "t-b": 2}
    assert dict(sessions.by_gateway) == {one.gateway_id: 2, two.gateway_id: 1}
    for worker in census.workers:
        assert worker.state == "live"
        assert worker.heartbeat_age_ms is not None
        assert 0 <= worker.heartbeat_age_ms <= HOUR_MS


async def test_census_reads_a_large_session_set_in_batches(
    scripts: Scripts, redis_client: Redis,
) -> None:
    """A worker whose sessions take many SSCAN rounds (batches of 3) is counted exactly."""
    worker_id = await listed_worker(redis_client, scripts, slots=40)
    for index in range(31):
        await open_session(scripts, worker_id, tenant=f"t-{index % 2}")
    worker = by_id(await take_census(redis_client, batch=3))[worker_id]
    assert dict(worker.sessions.by_state) == {"attached": 31}
    assert dict(worker.sessions.by_tenant) == {"t-0": 16, "t-1": 15}
    assert worker.used == 31


async def test_census_names_every_worker_state(scripts: Scripts, redis_client: Redis) -> None:
    """Live, draining, expired (heartbeat lapsed, not reaped yet), lost (reaped, still
    listed) and gone (listed without a record) are told apart."""
    live = await listed_worker(redis_client, scripts)
    draining = await listed_worker(redis_client, scripts)
    await scripts.worker_heartbeat(draining, slots=4, ttl_ms=HOUR_MS, register=False,
                                   drain=True)
    expired = await listed_worker(redis_client, scripts)
    await expire_heartbeat(redis_client, scripts, expired)
    lost = await listed_worker(redis_client, scripts)
    await open_session(scripts, lost)
    await expire_heartbeat(redis_client, scripts, lost)
    ended = await reap_until_lost(scripts, lost)
    assert ended == 1
    gone = new_worker_id()
    await announce_worker(redis_client, gone, await redis_now_ms(redis_client))
    unlisted = await register_worker(scripts)

    workers = by_id(await take_census(redis_client))
    assert unlisted not in workers
    assert {wid: w.state for wid, w in workers.items()} == {
        live: "live", draining: "draining", expired: "expired", lost: "lost", gone: "gone"}
    assert workers[lost].sessions.total == 0
    assert workers[gone].heartbeat_age_ms is None
    expired_age = workers[expired].heartbeat_age_ms
    assert expired_age is not None and expired_age >= 1
