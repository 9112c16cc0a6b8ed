"""The expiry reaper every gateway runs: grace and idle expiry, and worker loss (DESIGN §2.6).

Any number of gateways may reap at once: each session's end is a compare-and-set in Lua, so
exactly one reaper wins and exactly one terminal event is written.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.metrics import GatewayMetrics
from store import Scripts, StoreError
from store.client import RedisClient
from store.directory import forget_worker, listed_workers, server_time_ms
from store.errors import raise_if_cancelled
from store.scripts import DEFAULT_ATTACHMENT_LEASE_MS

__all__ = ["reap_once", "run_reaper"]

_log = logging.getLogger(__name__)


async def reap_once(client: RedisClient, scripts: Scripts, metrics: GatewayMetrics, *,
                    recovered_ms: int = 0, lease_ms: int = DEFAULT_ATTACHMENT_LEASE_MS) -> int:
    """One pass over every listed worker; returns how many sessions ended.

    Each worker's reap also hands back the sessions that ended on it since the last pass,
    wherever they ended (client close, worker, expiry, loss): this is the one place their
    tenant places are released, so a place is freed once the session is over, not when some
    connection happened to see its last event.
    """
    ended = 0
    # Every listed worker, however long ago it last beat: only a reap that finds it lost (or
    # its record gone) removes it, so one that died during a long outage is still declared
    # lost afterwards.
    for worker_id in await listed_workers(client):
        reaped = await scripts.reap(worker_id, recovered_ms=recovered_ms, lease_ms=lease_ms)
        ended += reaped.ended
        metrics.lapsed_detached.inc(reaped.detached)
        # Released before anything else can fail: these entries are ours alone now. Should
        # this fail, the places lapse with their reservation lease instead.
        await scripts.release_tenant_slots(reaped.released)
        if reaped.state in ("lost", "unknown"):
            await forget_worker(client, worker_id)
    metrics.reaped.inc(ended)
    return ended


async def run_reaper(client: RedisClient, scripts: Scripts, metrics: GatewayMetrics,
                     interval_s: float, *,
                     lease_ms: int = DEFAULT_ATTACHMENT_LEASE_MS) -> None:
    """Reap forever, every ``interval_s``; Redis errors are logged and retried.

    After a pass fails (Redis unreachable: a failover, a restart), the first pass that reaches
    Redis again gives every worker a full heartbeat TTL from then before declaring it lost:
    the workers could not beat while Redis was away either.
    """
    recovered_ms = 0
    failing = False
    while True:
        try:
            if failing:
                recovered_ms = await server_time_ms(client)
                failing = False
            await reap_once(client, scripts, metrics, recovered_ms=recovered_ms,
                            lease_ms=lease_ms)
        except (StoreError, OSError) as exc:
            _log.warning("reaper pass failed: %s", exc)
            failing = True
        raise_if_cancelled()  # a cancellation swallowed inside the Redis client ends us too
        await asyncio.sleep(interval_s)
