"""The gateway's input batcher: one script call per batch, per-session order, errors routed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from contract.reasons import CloseReason
from gateway.batcher import InputBatcher
from store import Lease, LeaseLost, Scripts, SessionGone
from store.logs import read_input
from tests.store._support import open_session, register_worker, until

pytestmark = pytest.mark.timeout(60)


async def script_calls(client: Redis) -> int:
    """How many EVALSHA calls the server has run so far."""
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_concurrent_appends_of_one_worker_share_calls(redis_client: Redis) -> None:
    """Many sessions appending at once cost fewer script calls than appends, in order."""
    scripts = Scripts(redis_client)
    worker = await register_worker(scripts, slots=16)
    leases = [(await open_session(scripts, worker)).lease for _ in range(16)]
    batcher = InputBatcher(scripts, max_entries=1000)
    before = await script_calls(redis_client)

    async def stream(lease: Lease) -> None:
        for i in range(20):
            await batcher.append(lease, [(i + 1, f"{lease.session_id}:{i}".encode())])

    await asyncio.gather(*(stream(lease) for lease in leases))
    calls = await script_calls(redis_client) - before
    assert calls < 16 * 20, "appends were coalesced"
    for lease in leases:
        rows = await read_input(redis_client, lease.session_id, 0)
        assert [p for _, p in rows] == [f"{lease.session_id}:{i}".encode() for i in range(20)]
    await batcher.aclose()


async def test_errors_reach_only_their_session(redis_client: Redis) -> None:
    """A stale lease and a closed session fail alone; their batch mates succeed."""
    scripts = Scripts(redis_client)
    worker = await register_worker(scripts, slots=4)
    good, stale, closed = [(await open_session(scripts, worker)).lease for _ in range(3)]
    await scripts.close_session(closed.session_id, CloseReason.CLIENT_CLOSE)
    stale_lease = Lease(session_id=stale.session_id, epoch=stale.epoch, generation=7,
                        tenant=stale.tenant)
    batcher = InputBatcher(scripts, max_entries=1000)
    outcomes = await asyncio.gather(
        batcher.append(good, [(None, b"a")]),
        batcher.append(stale_lease, [(None, b"b")]),
        batcher.append(closed, [(None, b"c")]),
        return_exceptions=True)
    assert not isinstance(outcomes[0], BaseException) and outcomes[0].appended == 1
    assert isinstance(outcomes[1], LeaseLost) and outcomes[1].current_generation == 1
    assert isinstance(outcomes[2], SessionGone) and outcomes[2].status == "closed"
    await batcher.aclose()


async def test_sessions_of_different_workers_are_not_mixed(redis_client: Redis) -> None:
    """Each worker gets its own calls (one hash slot each); both succeed."""
    scripts = Scripts(redis_client)
    leases = [(await open_session(scripts, await register_worker(scripts))).lease
              for _ in range(2)]
    batcher = InputBatcher(scripts, max_entries=1000)
    results = await asyncio.gather(*(batcher.append(lease, [(1, b"x")]) for lease in leases))
    assert [r.last_client_seq for r in results] == [1, 1]
    await batcher.aclose()


async def test_lone_appends_go_out_from_the_callers_task(
        redis_client: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """An append made while nothing is in flight for its worker is sent at once by the caller
    itself: one script call each, and no drain task started for it."""
    scripts = Scripts(redis_client)
    lease = (await open_session(scripts, await register_worker(scripts))).lease
    batcher = InputBatcher(scripts, max_entries=1000)
    drains = 0
    drain = InputBatcher._drain

    async def counted(self: InputBatcher, *args: Any) -> None:
        nonlocal drains
        drains += 1
        await drain(self, *args)

    monkeypatch.setattr(InputBatcher, "_drain", counted)
    before = await script_calls(redis_client)
    for seq in range(1, 6):
        assert (await batcher.append(lease, [(seq, f"{seq}".encode())])).last_client_seq == seq
    assert await script_calls(redis_client) - before == 5
    assert drains == 0
    await batcher.aclose()


async def test_a_cancelled_caller_leaves_what_queued_behind_its_call_sent(
        redis_client: Redis) -> None:
    """The caller whose own task makes a call gives up (its connection ends) while the call is
    held in Redis: the appends of other sessions that queued behind it are still sent, in one
    call, once Redis answers again."""
    scripts = Scripts(redis_client)
    worker = await register_worker(scripts, slots=4)
    first, second, third = [(await open_session(scripts, worker)).lease for _ in range(3)]
    batcher = InputBatcher(scripts, max_entries=1000)
    await redis_client.client_pause(20_000, all=False)  # write commands (scripts) wait
    try:
        leader = asyncio.create_task(batcher.append(first, [(1, b"first")]))
        await until(lambda: any(group.busy for group in batcher._groups.values()),
                    "the first call to be in flight")
        behind = [asyncio.create_task(batcher.append(lease, [(1, name)]))
                  for lease, name in ((second, b"second"), (third, b"third"))]
        await until(lambda: sum(len(g.pending) for g in batcher._groups.values()) == 2,
                    "both appends to queue behind it")
        leader.cancel()
        await asyncio.gather(leader, return_exceptions=True)
    finally:
        await redis_client.client_unpause()
    results = await asyncio.wait_for(asyncio.gather(*behind), 10)
    assert [result.appended for result in results] == [1, 1]
    for lease, name in ((second, b"second"), (third, b"third")):
        assert [p for _, p in await read_input(redis_client, lease.session_id, 0)] == [name]
    await batcher.aclose()
