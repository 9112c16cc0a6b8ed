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
    """Per worker: the newest trim of each session, and the sessions active since the last
    renewal that carried them."""

    def __init__(self) -> None:
        self._trims: dict[str, dict[str, OutputTrim]] = collections.defaultdict(dict)
        self._active: dict[str, set[str]] = collections.defaultdict(set)

    def trim(self, trim: OutputTrim) -> None:
        """Trim ``trim.lease``'s session up to ``trim.upto_seq`` at the next renewal."""
        self._trims[trim.worker_id][trim.lease.session_id] = trim

    def active(self, session_id: str) -> None:
        """The session's client was active: its idle TTL counts from the next renewal."""
        self._active[worker_of_session(session_id)].add(session_id)

    @property
    def workers(self) -> set[str]:
        """The workers some duty waits for."""
        return set(self._trims) | set(self._active)

    def take(self, worker_id: str) -> Duties:
        """Everything waiting for ``worker_id``, removed from here."""
        trims = self._trims.pop(worker_id, {})
        return list(trims.values()), sorted(self._active.pop(worker_id, ()))

    def put_back(self, worker_id: str, duties: Duties) -> None:
        """A call that carried ``duties`` failed: keep them for the next one, except the trims
        of sessions that got a newer trim meanwhile."""
        trims, active = duties
        pending = self._trims[worker_id]
        for trim in trims:
            pending.setdefault(trim.lease.session_id, trim)
        if not pending:
            del self._trims[worker_id]
        if active:
            self._active[worker_id].update(active)
