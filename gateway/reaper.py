"""The expiry reaper every gateway runs: grace and idle expiry, and worker loss (DESIGN §2.6).

Any number of gateways may reap at once: each session's end is a compare-and-set in Lua, so
exactly one reaper wins and exactly one terminal event is written. Each worker is reaped by a
few of the live gateways, not all (:mod:`gateway.reaper_share`), so the reaping grows with the
workers only.

A worker cannot heartbeat while its slot is out of reach (Redis restarting, a Cluster master
failing over), so a lapsed heartbeat right after such an outage is no proof of death. The REAP
script sees the outage itself, per slot, as a gap between reaps longer than ``outage_ms``, and
then gives the worker a full TTL from that moment; see ``store/lua/reap.lua``. Outages shorter than
that are the worker's own slack (its TTL minus its beat interval) to absorb.

A lost worker's sessions are offered to live workers of their models before they are ended
(``store/replacement.py``): those with a checkpoint and a worker with room move and go on.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import statistics
import time

from gateway.metrics import GatewayMetrics
from gateway.reaper_share import ReaperShare
from runtime.ratelog import RateLimitedLog
from store import Scripts, StoreError, WorkerState
from store.answers import DEFAULT_ATTACHMENT_LEASE_MS
from store.client import RedisClient
from store.directory import forget_worker, listed_workers
from store.errors import raise_if_cancelled
from store.outages import OutageLog
from store.replacement import Replacer
from store.scripts import DEFAULT_REAP_OUTAGE_MS

__all__ = ["Visits", "listing_ttl_ms", "outage_threshold_ms", "reap_once", "run_reaper"]

_log = logging.getLogger(__name__)
# Lines a pass can repeat every interval (a slot outage per worker, a refused script): one per
# cause per 10 s, with a count of the rest.
_rare = RateLimitedLog(_log, interval_s=10.0)


def outage_threshold_ms(interval_s: float, last_pass_s: float) -> int:
    """The gap between two reaps of one worker that means its slot was out of reach: twice
    the gap this reaper leaves between its visits (its pause plus a pass), so that a pass
    that runs late is not taken for an outage (which would delay a loss by one TTL)."""
    return int(2000 * (interval_s + last_pass_s))


class Visits:
    """When this reaper last reached each worker, and whether its last pass failed: what it
    needs to tell a gap of its own making from a Redis outage (:func:`reap_once`)."""

    def __init__(self) -> None:
        self.sent: dict[str, float] = {}  # worker id -> when its last reap was sent
        self.failed = False  # the last pass failed: a gap after it may be an outage


def listing_ttl_ms(interval_s: float) -> int:
    """How long one pass keeps its gateway listed live: four passes' spacing (a second at
    least), so a pass that runs late never drops it, and a dead gateway's workers go to the
    others within that much."""
    return int(1000 * max(4 * interval_s, 1.0))


async def reap_once(client: RedisClient, scripts: Scripts, metrics: GatewayMetrics, *,
                    outage_ms: int = DEFAULT_REAP_OUTAGE_MS,
                    lease_ms: int = DEFAULT_ATTACHMENT_LEASE_MS,
                    visits: Visits | None = None, share: ReaperShare | None = None,
                    ttl_ms: int = 1000) -> int:
    """One pass over the listed workers (``share``: those of its share, after listing this
    gateway live for ``ttl_ms`` and reading who else is; none: every one); returns how
    many sessions ended.

    Each worker's reap also hands back the sessions that ended on it since the last pass,
    wherever they ended (client close, worker, expiry, loss): this is the one place their
    tenant places are released, so a place is freed once the session is over, not when some
    connection happened to see its last event.

    ``visits``: this reaper's memory of its passes (kept by :func:`run_reaper`), so that a
    gap the script reports is told for what it is (see :func:`_tell_gap`); without it every
    gap is told as a possible outage.
    """
    ended = 0
    replacer = Replacer(client, scripts,
                        counted=lambda status: metrics.re_placements.labels(status).inc())
    if share is not None:
        share.live(await scripts.announce_gateway(share.gateway_id, ttl_ms=ttl_ms))
    # Every listed worker, however long ago it last beat: only a reap that finds it lost (or
    # its record gone) removes it, so one that died during a long outage is still declared
    # lost afterwards.
    for worker_id in await listed_workers(client):
        if share is not None and not share.is_mine(worker_id):
            if visits is not None:  # another gateway's now: a later return is a first visit
                visits.sent.pop(worker_id, None)
            continue
        sent = time.monotonic()
        metrics.worker_reaps.inc()
        reaped = await scripts.reap(worker_id, outage_ms=outage_ms, lease_ms=lease_ms,
                                    re_place=replacer.moved)
        ended += reaped.ended
        metrics.lapsed_detached.inc(reaped.detached)
        if reaped.outage_ms:
            _tell_gap(worker_id, reaped.outage_ms, visits, sent)
        if visits is not None:
            visits.sent[worker_id] = sent
        # Released before anything else can fail: these entries are ours alone now. Should
        # this fail, the places lapse with their reservation lease instead.
        await scripts.release_tenant_slots(reaped.released)
        # A lost worker goes from the directory once nothing is left to end (its sessions
        # ended by an earlier reap: their keys are gone); a home of sessions other workers
        # took over is reaped on (store/reaping.py).
        if reaped.state is WorkerState.UNKNOWN or (reaped.state is WorkerState.LOST
                                                   and reaped.settled):
            await forget_worker(client, worker_id)
            if visits is not None:
                visits.sent.pop(worker_id, None)
            if share is not None:
                share.forget(worker_id)
    metrics.reaped.inc(ended)
    return ended


def _tell_gap(worker_id: str, gap_ms: int, visits: Visits | None, sent: float) -> None:
    """Say why the reap sent at ``sent`` found the worker unreached for ``gap_ms`` (the
    script gave it a full TTL for it either way). Only a gap this reaper cannot account for
    points at Redis, a WARNING: after a failed pass of its own, or one longer than the span
    between its previous reap of the worker and this one, both taken when sent. A gap inside
    that span is this reaper's own spacing (its event loop late, a gateway under load: no
    other gateway reached the worker meanwhile either), and one before its first reap of the
    worker is the time no reaper had come since the worker registered (a deployment
    starting: the worker is up before its gateways): both INFO. Send times, because a reap
    that waited on Redis (a failover its client rode out) is no lateness of this reaper's;
    a tenth is left for the two clocks' rates and a round trip."""
    if visits is not None and not visits.failed:
        previous = visits.sent.get(worker_id)
        if previous is None:
            _rare.log(logging.INFO, "reaper_first", "no reaper reached worker %s for %d ms"
                      " before this gateway's reaper first did (none had since it registered,"
                      " or since another gateway last reaped it): it gets a full heartbeat TTL"
                      " to beat again", worker_id, gap_ms)
            return
        span_ms = int(1000 * (sent - previous))
        if span_ms >= 0.9 * gap_ms:
            _rare.log(logging.INFO, "reaper_late", "no reaper reached worker %s for %d ms,"
                      " this gateway's own reaps of it %d ms apart (its event loop was late):"
                      " it gets a full heartbeat TTL to beat again", worker_id, gap_ms,
                      span_ms)
            return
    _rare.warning("slot_outage", "no reaper reached worker %s for %d ms (a failover or an "
                  "outage): it gets a full heartbeat TTL to beat again", worker_id, gap_ms)


async def run_reaper(client: RedisClient, scripts: Scripts, metrics: GatewayMetrics,
                     interval_s: float, *,
                     lease_ms: int = DEFAULT_ATTACHMENT_LEASE_MS,
                     outages: OutageLog | None = None, share: ReaperShare | None = None,
                     ) -> None:
    """Reap forever, every ``interval_s``; failures are retried. Redis not answering is told
    once per outage by ``outages`` (the process's, shared with its other loops; by default
    its own); a refusal (a script's error) is a WARNING, at most one per cause per 10 s.
    ``share``: this gateway's share of the workers (see :mod:`gateway.reaper_share`); none:
    it reaps every worker."""
    outages = outages or OutageLog(_log)
    # The median of the last passes: one pass that waited out a failover inside the client
    # must not raise the outage threshold for the next ones.
    passes_s: collections.deque[float] = collections.deque([0.0], maxlen=5)
    visits = Visits()
    while True:
        started = time.monotonic()
        try:
            await reap_once(client, scripts, metrics,
                            outage_ms=outage_threshold_ms(interval_s, statistics.median(passes_s)),
                            lease_ms=lease_ms, visits=visits, share=share,
                            ttl_ms=listing_ttl_ms(interval_s))
            passes_s.append(time.monotonic() - started)
        except (StoreError, OSError) as exc:
            visits.failed = True
            if not outages.call_failed("reaper pass", exc):
                _rare.warning(("reaper pass", type(exc).__qualname__), "reaper pass failed: %s",
                              exc)
        else:
            visits.failed = False
            outages.succeeded()
        raise_if_cancelled()  # a cancellation swallowed inside the Redis client ends us too
        await asyncio.sleep(interval_s)
