"""Worker profiles and the session objects a record keeps for resumes, on each server.

A worker publishes its profile (the default session and the capabilities of its new sessions)
when it registers; placement reads it with the load; the open stores the session object and
capabilities in the session's record; the worker's output writes replace the session object
with each ``session.updated`` (fenced like every other write); a resume hands both back, to
the token's holder only.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import pytest
from redis.asyncio import Redis

from contract.reasons import CloseReason
from store import (
    Lease,
    OpenStatus,
    OutputAppend,
    OutputMismatch,
    ResumeResult,
    ResumeStatus,
    Scripts,
    SessionGone,
    WorkerFenced,
)
from store.directory import MAX_PROFILE_BYTES, WorkerProfile, decode_profile, worker_loads
from store.keys import WorkerKeys, new_session_id, new_worker_id, worker_of_session
from store.logs import SessionStart, session_start
from tests.store._support import (
    EPOCH,
    LONG_POLICY,
    Opened,
    digest,
    ev,
    expire_heartbeat,
    open_session,
    reap_until_lost,
    register_worker,
    session_field,
)

PROFILE = WorkerProfile(
    session={"type": "realtime", "model": "loopback", "instructions": "",
             "audio": {"output": {"voice": "alloy"}}},
    capabilities={"supports_barge_in": True, "chunk_period_ms": 40},
)
CREATED = {"type": "realtime", "object": "realtime.session", "id": "sess_x", "model": "m",
           "instructions": ""}
UPDATED = {**CREATED, "instructions": "Be brief."}


async def register_with_profile(scripts: Scripts, profile: WorkerProfile = PROFILE) -> str:
    """A fresh live worker that published ``profile``."""
    worker_id = new_worker_id()
    beat = await scripts.worker_heartbeat(worker_id, slots=4, ttl_ms=60_000, register=True,
                                          drain=False, profile=profile)
    assert beat.state == "live"
    return worker_id


async def open_with_session(scripts: Scripts, worker_id: str) -> Opened:
    """A session opened with :data:`CREATED` and the profile's capabilities."""
    sid = new_session_id(worker_id)
    token = secrets.token_urlsafe(16)
    status = await scripts.open_session(sid, epoch=EPOCH, token_digest=digest(token),
                                        tenant="tenant-a", policy=LONG_POLICY, session=CREATED,
                                        capabilities=PROFILE.capabilities)
    assert status is OpenStatus.OK
    return Opened(Lease(session_id=sid, epoch=EPOCH, generation=1, tenant="tenant-a"), token)


async def resume(scripts: Scripts, opened: Opened, *, token: str | None = None,
                 tenant: str = "tenant-a") -> ResumeResult:
    """Resume ``opened`` with its token (or ``token``), as ``tenant``."""
    return await scripts.resume(opened.session_id, tenant=tenant,
                                presented_digest=digest(token or opened.token),
                                new_digest=digest("rotated"), control_id="c1")


async def stored_session(client: Redis, session_id: str) -> Any:
    """The session object the record holds, decoded (None: none)."""
    text = await session_field(client, session_id, "session")
    return None if text is None else json.loads(text)


# --------------------------------------------------------------------------- profiles


async def test_registration_publishes_the_profile_and_loads_decode_it(
    scripts: Scripts, redis_client: Redis,
) -> None:
    """The profile a worker registers with comes back, decoded, with its load; renewals
    leave it as it was, and a worker that published none has None."""
    with_profile = await register_with_profile(scripts)
    without = await register_worker(scripts)
    other = WorkerProfile(session={"model": "other"}, capabilities={})
    await scripts.worker_heartbeat(with_profile, slots=4, ttl_ms=60_000, register=False,
                                   drain=False, profile=other)
    loads = {load.worker_id: load for load in
             await worker_loads(redis_client, [with_profile, without])}
    assert loads[with_profile].profile == PROFILE
    assert loads[without].profile is None


@pytest.mark.parametrize("raw", [None, b"", b"not json", b"\xff", b"[]",
                                 b'{"session": 1, "capabilities": {}}',
                                 b'{"session": {}}'])
def test_what_is_not_a_profile_decodes_as_none(raw: bytes | None) -> None:
    """A missing or malformed profile field is no profile: placement falls back, never
    fails."""
    assert decode_profile(raw) is None


def test_a_profile_round_trips_through_its_encoding() -> None:
    """What a worker publishes decodes to the same profile."""
    assert decode_profile(PROFILE.encode().encode()) == PROFILE


async def test_a_profile_over_the_limit_is_refused_before_anything_is_written(
    scripts: Scripts, redis_client: Redis,
) -> None:
    """A profile over MAX_PROFILE_BYTES stops the registration with a clear error, and the
    worker is never registered."""
    huge = WorkerProfile(session={"instructions": "x" * MAX_PROFILE_BYTES}, capabilities={})
    worker_id = new_worker_id()
    with pytest.raises(ValueError, match="over the limit"):
        await scripts.worker_heartbeat(worker_id, slots=4, ttl_ms=60_000, register=True,
                                       drain=False, profile=huge)
    assert await redis_client.exists(WorkerKeys(worker_id).record) == 0


# --------------------------------------------------------------------------- session objects


async def test_the_open_stores_the_session_and_a_resume_hands_it_back(
    scripts: Scripts, redis_client: Redis,
) -> None:
    """A resume with the right token gets the session and capabilities the open stored; a
    wrong token or another tenant gets neither."""
    opened = await open_with_session(scripts, await register_with_profile(scripts))
    assert await stored_session(redis_client, opened.session_id) == CREATED
    wrong = await resume(scripts, opened, token="wrong")
    assert wrong.status is ResumeStatus.BAD_TOKEN
    assert (wrong.session, wrong.capabilities) == (None, None)
    foreign = await resume(scripts, opened, tenant="tenant-b")
    assert foreign.status is ResumeStatus.UNKNOWN
    assert (foreign.session, foreign.capabilities) == (None, None)
    result = await resume(scripts, opened)
    assert result.status is ResumeStatus.OK
    assert (result.session, result.capabilities) == (CREATED, PROFILE.capabilities)


async def test_an_open_without_a_profile_stores_nothing(scripts: Scripts) -> None:
    """A session placed on a worker without a profile resumes without a session object."""
    opened = await open_session(scripts, await register_worker(scripts))
    result = await resume(scripts, opened)
    assert result.status is ResumeStatus.OK
    assert (result.session, result.capabilities) == (None, None)


async def test_output_writes_keep_the_newest_session(
    scripts: Scripts, redis_client: Redis,
) -> None:
    """An output write with a session object replaces the record's, a resend of it stores the
    same, a write without one leaves it, and a resume of the ended session still hands the
    last one back."""
    opened = await open_with_session(scripts, await register_with_profile(scripts))
    sid = opened.session_id
    update = OutputAppend(session_id=sid, events=[ev(1), ev(2)], first_seq=1, session=UPDATED)
    assert await scripts.append_output_many([update]) == [1]
    assert await stored_session(redis_client, sid) == UPDATED
    assert await scripts.append_output_many([update]) == [1]  # its reply was lost: resent
    await scripts.append_output_many([OutputAppend(session_id=sid, events=[ev(3)],
                                                   first_seq=3)])
    assert await stored_session(redis_client, sid) == UPDATED
    await scripts.append_output(sid, [], close_reason="client_close")
    result = await resume(scripts, opened)
    assert result.status is ResumeStatus.CLOSED
    assert (result.session, result.capabilities) == (UPDATED, PROFILE.capabilities)


async def test_a_refused_output_write_stores_no_session(
    scripts: Scripts, redis_client: Redis,
) -> None:
    """The session object goes with the events or not at all: a write refused for a gap, to
    a closed session, or from a worker declared lost stores none."""
    worker_id = await register_with_profile(scripts)
    gap = await open_with_session(scripts, worker_id)
    closed = await open_with_session(scripts, worker_id)
    outcome = await scripts.append_output_many([OutputAppend(
        session_id=gap.session_id, events=[ev(5)], first_seq=5, session=UPDATED)])
    assert isinstance(outcome[0], OutputMismatch) and outcome[0].status == "gap"
    assert await stored_session(redis_client, gap.session_id) == CREATED
    await scripts.close_session(closed.session_id, CloseReason.CLIENT_CLOSE)
    outcome = await scripts.append_output_many([OutputAppend(
        session_id=closed.session_id, events=[ev(1)], first_seq=1, session=UPDATED)])
    assert isinstance(outcome[0], SessionGone)
    assert await stored_session(redis_client, closed.session_id) == CREATED
    await expire_heartbeat(redis_client, scripts, worker_id)
    await reap_until_lost(scripts, worker_id)
    with pytest.raises(WorkerFenced):
        await scripts.append_output_many([OutputAppend(
            session_id=gap.session_id, events=[ev(1)], first_seq=1, session=UPDATED)])
    assert await stored_session(redis_client, gap.session_id) == CREATED


async def test_an_adopting_worker_reads_the_epoch_and_the_announced_model(
    scripts: Scripts, redis_client: Redis,
) -> None:
    """session_start gives the worker the record's epoch and the model session.created
    announced (the name the client opened the session with), so its own session object
    names the same model, its owner (the opener, epoch 1) and its input bounds (which the
    worker's checkpoints hold input well inside); a record without an announced session
    gives no model; a closed session says so (a late push must not bring it back); no
    record, nothing."""
    opened = await open_with_session(scripts, await register_with_profile(scripts))
    start = await session_start(redis_client, opened.session_id)
    bound = int(await session_field(redis_client, opened.session_id, "out_max") or 0)
    owner = worker_of_session(opened.session_id)
    record: dict[str, Any] = {"owner": owner, "owner_epoch": 1,
              "input_log_max_entries": LONG_POLICY.input_log_max_entries,
              "input_log_max_bytes": LONG_POLICY.input_log_max_bytes}
    assert start == SessionStart(epoch=EPOCH, model="m", output_log_max_entries=bound,
                                 closed=False, input_fence=2, **record)
    await scripts.close_session(opened.session_id, CloseReason.CLIENT_CLOSE)
    assert await session_start(redis_client, opened.session_id) == SessionStart(
        epoch=EPOCH, model="m", output_log_max_entries=bound, closed=True, input_fence=2,
        **record)
    bare = await open_session(scripts, await register_worker(scripts))
    bare_start = await session_start(redis_client, bare.session_id)
    assert bare_start is not None and bare_start.model is None
    # The input log's fence, as the record says: 2g attached, 2g + 1 detached.
    await scripts.detach(bare.lease)
    assert (await session_start(redis_client, bare.session_id) or bare_start).input_fence == 3
    await scripts.resume(bare.session_id, tenant=bare.lease.tenant,
                         presented_digest=digest(bare.token), new_digest=digest("t2"),
                         control_id="c1")
    assert (await session_start(redis_client, bare.session_id) or bare_start).input_fence == 4
    nowhere = new_session_id(new_worker_id())
    assert await session_start(redis_client, nowhere) is None
