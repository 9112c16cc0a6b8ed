"""This gateway's attachment leases: one per worker it serves sessions on, renewed in bulk.

Every session a gateway attaches (open, resume) is held under the gateway's lease on that
session's worker (``attach_to`` in ``store/lua/prelude.lua``). The gateway renews each lease it
holds once per ``lease / 5``, so its Redis cost is one call per worker per period, whatever the
number of sessions. A gateway that dies, pauses or is cut off stops renewing; once the lease
lapses any reaper detaches its sessions, whose disconnect grace then runs as after a lost
connection.

A gateway cut off from Redis (or paused) cannot tell whether a reaper has detached its sessions
yet, so it stops serving them on its own clock: once no renewal on a worker was answered for a
whole lease, counted from when the last answered one (or the attach) was sent, the
connections on that worker close 1012 ``lease_lapsed`` (:meth:`AttachmentLeases.lapses_at`)
and their clients resume through any gateway that reaches Redis.

The renewals carry the sessions' housekeeping too (:mod:`gateway.lease_duties`): the output
trims and the client activity the connections recorded since the last round ride the renewal on
their worker, and each tenant's reservations (when a tenant cap is set) are renewed in one call
per tenant per round for all the sessions of it this gateway holds. So the gateway's
housekeeping costs one call per worker and one per tenant each round, never one per session.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from prometheus_client import Counter

from gateway.lease_duties import Duties, PendingDuties
from runtime.ratelog import RateLimitedLog
from store import AttachmentHolder, Lease, Scripts, StoreError
from store.errors import raise_if_cancelled
from store.housekeeping import OutputTrim
from store.keys import worker_of_session
from store.outages import OutageLog

__all__ = ["AttachmentLeases"]

_log = logging.getLogger(__name__)

# Renewals per lease period: four may fail in a row before the lease lapses.
_RENEWALS_PER_LEASE = 5
# A refused renewal repeats every round: one line per cause per 10 s, with a count of the rest.
_refusals = RateLimitedLog(_log, interval_s=10.0)


class AttachmentLeases:
    """Which workers this gateway holds sessions on, and the loop that renews its leases."""

    def __init__(self, scripts: Scripts, holder: AttachmentHolder,
                 renewals: Counter | None = None, *, outages: OutageLog | None = None,
                 tenant_lease_ms: int = 0) -> None:
        """``outages``: the process's outage log, shared with its other loops (by default
        one of its own): a renewal round that fails is told once per outage.
        ``tenant_lease_ms``: how long each round keeps the held sessions' tenant reservations
        (0: no tenant cap, no reservations to renew)."""
        self.holder = holder
        self._outages = outages or OutageLog(_log)
        self._scripts = scripts
        self._renewals_metric = renewals
        self._tenant_lease_ms = tenant_lease_ms
        self._sessions_on: collections.Counter[str] = collections.Counter()  # worker -> held
        self._holds: collections.Counter[str] = collections.Counter()  # session -> connections
        self._tenant_of: dict[str, str] = {}
        self._lease_s = holder.lease_ms / 1000
        # Per worker held: when its lease may lapse, on the event loop's clock.
        self._lapses_at: dict[str, float] = {}
        self._duties = PendingDuties()
        #: Renewal calls made so far (one per worker per round, whatever the session count).
        self.renewals = 0
        #: Tenant renewal calls made so far (one per tenant per round).
        self.tenant_renewals = 0

    def hold(self, session_id: str, tenant: str | None = None) -> None:
        """A connection of this gateway attached ``session_id`` (of ``tenant``, whose
        reservation the rounds renew while it is held)."""
        worker = worker_of_session(session_id)
        # The attach that took the session set the lease on its worker.
        self._extend(worker, asyncio.get_running_loop().time())
        self._sessions_on[worker] += 1
        self._holds[session_id] += 1
        if tenant is not None:
            self._tenant_of[session_id] = tenant

    def release(self, session_id: str) -> None:
        """That connection ended; the session is detached, replaced or over."""
        worker = worker_of_session(session_id)
        self._sessions_on[worker] -= 1
        if self._sessions_on[worker] <= 0:
            del self._sessions_on[worker]
            self._lapses_at.pop(worker, None)
        self._holds[session_id] -= 1
        if self._holds[session_id] <= 0:
            del self._holds[session_id]
            self._tenant_of.pop(session_id, None)

    def trim(self, lease: Lease, upto_seq: int) -> None:
        """Trim the session's output up to ``upto_seq``, fenced on ``lease``, in the next
        round (a later trim of the session replaces it)."""
        self._duties.trim(OutputTrim(lease, upto_seq))

    def active(self, session_id: str) -> None:
        """The session's client sent something: the next round marks it active (its idle
        TTL counts from there)."""
        self._duties.active(session_id)

    def lapses_at(self, session_id: str) -> float | None:
        """When the lease holding ``session_id`` may have lapsed, on the event loop's clock,
        unless a renewal is answered first: a lease from when the last answered renewal on its
        worker (or the attach) was sent. None: no session of that worker is held."""
        return self._lapses_at.get(worker_of_session(session_id))

    def _extend(self, worker: str, sent_at: float) -> None:
        self._lapses_at[worker] = max(self._lapses_at.get(worker, sent_at),
                                      sent_at + self._lease_s)

    @property
    def workers(self) -> list[str]:
        """The workers this gateway holds sessions on now."""
        return sorted(self._sessions_on)

    async def renew_once(self) -> int:
        """Renew the lease on every worker held now, with the duties waiting for it, and the
        tenant reservations, concurrently; how many leases were renewed. A worker no longer
        held with duties waiting gets them in a call that renews no lease."""
        workers = self.workers
        duties = self._duties.take_all()
        unheld = sorted(duties.keys() - set(workers))
        tenants = self._tenant_sessions()
        answers = await asyncio.gather(
            *(self._renew(w, self.holder, duties.pop(w, ([], []))) for w in workers),
            *(self._renew(w, None, duties[w]) for w in unheld),
            *(self._scripts.renew_tenant_slots(tenant, sessions, lease_ms=self._tenant_lease_ms)
              for tenant, sessions in tenants.items()),
            return_exceptions=True)
        self.renewals += len(workers)
        self.tenant_renewals += len(tenants)
        if self._renewals_metric is not None:
            self._renewals_metric.inc(len(workers))
        failures = [answer for answer in answers if isinstance(answer, StoreError)]
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, StoreError):
                raise answer  # a bug, not Redis: it ends the gateway loudly
        if failures:
            self._renewal_failed(failures[0])
        elif answers:
            self._outages.succeeded()
        return len(workers)

    async def _renew(self, worker_id: str, holder: AttachmentHolder | None,
                     duties: Duties) -> None:
        sent_at = asyncio.get_running_loop().time()
        try:
            await self._scripts.renew_attachment_lease(worker_id, holder, trims=duties[0],
                                                       active=duties[1])
        except StoreError:
            self._duties.put_back(duties)
            raise
        if holder is not None and worker_id in self._sessions_on:
            self._extend(worker_id, sent_at)

    def _tenant_sessions(self) -> dict[str, list[str]]:
        """Per tenant, the sessions held now whose reservations this round renews."""
        by_tenant: dict[str, list[str]] = collections.defaultdict(list)
        if self._tenant_lease_ms:
            for session_id, tenant in self._tenant_of.items():
                by_tenant[tenant].append(session_id)
        return by_tenant

    def _renewal_failed(self, exc: StoreError) -> None:
        """Redis not answering is the process's outage, told once per change; a refusal (a
        script's error) says this gateway's leases are at risk whatever Redis does: a
        WARNING."""
        if not self._outages.call_failed("lease renewal", exc):
            _refusals.warning(type(exc).__qualname__, "lease renewal failed: %s", exc)

    async def run(self) -> None:
        """Renew forever, ``_RENEWALS_PER_LEASE`` times per lease period, on a fixed clock: a
        pause measured from the end of each round would let rounds drift apart on a busy
        event loop (measured: a round every 2.6-3.8 s instead of 1 s on a saturated machine)
        until healthy sessions' leases lapsed. A round that runs late is followed at once by
        the next due one, never by a burst of the missed ones."""
        loop = asyncio.get_running_loop()
        interval = self.holder.lease_ms / 1000 / _RENEWALS_PER_LEASE
        due = loop.time()
        while True:
            await self.renew_once()
            raise_if_cancelled()
            due = max(due + interval, loop.time())
            # A periodic duty, not a wait for a condition.
            await asyncio.sleep(max(0.0, due - loop.time()))
