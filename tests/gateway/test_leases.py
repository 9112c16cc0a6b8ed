"""The gateway's attachment leases on a real Redis: one renewal per worker, whatever the
number of sessions it holds there, carrying those sessions' housekeeping (output trims, client
activity), and one tenant renewal per tenant."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.lease_duties import PendingDuties
from gateway.leases import AttachmentLeases
from runtime.embedded import EmbeddedServer
from store import AttachmentHolder, Lease, Scripts, create_client
from store.housekeeping import OutputTrim
from store.keys import WorkerKeys, new_session_id, new_worker_id, tenant_sessions
from store.logs import read_output
from tests.faultproxy import FaultProxy
from tests.store._support import (
    assert_one_terminal,
    ev,
    make_policy,
    open_session,
    reap_until_ended,
    redis_now_ms,
    register_worker,
    session_field,
    wait_redis_clock_past,
)

pytestmark = pytest.mark.timeout(30)

HOLDER = AttachmentHolder(gateway_id="g00000000abcd", lease_ms=5_000)


async def test_renewal_costs_one_call_per_worker_not_per_session(redis_client: Redis) -> None:
    """50 sessions on 2 workers: each round renews 2 leases, and both end a lease from now;
    once every session is released, a round renews nothing."""
    leases = AttachmentLeases(Scripts(redis_client), HOLDER)
    workers = [new_worker_id(), new_worker_id()]
    sessions = [new_session_id(workers[i % 2]) for i in range(50)]
    for session_id in sessions:
        leases.hold(session_id)
    before = await redis_now_ms(redis_client)
    assert [await leases.renew_once() for _ in range(3)] == [2, 2, 2]
    assert leases.renewals == 6
    for worker in workers:
        score: Any = await redis_client.zscore(WorkerKeys(worker).gateways, HOLDER.gateway_id)
        assert score is not None and float(score) >= before + HOLDER.lease_ms
    for session_id in sessions[:-1]:
        leases.release(session_id)
    assert leases.workers == [workers[1]]
    leases.release(sessions[-1])
    assert await leases.renew_once() == 0


# ------------------------------------------------------------------ housekeeping on the rounds

IDLE = make_policy(idle_ttl_ms=500)
#: The rounds of these tests, on the Redis clock: well under the idle TTL.
ROUND_MS = 100


async def test_a_round_carries_trims_and_activity_and_one_tenant_renewal(
    redis_client: Redis,
) -> None:
    """Three sessions of one tenant on one worker: a round is one lease call carrying every
    trim and activity mark, and one tenant renewal for all three, whatever their number."""
    scripts = Scripts(redis_client)
    leases = AttachmentLeases(scripts, HOLDER, tenant_lease_ms=60_000)
    wid = await register_worker(scripts, slots=3)
    opened = [await open_session(scripts, wid, holder=HOLDER) for _ in range(3)]
    for o in opened:
        assert await scripts.reserve_tenant_slot(o.lease.tenant, o.session_id, cap=3,
                                                 lease_ms=1_000)
        leases.hold(o.session_id, o.lease.tenant)
        await scripts.append_output(o.session_id, [ev(1), ev(2), ev(3)])
        leases.trim(o.lease, 1)
        leases.trim(o.lease, 2)  # the newest trim of a session wins
        leases.active(o.session_id)
    before = await redis_now_ms(redis_client)
    assert await leases.renew_once() == 1
    assert (leases.renewals, leases.tenant_renewals) == (1, 1)
    for o in opened:
        assert [seq for seq, _ in await read_output(redis_client, o.session_id, 0)] == [3]
        assert int(await session_field(redis_client, o.session_id, "active_ms") or 0) >= before
        score: Any = await redis_client.zscore(tenant_sessions(o.lease.tenant), o.session_id)
        assert score is not None and float(score) >= before + 60_000
    leases.release(opened[0].session_id)
    assert await leases.renew_once() == 1
    assert leases.tenant_renewals == 2


async def test_duties_of_a_worker_no_longer_held_still_go(redis_client: Redis) -> None:
    """The connection ended before the round: its trim still goes, with no lease renewed."""
    scripts = Scripts(redis_client)
    leases = AttachmentLeases(scripts, HOLDER)
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await scripts.append_output(opened.session_id, [ev(1), ev(2)])
    leases.hold(opened.session_id)
    leases.trim(opened.lease, 1)
    leases.release(opened.session_id)
    assert await leases.renew_once() == 0
    assert [seq for seq, _ in await read_output(redis_client, opened.session_id, 0)] == [2]
    assert await redis_client.zcard(WorkerKeys(wid).gateways) == 0


async def test_duties_of_a_failed_round_wait_for_the_next(redis_server: EmbeddedServer,
                                                          redis_client: Redis) -> None:
    """Redis away: the round fails, its trim and activity are kept, and the round after the
    outage sends them (the newest trim of the session)."""
    proxy = FaultProxy("127.0.0.1", redis_server.port)
    await proxy.start()
    client = create_client(proxy.url)
    try:
        leases = AttachmentLeases(Scripts(client), HOLDER)
        direct = Scripts(redis_client)
        wid = await register_worker(direct)
        opened = await open_session(direct, wid, holder=HOLDER)
        sid = opened.session_id
        await direct.append_output(sid, [ev(1), ev(2), ev(3)])
        opened_ms = await session_field(redis_client, sid, "active_ms")
        leases.hold(sid)
        leases.trim(opened.lease, 1)
        leases.active(sid)
        proxy.cut()
        assert await leases.renew_once() == 1
        assert await session_field(redis_client, sid, "active_ms") == opened_ms
        leases.trim(opened.lease, 2)
        proxy.restore()
        before = await redis_now_ms(redis_client)
        assert await leases.renew_once() == 1
        assert [seq for seq, _ in await read_output(redis_client, sid, 0)] == [3]
        assert int(await session_field(redis_client, sid, "active_ms") or 0) >= before
    finally:
        await client.aclose()
        await proxy.aclose()


def test_a_put_back_trim_never_replaces_a_newer_one() -> None:
    """A trim recorded while the call that carried an older one was in flight wins when that
    call fails; the activity marks come back as a union."""
    duties = PendingDuties()
    wid = new_worker_id()
    sid = new_session_id(wid)
    lease = Lease(session_id=sid, epoch="e", generation=1, tenant="t")
    duties.trim(OutputTrim(lease, 1))
    duties.active(sid)
    taken = duties.take_all()
    assert duties.take_all() == {}
    duties.trim(OutputTrim(lease, 2))
    duties.put_back(taken[wid])
    assert duties.take_all() == {wid: ([OutputTrim(lease, 2)], [sid])}


async def test_input_alone_keeps_a_session_past_its_idle_ttl_silence_ends_it(
    redis_client: Redis,
) -> None:
    """A client that only sends input (no output) for three idle TTLs is not expired: each
    round marks it active. Once it falls silent it expires by the idle TTL counted from the
    last round that marked it, at most one round after its last input: not before."""
    scripts = Scripts(redis_client)
    leases = AttachmentLeases(scripts, HOLDER)
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid, policy=IDLE, holder=HOLDER)
    sid = opened.session_id
    leases.hold(sid)
    start = await redis_now_ms(redis_client)
    seq = 0
    while (now := await redis_now_ms(redis_client)) < start + 3 * IDLE.idle_ttl_ms:
        seq += 1
        await scripts.append_input(opened.lease, [(seq, b"audio")], max_entries=10_000)
        last_input = await redis_now_ms(redis_client)
        leases.active(sid)  # as the connection's input writer does
        await leases.renew_once()
        assert (await scripts.reap(wid)).ended == 0
        await wait_redis_clock_past(redis_client, now + ROUND_MS)
    assert await session_field(redis_client, sid, "state") == "attached"
    marked = int(await session_field(redis_client, sid, "active_ms") or 0)
    assert last_input <= marked
    # Silent from here: the rounds go on, marking nothing.
    await leases.renew_once()
    ended = (await scripts.reap(wid)).ended
    reaped_by = await redis_now_ms(redis_client)
    assert ended == 0 or reaped_by >= marked + IDLE.idle_ttl_ms, "expired before its idle TTL"
    await wait_redis_clock_past(redis_client, marked + IDLE.idle_ttl_ms)
    assert await reap_until_ended(scripts, wid, 1) == 1
    await assert_one_terminal(redis_client, sid, "session.expired", "idle_ttl_expired")


async def test_a_lease_lapses_on_the_gateways_own_clock_while_no_renewal_is_answered(
        redis_server: EmbeddedServer, redis_client: Redis) -> None:
    """A held session's lease lapses, on the gateway's clock, a lease after the attach or the
    last renewal Redis answered was sent; a round that fails (Redis cut off) moves nothing; a
    worker no longer held has no lapse."""
    proxy = FaultProxy("127.0.0.1", redis_server.port)
    await proxy.start()
    client = create_client(proxy.url)
    loop = asyncio.get_running_loop()
    lease_s = HOLDER.lease_ms / 1000
    try:
        leases = AttachmentLeases(Scripts(client), HOLDER)
        wid = await register_worker(Scripts(redis_client))
        sid = (await open_session(Scripts(redis_client), wid, holder=HOLDER)).session_id
        assert leases.lapses_at(sid) is None
        attached = loop.time()
        leases.hold(sid)
        after_hold = leases.lapses_at(sid)
        assert after_hold is not None and attached + lease_s <= after_hold
        assert after_hold <= loop.time() + lease_s
        await wait_redis_clock_past(redis_client, await redis_now_ms(redis_client) + 5)
        sent = loop.time()
        assert await leases.renew_once() == 1
        renewed = leases.lapses_at(sid)
        assert renewed is not None and sent + lease_s <= renewed <= loop.time() + lease_s
        assert renewed > after_hold
        proxy.cut()
        assert await leases.renew_once() == 1  # tried, and failed
        assert leases.lapses_at(sid) == renewed
        proxy.restore()
        sent = loop.time()
        assert await leases.renew_once() == 1
        restored = leases.lapses_at(sid)
        assert restored is not None and restored >= sent + lease_s > renewed
        leases.release(sid)
        assert leases.lapses_at(sid) is None
    finally:
        await client.aclose()
        await proxy.aclose()
