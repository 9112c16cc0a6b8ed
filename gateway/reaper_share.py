"""Which workers one gateway's reaper visits: each worker goes to ``REAPERS_PER_WORKER`` of the
live gateways, chosen by rendezvous (highest random weight) hashing.

Every gateway reaping every worker costs gateways x workers scripts a pass; sharing them out
makes it workers x ``REAPERS_PER_WORKER``, whatever the number of gateways. The share needs
coverage, not exclusivity: each reap is a compare-and-set, so two gateways reaping one worker
are safe, and while their views of the live gateways differ (one just joined, one just died) a
worker is at worst reaped by one more or one fewer. Rendezvous hashing moves only the workers
of a gateway that joins or leaves. I/O-free: the reaper feeds it the directory it read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["ReaperShare", "reapers_of"]


def _weight(gateway_id: str, worker_id: str) -> int:
    digest = hashlib.blake2b(f"{gateway_id}/{worker_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def reapers_of(worker_id: str, gateways: Sequence[str], count: int) -> tuple[str, ...]:
    """The ``count`` gateways of ``gateways`` that reap ``worker_id`` (all of them when there
    are no more), highest weight first."""
    ranked = sorted(gateways, key=lambda gateway_id: (_weight(gateway_id, worker_id),
                                                      gateway_id), reverse=True)
    return tuple(ranked[:count])


class ReaperShare:
    """One gateway's share of the workers, as of the live gateways it last read.

    Each answer is kept until the list of live gateways changes, so a steady pass costs a
    lookup per worker, not a hash per worker and gateway.
    """

    __slots__ = ("_mine", "count", "gateway_id", "gateways")

    def __init__(self, gateway_id: str, count: int) -> None:
        """``count``: how many gateways reap each worker (at least 1)."""
        if count < 1:
            raise ValueError(f"each worker needs at least one reaper, got {count}")
        self.gateway_id = gateway_id
        self.count = count
        #: The live gateways, as last read (this one among them once it is listed).
        self.gateways: tuple[str, ...] = ()
        self._mine: dict[str, bool] = {}

    def live(self, gateways: Sequence[str]) -> None:
        """The gateways listed live now; this one is counted among them whatever the list
        says (it is live: it is asking)."""
        listed = tuple(sorted({*gateways, self.gateway_id}))
        if listed != self.gateways:
            self.gateways = listed
            self._mine.clear()

    def is_mine(self, worker_id: str) -> bool:
        """Whether this gateway reaps ``worker_id``."""
        mine = self._mine.get(worker_id)
        if mine is None:
            mine = len(self.gateways) <= self.count or self._ranks_high(worker_id)
            self._mine[worker_id] = mine
        return mine

    def _ranks_high(self, worker_id: str) -> bool:
        """Whether fewer than ``count`` gateways outrank this one for ``worker_id`` (as
        :func:`reapers_of` orders them). The scan stops at the ``count``-th that does, so a
        gateway that is not a reaper of the worker, most of them, weighs a few, not all: the
        pass after the live list changes stays short on the event loop."""
        own = (_weight(self.gateway_id, worker_id), self.gateway_id)
        higher = 0
        for gateway_id in self.gateways:
            if (_weight(gateway_id, worker_id), gateway_id) > own:
                higher += 1
                if higher == self.count:
                    return False
        return True

    def forget(self, worker_id: str) -> None:
        """``worker_id`` left the directory: drop what was kept about it."""
        self._mine.pop(worker_id, None)
