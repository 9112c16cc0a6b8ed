"""The housekeeping a gateway's lease renewal carries (``store/lua/gateway_lease.lua``): the
output trims of the sessions it serves on the worker, each fenced as a trim alone is, and the
client activity the idle TTL counts from, which input appends no longer write."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from redis.asyncio import Redis

from contract.reasons import CloseReason
from store import AttachmentHolder, Scripts
from store.housekeeping import OutputTrim
from store.keys import SessionKeys, WorkerKeys, new_session_id, tenant_sessions
from store.logs import read_output
from tests.store._support import (
    digest,
    ev,
    open_session,
    redis_now_ms,
    register_worker,
    session_field,
    wait_redis_clock_past,
)

pytestmark = pytest.mark.timeout(30)

A = AttachmentHolder(gateway_id="g0000000000aa", lease_ms=60_000)


async def seqs(client: Redis, session_id: str) -> list[int]:
    return [seq for seq, _ in await read_output(client, session_id, 0)]


async def test_one_renewal_trims_several_sessions_each_fenced(
    scripts: Scripts, redis_client: Redis
) -> None:
    """One call renews the lease and answers each trim as TRIM_OUTPUT alone would: ok,
    stale (a resumed session's old lease), unknown (another tenant's, or no session) and
    ahead (past the log's end); only the ok one trims."""
    wid = await register_worker(scripts, slots=4)
    fresh, resumed, other = [await open_session(scripts, wid, holder=A) for _ in range(3)]
    for o in (fresh, resumed, other):
        await scripts.append_output(o.session_id, [ev(1), ev(2), ev(3)])
    await scripts.resume(resumed.session_id, tenant="tenant-a",
                         presented_digest=digest(resumed.token), new_digest=digest("t2"),
                         control_id="c1")
    forged = dataclasses.replace(other.lease, tenant="intruder")
    missing = dataclasses.replace(fresh.lease, session_id=new_session_id(wid))
    renewal = await scripts.renew_attachment_lease(wid, A, trims=[
        OutputTrim(fresh.lease, 2), OutputTrim(resumed.lease, 2), OutputTrim(forged, 2),
        OutputTrim(missing, 1), OutputTrim(other.lease, 9)])
    assert renewal.trims == ("ok", "stale", "unknown", "unknown", "ahead")
    assert renewal.until_ms >= await redis_now_ms(redis_client) + A.lease_ms - 1_000
    assert await redis_client.zscore(WorkerKeys(wid).gateways, A.gateway_id) == renewal.until_ms
    assert await seqs(redis_client, fresh.session_id) == [3]
    for o in (resumed, other):
        assert await seqs(redis_client, o.session_id) == [1, 2, 3]
    assert not await redis_client.exists(SessionKeys(missing.session_id).record)


async def test_housekeeping_without_a_holder_renews_no_lease(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A call with no holder (the sessions' worker is no longer held) trims and marks, and
    lists no gateway; every session it names must be of that worker (one hash slot)."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await scripts.append_output(opened.session_id, [ev(1), ev(2)])
    renewal = await scripts.renew_attachment_lease(
        wid, None, trims=[OutputTrim(opened.lease, 1)], active=[opened.session_id])
    assert (renewal.until_ms, renewal.trims) == (0, ("ok",))
    assert await redis_client.zcard(WorkerKeys(wid).gateways) == 0
    assert await seqs(redis_client, opened.session_id) == [2]
    elsewhere = await register_worker(scripts)
    with pytest.raises(ValueError, match="not a session of"):
        await scripts.renew_attachment_lease(elsewhere, A, active=[opened.session_id])
    with pytest.raises(ValueError, match="not a session of"):
        await scripts.renew_attachment_lease(elsewhere, A,
                                             trims=[OutputTrim(opened.lease, 2)])


async def test_input_leaves_the_activity_to_the_lease_call(
    scripts: Scripts, redis_client: Redis
) -> None:
    """An input append does not move ``active_ms``; a renewal marking the session does, to
    Redis's clock at the renewal. A closed session, or one that does not exist, is left as
    it is: no record is made."""
    wid = await register_worker(scripts, slots=3)
    opened, closed = [await open_session(scripts, wid, holder=A) for _ in range(2)]
    sid = opened.session_id
    opened_ms = int(await session_field(redis_client, sid, "active_ms") or 0)
    await wait_redis_clock_past(redis_client, opened_ms + 2)
    result = await scripts.append_input(opened.lease, [(1, b"audio")], max_entries=100)
    assert result.appended == 1
    assert await session_field(redis_client, sid, "active_ms") == str(opened_ms)
    await scripts.close_session(closed.session_id, CloseReason.CLIENT_CLOSE)
    closed_ms = await session_field(redis_client, closed.session_id, "active_ms")
    absent = new_session_id(wid)
    before = await redis_now_ms(redis_client)
    await scripts.renew_attachment_lease(wid, A, active=[sid, closed.session_id, absent])
    assert int(await session_field(redis_client, sid, "active_ms") or 0) >= before
    assert await session_field(redis_client, closed.session_id, "active_ms") == closed_ms
    assert not await redis_client.exists(SessionKeys(absent).record)


async def test_tenant_renewal_renews_many_places_in_one_call(
    scripts: Scripts, redis_client: Redis
) -> None:
    """One renewal per tenant for every session a gateway holds of it; a released place
    stays released, whatever the others in the call."""
    sids = [f"sess_w000000000001.{i:032x}" for i in range(3)]
    for sid in sids:
        assert await scripts.reserve_tenant_slot("t-bulk", sid, cap=3, lease_ms=60_000)
    await scripts.release_tenant_slot("t-bulk", sids[1])
    assert await scripts.renew_tenant_slots("t-bulk", sids, lease_ms=120_000) == [
        True, False, True]
    places: Any = await redis_client.zrange(tenant_sessions("t-bulk"), 0, -1, withscores=True)
    now = await redis_now_ms(redis_client)
    assert {m.decode() for m, _ in places} == {sids[0], sids[2]}
    assert all(score > now + 60_000 for _, score in places)
