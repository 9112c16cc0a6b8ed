"""A worker that reads its input on its own clock: its id says so, the input appends push it
nothing, and one ``XREAD`` reads every session's new entries past where each stands. And what
a pushed worker's channel tells it of its sessions' fences."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from contract.messages import Heartbeat, encode_message
from contract.reasons import CloseReason
from store import ResumeStatus, Scripts
from store.keys import WorkerKeys, new_worker_id, worker_pulls_input
from store.logs import InputPosition, WriteToken, pull_input
from store.pushes import FenceRaised, InputPushed, SessionPlaced
from tests.store._support import (
    EPOCH,
    digest,
    listening,
    open_session,
    register_worker,
)
from tests.store.test_leases import A, expire_lease

pytestmark = pytest.mark.timeout(30)

def cmd(n: int) -> bytes:
    return encode_message(Heartbeat(event_id=f"c{n}"))


def test_the_id_says_whether_a_worker_pulls() -> None:
    """A pulling worker's id starts with p, any other with w; both are worker ids."""
    pulling, pushed = new_worker_id(pulls_input=True), new_worker_id()
    assert pulling.startswith("p") and pushed.startswith("w")
    assert worker_pulls_input(pulling) and not worker_pulls_input(pushed)
    assert WorkerKeys(pulling).worker_id == pulling


@pytest.mark.parametrize("pulls", [False, True], ids=["pushed worker", "pulling worker"])
async def test_an_append_pushes_to_a_pushed_worker_only(
        scripts: Scripts, redis_client: Redis, pulls: bool) -> None:
    """The same append to a session of each kind of worker: a pushed worker's channel gets
    the entries, a pulling worker's gets the placement alone; both logs hold them."""
    worker_id = await register_worker(scripts, worker_id=new_worker_id(pulls_input=pulls))
    channel = WorkerKeys(worker_id).input_channel
    async with listening(redis_client, channel) as heard:
        opened = await open_session(scripts, worker_id)
        result = await scripts.append_input(opened.lease, [(1, cmd(1)), (2, cmd(2))],
                                            max_entries=100)
        assert result.appended == 2
        pushes = await heard()
    assert pushes[0] == SessionPlaced(opened.session_id)
    inputs = [push for push in pushes[1:] if isinstance(push, InputPushed)]
    assert [(push.first_index, push.payloads) for push in inputs] == (
        [] if pulls else [(1, [cmd(1), cmd(2)])])
    assert len(pushes) == 1 + len(inputs)
    pulled = await pull_input(redis_client, {opened.session_id: InputPosition(0, 0)})
    assert [entry.payload for entry in pulled[opened.session_id]] == [cmd(1), cmd(2)]


async def test_one_pull_reads_each_session_past_its_position(scripts: Scripts,
                                                             redis_client: Redis) -> None:
    """Sessions of one worker read together: each from past the entry it names, the fence
    markers left out; after a resume the new holder's entries follow under its fence, and a
    session that read everything or ended gives nothing."""
    worker_id = await register_worker(scripts, worker_id=new_worker_id(pulls_input=True))
    first, second, idle, ended = [await open_session(scripts, worker_id) for _ in range(4)]
    for opened in (first, second, idle, ended):
        await scripts.append_input(opened.lease, [(1, cmd(1)), (2, cmd(2))], max_entries=100)
    resumed = await scripts.resume(second.session_id, tenant="tenant-a",
                                   presented_digest=digest(second.token),
                                   new_digest=digest("t2"), control_id="c1")
    assert resumed.status is ResumeStatus.OK and resumed.lease is not None
    await scripts.append_input(resumed.lease, [(3, cmd(3))], max_entries=100)
    await scripts.close_session(ended.session_id, CloseReason.CLIENT_CLOSE)

    pulled = await pull_input(redis_client, {
        first.session_id: InputPosition(0, 0), second.session_id: InputPosition(2, 1),
        idle.session_id: InputPosition(2, 2), ended.session_id: InputPosition(0, 0)})

    assert set(pulled) == {first.session_id, second.session_id}
    assert [(e.index, e.fence, e.payload) for e in pulled[first.session_id]] == [
        (1, 2, cmd(1)), (2, 2, cmd(2))]
    assert [(e.index, e.fence, e.payload) for e in pulled[second.session_id]] == [
        (2, 2, cmd(2)), (3, 4, cmd(3))]
    token = pulled[second.session_id][-1].token
    assert token is not None and token.generation == 2
    assert await pull_input(redis_client, {}) == {}


async def test_each_raise_of_a_fence_tells_the_worker_before_what_follows(
        scripts: Scripts, redis_client: Redis) -> None:
    """A detach, a resume and a reaper's detachment of a lapsed lease each raise the fence
    and say so on the worker's channel (FenceRaised), in order with the pushes around them;
    a detach that changes nothing says nothing."""
    worker_id = await register_worker(scripts)
    channel = WorkerKeys(worker_id).input_channel
    async with listening(redis_client, channel) as heard:
        holder = A
        opened = await open_session(scripts, worker_id, holder=holder)
        sid = opened.session_id
        await scripts.append_input(opened.lease, [(1, cmd(1))], max_entries=100)
        await scripts.detach(opened.lease)
        await scripts.detach(opened.lease)  # already detached: no raise
        resumed = await scripts.resume(sid, tenant="tenant-a",
                                       presented_digest=digest(opened.token),
                                       new_digest=digest("t2"), control_id="c1",
                                       holder=holder)
        assert resumed.lease is not None
        await scripts.append_input(resumed.lease, [(2, cmd(2))], max_entries=100)
        await expire_lease(redis_client, scripts, worker_id, holder)
        assert (await scripts.reap(worker_id)).detached == 1
        pushes = await heard()
    assert [push for push in pushes if not isinstance(push, SessionPlaced)] == [
        InputPushed(sid, 1, [cmd(1)], WriteToken(EPOCH, 1), 2), FenceRaised(sid, 3),
        FenceRaised(sid, 4), InputPushed(sid, 2, [cmd(2)], WriteToken(EPOCH, 2), 4),
        FenceRaised(sid, 5)]
