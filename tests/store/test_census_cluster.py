"""The census on a real 3-node Redis Cluster: each worker's keys are read on the node that
serves its hash tag, so workers spread over every node are all counted (no CROSSSLOT)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster

from store import AttachmentHolder, Scripts, create_client
from store.census import TickTime, take_census
from store.directory import announce_worker
from store.keys import WorkerKeys, new_gateway_id, new_worker_id
from tests.cluster import Cluster, start_cluster
from tests.store._support import open_session

NODES = 3
HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Three redis-server primaries joined into one cluster."""
    running = start_cluster(masters=NODES)
    yield running
    running.stop()


@pytest.fixture
async def cluster_client(cluster: Cluster) -> AsyncIterator[RedisCluster]:
    """A cluster client (from the store's own factory) on a flushed cluster."""
    client = create_client(cluster.url)
    assert isinstance(client, RedisCluster)
    await client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    await client.aclose()


def worker_ids_on_every_node(client: RedisCluster) -> list[str]:
    """Fresh worker ids, one whose keys live on each primary."""
    by_node: dict[str, str] = {}
    for _ in range(500):
        worker_id = new_worker_id()
        node: Any = client.get_node_from_key(WorkerKeys(worker_id).record)
        by_node.setdefault(str(node.name), worker_id)
        if len(by_node) == NODES:
            return sorted(by_node.values())
    raise AssertionError(f"worker ids never covered every node: {by_node}")


async def test_census_reads_workers_on_every_node(cluster_client: RedisCluster) -> None:
    """A worker on each node, each with sessions of its own count (one detached), read in
    small SSCAN batches: every worker, backend and session is counted where it is."""
    scripts = Scripts(cluster_client)
    holder = AttachmentHolder(gateway_id=new_gateway_id(), lease_ms=HOUR_MS)
    worker_ids = worker_ids_on_every_node(cluster_client)
    for count, worker_id in enumerate(worker_ids, start=2):
        beat = await scripts.worker_heartbeat(worker_id, slots=8, ttl_ms=HOUR_MS,
                                              register=True, drain=False, backend="fake",
                                              tick=TickTime(engine=True, p99_ms=float(count)))
        await announce_worker(cluster_client, worker_id, beat.alive_until_ms)
        opened = [await open_session(scripts, worker_id, tenant="t-a", holder=holder)
                  for _ in range(count)]
        assert await scripts.detach(opened[0].lease) == "ok"

    census = await take_census(cluster_client, batch=2)
    assert [worker.worker_id for worker in census.workers] == worker_ids
    for count, worker in enumerate(census.workers, start=2):
        assert (worker.state, worker.backend, worker.used) == ("live", "fake", count)
        assert worker.tick == TickTime(engine=True, p99_ms=float(count))
        assert dict(worker.sessions.by_state) == {"attached": count - 1, "detached": 1}
    total = sum(range(2, 2 + NODES))
    assert dict(census.sessions.by_state) == {"attached": total - NODES, "detached": NODES}
    assert dict(census.sessions.by_tenant) == {"t-a": total}
    assert dict(census.sessions.by_gateway) == {holder.gateway_id: total - NODES}
