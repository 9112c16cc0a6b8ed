"""The gateway's input batcher: one script call per batch, per-session order, errors routed."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from gateway.batcher import InputBatcher
from store import Lease, LeaseLost, Scripts, SessionGone
from store.logs import read_input
from tests.store._support import open_session, register_worker

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
    await scripts.close_session(closed.session_id, "client_close")
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
