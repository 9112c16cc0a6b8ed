"""Attachment leases: a gateway holds the sessions it serves on a worker under one lease,
renewed once per worker; when it lapses, any reaper detaches them (DESIGN §2.6)."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from contract.reasons import CloseReason
from store import AttachmentHolder, Scripts
from store.keys import WorkerKeys, held_member
from tests.store._support import (
    LONG_POLICY,
    assert_one_terminal,
    digest,
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

A = AttachmentHolder(gateway_id="g0000000000aa", lease_ms=60_000)
B = AttachmentHolder(gateway_id="g0000000000bb", lease_ms=60_000)


async def held(client: Redis, worker_id: str, holder: AttachmentHolder) -> set[str]:
    """The sessions ``holder`` holds on the worker."""
    members: Any = await client.zrange(WorkerKeys(worker_id).held, 0, -1)
    mine = held_member(holder.gateway_id, "")
    return {m.decode().removeprefix(mine) for m in members if m.decode().startswith(mine)}


async def lease_end(client: Redis, worker_id: str, holder: AttachmentHolder) -> float | None:
    """When ``holder``'s lease on the worker ends (ms), if it has one."""
    score: Any = await client.zscore(WorkerKeys(worker_id).gateways, holder.gateway_id)
    return None if score is None else float(score)


async def expire_lease(client: Redis, scripts: Scripts, worker_id: str,
                       holder: AttachmentHolder) -> None:
    """Renew ``holder``'s lease for 1 ms and wait until the Redis clock is past it."""
    short = AttachmentHolder(gateway_id=holder.gateway_id, lease_ms=1)
    renewal = await scripts.renew_attachment_lease(worker_id, short)
    await wait_redis_clock_past(client, renewal.until_ms)


async def test_an_open_attaches_under_the_gateways_lease(
    scripts: Scripts, redis_client: Redis
) -> None:
    """The open names its holder, adds the session to its set and starts the lease."""
    wid = await register_worker(scripts)
    now = await redis_now_ms(redis_client)
    opened = await open_session(scripts, wid, holder=A)
    assert await session_field(redis_client, opened.session_id, "gw") == A.gateway_id
    assert await held(redis_client, wid, A) == {opened.session_id}
    end = await lease_end(redis_client, wid, A)
    assert end is not None and now + A.lease_ms <= end <= now + A.lease_ms + 5_000


async def test_a_lapsed_lease_detaches_its_sessions_then_the_grace_runs(
    scripts: Scripts, redis_client: Redis
) -> None:
    """Gateway A stops renewing: one reap detaches all its sessions (grace starts), leaves
    B's alone, and the grace then expires them, one terminal event each."""
    wid = await register_worker(scripts, slots=8)
    policy = make_policy(disconnect_grace_ms=50, idle_ttl_ms=600_000)
    mine = [await open_session(scripts, wid, policy=policy, holder=A) for _ in range(3)]
    other = await open_session(scripts, wid, policy=policy, holder=B)
    await expire_lease(redis_client, scripts, wid, A)
    reaped = await scripts.reap(wid)
    assert reaped.detached == 3
    for o in mine:
        assert await session_field(redis_client, o.session_id, "state") == "detached"
        assert await session_field(redis_client, o.session_id, "gw") == ""
    assert await session_field(redis_client, other.session_id, "state") == "attached"
    assert await held(redis_client, wid, A) == set()
    assert await lease_end(redis_client, wid, A) is None
    assert (await scripts.reap(wid)).detached == 0
    assert await reap_until_ended(scripts, wid, 3) == 3
    for o in mine:
        await assert_one_terminal(redis_client, o.session_id, "session.expired",
                                  "disconnect_grace_expired")


async def test_renewal_keeps_every_session_attached(
    scripts: Scripts, redis_client: Redis
) -> None:
    """One renewal call per worker covers all of a gateway's sessions there."""
    wid = await register_worker(scripts, slots=8)
    short = AttachmentHolder(gateway_id=A.gateway_id, lease_ms=200)
    sessions = [await open_session(scripts, wid, holder=short) for _ in range(5)]
    until_ms = (await scripts.renew_attachment_lease(wid, A)).until_ms  # the long lease
    await wait_redis_clock_past(redis_client, until_ms - A.lease_ms + short.lease_ms)
    assert (await scripts.reap(wid)).detached == 0
    for o in sessions:
        assert await session_field(redis_client, o.session_id, "state") == "attached"


async def test_a_resume_moves_the_session_to_the_new_holder(
    scripts: Scripts, redis_client: Redis
) -> None:
    """Resumed through gateway B, the session is B's: A's lapse does not detach it."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid, holder=A)
    result = await scripts.resume(opened.session_id, tenant="tenant-a",
                                  presented_digest=digest(opened.token),
                                  new_digest=digest("t2"), control_id="c", holder=B)
    assert result.lease is not None
    assert await held(redis_client, wid, A) == set()
    assert await held(redis_client, wid, B) == {opened.session_id}
    await expire_lease(redis_client, scripts, wid, A)
    assert (await scripts.reap(wid)).detached == 0
    assert await session_field(redis_client, opened.session_id, "state") == "attached"


async def test_detach_and_close_let_go_of_the_session(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A detached or ended session is no longer in its gateway's set."""
    wid = await register_worker(scripts)
    detached = await open_session(scripts, wid, holder=A)
    closed = await open_session(scripts, wid, holder=A)
    await scripts.detach(detached.lease)
    await scripts.close_session(closed.session_id, CloseReason.CLIENT_CLOSE)
    assert await held(redis_client, wid, A) == set()
    assert await session_field(redis_client, closed.session_id, "gw") == ""


async def test_after_an_outage_a_lapsed_gateway_gets_one_lease_to_renew(
    scripts: Scripts, redis_client: Redis
) -> None:
    """The reap that ends an outage of the slot (no reaper reached it for longer than
    ``outage_ms``) does not detach a lapsed gateway's sessions until the gateway had a full
    lease to renew."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid, holder=A)
    await expire_lease(redis_client, scripts, wid, A)
    await wait_redis_clock_past(redis_client, await redis_now_ms(redis_client) + 150)
    back = await scripts.reap(wid, outage_ms=100, lease_ms=100)
    assert (back.detached, back.outage_ms > 0) == (0, True)
    recovered = await redis_now_ms(redis_client)
    await wait_redis_clock_past(redis_client, recovered + 100)
    assert (await scripts.reap(wid, outage_ms=60_000, lease_ms=100)).detached == 1
    assert await session_field(redis_client, opened.session_id, "state") == "detached"


async def test_the_models_output_is_no_client_activity(
    scripts: Scripts, redis_client: Redis
) -> None:
    """The idle TTL counts the client's activity alone: output does not move it."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid, policy=LONG_POLICY)
    active = await session_field(redis_client, opened.session_id, "active_ms")
    await wait_redis_clock_past(redis_client, int(active or 0) + 2)
    await scripts.append_output(opened.session_id, [ev(1), ev(2)])
    assert await session_field(redis_client, opened.session_id, "active_ms") == active
