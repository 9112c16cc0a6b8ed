"""The census ``duplex-gateway status`` prints, and the heartbeat fields it reads (the backend
and the p99 tick time), on real servers."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from contract.reasons import CloseReason
from store import AttachmentHolder, OpenStatus, Scripts, WorkerFenced, WorkerState
from store.census import (
    NO_ENGINE,
    Census,
    TickTime,
    WorkerCensus,
    decode_tick,
    encode_tick,
    take_census,
)
from store.directory import announce_worker, worker_loads
from store.keys import WorkerKeys, new_gateway_id, new_session_id, new_worker_id
from tests.store._support import (
    LONG_POLICY,
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
    """No field (a record gone, or of another format) or something no worker writes says
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


async def test_a_worker_record_of_another_format_is_refused(
    scripts: Scripts, redis_client: Redis,
) -> None:
    """A worker record without this code's format (``v``) is read by nobody: its renewal is
    fenced, no session is placed on it, a reap leaves it as it is, placement's loads leave it
    out and the census shows it as ``other_format`` with nothing else of it."""
    worker_id = new_worker_id()
    record = WorkerKeys(worker_id).record
    await redis_client.hset(record, mapping={"state": "live", "slots": 3, "used": 0,
                                             "alive_until": 2**50, "ttl_ms": HOUR_MS})
    await announce_worker(redis_client, worker_id, 2**50)
    with pytest.raises(WorkerFenced):
        await scripts.worker_heartbeat(worker_id, slots=3, ttl_ms=HOUR_MS, register=False,
                                       drain=False)
    status = await scripts.open_session(new_session_id(worker_id), epoch="e",
                                        token_digest="d", tenant="t", policy=LONG_POLICY)
    assert status is OpenStatus.UNAVAILABLE
    reaped = await scripts.reap(worker_id)
    assert (reaped.state, reaped.ended) == (WorkerState.OTHER_FORMAT, 0)
    assert await worker_field(redis_client, worker_id, "state") == "live"
    assert await worker_field(redis_client, worker_id, "reaped_ms") is None
    assert worker_id not in {load.worker_id for load in await worker_loads(redis_client,
                                                                            [worker_id])}
    worker = by_id(await take_census(redis_client))[worker_id]
    assert (worker.state, worker.backend, worker.slots) == ("other_format", None, 0)
    assert worker.tick == TickTime(engine=None, p99_ms=None)


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
    assert await scripts.close_session(closed.session_id, CloseReason.CLIENT_CLOSE) == "ok"

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
