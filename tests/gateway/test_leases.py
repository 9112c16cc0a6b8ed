"""The gateway's attachment leases on a real Redis: one renewal per worker, whatever the
number of sessions it holds there."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.leases import AttachmentLeases
from store import AttachmentHolder, Scripts
from store.keys import WorkerKeys, new_session_id, new_worker_id
from tests.store._support import redis_now_ms

pytestmark = pytest.mark.timeout(30)

HOLDER = AttachmentHolder(gateway_id="g00000000abcd", lease_ms=5_000)


async def test_renewal_costs_one_call_per_worker_not_per_session(redis_client: Redis) -> None:
    """50 sessions on 2 workers: each round renews 2 leases, and both end a lease from now;
    once every session is released, a round renews nothing."""
    leases = AttachmentLeases(Scripts(redis_client), HOLDER)
    workers = [new_worker_id(), new_worker_id()]
    sessions = [new_session_id(workers[i % 2]) for i in range(50)]
    for session_id in sessions:
        leases.hold(session_id)
    before = await redis_now_ms(redis_client)
    assert [await leases.renew_once() for _ in range(3)] == [2, 2, 2]
    assert leases.renewals == 6
    for worker in workers:
        score: Any = await redis_client.zscore(WorkerKeys(worker).gateways, HOLDER.gateway_id)
        assert score is not None and float(score) >= before + HOLDER.lease_ms
    for session_id in sessions[:-1]:
        leases.release(session_id)
    assert leases.workers == [workers[1]]
    leases.release(sessions[-1])
    assert await leases.renew_once() == 0
