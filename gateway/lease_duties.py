"""The per-session housekeeping a gateway's lease renewals carry (``store/housekeeping.py``).

A connection records what its session needs (an output trim, its client's activity) here, with
no Redis call; the next renewal of the gateway's lease on the session's worker sends all of it
in the same call. So housekeeping costs one call per (gateway, worker) and renewal period,
whatever the number of sessions. A duty taken for a call that failed is put back, unless a newer
one came meanwhile: the newest trim of a session wins.
"""

from __future__ import annotations

import collections

from store.housekeeping import OutputTrim
from store.keys import worker_of_session

__all__ = ["Duties", "PendingDuties"]

#: What one renewal on one worker carries: trims, and sessions whose clients were active.
Duties = tuple[list[OutputTrim], list[str]]


class PendingDuties:
    """The newest trim of each session, and the sessions active since the round that last
    carried them; grouped by worker once per round, so marking one costs a set add."""

    def __init__(self) -> None:
        self._trims: dict[str, OutputTrim] = {}
        self._active: set[str] = set()

    def trim(self, trim: OutputTrim) -> None:
        """Trim ``trim.lease``'s session up to ``trim.upto_seq`` at the next round."""
        self._trims[trim.lease.session_id] = trim

    def active(self, session_id: str) -> None:
        """The session's client was active: its idle TTL counts from the next round."""
        self._active.add(session_id)

    def take_all(self) -> dict[str, Duties]:
        """Everything waiting, by worker, removed from here."""
        trims, self._trims = self._trims, {}
        active, self._active = self._active, set()
        by_worker: dict[str, Duties] = collections.defaultdict(lambda: ([], []))
        for trim in trims.values():
            by_worker[trim.worker_id][0].append(trim)
        for session_id in sorted(active):
            by_worker[worker_of_session(session_id)][1].append(session_id)
        return dict(by_worker)

    def put_back(self, duties: Duties) -> None:
        """A call that carried ``duties`` failed: keep them for the next one, except the trims
        of sessions that got a newer trim meanwhile."""
        trims, active = duties
        for trim in trims:
            self._trims.setdefault(trim.lease.session_id, trim)
        self._active.update(active)
