"""Tenants in the store: a session is its opener's, and its place is released once it ends.

Every check is in Lua, so a gateway with a bug (or an attacker holding another tenant's session
id and token) cannot get past it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from redis.asyncio import Redis

from contract.reasons import CloseReason
from store import EndedSession, LeaseLost, ResumeStatus, Scripts
from store.keys import tenant_sessions
from tests.store._support import (
    LONG_POLICY,
    digest,
    ev,
    events_of,
    expire_heartbeat,
    make_policy,
    open_session,
    register_worker,
    session_field,
)

pytestmark = pytest.mark.timeout(30)

OWNER, INTRUDER = "tenant-a", "tenant-b"


async def places(client: Redis, tenant: str) -> set[str]:
    """The session ids holding a place of ``tenant``."""
    members: Any = await client.zrange(tenant_sessions(tenant), 0, -1)
    return {m.decode() for m in members}


async def test_another_tenants_resume_is_unknown_even_with_the_right_token(
    scripts: Scripts, redis_client: Redis
) -> None:
    """Tenant b holding a's session id and token gets UNKNOWN, and nothing changes: the
    owner's token still works afterwards (no lock-out, no oracle)."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid, tenant=OWNER)
    stolen = await scripts.resume(opened.session_id, tenant=INTRUDER,
                                  presented_digest=digest(opened.token),
                                  new_digest=digest("evil"), control_id="x")
    assert stolen.status is ResumeStatus.UNKNOWN and stolen.lease is None
    # The same answer as for a wrong token on a session that never existed.
    assert await session_field(redis_client, opened.session_id, "gen") == "1"
    mine = await scripts.resume(opened.session_id, tenant=OWNER,
                                presented_digest=digest(opened.token),
                                new_digest=digest("t2"), control_id="y")
    assert mine.status is ResumeStatus.OK


async def test_another_tenants_lease_cannot_append_trim_or_detach(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A lease naming another tenant (a forged one: the right epoch and generation) is refused
    as if the session did not exist by every fenced script that reads the record. The input
    append reads only the log (its fence): a gateway holds no lease but what an open or a
    resume of the session's own tenant gave it, so a lease of another tenant never reaches
    it."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid, tenant=OWNER)
    await scripts.append_output(opened.session_id, [ev(1), ev(2)])
    forged = dataclasses.replace(opened.lease, tenant=INTRUDER)
    assert await scripts.trim_output(forged, 2) == "unknown"
    assert await scripts.detach(forged) == "unknown"
    assert [seq for seq, _ in await events_of(redis_client, opened.session_id)] == [1, 2]
    assert await session_field(redis_client, opened.session_id, "state") == "attached"
    result = await scripts.append_input(opened.lease, [(None, b"ok")], max_entries=100)
    assert result.appended == 1


async def test_an_ended_session_is_handed_to_one_reaper_with_its_tenant(
    scripts: Scripts, redis_client: Redis
) -> None:
    """Closing queues (tenant, session) on the worker's ended list; of racing reapers exactly
    one gets it, and the release frees the place."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid, tenant=OWNER)
    assert await scripts.reserve_tenant_slot(OWNER, opened.session_id, cap=4, lease_ms=60_000)
    await scripts.close_session(opened.session_id, CloseReason.CLIENT_CLOSE)
    answers = await asyncio.gather(*(scripts.reap(wid) for _ in range(8)))
    released = [item for answer in answers for item in answer.released]
    assert released == [EndedSession(tenant=OWNER, session_id=opened.session_id)]
    await scripts.release_tenant_slots(released)
    assert await places(redis_client, OWNER) == set()


async def test_every_way_a_session_ends_is_handed_back(
    scripts: Scripts, redis_client: Redis
) -> None:
    """Worker close, expiry and worker loss each queue the session once."""
    wid = await register_worker(scripts, slots=8)
    by_worker = await open_session(scripts, wid)
    expiring = await open_session(scripts, wid, policy=make_policy(disconnect_grace_ms=0))
    lost_with_worker = [await open_session(scripts, wid, policy=LONG_POLICY) for _ in range(2)]
    await scripts.append_output(by_worker.session_id, [], close_reason="client_close")
    await scripts.detach(expiring.lease)
    released: list[EndedSession] = []
    while len(released) < 2:
        released += (await scripts.reap(wid)).released
    await expire_heartbeat(redis_client, scripts, wid)
    lost = await scripts.reap(wid)
    assert lost.state == "lost"
    released += lost.released
    assert sorted(item.session_id for item in released) == sorted(
        o.session_id for o in (by_worker, expiring, *lost_with_worker))
    assert (await scripts.reap(wid)).released == ()


async def test_a_renewal_never_takes_a_released_place_back(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A renewal racing the session's end finds the place released and leaves it so."""
    sid = "sess_w000000000001.00000000000000000000000000000001"
    assert await scripts.reserve_tenant_slot(OWNER, sid, cap=1, lease_ms=60_000)
    assert await scripts.renew_tenant_slots(OWNER, [sid], lease_ms=60_000) == [True]
    await scripts.release_tenant_slot(OWNER, sid)
    assert await scripts.renew_tenant_slots(OWNER, [sid], lease_ms=60_000) == [False]
    assert await places(redis_client, OWNER) == set()


async def test_new_sessions_per_window_are_counted_exactly(scripts: Scripts) -> None:
    """``limit`` opens go ahead in a window, the next is refused with a wait no longer than the
    window, and another tenant is not affected."""
    waits = [await scripts.count_tenant_open(OWNER, limit=3, window_ms=60_000)
             for _ in range(4)]
    assert waits[:3] == [0, 0, 0]
    assert 0 < waits[3] <= 60_000
    assert await scripts.count_tenant_open(INTRUDER, limit=3, window_ms=60_000) == 0


async def test_the_open_window_slides(scripts: Scripts) -> None:
    """Once the oldest open leaves the window, a new one is allowed again."""
    assert await scripts.count_tenant_open(OWNER, limit=1, window_ms=50) == 0
    refused = await scripts.count_tenant_open(OWNER, limit=1, window_ms=50)
    assert 0 < refused <= 50
    deadline = asyncio.get_running_loop().time() + 5
    while await scripts.count_tenant_open(OWNER, limit=1, window_ms=50):
        assert asyncio.get_running_loop().time() < deadline, "the window never slid"
        await asyncio.sleep(0.005)


async def test_lease_lost_still_reports_the_generation_for_the_owner(scripts: Scripts) -> None:
    """The tenant check comes on top of fencing: the owner's stale lease is still LeaseLost."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid, tenant=OWNER)
    await scripts.resume(opened.session_id, tenant=OWNER, presented_digest=digest(opened.token),
                         new_digest=digest("t2"), control_id="c")
    with pytest.raises(LeaseLost):
        await scripts.append_input(opened.lease, [(None, b"x")], max_entries=100)
