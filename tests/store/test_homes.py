"""A session's home and its owner, once they differ (docs/design/hand-over.md).

A session's keys stay in the slot of the worker that opened it (its home); a worker that
takes it over (its owner) counts it against its own slots, reserved first
(``reserve_slot.lua``). The home's slot is freed at the adoption, the session listed in the
home's moved set, and the reapers keep reaping the home for it whatever becomes of the home's
worker: its leases, deadlines and end live there. When the owner is lost, its sessions end
worker_lost in their homes, once, and only while it still owns them.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from contract.reasons import CloseReason
from store import OutputAppend, Scripts, WorkerFenced, lua
from store.answers import WorkerState
from store.checkpoints import AdoptStatus, CheckpointStatus, CheckpointWrite, ReserveStatus
from store.keys import WorkerKeys, session_keys
from tests.store._support import (
    assert_one_terminal,
    ev,
    events_of,
    expire_heartbeat,
    make_policy,
    open_session,
    register_worker,
    session_field,
    until,
    used_slots,
)

pytestmark = pytest.mark.timeout(30)


async def adopted_by(scripts: Scripts, session_id: str, adopter: str) -> None:
    """Checkpoint ``session_id`` where it stands (no event yet) and hand it to ``adopter``,
    its slot reserved there first."""
    assert await scripts.write_checkpoints([CheckpointWrite(
        session_id=session_id, owner_epoch=1, applied="2-0", keep="2-0", seq=0,
        core=b"{}")]) == [CheckpointStatus.OK]
    assert await scripts.reserve_slot(adopter, session_id) is ReserveStatus.OK
    taken = await scripts.adopt_session(session_id, replaces_epoch=1, adopter=adopter)
    assert taken.status is AdoptStatus.OK


async def members(client: Redis, key: str) -> set[str]:
    found: Any = await client.smembers(key)
    return {member.decode() for member in found}


async def test_a_reserved_slot_counts_until_it_is_let_go(
        scripts: Scripts, redis_client: Redis) -> None:
    """Two slots: two reservations fill them (a resend counts once), a third is refused full,
    one for a model not served other_model; letting go frees a slot, once. A draining worker
    reserves nothing."""
    home = await register_worker(scripts, slots=8)
    sessions = [(await open_session(scripts, home)).session_id for _ in range(3)]
    adopter = await register_worker(scripts, slots=2)
    for session_id in (sessions[0], sessions[0], sessions[1]):
        assert await scripts.reserve_slot(adopter, session_id) is ReserveStatus.OK
    assert await used_slots(redis_client, adopter) == 2
    assert await scripts.reserve_slot(adopter, sessions[2]) is ReserveStatus.FULL
    assert await scripts.release_slot(adopter, sessions[0]) is True
    assert await scripts.release_slot(adopter, sessions[0]) is False
    assert await used_slots(redis_client, adopter) == 1
    assert await scripts.reserve_slot(adopter, sessions[2],
                                      model="another") is ReserveStatus.OTHER_MODEL
    beat = await scripts.worker_heartbeat(adopter, slots=2, ttl_ms=60_000, register=False,
                                          drain=True)
    assert beat.state == "draining"
    assert await scripts.reserve_slot(adopter, sessions[2]) is ReserveStatus.UNAVAILABLE


async def test_an_adopted_session_frees_its_home_and_ends_there_once(
        scripts: Scripts, redis_client: Redis) -> None:
    """The adoption frees the home's slot, lists the session as moved and counts it in the
    home's record (its own flushes read owner epochs only while it counts any); its end (by
    its owner) undoes both and frees nothing more of the home's; a home never takes a
    session back."""
    home = await register_worker(scripts)
    session_id = (await open_session(scripts, home)).session_id
    adopter = await register_worker(scripts)
    with pytest.raises(ValueError, match="home"):
        await scripts.adopt_session(session_id, replaces_epoch=1, adopter=home)
    await adopted_by(scripts, session_id, adopter)
    w = WorkerKeys(home)
    assert await used_slots(redis_client, home) == 0
    assert (await members(redis_client, w.sessions), await members(redis_client, w.moved)) == (
        set(), {session_id})
    assert await used_slots(redis_client, adopter) == 1
    assert await redis_client.hget(w.record, "moved") == b"1"
    await scripts.append_output(session_id, [], close_reason=CloseReason.CLIENT_CLOSE,
                                owner_epoch=2)
    assert await redis_client.hget(w.record, "moved") == b"0"
    await assert_one_terminal(redis_client, session_id, "session.closed", "client_close")
    assert await members(redis_client, w.moved) == set()
    assert await used_slots(redis_client, home) == 0
    assert await scripts.release_slot(adopter, session_id) is True


async def test_a_lost_home_is_reaped_on_while_it_homes_moved_sessions(
        scripts: Scripts, redis_client: Redis) -> None:
    """A home declared lost: the session it still served ends worker_lost; the one another
    worker took over lives on, and the reaps go on (state home) and expire it when its idle
    time is up, after which the home is settled and its keys gone."""
    home = await register_worker(scripts, slots=4)
    owned = (await open_session(scripts, home)).session_id
    moved = (await open_session(scripts, home,
                                policy=make_policy(idle_ttl_ms=1500))).session_id
    await adopted_by(scripts, moved, await register_worker(scripts))
    await expire_heartbeat(redis_client, scripts, home)
    first = await scripts.reap(home)
    assert (first.state, first.ended, first.settled) == (WorkerState.LOST, 1, False)
    await assert_one_terminal(redis_client, owned, "session.closed", "worker_lost")
    assert await session_field(redis_client, moved, "state") != "closed"
    second = await scripts.reap(home)
    assert (second.state, second.ended) == (WorkerState.HOME, 0)

    async def expired() -> bool:
        reaped = await scripts.reap(home)
        return reaped.ended == 1

    await until(expired, "the moved session's idle time expired by its home's reap")
    await assert_one_terminal(redis_client, moved, "session.expired", "idle_ttl_expired")
    settled = await scripts.reap(home)
    assert (settled.state, settled.settled) == (WorkerState.LOST, True)
    w = WorkerKeys(home)
    assert await redis_client.exists(w.sessions, w.deadlines, w.moved) == 0


async def test_a_lost_owner_s_sessions_end_in_their_homes_once(
        scripts: Scripts, redis_client: Redis) -> None:
    """The worker that took two sessions over is lost: the one it still owns ends
    worker_lost in its home, once, and its slot there is let go; one that moved on to a third
    worker (its reservation left behind) is not ended. Then the lost owner is settled."""
    home = await register_worker(scripts, slots=4)
    first, second = [(await open_session(scripts, home)).session_id for _ in range(2)]
    owner, third = await register_worker(scripts), await register_worker(scripts)
    await adopted_by(scripts, first, owner)
    await adopted_by(scripts, second, third)
    assert await scripts.reserve_slot(owner, second) is ReserveStatus.OK  # left behind
    await expire_heartbeat(redis_client, scripts, owner)
    reaped = await scripts.reap(owner)
    assert (reaped.state, reaped.ended, reaped.settled) == (WorkerState.LOST, 1, False)
    await assert_one_terminal(redis_client, first, "session.closed", "worker_lost")
    assert await session_field(redis_client, second, "state") != "closed"
    assert await redis_client.zcard(WorkerKeys(owner).adopted) == 0
    assert await members(redis_client, WorkerKeys(home).moved) == {second}
    again = await scripts.reap(owner)
    assert (again.state, again.ended, again.settled) == (WorkerState.LOST, 0, True)


async def test_a_session_taken_over_between_the_two_reap_calls_lives_on(
        scripts: Scripts, redis_client: Redis) -> None:
    """REAP named a lost worker's session; before REAP_SESSIONS ran, another worker took it
    over (from the checkpoint the lost worker had written): it is not ended."""
    home = await register_worker(scripts)
    session_id = (await open_session(scripts, home)).session_id
    await expire_heartbeat(redis_client, scripts, home)
    w = WorkerKeys(home)
    named: Any = await redis_client.eval(lua.REAP, 9, *w.ending, w.adopted, 100, 500, 1000,
                                         60_000)
    assert named[0] == b"lost" and named[1] == [session_id.encode()]
    await adopted_by(scripts, session_id, await register_worker(scripts))
    k = session_keys(session_id)
    keys = [*w.ending, k.record, k.input_log, k.output_log, k.output_channel]
    done: Any = await redis_client.eval(lua.REAP_SESSIONS, len(keys), *keys, b"lost",
                                        b"grace", b"idle", 1000, 60_000, "lost", session_id, "")
    assert int(done[0]) == 0
    assert await session_field(redis_client, session_id, "state") != "closed"


async def test_a_taken_over_session_is_written_on_after_its_home_is_lost(
        scripts: Scripts, redis_client: Redis) -> None:
    """The home's worker is declared lost: its own writes are refused whole (fenced), while
    the worker that took a session over from it writes on there, its log end known or not,
    fenced by the owner epoch alone."""
    home = await register_worker(scripts, slots=4)
    moved = (await open_session(scripts, home)).session_id
    kept = (await open_session(scripts, home)).session_id
    await adopted_by(scripts, moved, await register_worker(scripts))
    await expire_heartbeat(redis_client, scripts, home)
    assert (await scripts.reap(home)).state is WorkerState.LOST
    with pytest.raises(WorkerFenced):
        await scripts.append_output_many([OutputAppend(session_id=kept, events=[ev(1)],
                                                       first_seq=1)])
    routes = scripts.route_changes
    for first, known in ((1, None), (2, routes)):
        assert await scripts.append_output_many([OutputAppend(
            session_id=moved, events=[ev(first)], first_seq=first, owner_epoch=2,
            output_log_max_entries=100, top_known_at=known)]) == [first]
    assert [seq for seq, _ in await events_of(redis_client, moved)] == [1, 2]
