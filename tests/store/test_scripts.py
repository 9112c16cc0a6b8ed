"""Contract tests of every Lua compare-and-set script, winning and losing paths, on each server."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from contract.messages import AudioDelta, ErrorEvent, SessionClosed, encode_message
from contract.reasons import CloseReason
from store import (
    Lease,
    LeaseLost,
    OpenStatus,
    OutputAppend,
    OutputMismatch,
    ResumeStatus,
    Scripts,
    SessionGone,
    SessionPolicy,
    WorkerFenced,
    lua,
)
from store.answers import DEFAULT_ATTACHMENT_LEASE_MS
from store.directory import worker_loads
from store.keys import SessionKeys, WorkerKeys, new_session_id, new_worker_id
from store.logs import log_ends, read_input, read_output
from store.scripts import RESUME_RETRY_WINDOW_MS
from tests.store._support import (
    EPOCH,
    LONG_POLICY,
    assert_one_terminal,
    counts,
    digest,
    ev,
    events_of,
    expire_heartbeat,
    make_policy,
    open_session,
    poll_until,
    reap_until_ended,
    reap_until_lost,
    redis_now_ms,
    register_worker,
    session_field,
    used_slots,
    wait_redis_clock_past,
    worker_field,
)

#: Reaps further apart than this are an outage of the slot, in the outage tests; LONG_MS: never.
OUTAGE_MS = 100
LONG_MS = 60_000


def cmd(text: str) -> bytes:
    """An opaque encoded input command (the store never decodes commands)."""
    return text.encode()


async def open_status(
    scripts: Scripts, session_id: str, policy: SessionPolicy = LONG_POLICY
) -> OpenStatus:
    """Try to open ``session_id``; the raw status."""
    return await scripts.open_session(session_id, epoch=EPOCH, token_digest=digest("t"),
                                      tenant="tenant-a", policy=policy)


# --------------------------------------------------------------------------- open


async def test_open_ok_writes_record_and_reserves_slot(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A successful open writes generation 1 in the store epoch and reserves one slot."""
    wid = await register_worker(scripts, slots=3)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    assert await session_field(redis_client, sid, "state") == "attached"
    assert await session_field(redis_client, sid, "gen") == "1"
    assert await session_field(redis_client, sid, "epoch") == EPOCH
    assert await session_field(redis_client, sid, "digest") == digest(opened.token)
    assert await used_slots(redis_client, wid) == 1
    members = await redis_client.smembers(WorkerKeys(wid).sessions)
    assert members == {sid.encode()}
    assert await redis_client.zscore(WorkerKeys(wid).deadlines, sid) is not None


async def test_open_twice_is_exists_and_reserves_nothing(
    scripts: Scripts, redis_client: Redis
) -> None:
    """Opening an id that already has a record answers EXISTS and takes no second slot."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    assert await open_status(scripts, opened.session_id) is OpenStatus.EXISTS
    assert await used_slots(redis_client, wid) == 1
    assert await session_field(redis_client, opened.session_id, "gen") == "1"


async def test_open_after_abandon_tombstone_is_refused(
    scripts: Scripts, redis_client: Redis
) -> None:
    """An open that lands after the gateway abandoned it is refused and reserves nothing."""
    wid = await register_worker(scripts)
    sid = new_session_id(wid)
    assert await scripts.abandon_open(sid) == "tombstoned"
    assert await open_status(scripts, sid) is OpenStatus.ABANDONED
    assert await used_slots(redis_client, wid) == 0
    assert not await redis_client.exists(SessionKeys(sid).record)


async def test_open_on_unknown_worker_is_unavailable(scripts: Scripts, redis_client: Redis) -> None:
    """A worker that never registered cannot take a session."""
    sid = new_session_id(new_worker_id())
    assert await open_status(scripts, sid) is OpenStatus.UNAVAILABLE
    assert not await redis_client.exists(SessionKeys(sid).record)


async def test_open_on_lost_worker_is_unavailable(scripts: Scripts, redis_client: Redis) -> None:
    """A worker declared lost by the reaper cannot take a session."""
    wid = await register_worker(scripts)
    await expire_heartbeat(redis_client, scripts, wid)
    await reap_until_lost(scripts, wid)
    assert await open_status(scripts, new_session_id(wid)) is OpenStatus.UNAVAILABLE


async def test_open_on_expired_heartbeat_is_unavailable(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A lapsed heartbeat refuses opens even before any reaper ran."""
    wid = await register_worker(scripts)
    await expire_heartbeat(redis_client, scripts, wid)
    assert await worker_field(redis_client, wid, "state") == "live"
    assert await open_status(scripts, new_session_id(wid)) is OpenStatus.UNAVAILABLE
    assert await used_slots(redis_client, wid) == 0


async def test_open_on_draining_worker_is_unavailable(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A draining worker admits no new session."""
    wid = await register_worker(scripts)
    await scripts.worker_heartbeat(wid, slots=4, ttl_ms=60_000, register=False, drain=True)
    assert await open_status(scripts, new_session_id(wid)) is OpenStatus.UNAVAILABLE
    assert await used_slots(redis_client, wid) == 0


async def test_busy_worker_admits_again_when_it_has_budget(
    scripts: Scripts, redis_client: Redis
) -> None:
    """admit=False makes a worker busy (no opens); the next admitting beat reopens it."""
    wid = await register_worker(scripts)
    beat = await scripts.worker_heartbeat(wid, slots=4, ttl_ms=60_000, register=False,
                                          drain=False, admit=False)
    assert beat.state == "busy"
    assert await open_status(scripts, new_session_id(wid)) is OpenStatus.UNAVAILABLE
    beat = await scripts.worker_heartbeat(wid, slots=4, ttl_ms=60_000, register=False,
                                          drain=False, admit=True)
    assert beat.state == "live"
    assert await open_status(scripts, new_session_id(wid)) is OpenStatus.OK
    drained = await scripts.worker_heartbeat(wid, slots=4, ttl_ms=60_000, register=False,
                                             drain=True, admit=True)
    assert drained.state == "draining"
    again = await scripts.worker_heartbeat(wid, slots=4, ttl_ms=60_000, register=False,
                                           drain=False, admit=True)
    assert again.state == "draining", "draining is sticky"


async def test_open_full_worker_and_slot_accounting(scripts: Scripts, redis_client: Redis) -> None:
    """Slots are counted exactly: FULL at capacity, free again after a close."""
    wid = await register_worker(scripts, slots=2)
    first = await open_session(scripts, wid)
    await open_session(scripts, wid)
    assert await used_slots(redis_client, wid) == 2
    assert await open_status(scripts, new_session_id(wid)) is OpenStatus.FULL
    assert await used_slots(redis_client, wid) == 2
    [load] = await worker_loads(redis_client, [wid])
    assert (load.slots, load.used, load.free) == (2, 2, 0)
    assert await scripts.close_session(first.session_id, CloseReason.CLIENT_CLOSE) == "ok"
    assert await used_slots(redis_client, wid) == 1
    await open_session(scripts, wid)
    assert await used_slots(redis_client, wid) == 2


async def test_concurrent_opens_never_oversubscribe(scripts: Scripts, redis_client: Redis) -> None:
    """Many racing opens on one worker take exactly its slot count, never more."""
    wid = await register_worker(scripts, slots=5)
    statuses = await asyncio.gather(*(open_status(scripts, new_session_id(wid))
                                      for _ in range(20)))
    assert statuses.count(OpenStatus.OK) == 5
    assert statuses.count(OpenStatus.FULL) == 15
    assert await used_slots(redis_client, wid) == 5


# --------------------------------------------------------------------------- resume


async def test_resume_bumps_generation_and_rotates_digest(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A resume with the right token bumps the generation and only the new token works next."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    await scripts.append_input(opened.lease, [(7, cmd("a"))], max_entries=100)
    await scripts.append_output(sid, [ev(1), ev(2)])
    result = await scripts.resume(sid, tenant="tenant-a", presented_digest=digest(opened.token),
                                  new_digest=digest("t2"), control_id="c1")
    assert result.status is ResumeStatus.OK
    assert result.lease == Lease(session_id=sid, epoch=EPOCH, generation=2, tenant="tenant-a")
    assert (result.last_client_seq, result.last_server_event_seq) == (7, 2)
    assert result.first_retained_seq == 1
    assert await session_field(redis_client, sid, "digest") == digest("t2")
    stale = await scripts.resume(sid, tenant="tenant-a", presented_digest=digest(opened.token),
                                 new_digest=digest("t3"), control_id="c2")
    assert stale.status is ResumeStatus.BAD_TOKEN
    again = await scripts.resume(sid, tenant="tenant-a",
                                 presented_digest=digest("t2"), new_digest=digest("t3"),
                                 control_id="c3")
    assert again.status is ResumeStatus.OK
    assert again.lease is not None and again.lease.generation == 3


async def test_resume_of_detached_session_reattaches(scripts: Scripts, redis_client: Redis) -> None:
    """A resume during the disconnect grace attaches again and lifts the grace deadline."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid, policy=make_policy(disconnect_grace_ms=0))
    assert await scripts.detach(opened.lease) == "ok"
    result = await scripts.resume(opened.session_id, tenant="tenant-a",
                                  presented_digest=digest(opened.token),
                                  new_digest=digest("t2"), control_id="c1")
    assert result.status is ResumeStatus.OK
    assert await session_field(redis_client, opened.session_id, "state") == "attached"
    assert counts(await scripts.reap(wid)) == ("live", 0)
    assert await session_field(redis_client, opened.session_id, "state") == "attached"


async def test_a_retried_resume_keeps_its_token_and_fences_the_first(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A retry of a resume that landed (its answer lost: same control id, the old token, the
    same new digest), as another gateway sends it: accepted, the token it rotated to stays
    valid, and a newer generation fences the first attempt's lease."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    kwargs: dict[str, Any] = {"tenant": "tenant-a", "presented_digest": digest(opened.token),
                              "new_digest": digest("t2"), "control_id": "ctl-1"}
    first = await scripts.resume(sid, **kwargs)
    retry = await scripts.resume(sid, **kwargs)
    assert first.status is retry.status is ResumeStatus.OK
    assert first.lease is not None and retry.lease is not None
    assert (first.lease.generation, retry.lease.generation) == (2, 3)
    assert await session_field(redis_client, sid, "digest") == digest("t2")
    with pytest.raises(LeaseLost):
        await scripts.append_input(first.lease, [(None, cmd("late"))], max_entries=100)
    # The old token under another control id, or with another new digest, is refused.
    other = await scripts.resume(sid, tenant="tenant-a", presented_digest=digest(opened.token),
                                 new_digest=digest("t2"), control_id="ctl-2")
    assert other.status is ResumeStatus.BAD_TOKEN
    forged = await scripts.resume(sid, **{**kwargs, "new_digest": digest("t3")})
    assert forged.status is ResumeStatus.BAD_TOKEN
    # The rotated-to token resumes as usual, and after that the retry is over.
    assert (await scripts.resume(sid, tenant="tenant-a", presented_digest=digest("t2"),
                                 new_digest=digest("t4"), control_id="ctl-3")).status \
        is ResumeStatus.OK
    assert (await scripts.resume(sid, **kwargs)).status is ResumeStatus.BAD_TOKEN


async def test_a_late_copy_of_an_earlier_resume_attempt_is_stale(
    scripts: Scripts, redis_client: Redis
) -> None:
    """Attempt 1 of a resume waits out a failover inside gateway B; the client gives up on it
    and attempt 2 (same control id) attaches through gateway A. When attempt 1 lands at
    last it is refused as stale: A's generation and lease stand, nothing is rotated. The same
    attempt sent again (its gateway's own retry) and a later attempt are still accepted."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    kwargs: dict[str, Any] = {"tenant": "tenant-a", "presented_digest": digest(opened.token),
                              "new_digest": digest("t2"), "control_id": "ctl-1"}
    second = await scripts.resume(sid, **kwargs, attempt=2)
    assert second.status is ResumeStatus.OK and second.lease is not None
    late = await scripts.resume(sid, **kwargs, attempt=1)
    assert (late.status, late.lease) == (ResumeStatus.STALE, None)
    assert await session_field(redis_client, sid, "gen") == str(second.lease.generation)
    await scripts.append_input(second.lease, [(None, cmd("still mine"))], max_entries=100)
    again = await scripts.resume(sid, **kwargs, attempt=2)  # attempt 2's gateway retrying
    third = await scripts.resume(sid, **kwargs, attempt=3)
    assert again.status is third.status is ResumeStatus.OK
    assert third.lease is not None and third.lease.generation == second.lease.generation + 2
    assert (await scripts.resume(sid, **kwargs, attempt=2)).status is ResumeStatus.STALE
    assert await session_field(redis_client, sid, "digest") == digest("t2")


async def test_a_resume_retry_is_refused_after_its_window(
    scripts: Scripts, redis_client: Redis
) -> None:
    """Once the retry window has passed, the old token is void like any rotated token."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    kwargs: dict[str, Any] = {"tenant": "tenant-a", "presented_digest": digest(opened.token),
                              "new_digest": digest("t2"), "control_id": "ctl-1"}
    assert (await scripts.resume(sid, **kwargs)).status is ResumeStatus.OK
    landed = int(await session_field(redis_client, sid, "rcid_ms") or 0)
    # Move the landing back past the window instead of waiting a minute.
    await redis_client.hset(SessionKeys(sid).record, "rcid_ms",
                            landed - RESUME_RETRY_WINDOW_MS)
    assert (await scripts.resume(sid, **kwargs)).status is ResumeStatus.BAD_TOKEN


async def test_resume_with_bad_token_changes_nothing(scripts: Scripts, redis_client: Redis) -> None:
    """A wrong token is refused without a lease, and the generation stays put."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    result = await scripts.resume(opened.session_id, tenant="tenant-a",
                                  presented_digest=digest("wrong"),
                                  new_digest=digest("t2"), control_id="c1")
    assert result.status is ResumeStatus.BAD_TOKEN
    assert result.lease is None
    assert await session_field(redis_client, opened.session_id, "gen") == "1"
    assert await session_field(redis_client, opened.session_id, "digest") == digest(opened.token)


async def test_resume_unknown_session(scripts: Scripts) -> None:
    """A session id with no record resumes to UNKNOWN."""
    result = await scripts.resume(new_session_id(new_worker_id()), tenant="tenant-a",
                                                               presented_digest=digest("x"),
                                  new_digest=digest("y"), control_id="c")
    assert result.status is ResumeStatus.UNKNOWN
    assert result.lease is None


async def test_resume_closed_session_allows_replay(scripts: Scripts, redis_client: Redis) -> None:
    """A closed session resumes to CLOSED with its lease, and its log replays to the end."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    await scripts.append_output(sid, [ev(1), ev(2)], close_reason="client_close")
    result = await scripts.resume(sid, tenant="tenant-a", presented_digest=digest(opened.token),
                                  new_digest=digest("t2"), control_id="c1")
    assert result.status is ResumeStatus.CLOSED
    assert result.lease == opened.lease
    assert (result.last_server_event_seq, result.first_retained_seq) == (3, 1)
    assert [seq for seq, _ in await read_output(redis_client, sid, 1)] == [2, 3]
    await assert_one_terminal(redis_client, sid, "session.closed", "client_close")
    bad = await scripts.resume(sid, tenant="tenant-a",
                               presented_digest=digest("wrong"), new_digest=digest("t2"),
                               control_id="c2")
    assert bad.status is ResumeStatus.BAD_TOKEN


async def test_resume_reports_first_retained_seq_after_trim(
    scripts: Scripts, redis_client: Redis
) -> None:
    """Once the output log was trimmed, resume reports the oldest seq still retained."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid, policy=make_policy(output_log_max_entries=10))
    sid = opened.session_id
    empty = await scripts.resume(sid, tenant="tenant-a", presented_digest=digest(opened.token),
                                 new_digest=digest("t1"), control_id="c0")
    assert (empty.first_retained_seq, empty.last_server_event_seq) == (0, 0)
    for batch in range(5):
        await scripts.append_output(sid, [ev(batch * 100 + i) for i in range(100)])
    result = await scripts.resume(sid, tenant="tenant-a",
                                  presented_digest=digest("t1"), new_digest=digest("t2"),
                                  control_id="c1")
    assert result.last_server_event_seq == 500
    retained = await read_output(redis_client, sid, 0, count=1000)
    assert result.first_retained_seq > 1
    assert result.first_retained_seq == retained[0][0]
    assert [seq for seq, _ in retained] == list(range(result.first_retained_seq, 501))


# --------------------------------------------------------------------------- detach


async def test_detach_ok_starts_grace(scripts: Scripts, redis_client: Redis) -> None:
    """Detach on the current lease marks the session detached and schedules the grace."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid, policy=make_policy(disconnect_grace_ms=50_000))
    before = await redis_now_ms(redis_client)
    assert await scripts.detach(opened.lease) == "ok"
    assert await session_field(redis_client, opened.session_id, "state") == "detached"
    score = await redis_client.zscore(WorkerKeys(wid).deadlines, opened.session_id)
    assert score is not None and before + 50_000 <= score <= before + 60_000


async def test_detach_with_stale_generation(scripts: Scripts, redis_client: Redis) -> None:
    """An old connection cannot detach the lease a newer resume holds."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await scripts.resume(opened.session_id, tenant="tenant-a",
                         presented_digest=digest(opened.token),
                         new_digest=digest("t2"), control_id="c1")
    assert await scripts.detach(opened.lease) == "stale"
    assert await session_field(redis_client, opened.session_id, "state") == "attached"


async def test_detach_with_stale_epoch(scripts: Scripts, redis_client: Redis) -> None:
    """A token from another store epoch is stale even with the right generation."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    other = Lease(session_id=opened.session_id, epoch="epoch-0", generation=1, tenant="tenant-a")
    assert await scripts.detach(other) == "stale"
    assert await session_field(redis_client, opened.session_id, "state") == "attached"


async def test_detach_twice_is_ok_and_keeps_the_grace_start(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A second detach of the same lease (a resend) changes nothing; a newer lease is stale."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    assert await scripts.detach(opened.lease) == "ok"
    detached_ms = await session_field(redis_client, opened.session_id, "detached_ms")
    await wait_redis_clock_past(redis_client, int(detached_ms or 0) + 2)
    assert await scripts.detach(opened.lease) == "ok"
    assert await session_field(redis_client, opened.session_id, "detached_ms") == detached_ms
    result = await scripts.resume(opened.session_id, tenant="tenant-a",
                                  presented_digest=digest(opened.token),
                                  new_digest=digest("t2"), control_id="c")
    assert result.lease is not None
    assert await scripts.detach(opened.lease) == "stale"


async def test_detach_closed_and_unknown(scripts: Scripts) -> None:
    """Detach reports a closed session as closed and a missing one as unknown."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await scripts.close_session(opened.session_id, CloseReason.CLIENT_CLOSE)
    assert await scripts.detach(opened.lease) == "closed"
    missing = Lease(session_id=new_session_id(wid), epoch=EPOCH, generation=1, tenant="tenant-a")
    assert await scripts.detach(missing) == "unknown"


# --------------------------------------------------------------------------- append_input


async def test_append_input_with_stale_generation_raises_lease_lost(scripts: Scripts) -> None:
    """The superseded lease is refused with the current generation in the error."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await scripts.resume(opened.session_id, tenant="tenant-a",
                         presented_digest=digest(opened.token),
                         new_digest=digest("t2"), control_id="c1")
    with pytest.raises(LeaseLost) as caught:
        await scripts.append_input(opened.lease, [(1, cmd("a"))], max_entries=100)
    assert caught.value.current_generation == 2
    assert caught.value.session_id == opened.session_id


async def test_append_input_under_a_generation_the_store_never_gave_raises_lease_lost(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A generation above the session's (a failover took the resume that handed it out, and
    the store stands at the one before) cannot append: the log's fence is not its, so
    nothing reaches the log, and the answer names the generation the store has."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    ahead = dataclasses.replace(opened.lease, generation=opened.lease.generation + 1)
    with pytest.raises(LeaseLost) as caught:
        await scripts.append_input(ahead, [(1, cmd("a"))], max_entries=100)
    assert caught.value.current_generation == opened.lease.generation
    assert await read_input(redis_client, opened.session_id, 0) == []


async def test_append_input_on_detached_lease_raises_lease_lost(scripts: Scripts) -> None:
    """After detach the old connection's lease no longer writes."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await scripts.detach(opened.lease)
    with pytest.raises(LeaseLost) as caught:
        await scripts.append_input(opened.lease, [(1, cmd("a"))], max_entries=100)
    assert caught.value.current_generation == 1


async def test_append_input_closed_or_unknown_raises_session_gone(scripts: Scripts) -> None:
    """Appends to a closed or never-opened session raise SessionGone with the status."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await scripts.close_session(opened.session_id, CloseReason.CLIENT_CLOSE)
    with pytest.raises(SessionGone) as closed:
        await scripts.append_input(opened.lease, [(1, cmd("a"))], max_entries=100)
    assert closed.value.status == "closed"
    missing = Lease(session_id=new_session_id(wid), epoch=EPOCH, generation=1, tenant="tenant-a")
    with pytest.raises(SessionGone) as unknown:
        await scripts.append_input(missing, [(1, cmd("a"))], max_entries=100)
    assert unknown.value.status == "unknown"


async def test_append_input_dedups_client_seq_across_retries_and_resume(
    scripts: Scripts, redis_client: Redis
) -> None:
    """Resent commands (same client seq) are appended exactly once, also after a resume."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    first = await scripts.append_input(opened.lease, [(1, cmd("a")), (2, cmd("b"))],
                                       max_entries=100)
    assert (first.appended, first.last_client_seq) == (2, 2)
    retry = await scripts.append_input(
        opened.lease, [(1, cmd("a")), (2, cmd("b")), (3, cmd("c"))], max_entries=100
    )
    assert (retry.appended, retry.last_client_seq) == (1, 3)
    resumed = await scripts.resume(sid, tenant="tenant-a", presented_digest=digest(opened.token),
                                   new_digest=digest("t2"), control_id="c1")
    assert resumed.last_client_seq == 3
    assert resumed.lease is not None
    after = await scripts.append_input(
        resumed.lease, [(2, cmd("b")), (3, cmd("c")), (4, cmd("d"))], max_entries=100
    )
    assert (after.appended, after.last_client_seq) == (1, 4)
    same = await scripts.append_input(resumed.lease, [(4, cmd("d"))], max_entries=100)
    assert (same.appended, same.last_client_seq) == (0, 4)
    entries = await read_input(redis_client, sid, 0)
    assert entries == [(1, b"a"), (2, b"b"), (3, b"c"), (4, b"d")]
    assert await read_input(redis_client, sid, 2) == [(3, b"c"), (4, b"d")]


async def test_append_input_without_seq_is_always_appended(
    scripts: Scripts, redis_client: Redis
) -> None:
    """Commands without a client seq are never deduplicated and keep their order."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    one = await scripts.append_input(opened.lease, [(None, cmd("x")), (5, cmd("y"))],
                                     max_entries=100)
    two = await scripts.append_input(opened.lease, [(None, cmd("x")), (5, cmd("y")),
                                                    (None, cmd("z"))], max_entries=100)
    assert (one.appended, two.appended) == (2, 2)
    assert two.last_client_seq == 5
    entries = await read_input(redis_client, opened.session_id, 0)
    assert entries == [(1, b"x"), (2, b"y"), (3, b"x"), (4, b"z")]


async def test_append_input_empty_batch_and_paging(scripts: Scripts, redis_client: Redis) -> None:
    """An empty batch appends nothing; read_input pages in order with count."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    empty = await scripts.append_input(opened.lease, [], max_entries=100)
    assert (empty.appended, empty.last_client_seq) == (0, 0)
    await scripts.append_input(opened.lease, [(i, cmd(str(i))) for i in range(1, 11)],
                               max_entries=100)
    assert [i for i, _ in await read_input(redis_client, opened.session_id, 0, count=4)] == [
        1, 2, 3, 4]
    assert [i for i, _ in await read_input(redis_client, opened.session_id, 8)] == [9, 10]


# --------------------------------------------------------------------------- append_output


async def test_append_output_numbers_seq_across_calls(
    scripts: Scripts, redis_client: Redis
) -> None:
    """server_event_seq runs 1..n without gaps across calls, in order."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    assert await scripts.append_output(sid, [ev(1), ev(2), ev(3)]) == 1
    assert await scripts.append_output(sid, []) == 0
    assert await scripts.append_output(sid, [ev(4), ev(5)]) == 4
    rows = await read_output(redis_client, sid, 0)
    assert rows == [(i, ev(i)) for i in range(1, 6)]
    assert (await log_ends(redis_client, sid)).last_output == 5
    assert await session_field(redis_client, sid, "out_seq") is None, "no record write"


async def test_numbered_append_resent_stores_each_event_once(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A resend (same first seq) skips what is stored and appends only what is new."""
    wid = await register_worker(scripts)
    sid = (await open_session(scripts, wid)).session_id
    assert await scripts.append_output(sid, [ev(1), ev(2)], first_seq=1) == 1
    assert await scripts.append_output(sid, [ev(1), ev(2)], first_seq=1) == 1
    assert await scripts.append_output(sid, [ev(1), ev(2), ev(3)], first_seq=1) == 1
    assert await scripts.append_output(sid, [ev(3), ev(4)], first_seq=3) == 3
    assert await read_output(redis_client, sid, 0) == [(i, ev(i)) for i in range(1, 5)]
    # A resend with a close stores the new event, then the terminal, once.
    assert await scripts.append_output(sid, [ev(4), ev(5)], first_seq=4,
                                       close_reason="client_close") == 4
    rows = await assert_one_terminal(redis_client, sid, "session.closed", "client_close")
    assert [seq for seq, _ in rows] == [1, 2, 3, 4, 5, 6]


async def test_numbered_append_refuses_a_gap_or_a_different_event(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A first seq past the output log's end, or a resend whose bytes differ, writes
    nothing."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    await scripts.append_input(opened.lease, [(None, cmd("a")), (None, cmd("b"))],
                               max_entries=100)
    assert await scripts.append_output(sid, [ev(1), ev(2)], first_seq=1) == 1
    with pytest.raises(OutputMismatch) as gap:
        await scripts.append_output(sid, [ev(4)], first_seq=4)
    assert (gap.value.status, gap.value.first_seq, gap.value.last_seq) == ("gap", 4, 2)
    (conflict,) = await scripts.append_output_many([OutputAppend(
        session_id=sid, events=[ev(1), ev(99), ev(3)], first_seq=1, input_trim_to=2,
        input_trim_fence=2, close_reason="client_close")])
    assert isinstance(conflict, OutputMismatch) and conflict.status == "conflict"
    assert await read_output(redis_client, sid, 0) == [(1, ev(1)), (2, ev(2))]
    assert len(await read_input(redis_client, sid, 0)) == 2, "refused whole: no input trim"
    assert await session_field(redis_client, sid, "state") == "attached"


async def test_append_output_from_lost_worker_is_fenced(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A worker declared lost cannot write, even to a session that is now closed; and each
    ended session's log refuses any later append by itself (its terminal event kept last)."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await expire_heartbeat(redis_client, scripts, wid)
    await reap_until_lost(scripts, wid)
    for payloads, first_seq, reason in (([ev(1)], 0, None), ([ev(1)], 1, None),
                                        ([ev(2)], 2, None), ([], 0, "done")):
        with pytest.raises(WorkerFenced):
            await scripts.append_output(opened.session_id, payloads, first_seq=first_seq,
                                        close_reason=reason)
    await assert_one_terminal(redis_client, opened.session_id, "session.closed", "worker_lost")
    keys = SessionKeys(opened.session_id)
    with pytest.raises(ResponseError, match="exhausted"):
        await redis_client.xadd(keys.output_log, {"d": ev(9)})


async def test_append_output_is_refused_from_the_moment_the_worker_is_declared_lost(
    scripts: Scripts, redis_client: Redis
) -> None:
    """The reaper's first call declares the worker lost and names its sessions; they end in
    later calls. In between, the worker's appends are refused whole (DESIGN §2.9: it must
    never write again): nothing lands, the session is still open for the reaper to end."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await expire_heartbeat(redis_client, scripts, wid)
    w = WorkerKeys(wid)

    async def declare_lost() -> Any:
        return await redis_client.eval(
            lua.REAP, 9, *w.ending, w.adopted, 100, LONG_MS, 1000, DEFAULT_ATTACHMENT_LEASE_MS)

    answer = (await poll_until(declare_lost, lambda a: a[0] == b"lost"))[-1]
    assert answer[1] == [opened.session_id.encode()], "its session is left to end"
    for payloads, first_seq, reason in (([ev(1)], 1, None), ([], 0, "done")):
        with pytest.raises(WorkerFenced):
            await scripts.append_output(opened.session_id, payloads, first_seq=first_seq,
                                        close_reason=reason)
    assert await read_output(redis_client, opened.session_id, 0) == []
    assert await session_field(redis_client, opened.session_id, "state") == "attached"


async def test_append_output_without_worker_record_is_fenced(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A worker whose record vanished (expired after loss) is fenced too."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await redis_client.delete(WorkerKeys(wid).record)
    with pytest.raises(WorkerFenced):
        await scripts.append_output(opened.session_id, [ev(1)])
    assert await read_output(redis_client, opened.session_id, 0) == []


async def test_append_output_after_the_keys_expired_creates_nothing(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A late append to a session that ended and whose keys expired brings no key back."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    await scripts.close_session(sid, CloseReason.CLIENT_CLOSE)
    keys = SessionKeys(sid)
    await redis_client.delete(keys.record, keys.output_log, keys.input_log)
    for first_seq in (0, 2, 5):
        with pytest.raises(SessionGone) as gone:
            await scripts.append_output(sid, [ev(1)], first_seq=first_seq)
        assert gone.value.status == "unknown"
    assert await redis_client.exists(keys.record, keys.output_log, keys.input_log) == 0


async def test_append_output_closed_or_unknown_raises_session_gone(scripts: Scripts) -> None:
    """A live worker writing to a closed or unknown session gets SessionGone."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await scripts.close_session(opened.session_id, CloseReason.CLIENT_CLOSE)
    with pytest.raises(SessionGone) as closed:
        await scripts.append_output(opened.session_id, [ev(1)])
    assert closed.value.status == "closed"
    with pytest.raises(SessionGone) as unknown:
        await scripts.append_output(new_session_id(wid), [ev(1)])
    assert unknown.value.status == "unknown"


async def test_append_output_with_close_reason_terminates_once(
    scripts: Scripts, redis_client: Redis
) -> None:
    """close_reason writes the events, then one terminal session.closed, and frees the slot."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid, policy=make_policy(closed_retention_ms=30_000))
    sid = opened.session_id
    keys = SessionKeys(sid)
    await scripts.append_input(opened.lease, [(1, cmd("a"))], max_entries=100)
    assert await scripts.append_output(sid, [ev(1)]) == 1
    assert await scripts.append_output(sid, [ev(2), ev(3)], close_reason="runtime_error") == 2
    events = await assert_one_terminal(redis_client, sid, "session.closed", "runtime_error")
    assert [seq for seq, _ in events] == [1, 2, 3, 4]
    assert events[-1][1] == SessionClosed(reason="runtime_error")
    assert await session_field(redis_client, sid, "state") == "closed"
    assert await session_field(redis_client, sid, "reason") == "runtime_error"
    assert await used_slots(redis_client, wid) == 0
    assert not await redis_client.sismember(WorkerKeys(wid).sessions, sid)
    assert await redis_client.zscore(WorkerKeys(wid).deadlines, sid) is None
    for key in (keys.record, keys.output_log):
        ttl = await redis_client.pttl(key)
        assert 0 < ttl <= 30_000, (key, ttl)
    assert not await redis_client.exists(keys.input_log)
    with pytest.raises(SessionGone):
        await scripts.append_output(sid, [ev(9)], close_reason="again")
    await assert_one_terminal(redis_client, sid, "session.closed", "runtime_error")
    assert await used_slots(redis_client, wid) == 0


async def test_append_output_close_without_events(scripts: Scripts, redis_client: Redis) -> None:
    """A close with no events still writes exactly the terminal event, as seq 1."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    assert await scripts.append_output(opened.session_id, [], close_reason="client_close") == 0
    events = await assert_one_terminal(redis_client, opened.session_id, "session.closed",
                                       "client_close")
    assert [seq for seq, _ in events] == [1]


async def test_append_output_on_detached_session_keeps_generating(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A detached session still accepts its worker's output for a later replay."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await scripts.detach(opened.lease)
    assert await scripts.append_output(opened.session_id, [ev(1), ev(2)]) == 1
    result = await scripts.resume(opened.session_id, tenant="tenant-a",
                                  presented_digest=digest(opened.token),
                                  new_digest=digest("t2"), control_id="c1")
    assert result.last_server_event_seq == 2
    assert len(await read_output(redis_client, opened.session_id, 0)) == 2


# --------------------------------------------------------------------------- trim_output


async def test_trim_output_drops_acknowledged_events(scripts: Scripts, redis_client: Redis) -> None:
    """An ack on the current lease drops events up to it; numbering continues after."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    await scripts.append_output(sid, [ev(i) for i in range(1, 6)])
    assert await scripts.trim_output(opened.lease, 3) == "ok"
    assert [seq for seq, _ in await read_output(redis_client, sid, 0)] == [4, 5]
    assert await scripts.trim_output(opened.lease, 2) == "ok"  # an older ack changes nothing
    assert [seq for seq, _ in await read_output(redis_client, sid, 0)] == [4, 5]
    assert await scripts.trim_output(opened.lease, 5) == "ok"
    # The last entry stays whatever was acknowledged: it numbers the next event.
    assert [seq for seq, _ in await read_output(redis_client, sid, 0)] == [5]
    assert await scripts.append_output(sid, [ev(6)]) == 6
    assert await scripts.trim_output(opened.lease, 6) == "ok"
    result = await scripts.resume(sid, tenant="tenant-a", presented_digest=digest(opened.token),
                                  new_digest=digest("t2"), control_id="c1")
    assert (result.first_retained_seq, result.last_server_event_seq) == (6, 6)


async def test_an_ack_past_a_rewound_logs_end_trims_nothing(
    scripts: Scripts, redis_client: Redis
) -> None:
    """The client holds events 1-5; a failover to a replica that had only 1-3 loses 4-5, and
    the session's terminal event is written as 4. The client's ack of 5, sent before it
    heard of the rewind, must not trim that unseen event 4: it is 'ahead' of the log."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    await scripts.append_output(sid, [ev(i) for i in range(1, 6)])
    # What the replica holds: events 1-3, numbered up to 3 (a stream rebuilt from them: one
    # that saw 5 would refuse a new 4).
    keys = SessionKeys(sid)
    kept: Any = await redis_client.xrange(keys.output_log, "-", "3-0")
    await redis_client.delete(keys.output_log)
    for entry_id, fields in kept:
        await redis_client.xadd(keys.output_log, fields, id=entry_id)
    await scripts.close_session(sid, CloseReason.LOG_REWOUND)
    assert [seq for seq, _ in await read_output(redis_client, sid, 0)] == [1, 2, 3, 4]
    assert await scripts.trim_output(opened.lease, 5) == "ahead"
    assert [seq for seq, _ in await read_output(redis_client, sid, 0)] == [1, 2, 3, 4]
    assert await scripts.trim_output(opened.lease, 3) == "ok"
    assert [seq for seq, _ in await read_output(redis_client, sid, 0)] == [4]


async def test_trim_output_is_fenced(scripts: Scripts, redis_client: Redis) -> None:
    """Only the current attachment may trim: stale generation or epoch, or no session, refused."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    await scripts.append_output(sid, [ev(1), ev(2)])
    await scripts.resume(sid, tenant="tenant-a",
                         presented_digest=digest(opened.token), new_digest=digest("t2"),
                         control_id="c1")
    assert await scripts.trim_output(opened.lease, 2) == "stale"
    other_epoch = Lease(session_id=sid, epoch="epoch-0", generation=2, tenant="tenant-a")
    assert await scripts.trim_output(other_epoch, 2) == "stale"
    assert len(await read_output(redis_client, sid, 0)) == 2
    missing = Lease(session_id=new_session_id(wid), epoch=EPOCH, generation=1, tenant="tenant-a")
    assert await scripts.trim_output(missing, 1) == "unknown"


# --------------------------------------------------------------------------- close / abandon


async def test_close_session_is_idempotent(scripts: Scripts, redis_client: Redis) -> None:
    """A second close answers 'closed' and writes no second terminal event."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await scripts.append_output(opened.session_id, [ev(1)])
    assert await scripts.close_session(opened.session_id, CloseReason.CLIENT_CLOSE) == "ok"
    assert await scripts.close_session(opened.session_id, CloseReason.INTERNAL_ERROR) == "closed"
    await assert_one_terminal(redis_client, opened.session_id, "session.closed", "client_close")
    assert await used_slots(redis_client, wid) == 0
    assert await scripts.close_session(new_session_id(wid), CloseReason.CLIENT_CLOSE) == "unknown"


@pytest.mark.parametrize("ending", ["close", "worker_lost"])
async def test_the_terminal_event_stays_last_whoever_writes_after_it(
    scripts: Scripts, redis_client: Redis, ending: str
) -> None:
    """Once a session ended, Redis itself refuses any entry after its terminal event (the
    log's last ID is the highest there is), so a writer that skipped the record's state (a
    lost worker's late flush, a resend) cannot put an event after it."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await scripts.append_output(opened.session_id, [ev(1)])
    if ending == "close":
        await scripts.close_session(opened.session_id, CloseReason.CLIENT_CLOSE)
    else:
        await expire_heartbeat(redis_client, scripts, wid)
        await reap_until_ended(scripts, wid, 1 - await reap_until_lost(scripts, wid))
    events = await events_of(redis_client, opened.session_id)
    out_log = SessionKeys(opened.session_id).output_log
    for entry_id in (f"{len(events) + 1}-0", "*"):
        with pytest.raises(ResponseError, match="exhausted"):
            await redis_client.xadd(out_log, {"d": ev(9)}, id=entry_id)
    assert await events_of(redis_client, opened.session_id) == events
    await assert_one_terminal(redis_client, opened.session_id, "session.closed",
                              "client_close" if ending == "close" else "worker_lost")


async def test_appends_racing_a_close_never_bring_its_keys_back(
    scripts: Scripts, redis_client: Redis
) -> None:
    """Appends in flight on several connections while the session closes: whichever land
    after the close are refused (SessionGone), the input log is not created again, and every
    key of the session left in Redis expires (its retention), none is kept for ever."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)

    async def append(i: int) -> str:
        try:
            await scripts.append_input(opened.lease, [(i, cmd(str(i)))], max_entries=1000)
        except SessionGone:
            return "gone"
        return "ok"

    answers = await asyncio.gather(
        *(append(i) for i in range(1, 41)),
        scripts.close_session(opened.session_id, CloseReason.CLIENT_CLOSE),
        *(append(i) for i in range(41, 81)))
    assert answers[40] == "ok"
    keys = SessionKeys(opened.session_id)
    assert await redis_client.exists(keys.input_log) == 0
    assert await append(81) == "gone"
    assert await redis_client.exists(keys.input_log) == 0
    left = [key async for key in redis_client.scan_iter(match=f"{keys.record}*")]
    left += [key async for key in redis_client.scan_iter(match=f"*{opened.session_id}*")]
    assert left, "the record and the output log stay for a late resume"
    for key in set(left):
        assert await redis_client.pttl(key) > 0, key


async def test_racing_closes_write_one_terminal(scripts: Scripts, redis_client: Redis) -> None:
    """Concurrent closes of one session: exactly one wins, one slot released."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    answers = await asyncio.gather(*(
        scripts.close_session(opened.session_id, CloseReason.CLIENT_CLOSE) for _ in range(10)))
    assert sorted(answers) == ["closed"] * 9 + ["ok"]
    await assert_one_terminal(redis_client, opened.session_id, "session.closed", "client_close")
    assert await used_slots(redis_client, wid) == 0


async def test_abandon_before_open_leaves_tombstone(scripts: Scripts, redis_client: Redis) -> None:
    """Abandoning an open that has not landed leaves an expiring tombstone that refuses it."""
    wid = await register_worker(scripts)
    sid = new_session_id(wid)
    assert await scripts.abandon_open(sid, tombstone_ttl_ms=20_000) == "tombstoned"
    ttl = await redis_client.pttl(SessionKeys(sid).abandoned)
    assert 0 < ttl <= 20_000
    assert await open_status(scripts, sid) is OpenStatus.ABANDONED
    assert await used_slots(redis_client, wid) == 0
    assert await read_output(redis_client, sid, 0) == []


async def test_abandon_after_open_closes_it(scripts: Scripts, redis_client: Redis) -> None:
    """Abandoning an open that landed closes it with open_abandoned and frees the slot."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    assert await used_slots(redis_client, wid) == 1
    assert await scripts.abandon_open(opened.session_id) == "closed_open"
    await assert_one_terminal(redis_client, opened.session_id, "session.closed", "open_abandoned")
    assert await used_slots(redis_client, wid) == 0
    assert await scripts.abandon_open(opened.session_id) == "already_closed"
    await assert_one_terminal(redis_client, opened.session_id, "session.closed", "open_abandoned")
    assert await open_status(scripts, opened.session_id) is OpenStatus.EXISTS


# --------------------------------------------------------------------------- reap


async def test_reap_lost_worker_closes_every_session_once(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A lapsed heartbeat: worker lost, each open session gets one worker_lost, slots freed."""
    wid = await register_worker(scripts, slots=8)
    opened = [await open_session(scripts, wid) for _ in range(4)]
    await scripts.append_output(opened[0].session_id, [ev(1), ev(2)])
    await scripts.detach(opened[1].lease)
    await scripts.close_session(opened[2].session_id, CloseReason.CLIENT_CLOSE)
    assert await used_slots(redis_client, wid) == 3
    await expire_heartbeat(redis_client, scripts, wid)
    assert await reap_until_lost(scripts, wid) == 3
    assert await worker_field(redis_client, wid, "state") == "lost"
    assert await used_slots(redis_client, wid) == 0
    for o in (opened[0], opened[1], opened[3]):
        await assert_one_terminal(redis_client, o.session_id, "session.closed", "worker_lost")
    await assert_one_terminal(redis_client, opened[2].session_id, "session.closed",
                              "client_close")
    assert counts(await scripts.reap(wid)) == ("lost", 0)
    assert 0 < await redis_client.pttl(WorkerKeys(wid).record)
    with pytest.raises(WorkerFenced):
        await scripts.worker_heartbeat(wid, slots=8, ttl_ms=60_000, register=False, drain=False)
    with pytest.raises(WorkerFenced):
        await scripts.worker_heartbeat(wid, slots=8, ttl_ms=60_000, register=True, drain=False)


async def test_reap_after_an_outage_gives_a_lapsed_worker_one_ttl(
    scripts: Scripts, redis_client: Redis
) -> None:
    """No reaper reached the worker's slot for longer than ``outage_ms`` (a failover, a
    restart) while its heartbeat lapsed: the reap that ends the gap reports the outage and
    declares the worker lost only once it had a full TTL since then to beat."""
    wid = await register_worker(scripts, slots=2)
    opened = await open_session(scripts, wid)
    assert (await scripts.reap(wid, outage_ms=OUTAGE_MS)).outage_ms == 0
    beat = await scripts.worker_heartbeat(wid, slots=2, ttl_ms=300, register=False,
                                          drain=False)
    await wait_redis_clock_past(redis_client, beat.alive_until_ms)  # 300 ms: an outage
    back = await scripts.reap(wid, outage_ms=OUTAGE_MS)
    assert counts(back) == ("live", 0) and back.outage_ms >= 300
    recovered = await redis_now_ms(redis_client)
    # Reaps close together: no outage, so the TTL since the return runs out.
    assert counts(await scripts.reap(wid, outage_ms=LONG_MS)) == ("live", 0)
    await wait_redis_clock_past(redis_client, recovered + 300)
    lost = await scripts.reap(wid, outage_ms=LONG_MS)
    assert counts(lost) == ("lost", 1) and lost.outage_ms == 0
    await assert_one_terminal(redis_client, opened.session_id, "session.closed", "worker_lost")


async def test_reap_after_a_short_gap_declares_a_lapsed_worker_lost_at_once(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A gap between reaps within ``outage_ms`` is no outage: a lapsed heartbeat is a loss."""
    wid = await register_worker(scripts, slots=2)
    await open_session(scripts, wid)
    beat = await scripts.worker_heartbeat(wid, slots=2, ttl_ms=100, register=False,
                                          drain=False)
    await wait_redis_clock_past(redis_client, beat.alive_until_ms)
    reaped = await scripts.reap(wid, outage_ms=LONG_MS)
    assert counts(reaped) == ("lost", 1) and reaped.outage_ms == 0


async def test_reap_after_an_outage_counts_grace_and_idle_from_the_return(
    scripts: Scripts, redis_client: Redis
) -> None:
    """Clients could not resume or show activity while the slot was out of reach: a detached
    session's grace and an idle session's TTL count from the reap that ended the outage."""
    wid = await register_worker(scripts, slots=4)
    policy = make_policy(disconnect_grace_ms=200, idle_ttl_ms=300)
    detached = await open_session(scripts, wid, policy=policy)
    idle = await open_session(scripts, wid, policy=policy)
    await scripts.detach(detached.lease)
    await scripts.worker_heartbeat(wid, slots=4, ttl_ms=60_000, register=False, drain=False)
    await wait_redis_clock_past(redis_client, await redis_now_ms(redis_client) + 320)
    back = await scripts.reap(wid, outage_ms=OUTAGE_MS)  # both are past due by now
    assert counts(back) == ("live", 0) and back.outage_ms > 0
    recovered = await redis_now_ms(redis_client)
    await wait_redis_clock_past(redis_client, recovered + 200)
    assert counts(await scripts.reap(wid, outage_ms=LONG_MS)) == ("live", 1)
    await assert_one_terminal(redis_client, detached.session_id, "session.expired",
                              "disconnect_grace_expired")
    await wait_redis_clock_past(redis_client, recovered + 300)
    assert counts(await scripts.reap(wid, outage_ms=LONG_MS)) == ("live", 1)
    await assert_one_terminal(redis_client, idle.session_id, "session.expired",
                              "idle_ttl_expired")


async def test_reap_draining_worker_with_lapsed_heartbeat_is_lost(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A draining worker that stops heartbeating is declared lost like any other."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await scripts.worker_heartbeat(wid, slots=4, ttl_ms=60_000, register=False, drain=True)
    await expire_heartbeat(redis_client, scripts, wid)
    assert await reap_until_lost(scripts, wid) == 1
    await assert_one_terminal(redis_client, opened.session_id, "session.closed", "worker_lost")


async def test_reap_expires_detached_session_after_grace(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A session detached past its grace ends with session.expired disconnect_grace_expired."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid, policy=make_policy(disconnect_grace_ms=50))
    await scripts.append_output(opened.session_id, [ev(1)])
    assert await scripts.detach(opened.lease) == "ok"
    detached_ms = int(await session_field(redis_client, opened.session_id, "detached_ms") or 0)
    assert counts(await scripts.reap(wid)) == ("live", 0)
    await wait_redis_clock_past(redis_client, detached_ms + 50)
    assert await reap_until_ended(scripts, wid, 1) == 1
    await assert_one_terminal(redis_client, opened.session_id, "session.expired",
                              "disconnect_grace_expired")
    assert await used_slots(redis_client, wid) == 0
    assert counts(await scripts.reap(wid)) == ("live", 0)


async def test_reap_zero_grace_expires_at_once(scripts: Scripts, redis_client: Redis) -> None:
    """With no grace, the first reap after a detach expires the session."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid, policy=make_policy(disconnect_grace_ms=0))
    await scripts.detach(opened.lease)
    assert await reap_until_ended(scripts, wid, 1) == 1
    await assert_one_terminal(redis_client, opened.session_id, "session.expired",
                              "disconnect_grace_expired")


async def test_reap_expires_idle_session(scripts: Scripts, redis_client: Redis) -> None:
    """An attached session with no activity for its idle TTL ends with idle_ttl_expired."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid, policy=make_policy(idle_ttl_ms=30))
    active_ms = int(await session_field(redis_client, opened.session_id, "active_ms") or 0)
    await wait_redis_clock_past(redis_client, active_ms + 30)
    assert await reap_until_ended(scripts, wid, 1) == 1
    await assert_one_terminal(redis_client, opened.session_id, "session.expired",
                              "idle_ttl_expired")
    assert await used_slots(redis_client, wid) == 0


async def test_reap_leaves_sessions_not_yet_due(scripts: Scripts, redis_client: Redis) -> None:
    """Only due sessions end; a due deadline entry for an active record is rescheduled."""
    wid = await register_worker(scripts)
    due = await open_session(scripts, wid, policy=make_policy(idle_ttl_ms=1))
    calm = await open_session(scripts, wid)
    forced = await open_session(scripts, wid)
    in_grace = await open_session(scripts, wid)
    await scripts.detach(in_grace.lease)
    # The deadline entries say "due now", but the records say the sessions are not.
    await redis_client.zadd(WorkerKeys(wid).deadlines,
                            {forced.session_id: 0, in_grace.session_id: 0})
    assert await reap_until_ended(scripts, wid, 1) == 1
    await assert_one_terminal(redis_client, due.session_id, "session.expired",
                              "idle_ttl_expired")
    for o, state in ((calm, "attached"), (forced, "attached"), (in_grace, "detached")):
        assert await session_field(redis_client, o.session_id, "state") == state
        assert await read_output(redis_client, o.session_id, 0) == []
    now = await redis_now_ms(redis_client)
    score = await redis_client.zscore(WorkerKeys(wid).deadlines, forced.session_id)
    assert score is not None and score > now + 500_000
    detached_ms = int(await session_field(redis_client, in_grace.session_id, "detached_ms") or 0)
    score = await redis_client.zscore(WorkerKeys(wid).deadlines, in_grace.session_id)
    assert score == detached_ms + LONG_POLICY.disconnect_grace_ms
    assert await used_slots(redis_client, wid) == 3


async def test_reap_detached_session_idle_before_grace(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A detached session whose idle TTL ends before its grace expires as idle."""
    wid = await register_worker(scripts)
    policy = make_policy(disconnect_grace_ms=60_000, idle_ttl_ms=30)
    opened = await open_session(scripts, wid, policy=policy)
    await scripts.detach(opened.lease)
    active_ms = int(await session_field(redis_client, opened.session_id, "active_ms") or 0)
    await wait_redis_clock_past(redis_client, active_ms + 30)
    assert await reap_until_ended(scripts, wid, 1) == 1
    await assert_one_terminal(redis_client, opened.session_id, "session.expired",
                              "idle_ttl_expired")


async def test_reap_respects_budget(scripts: Scripts, redis_client: Redis) -> None:
    """One reap ends at most ``budget`` sessions; the rest wait for the next call."""
    wid = await register_worker(scripts, slots=8)
    policy = make_policy(disconnect_grace_ms=0)
    opened = [await open_session(scripts, wid, policy=policy) for _ in range(5)]
    for o in opened:
        await scripts.detach(o.lease)
    assert counts(await scripts.reap(wid, budget=2)) == ("live", 2)
    assert counts(await scripts.reap(wid, budget=2)) == ("live", 2)
    assert counts(await scripts.reap(wid, budget=2)) == ("live", 1)
    for o in opened:
        await assert_one_terminal(redis_client, o.session_id, "session.expired",
                                  "disconnect_grace_expired")


async def test_reap_unknown_worker(scripts: Scripts) -> None:
    """Reaping a worker with no record changes nothing."""
    assert counts(await scripts.reap(new_worker_id())) == ("unknown", 0)


@pytest.mark.parametrize("reapers", [2, 16])
async def test_racing_reapers_write_one_terminal_per_session(
    scripts: Scripts, redis_client: Redis, reapers: int
) -> None:
    """Concurrent reapers on a lost worker: each session gets exactly one terminal event."""
    wid = await register_worker(scripts, slots=16)
    opened = [await open_session(scripts, wid) for _ in range(6)]
    await expire_heartbeat(redis_client, scripts, wid)
    answers = await asyncio.gather(*(scripts.reap(wid) for _ in range(reapers)))
    assert sum(a.ended for a in answers) == 6
    assert {a.state for a in answers} == {"lost"}
    for o in opened:
        await assert_one_terminal(redis_client, o.session_id, "session.closed", "worker_lost")
    assert await used_slots(redis_client, wid) == 0


@pytest.mark.parametrize("reapers", [2, 16])
async def test_racing_reapers_expire_each_session_once(
    scripts: Scripts, redis_client: Redis, reapers: int
) -> None:
    """Concurrent reapers on due sessions of a live worker: one expiry each, never two."""
    wid = await register_worker(scripts, slots=16)
    policy = make_policy(disconnect_grace_ms=0)
    opened = [await open_session(scripts, wid, policy=policy) for _ in range(6)]
    for o in opened:
        await scripts.detach(o.lease)
    answers = await asyncio.gather(*(scripts.reap(wid, budget=2) for _ in range(reapers)))
    ended = sum(a.ended for a in answers)
    ended += await reap_until_ended(scripts, wid, 6 - ended) if ended < 6 else 0
    assert ended == 6
    for o in opened:
        await assert_one_terminal(redis_client, o.session_id, "session.expired",
                                  "disconnect_grace_expired")
    assert await used_slots(redis_client, wid) == 0


# --------------------------------------------------------------------------- heartbeat


async def test_heartbeat_register_and_renew(scripts: Scripts, redis_client: Redis) -> None:
    """Register creates a live worker with no used slots; renew moves its deadline forward."""
    wid = new_worker_id()
    before = await redis_now_ms(redis_client)
    beat = await scripts.worker_heartbeat(wid, slots=3, ttl_ms=10_000, register=True,
                                          drain=False)
    assert beat.state == "live"
    assert before + 10_000 <= beat.alive_until_ms <= before + 20_000
    assert await worker_field(redis_client, wid, "slots") == "3"
    assert await used_slots(redis_client, wid) == 0
    await open_session(scripts, wid)
    renewed = await scripts.worker_heartbeat(wid, slots=5, ttl_ms=40_000, register=False,
                                             drain=False)
    assert renewed.state == "live"
    assert renewed.alive_until_ms >= beat.alive_until_ms + 30_000
    assert await worker_field(redis_client, wid, "slots") == "5"
    again = await scripts.worker_heartbeat(wid, slots=5, ttl_ms=40_000, register=True,
                                           drain=False)
    assert again.state == "live"
    assert await used_slots(redis_client, wid) == 1


async def test_heartbeat_draining_is_sticky(scripts: Scripts, redis_client: Redis) -> None:
    """Once draining, later heartbeats without drain stay draining."""
    wid = await register_worker(scripts)
    drained = await scripts.worker_heartbeat(wid, slots=4, ttl_ms=60_000, register=False,
                                             drain=True)
    assert drained.state == "draining"
    later = await scripts.worker_heartbeat(wid, slots=4, ttl_ms=60_000, register=False,
                                           drain=False)
    assert later.state == "draining"
    assert await worker_field(redis_client, wid, "state") == "draining"


async def test_heartbeat_without_record_and_register_is_fenced(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A renew for a worker whose record is gone is fenced, and creates nothing."""
    wid = new_worker_id()
    with pytest.raises(WorkerFenced):
        await scripts.worker_heartbeat(wid, slots=4, ttl_ms=60_000, register=False, drain=False)
    assert not await redis_client.exists(WorkerKeys(wid).record)


async def test_draining_worker_keeps_serving_its_sessions(scripts: Scripts) -> None:
    """Draining refuses new opens but existing sessions keep appending output."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await scripts.worker_heartbeat(wid, slots=4, ttl_ms=60_000, register=False, drain=True)
    assert await scripts.append_output(opened.session_id, [ev(1)]) == 1
    await scripts.append_input(opened.lease, [(1, cmd("a"))], max_entries=100)


async def test_error_event_roundtrips_through_output_log(
    scripts: Scripts, redis_client: Redis
) -> None:
    """Events written by the worker read back as the same typed values."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    error = ErrorEvent(code="invalid_value", message="nope " + secrets.token_hex(2))
    delta = AudioDelta(response_id="r", item_id="i", output_index=0, content_index=0,
                       audio=b"\x00\x01\xff")
    await scripts.append_output(opened.session_id, [encode_message(error), encode_message(delta)])
    assert await events_of(redis_client, opened.session_id) == [(1, error), (2, delta)]


async def test_append_output_many_writes_each_session_and_refuses_closed_alone(
    scripts: Scripts, redis_client: Redis
) -> None:
    """One call writes several sessions; a closed one is refused alone; a close ends one."""
    wid = await register_worker(scripts, slots=4)
    a, b, c = [(await open_session(scripts, wid)).lease.session_id for _ in range(3)]
    await scripts.close_session(c, CloseReason.CLIENT_CLOSE)
    outcomes = await scripts.append_output_many([
        OutputAppend(session_id=a, events=[ev(1), ev(2)], first_seq=1),
        OutputAppend(session_id=b, events=[ev(3)], close_reason="client_close"),
        OutputAppend(session_id=c, events=[ev(4)])])
    assert outcomes[0] == 1 and outcomes[1] == 1
    assert isinstance(outcomes[2], SessionGone) and outcomes[2].status == "closed"
    assert [seq for seq, _ in await events_of(redis_client, a)] == [1, 2]
    await assert_one_terminal(redis_client, b, "session.closed", "client_close")
    assert await used_slots(redis_client, wid) == 1


async def test_append_output_many_is_fenced_whole(scripts: Scripts, redis_client: Redis) -> None:
    """A lost worker writes nothing at all, for any session of the batch."""
    wid = await register_worker(scripts, slots=2)
    a, b = [(await open_session(scripts, wid)).lease.session_id for _ in range(2)]
    await expire_heartbeat(redis_client, scripts, wid)
    await reap_until_lost(scripts, wid)
    with pytest.raises(WorkerFenced):
        await scripts.append_output_many([OutputAppend(session_id=a, events=[ev(1)]),
                                          OutputAppend(session_id=b, events=[ev(2)])])
    for sid in (a, b):
        await assert_one_terminal(redis_client, sid, "session.closed", "worker_lost")


async def test_append_output_trims_the_input_the_worker_applied(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A write names the input entry to trim to (the worker decides when: see
    inference_worker/output_writer.py); the entries before it go, it stays (the next append
    reads its index there), later ones stay for a gap fill."""
    wid = await register_worker(scripts, slots=1)
    opened = await open_session(scripts, wid)
    await scripts.append_input(opened.lease, [(None, cmd(str(i))) for i in range(20)],
                               max_entries=100)
    sid = opened.lease.session_id
    fence = 2  # the first generation's (store/lua/prelude.lua)
    await scripts.append_output_many([OutputAppend(session_id=sid, events=[ev(1)])])
    assert len(await read_input(redis_client, sid, 0)) == 20, "no trim named, none made"
    await scripts.append_output_many([OutputAppend(session_id=sid, events=[ev(2)], first_seq=2,
                                                   input_trim_to=17, input_trim_fence=fence)])
    assert [n for n, _ in await read_input(redis_client, sid, 0)] == [17, 18, 19, 20]
    await scripts.append_output_many([OutputAppend(session_id=sid, events=[],
                                                   input_trim_to=19, input_trim_fence=fence)])
    assert [n for n, _ in await read_input(redis_client, sid, 0)] == [19, 20]
    appended = await scripts.append_input(opened.lease, [(None, cmd("next"))], max_entries=100)
    assert appended.last_index == 21


async def test_tenant_cap_reserve_renew_release(scripts: Scripts, redis_client: Redis) -> None:
    """Reservations count against the cap; renewals don't check it; release and expiry free."""
    assert await scripts.reserve_tenant_slot("t1", "s1", cap=2, lease_ms=60_000)
    assert await scripts.reserve_tenant_slot("t1", "s2", cap=2, lease_ms=60_000)
    assert not await scripts.reserve_tenant_slot("t1", "s3", cap=2, lease_ms=60_000)
    assert await scripts.reserve_tenant_slot("t1", "s1", cap=2, lease_ms=60_000), "idempotent"
    assert await scripts.reserve_tenant_slot("t2", "s3", cap=2, lease_ms=60_000), "per tenant"
    await scripts.renew_tenant_slots("t1", ["s9"], lease_ms=60_000)  # an existing session: no cap
    await scripts.release_tenant_slot("t1", "s9")
    await scripts.release_tenant_slot("t1", "s2")
    assert await scripts.reserve_tenant_slot("t1", "s3", cap=2, lease_ms=1)
    await wait_redis_clock_past(redis_client, await redis_now_ms(redis_client) + 2)
    assert await scripts.reserve_tenant_slot("t1", "s4", cap=2, lease_ms=60_000), "s3 expired"


async def test_a_detachment_may_ask_for_a_shorter_grace(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A detach that asks for a short grace (a client that closed its socket normally) expires
    after it; resumed and detached again without asking, the session's own grace holds."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)  # a 60 s grace
    assert await scripts.detach(opened.lease, grace_ms=30) == "ok"
    detached_ms = int(await session_field(redis_client, opened.session_id, "detached_ms") or 0)
    score = await redis_client.zscore(WorkerKeys(wid).deadlines, opened.session_id)
    assert score == detached_ms + 30
    await wait_redis_clock_past(redis_client, detached_ms + 30)
    assert await reap_until_ended(scripts, wid, 1) == 1
    await assert_one_terminal(redis_client, opened.session_id, "session.expired",
                              "disconnect_grace_expired")
    other = await open_session(scripts, wid)
    await scripts.detach(other.lease, grace_ms=30)
    resumed = await scripts.resume(other.session_id, tenant="tenant-a",
                                   presented_digest=digest(other.token),
                                   new_digest=digest("t2"), control_id="c")
    assert resumed.lease is not None
    await scripts.detach(resumed.lease)
    detached_ms = int(await session_field(redis_client, other.session_id, "detached_ms") or 0)
    score = await redis_client.zscore(WorkerKeys(wid).deadlines, other.session_id)
    assert score == detached_ms + LONG_POLICY.disconnect_grace_ms
