"""What a gateway's lease renewal on one worker carries for the sessions it serves there
(``store/lua/gateway_lease.lua``): their output trims and their clients' activity, so the
housekeeping costs one call per (gateway, worker) and renewal period, whatever the number of
sessions. The arguments and the answer of that call; ``Scripts.renew_attachment_lease`` sends it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from store.answers import AttachmentHolder, Lease, TrimStatus
from store.keys import SessionKeys, WorkerKeys, worker_of_session

__all__ = ["LeaseRenewal", "OutputTrim", "lease_call"]


@dataclass(frozen=True, slots=True)
class OutputTrim:
    """Drop a session's output up to ``upto_seq`` (what its client acknowledged or took long
    ago), fenced on ``lease``."""

    lease: Lease
    upto_seq: int

    @property
    def worker_id(self) -> str:
        """The worker whose slot holds the session's keys."""
        return worker_of_session(self.lease.session_id)


@dataclass(frozen=True, slots=True)
class LeaseRenewal:
    """What one renewal did: when the lease now ends (ms, Redis clock; 0 when it renewed none)
    and each trim's outcome, in the order they were asked."""

    until_ms: int
    trims: tuple[TrimStatus, ...]

    @classmethod
    def parse(cls, answer: Any) -> LeaseRenewal:
        until_ms, statuses = answer
        return cls(until_ms=int(until_ms), trims=tuple(
            TrimStatus(s.decode() if isinstance(s, bytes) else str(s)) for s in statuses))


def lease_call(worker_id: str, holder: AttachmentHolder | None, trims: Sequence[OutputTrim],
               active: Sequence[str]) -> tuple[list[str], list[Any]]:
    """The keys and arguments of one renewal on ``worker_id`` (``holder`` None: renew no lease,
    only trim and mark). Every session named must be one of that worker's: one hash slot.

    Raises:
        ValueError: a session of another worker, or not a session id.
    """
    keys = [WorkerKeys(worker_id).gateways]
    args: list[Any] = ["" if holder is None else holder.gateway_id,
                       0 if holder is None else holder.lease_ms, len(trims)]
    for trim in trims:
        k = _keys_on(worker_id, trim.lease.session_id)
        keys += [k.record, k.output_log]
        args += [trim.lease.epoch, trim.lease.generation, trim.upto_seq, trim.lease.tenant]
    keys += [_keys_on(worker_id, session_id).record for session_id in active]
    return keys, args


def _keys_on(worker_id: str, session_id: str) -> SessionKeys:
    if worker_of_session(session_id) != worker_id:
        raise ValueError(f"{session_id} is not a session of {worker_id}")
    return SessionKeys(session_id)
