"""The reapers share the workers out: each worker is reaped by ``REAPERS_PER_WORKER`` of the
live gateways, so the reaps a pass makes grow with the workers, not gateways x workers.

The share's arithmetic alone, then real passes of several gateways' reapers against a real
Redis, counted by the reaper's own counter of worker reaps.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from gateway.metrics import GatewayMetrics
from gateway.reaper import reap_once
from gateway.reaper_share import ReaperShare, reapers_of
from store import Scripts
from store.directory import announce_worker, listed_workers
from store.keys import GATEWAY_DIRECTORY, new_gateway_id, new_worker_id
from tests.store._support import redis_now_ms, register_worker, until

REAPERS = 3
WORKERS = [new_worker_id() for _ in range(60)]


def shares(gateways: list[str]) -> list[ReaperShare]:
    """Each gateway's share, all of them reading the same live list."""
    out = []
    for gateway_id in gateways:
        share = ReaperShare(gateway_id, REAPERS)
        share.live(gateways)
        out.append(share)
    return out


@pytest.mark.parametrize("gateway_count", range(1, 9))
def test_each_worker_has_min_of_gateways_and_reapers_reapers(gateway_count: int) -> None:
    """With 1 to 8 gateways, every worker is reaped, by exactly min(gateways, 3) of them."""
    gateways = [new_gateway_id() for _ in range(gateway_count)]
    everyone = shares(gateways)
    for worker_id in WORKERS:
        reapers = {share.gateway_id for share in everyone if share.is_mine(worker_id)}
        assert len(reapers) == min(gateway_count, REAPERS), worker_id
        assert reapers == set(reapers_of(worker_id, gateways, REAPERS))


def test_a_gateway_that_leaves_moves_only_its_own_workers() -> None:
    """Rendezvous hashing: a worker whose reapers did not include the gateway that left keeps
    the same reapers; one that did keeps the other two and gains one."""
    gateways = [new_gateway_id() for _ in range(6)]
    gone, *rest = gateways
    for worker_id in WORKERS:
        before = set(reapers_of(worker_id, gateways, REAPERS))
        after = set(reapers_of(worker_id, rest, REAPERS))
        if gone in before:
            assert before - {gone} < after and len(after) == REAPERS
        else:
            assert after == before


def test_a_share_counts_its_own_gateway_and_refuses_no_reaper() -> None:
    """A gateway that reads a list without itself (its listing not yet seen) still takes its
    share; a share of zero reapers would leave workers unreaped."""
    share = ReaperShare(new_gateway_id(), 1)
    share.live([])
    assert all(share.is_mine(worker_id) for worker_id in WORKERS)
    with pytest.raises(ValueError, match="at least one reaper"):
        ReaperShare(new_gateway_id(), 0)


async def reap_round(redis_client: Redis, gateways: list[ReaperShare],
                     metrics: list[GatewayMetrics], ttl_ms: int = 60_000) -> int:
    """One pass of each gateway's reaper; how many worker reaps they ran in all."""
    before = sum(reaps(m) for m in metrics)
    for share, counted in zip(gateways, metrics, strict=True):
        await reap_once(redis_client, Scripts(redis_client), counted, share=share,
                        ttl_ms=ttl_ms)
    return sum(reaps(m) for m in metrics) - before


def reaps(metrics: GatewayMetrics) -> int:
    """The reaper's count of worker reaps, as /metrics shows it."""
    return int(metrics.registry.get_sample_value("duplex_gateway_worker_reaps_total") or 0)


async def listed(redis_client: Redis, workers: int) -> None:
    """Register and list ``workers`` live workers."""
    scripts = Scripts(redis_client)
    for _ in range(workers):
        worker_id = await register_worker(scripts)
        await announce_worker(redis_client, worker_id, await redis_now_ms(redis_client) + 60_000)


async def test_reaps_per_pass_stay_flat_from_one_to_eight_gateways(redis_client: Redis) -> None:
    """Gateways join one at a time; once each has listed itself, a round of passes of every
    reaper reaps each worker min(gateways, 3) times: 20 workers cost 60 reaps a round
    whether 3 or 8 gateways run."""
    await listed(redis_client, 20)
    gateways: list[ReaperShare] = []
    metrics: list[GatewayMetrics] = []
    counts = []
    for count in range(1, 9):
        gateways.append(ReaperShare(new_gateway_id(), REAPERS))
        metrics.append(GatewayMetrics())
        await reap_round(redis_client, gateways, metrics)  # each lists itself, reads the rest
        counts.append(await reap_round(redis_client, gateways, metrics))
        assert await redis_client.zcard(GATEWAY_DIRECTORY) == count
    assert counts == [20 * min(count, REAPERS) for count in range(1, 9)]


async def test_a_dead_gateways_workers_go_to_the_others(redis_client: Redis) -> None:
    """Five gateways; one stops reaping (dies). Once its listing ran out, the four left reap
    every worker three times a round again, the dead one's workers included."""
    await listed(redis_client, 20)
    gateways = [ReaperShare(new_gateway_id(), REAPERS) for _ in range(5)]
    metrics = [GatewayMetrics() for _ in gateways]
    await reap_round(redis_client, gateways, metrics, ttl_ms=200)
    dead, *alive = gateways
    alive_metrics = metrics[1:]

    async def dead_one_unlisted() -> bool:
        await reap_round(redis_client, alive, alive_metrics, ttl_ms=200)
        return all(dead.gateway_id not in share.gateways for share in alive)

    await until(dead_one_unlisted, "the dead gateway's listing to run out")
    assert await reap_round(redis_client, alive, alive_metrics, ttl_ms=200) == 20 * REAPERS
    workers = await listed_workers(redis_client)
    assert [sum(share.is_mine(w) for share in alive) for w in workers] == [REAPERS] * 20
