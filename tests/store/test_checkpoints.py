"""Checkpoints and adoption in the store: what lets a session outlive its worker
(``store/lua/write_checkpoint.lua``, ``store/lua/adopt_session.lua``, the owner epoch in both
output scripts; docs/design/hand-over.md).

A checkpoint lands only where it can be continued from (the session open, its output log
ending at the event it names, written by its owner) and ends with the session; an adoption is
a compare-and-set on the owner epoch, after which the old owner writes nothing: no event, no
trim, no checkpoint, no close.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from contract.reasons import CloseReason
from store import OutputAppend, Scripts, SessionGone
from store.answers import CheckpointFields
from store.checkpoints import AdoptStatus, CheckpointStatus, CheckpointWrite
from store.errors import Gone
from store.keys import SessionKeys, new_session_id, new_worker_id
from tests.store._support import ev, events_of, open_session, register_worker

pytestmark = pytest.mark.timeout(30)

CORE = b'{"v":1,"state":"made up: the store never reads it"}'


def checkpoint(session_id: str, seq: int, *, owner_epoch: int = 1, applied: str = "2-0",
               keep: str = "2-0", core: bytes = CORE) -> CheckpointWrite:
    return CheckpointWrite(session_id=session_id, owner_epoch=owner_epoch, applied=applied,
                           keep=keep, seq=seq, core=core)


async def written(scripts: Scripts, session_id: str, first: int, count: int, *,
                  owner_epoch: int = 1, **changes: object) -> int | SessionGone:
    (outcome,) = await scripts.append_output_many([OutputAppend(
        session_id=session_id, events=[ev(n) for n in range(first, first + count)],
        first_seq=first, owner_epoch=owner_epoch, **changes)])  # type: ignore[arg-type]
    assert not isinstance(outcome, Exception) or isinstance(outcome, SessionGone), outcome
    return outcome


async def record(client: Redis, session_id: str) -> dict[bytes, bytes]:
    fields: dict[Any, Any] = await client.hgetall(SessionKeys(session_id).record)
    return fields


async def test_a_checkpoint_lands_only_where_the_output_log_ends(
        scripts: Scripts, redis_client: Redis) -> None:
    """Three events written: a checkpoint naming the second is behind (a write came between
    the state taken and the call), one naming the third lands, with when it was written;
    the next replaces it. Its opener owns the session under epoch 1."""
    wid = await register_worker(scripts)
    sid = (await open_session(scripts, wid)).session_id
    fields = await record(redis_client, sid)
    assert (fields[b"owner"], fields[b"owner_epoch"]) == (wid.encode(), b"1")
    assert await written(scripts, sid, 1, 3) == 1
    assert await scripts.write_checkpoints([checkpoint(sid, 2)]) == [CheckpointStatus.BEHIND]
    assert b"ck_seq" not in await record(redis_client, sid)
    assert await scripts.write_checkpoints([checkpoint(sid, 3)]) == [CheckpointStatus.OK]
    fields = await record(redis_client, sid)
    assert (fields[b"ck_epoch"], fields[b"ck_in"], fields[b"ck_keep"], fields[b"ck_seq"],
            fields[b"ck_core"]) == (b"1", b"2-0", b"2-0", b"3", CORE)
    assert int(fields[b"ck_ms"]) > 0
    assert await written(scripts, sid, 4, 1) == 4
    assert await scripts.write_checkpoints([checkpoint(sid, 4, core=b"{}")]) == [
        CheckpointStatus.OK]
    assert (await record(redis_client, sid))[b"ck_core"] == b"{}"


async def test_a_checkpoint_rides_the_events_it_reflects(
        scripts: Scripts, redis_client: Redis) -> None:
    """A checkpoint carried by an append (a response's end) lands with its events, naming the
    last of them, even where the worker knows its log's end (it goes through the careful
    script); a resend of those events lands it again, the same; an old owner's append after
    an adoption writes neither; one can ride only numbered events of an open session."""
    home = await register_worker(scripts)
    sid = (await open_session(scripts, home)).session_id
    assert await written(scripts, sid, 1, 2) == 1
    fields = CheckpointFields(applied="2-5", keep="2-3", core=CORE)
    for _ in range(2):  # the second: a resend whose reply was lost
        assert await written(scripts, sid, 3, 2, checkpoint=fields,
                             top_known_at=scripts.route_changes,
                             output_log_max_entries=100) == 3
        stored = await record(redis_client, sid)
        assert (stored[b"ck_epoch"], stored[b"ck_in"], stored[b"ck_keep"], stored[b"ck_seq"],
                stored[b"ck_core"]) == (b"1", b"2-5", b"2-3", b"4", CORE)
    assert [seq for seq, _ in await events_of(redis_client, sid)] == [1, 2, 3, 4]
    taken = await scripts.adopt_session(sid, replaces_epoch=1, adopter=new_worker_id(),
                                        checkpoint_seq=4)
    assert taken.status is AdoptStatus.OK and taken.keep == "2-3"
    refused = await written(scripts, sid, 5, 1, checkpoint=CheckpointFields(
        applied="2-9", keep="2-9", core=b"{}"))
    assert isinstance(refused, SessionGone) and refused.status is Gone.MOVED
    assert (await record(redis_client, sid))[b"ck_seq"] == b"4"
    unfit = [OutputAppend(session_id=sid, events=[ev(5)], first_seq=0, owner_epoch=2,
                          checkpoint=fields),
             OutputAppend(session_id=sid, events=[], first_seq=5, owner_epoch=2,
                          checkpoint=fields),
             OutputAppend(session_id=sid, events=[ev(5)], first_seq=5, owner_epoch=2,
                          close_reason=CloseReason.CLIENT_CLOSE, checkpoint=fields)]
    for append in unfit:
        with pytest.raises(ValueError, match="numbered events of an open session"):
            await scripts.append_output_many([append])


async def test_checkpoints_of_many_sessions_in_one_call_each_answered(
        scripts: Scripts, redis_client: Redis) -> None:
    """One call for a home's sessions: each answered alone (ok, behind, moved, closed,
    unknown), and a closed session's checkpoint is gone with it."""
    wid = await register_worker(scripts, slots=8)
    ok, behind, closed = [(await open_session(scripts, wid)).session_id for _ in range(3)]
    assert await scripts.write_checkpoints([checkpoint(closed, 0)]) == [CheckpointStatus.OK]
    await scripts.append_output(closed, [], close_reason=CloseReason.CLIENT_CLOSE)
    assert not any(name.startswith(b"ck_") for name in await record(redis_client, closed))
    assert await written(scripts, behind, 1, 1) == 1
    unknown = new_session_id(wid)
    answers = await scripts.write_checkpoints([
        checkpoint(ok, 0), checkpoint(behind, 0), checkpoint(ok, 0, owner_epoch=2),
        checkpoint(closed, 1), checkpoint(unknown, 0)])
    assert answers == [CheckpointStatus.OK, CheckpointStatus.BEHIND, CheckpointStatus.MOVED,
                       CheckpointStatus.CLOSED, CheckpointStatus.UNKNOWN]
    with pytest.raises(ValueError, match="one home"):
        await scripts.write_checkpoints([checkpoint(ok, 0),
                                         checkpoint(new_session_id(new_worker_id()), 0)])


async def test_an_adoption_takes_the_session_from_its_checkpoint_once(
        scripts: Scripts, redis_client: Redis) -> None:
    """Without a checkpoint there is nothing to continue from. With one, the adopter named
    gets it and the epoch after the one it replaced; a resend (its reply lost) answers the
    same; a second adopter naming the old epoch is refused, as is one naming another
    checkpoint than the record's."""
    home = await register_worker(scripts)
    adopter, rival = new_worker_id(), new_worker_id()
    sid = (await open_session(scripts, home)).session_id
    no_checkpoint = await scripts.adopt_session(sid, replaces_epoch=1, adopter=adopter)
    assert (no_checkpoint.status, no_checkpoint.owner_epoch) == (AdoptStatus.NO_CHECKPOINT, 1)
    assert await written(scripts, sid, 1, 2) == 1
    assert await scripts.write_checkpoints([checkpoint(sid, 2)]) == [CheckpointStatus.OK]
    assert await written(scripts, sid, 3, 1) == 3  # after it: the adopter reconciles these
    other = await scripts.adopt_session(sid, replaces_epoch=1, adopter=adopter,
                                        checkpoint_seq=1)
    assert other.status is AdoptStatus.OTHER_CHECKPOINT
    for _ in range(2):  # the second: a resend whose first reply was lost
        taken = await scripts.adopt_session(sid, replaces_epoch=1, adopter=adopter,
                                            checkpoint_seq=2)
        assert (taken.status, taken.owner_epoch, taken.applied, taken.keep, taken.seq,
                taken.core, taken.output_seq) == (AdoptStatus.OK, 2, "2-0", "2-0", 2, CORE, 3)
    fields = await record(redis_client, sid)
    assert (fields[b"owner"], fields[b"owner_epoch"]) == (adopter.encode(), b"2")
    late = await scripts.adopt_session(sid, replaces_epoch=1, adopter=rival)
    assert (late.status, late.owner_epoch) == (AdoptStatus.MOVED, 2)
    await scripts.append_output(sid, [], close_reason=CloseReason.CLIENT_CLOSE,
                                owner_epoch=2)
    ended = await scripts.adopt_session(sid, replaces_epoch=2, adopter=rival)
    assert ended.status is AdoptStatus.CLOSED
    unknown = await scripts.adopt_session(new_session_id(home), replaces_epoch=1,
                                          adopter=rival)
    assert unknown.status is AdoptStatus.UNKNOWN


async def test_the_old_owner_writes_nothing_after_an_adoption(
        scripts: Scripts, redis_client: Redis) -> None:
    """Once adopted, the old owner's events (its log end known or not), its trim, its
    checkpoint and its close are all refused as moved, and the session stays open; the
    adopter writes on under the new epoch, its numbering continuing the log's."""
    home = await register_worker(scripts)
    sid = (await open_session(scripts, home)).session_id
    assert await written(scripts, sid, 1, 1) == 1
    assert await scripts.write_checkpoints([checkpoint(sid, 1)]) == [CheckpointStatus.OK]
    taken = await scripts.adopt_session(sid, replaces_epoch=1, adopter=new_worker_id())
    assert taken.status is AdoptStatus.OK
    routes = scripts.route_changes
    for known in (None, routes):
        refused = await written(scripts, sid, 2, 2, top_known_at=known, input_trim_to=1,
                                input_trim_fence=2, output_log_max_entries=100)
        assert isinstance(refused, SessionGone) and refused.status is Gone.MOVED
    assert await scripts.write_checkpoints([checkpoint(sid, 1)]) == [CheckpointStatus.MOVED]
    with pytest.raises(SessionGone) as gone:
        await scripts.append_output(sid, [], close_reason=CloseReason.WORKER_SHUTDOWN)
    assert gone.value.status is Gone.MOVED
    assert (await record(redis_client, sid))[b"state"] != b"closed"
    assert [seq for seq, _ in await events_of(redis_client, sid)] == [1]
    assert await written(scripts, sid, 2, 2, owner_epoch=2) == 2
    assert [seq for seq, _ in await events_of(redis_client, sid)] == [1, 2, 3]
    assert await scripts.write_checkpoints([checkpoint(sid, 3, owner_epoch=2)]) == [
        CheckpointStatus.OK]


async def test_an_adoption_is_refused_once_the_input_it_needs_is_trimmed(
        scripts: Scripts, redis_client: Redis) -> None:
    """A checkpoint keeps input from its oldest entry to read back; once a trim went past it
    (the old owner overtook a stale checkpoint), the session cannot be continued from it."""
    home = await register_worker(scripts)
    opened = await open_session(scripts, home)
    sid = opened.session_id
    await scripts.append_input(opened.lease, [(n, f"c{n}".encode()) for n in range(1, 5)],
                               max_entries=100)
    assert await scripts.write_checkpoints([checkpoint(sid, 0, applied="2-3", keep="2-2")]) == [
        CheckpointStatus.OK]
    assert await written(scripts, sid, 1, 1, input_trim_to=2, input_trim_fence=2) == 1
    assert await scripts.write_checkpoints([checkpoint(sid, 1, applied="2-3", keep="2-2")]) == [
        CheckpointStatus.OK]
    kept = await scripts.adopt_session(sid, replaces_epoch=1, adopter=new_worker_id(),
                                       checkpoint_seq=1)
    assert kept.status is AdoptStatus.OK
    assert await written(scripts, sid, 2, 1, owner_epoch=2, input_trim_to=3,
                         input_trim_fence=2) == 2
    gone = await scripts.adopt_session(sid, replaces_epoch=2, adopter=new_worker_id())
    assert (gone.status, gone.owner_epoch) == (AdoptStatus.INPUT_GONE, 2)
