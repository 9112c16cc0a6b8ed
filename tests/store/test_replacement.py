"""A lost worker's sessions are re-placed, not ended (``store/replacement.py``).

The reap that declares a worker lost offers its sessions to live workers first: one with a
checkpoint moves to the least loaded live worker with a free slot (its owner epoch up by one,
its slot reserved there, the adopter woken), and is not ended; one without a checkpoint, or
with no worker to take it, ends ``worker_lost`` as before, once. A session the lost worker had
itself taken over moves on the same way. Two reapers racing move a session once.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from store import Scripts
from store.answers import WorkerState
from store.checkpoints import AdoptStatus, CheckpointStatus, CheckpointWrite, ReserveStatus
from store.directory import announce_worker, server_time_ms
from store.keys import WorkerKeys
from store.replacement import Replacer, ReplaceStatus
from tests.store._support import (
    assert_one_terminal,
    events_of,
    expire_heartbeat,
    open_session,
    register_worker,
    session_field,
    used_slots,
)

pytestmark = pytest.mark.timeout(30)


async def listed(scripts: Scripts, client: Redis, *, slots: int) -> str:
    """A live worker, listed in the directory placement reads (as its heartbeat lists it)."""
    worker_id = await register_worker(scripts, slots=slots)
    await announce_worker(client, worker_id, await server_time_ms(client) + 60_000)
    return worker_id


async def checkpointed(scripts: Scripts, session_id: str, owner_epoch: int = 1) -> None:
    assert await scripts.write_checkpoints([CheckpointWrite(
        session_id=session_id, owner_epoch=owner_epoch, applied="2-0", keep="2-0", seq=0,
        core=b"{}")]) == [CheckpointStatus.OK]


async def test_a_lost_worker_s_checkpointed_sessions_move_and_the_rest_end(
        scripts: Scripts, redis_client: Redis) -> None:
    lost = await register_worker(scripts, slots=4)
    kept = [(await open_session(scripts, lost)).session_id for _ in range(2)]
    bare = (await open_session(scripts, lost)).session_id
    for session_id in kept:
        await checkpointed(scripts, session_id)
    small = await listed(scripts, redis_client, slots=1)
    big = await listed(scripts, redis_client, slots=8)
    outcomes: list[ReplaceStatus] = []
    replacer = Replacer(redis_client, scripts, counted=outcomes.append)
    await expire_heartbeat(redis_client, scripts, lost)

    reaped = await scripts.reap(lost, re_place=replacer.moved)

    assert (reaped.state, reaped.ended, reaped.moved) == (WorkerState.LOST, 1, 2), outcomes
    assert sorted(outcomes) == sorted([ReplaceStatus.MOVED, ReplaceStatus.MOVED,
                                       ReplaceStatus.NO_CHECKPOINT])
    await assert_one_terminal(redis_client, bare, "session.closed", "worker_lost")
    for session_id in kept:
        assert await session_field(redis_client, session_id, "state") != "closed"
        assert await session_field(redis_client, session_id, "owner") == big, (
            "the least loaded worker takes each")
        assert await session_field(redis_client, session_id, "owner_epoch") == "2"
        assert await events_of(redis_client, session_id) == []
    assert await used_slots(redis_client, big) == 2
    assert await used_slots(redis_client, small) == 0
    assert await redis_client.zcard(WorkerKeys(big).adopted) == 2
    again = await scripts.reap(lost, re_place=replacer.moved)
    assert (again.state, again.ended, again.moved) == (WorkerState.HOME, 0, 0)


async def test_with_no_room_anywhere_a_lost_worker_s_session_ends_as_before(
        scripts: Scripts, redis_client: Redis, caplog: pytest.LogCaptureFixture) -> None:
    lost = await register_worker(scripts, slots=4)
    session_id = (await open_session(scripts, lost)).session_id
    await checkpointed(scripts, session_id)
    full = await listed(scripts, redis_client, slots=1)
    other = (await open_session(scripts, full)).session_id
    assert other
    outcomes: list[ReplaceStatus] = []
    await expire_heartbeat(redis_client, scripts, lost)

    reaped = await scripts.reap(lost, re_place=Replacer(redis_client, scripts,
                                                        counted=outcomes.append).moved)

    assert (reaped.ended, reaped.moved, outcomes) == (1, 0, [ReplaceStatus.NO_ROOM])
    assert f"session {session_id} of lost worker {lost} not re-placed (no_room): it ends" in [
        record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    await assert_one_terminal(redis_client, session_id, "session.closed", "worker_lost")
    assert await redis_client.zcard(WorkerKeys(full).adopted) == 0


async def test_a_session_a_lost_worker_had_taken_over_moves_on(
        scripts: Scripts, redis_client: Redis) -> None:
    """Home, then a first owner that is lost: the session moves to a third worker (never
    back to its home), and the lost owner's slot for it is let go."""
    home = await register_worker(scripts, slots=4)
    session_id = (await open_session(scripts, home)).session_id
    await checkpointed(scripts, session_id)
    owner = await register_worker(scripts, slots=4)
    assert await scripts.reserve_slot(owner, session_id) is ReserveStatus.OK
    taken = await scripts.adopt_session(session_id, replaces_epoch=1, adopter=owner)
    assert taken.status is AdoptStatus.OK
    await checkpointed(scripts, session_id, owner_epoch=2)
    third = await listed(scripts, redis_client, slots=4)
    await expire_heartbeat(redis_client, scripts, owner)

    reaped = await scripts.reap(owner, re_place=Replacer(redis_client, scripts).moved)

    assert (reaped.ended, reaped.moved) == (0, 1)
    assert await session_field(redis_client, session_id, "owner") == third
    assert await session_field(redis_client, session_id, "owner_epoch") == "3"
    assert await redis_client.zcard(WorkerKeys(owner).adopted) == 0
    assert await used_slots(redis_client, home) == 0
    settled = await scripts.reap(owner, re_place=Replacer(redis_client, scripts).moved)
    assert (settled.state, settled.settled) == (WorkerState.LOST, True)


async def test_two_reapers_racing_move_a_session_once(
        scripts: Scripts, redis_client: Redis) -> None:
    lost = await register_worker(scripts, slots=4)
    session_id = (await open_session(scripts, lost)).session_id
    await checkpointed(scripts, session_id)
    live = [await listed(scripts, redis_client, slots=4) for _ in range(2)]
    await expire_heartbeat(redis_client, scripts, lost)

    racing = await asyncio.gather(*(
        Replacer(redis_client, scripts).re_place(lost, [session_id]) for _ in range(2)))

    owner = await session_field(redis_client, session_id, "owner")
    assert owner in live
    for (placement,) in racing:  # moved by one, or found moved there (a resend's answer)
        assert placement.status is not ReplaceStatus.MOVED or placement.adopter == owner
    assert await session_field(redis_client, session_id, "owner_epoch") == "2"
    assert sum([await used_slots(redis_client, w) for w in live]) == 1, (
        "the loser's reservation let go")
