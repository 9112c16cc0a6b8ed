"""The expiry reaper every gateway runs: grace and idle expiry, and worker loss (DESIGN §2.6).

Any number of gateways may reap at once: each session's end is a compare-and-set in Lua, so
exactly one reaper wins and exactly one terminal event is written.

A worker cannot heartbeat while its slot is out of reach (Redis restarting, a Cluster master
failing over), so a lapsed heartbeat right after such an outage is no proof of death. The REAP
script sees the outage itself, per slot, as a gap between reaps longer than ``outage_ms``, and
then gives the worker a full TTL from that moment; see ``store/lua.py``. Outages shorter than
that are the worker's own slack (its TTL minus its beat interval) to absorb.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import statistics
import time

from gateway.metrics import GatewayMetrics
from store import Scripts, StoreError
from store.client import RedisClient
from store.directory import forget_worker, listed_workers
from store.errors import raise_if_cancelled
from store.outages import OutageLog
from store.ratelog import RateLimitedLog
from store.scripts import DEFAULT_ATTACHMENT_LEASE_MS, DEFAULT_REAP_OUTAGE_MS

__all__ = ["outage_threshold_ms", "reap_once", "run_reaper"]

_log = logging.getLogger(__name__)
# Lines a pass can repeat every interval (a slot outage per worker, a refused script): one per
# cause per 10 s, with a count of the rest.
_rare = RateLimitedLog(_log, interval_s=10.0)


def outage_threshold_ms(interval_s: float, last_pass_s: float) -> int:
    """The gap between two reaps of one worker that means its slot was out of reach: twice
    the gap this reaper leaves between its visits (its pause plus a pass), so that a pass
    that runs late is not taken for an outage (which would delay a loss by one TTL)."""
    return int(2000 * (interval_s + last_pass_s))


async def reap_once(client: RedisClient, scripts: Scripts, metrics: GatewayMetrics, *,
                    outage_ms: int = DEFAULT_REAP_OUTAGE_MS,
                    lease_ms: int = DEFAULT_ATTACHMENT_LEASE_MS,
                    own_gap_ms: int | None = None) -> int:
    """One pass over every listed worker; returns how many sessions ended.

    Each worker's reap also hands back the sessions that ended on it since the last pass,
    wherever they ended (client close, worker, expiry, loss): this is the one place their
    tenant places are released, so a place is freed once the session is over, not when some
    connection happened to see its last event.

    ``own_gap_ms``: how long since this reaper's previous pass started, when that pass
    succeeded (None: unknown, or it failed). A gap the script reports that this reaper's own
    lateness covers (its event loop busy: a gateway under load) is told as that, at INFO: no
    Redis outage to look for.
    """
    ended = 0
    # Every listed worker, however long ago it last beat: only a reap that finds it lost (or
    # its record gone) removes it, so one that died during a long outage is still declared
    # lost afterwards.
    for worker_id in await listed_workers(client):
        reaped = await scripts.reap(worker_id, outage_ms=outage_ms, lease_ms=lease_ms)
        ended += reaped.ended
        metrics.lapsed_detached.inc(reaped.detached)
        if reaped.outage_ms:
            _tell_gap(worker_id, reaped.outage_ms, own_gap_ms)
        # Released before anything else can fail: these entries are ours alone now. Should
        # this fail, the places lapse with their reservation lease instead.
        await scripts.release_tenant_slots(reaped.released)
        if reaped.state in ("lost", "unknown"):
            await forget_worker(client, worker_id)
    metrics.reaped.inc(ended)
    return ended


def _tell_gap(worker_id: str, gap_ms: int, own_gap_ms: int | None) -> None:
    """Say why a reap found the worker unreached for ``gap_ms``. When this reaper's own
    previous pass, which succeeded, started at least that long ago (less a tenth: the two are
    read on different clocks, around a round trip), its own lateness covers the gap: its event
    loop was busy (a gateway under load), and no other gateway reached the worker meanwhile
    either. Either way the worker gets a full TTL (the script decided that); only a gap this
    reaper cannot account for points at Redis."""
    if own_gap_ms is not None and own_gap_ms >= 0.9 * gap_ms:
        _rare.log(logging.INFO, "reaper_late", "no reaper reached worker %s for %d ms, this "
                  "gateway's own reaper passes %d ms apart (its event loop was late): the "
                  "worker gets a full heartbeat TTL to beat again", worker_id, gap_ms,
                  own_gap_ms)
        return
    _rare.warning("slot_outage", "no reaper reached worker %s for %d ms (a failover or an "
                  "outage): it gets a full heartbeat TTL to beat again", worker_id, gap_ms)


async def run_reaper(client: RedisClient, scripts: Scripts, metrics: GatewayMetrics,
                     interval_s: float, *,
                     lease_ms: int = DEFAULT_ATTACHMENT_LEASE_MS,
                     outages: OutageLog | None = None) -> None:
    """Reap forever, every ``interval_s``; failures are retried. Redis not answering is told
    once per outage by ``outages`` (the process's, shared with its other loops; by default
    its own); a refusal (a script's error) is a WARNING, at most one per cause per 10 s."""
    outages = outages or OutageLog(_log)
    # The median of the last passes: one pass that waited out a failover inside the client
    # must not raise the outage threshold for the next ones.
    passes_s: collections.deque[float] = collections.deque([0.0], maxlen=5)
    last_success_start: float | None = None
    while True:
        started = time.monotonic()
        own_gap_ms = (None if last_success_start is None
                      else int(1000 * (started - last_success_start)))
        try:
            await reap_once(client, scripts, metrics,
                            outage_ms=outage_threshold_ms(interval_s, statistics.median(passes_s)),
                            lease_ms=lease_ms, own_gap_ms=own_gap_ms)
            passes_s.append(time.monotonic() - started)
        except (StoreError, OSError) as exc:
            last_success_start = None  # what follows a failed pass may be a real outage
            if not outages.call_failed("reaper pass", exc):
                _rare.warning(("reaper pass", type(exc).__qualname__), "reaper pass failed: %s",
                              exc)
        else:
            last_success_start = started
            outages.succeeded()
        raise_if_cancelled()  # a cancellation swallowed inside the Redis client ends us too
        await asyncio.sleep(interval_s)
