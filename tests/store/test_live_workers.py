"""store.directory.live_worker_count: what a gateway's readiness probe reads."""

from __future__ import annotations

from redis.asyncio import Redis

from store.directory import announce_worker, forget_worker, live_worker_count
from store.keys import new_worker_id
from tests.store._support import redis_now_ms

LONG_MS = 600_000  # a deadline no test run reaches


async def test_counts_workers_whose_heartbeat_deadline_is_ahead(redis_client: Redis) -> None:
    """Only entries whose deadline is still ahead on Redis's clock count: a lapsed worker
    does not until it beats again, a forgotten one not at all."""
    assert await live_worker_count(redis_client) == 0
    now = await redis_now_ms(redis_client)
    lapsed, lasting = new_worker_id(), new_worker_id()
    await announce_worker(redis_client, lapsed, now - 1)
    await announce_worker(redis_client, lasting, now + LONG_MS)
    assert await live_worker_count(redis_client) == 1
    await announce_worker(redis_client, lapsed, now + LONG_MS)  # it beat again
    assert await live_worker_count(redis_client) == 2
    await forget_worker(redis_client, lasting)
    await forget_worker(redis_client, lapsed)
    assert await live_worker_count(redis_client) == 0
