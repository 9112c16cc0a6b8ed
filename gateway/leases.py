"""This gateway's attachment leases: one per worker it serves sessions on, renewed in bulk.

Every session a gateway attaches (open, resume) is held under the gateway's lease on that
session's worker (``attach_to`` in ``store/lua/prelude.lua``). The gateway renews each lease it
holds once per ``lease / 5``, so its Redis cost is one call per worker per period, whatever the
number of sessions. A gateway that dies, pauses or is cut off stops renewing; once the lease
lapses any reaper detaches its sessions, whose disconnect grace then runs as after a lost
connection.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from prometheus_client import Counter

from runtime.ratelog import RateLimitedLog
from store import AttachmentHolder, Scripts, StoreError
from store.errors import raise_if_cancelled
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
                 renewals: Counter | None = None, *, outages: OutageLog | None = None) -> None:
        """``outages``: the process's outage log, shared with its other loops (by default
        one of its own): a renewal round that fails is told once per outage."""
        self.holder = holder
        self._outages = outages or OutageLog(_log)
        self._scripts = scripts
        self._renewals_metric = renewals
        self._sessions_on: collections.Counter[str] = collections.Counter()  # worker -> held
        #: Renewal calls made so far (one per worker per round, whatever the session count).
        self.renewals = 0

    def hold(self, session_id: str) -> None:
        """A connection of this gateway attached ``session_id``."""
        self._sessions_on[worker_of_session(session_id)] += 1

    def release(self, session_id: str) -> None:
        """That connection ended; the session is detached, replaced or over."""
        worker = worker_of_session(session_id)
        self._sessions_on[worker] -= 1
        if self._sessions_on[worker] <= 0:
            del self._sessions_on[worker]

    @property
    def workers(self) -> list[str]:
        """The workers this gateway holds sessions on now."""
        return sorted(self._sessions_on)

    async def renew_once(self) -> int:
        """Renew the lease on every worker held now, concurrently; how many calls were made."""
        workers = self.workers
        answers = await asyncio.gather(
            *(self._scripts.renew_attachment_lease(w, self.holder) for w in workers),
            return_exceptions=True)
        self.renewals += len(workers)
        if self._renewals_metric is not None:
            self._renewals_metric.inc(len(workers))
        failures = [answer for answer in answers if isinstance(answer, StoreError)]
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, StoreError):
                raise answer  # a bug, not Redis: it ends the gateway loudly
        if failures:
            self._renewal_failed(failures[0])
        elif workers:
            self._outages.succeeded()
        return len(workers)

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
