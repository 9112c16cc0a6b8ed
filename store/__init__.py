"""The only package that talks to Redis: session records, leases, logs, the worker directory.

Shared by the gateway and the inference worker; it imports neither.

Scripts go to Redis one of two ways: over the store's own pipelined connection
(``store/script_lane.py``) on one node or Sentinel, or through redis-py on a Cluster. The
optimised lane is single-node/Sentinel only: it has no slot routing, and a Cluster pays
redis-py's per-call cost.

What the two services share without Redis is not here: the log's typed messages, the log
follower and the end reasons are the ``contract`` package; process helpers are ``runtime``.
The names below are loaded on first use (PEP 562), as websockets does: the I/O-free cores
import the store's errors and answers (``store.errors``, ``store.answers``) without loading the
Redis client, and ``from store import Scripts`` still works for the drivers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from store.answers import (
        AbandonStatus,
        AppendResult,
        AttachmentHolder,
        CloseStatus,
        DetachStatus,
        EndedSession,
        Lease,
        OpenStatus,
        OutputAppend,
        Reaped,
        ResumeResult,
        ResumeStatus,
        SessionPolicy,
        TrimStatus,
        WorkerBeat,
        WorkerState,
    )
    from store.client import create_client, is_cluster_url
    from store.errors import (
        Gone,
        LeaseLost,
        Mismatch,
        OutputMismatch,
        PlacementFailed,
        SessionGone,
        StoreError,
        StoreUnavailable,
        WorkerFenced,
    )
    from store.scripts import Scripts

#: Where each public name lives.
_HOMES = {
    "create_client": "store.client",
    "is_cluster_url": "store.client",
    "LeaseLost": "store.errors",
    "OutputMismatch": "store.errors",
    "PlacementFailed": "store.errors",
    "SessionGone": "store.errors",
    "StoreError": "store.errors",
    "StoreUnavailable": "store.errors",
    "WorkerFenced": "store.errors",
    "AppendResult": "store.answers",
    "AttachmentHolder": "store.answers",
    "EndedSession": "store.answers",
    "Lease": "store.answers",
    "OpenStatus": "store.answers",
    "OutputAppend": "store.answers",
    "Reaped": "store.answers",
    "ResumeResult": "store.answers",
    "ResumeStatus": "store.answers",
    "Scripts": "store.scripts",
    "AbandonStatus": "store.answers",
    "CloseStatus": "store.answers",
    "DetachStatus": "store.answers",
    "TrimStatus": "store.answers",
    "WorkerState": "store.answers",
    "Gone": "store.errors",
    "Mismatch": "store.errors",
    "SessionPolicy": "store.answers",
    "WorkerBeat": "store.answers",
}

__all__ = [
    "AbandonStatus",
    "AppendResult",
    "AttachmentHolder",
    "CloseStatus",
    "DetachStatus",
    "EndedSession",
    "Gone",
    "Lease",
    "LeaseLost",
    "Mismatch",
    "OpenStatus",
    "OutputAppend",
    "OutputMismatch",
    "PlacementFailed",
    "Reaped",
    "ResumeResult",
    "ResumeStatus",
    "Scripts",
    "SessionGone",
    "SessionPolicy",
    "StoreError",
    "StoreUnavailable",
    "TrimStatus",
    "WorkerBeat",
    "WorkerFenced",
    "WorkerState",
    "create_client",
    "is_cluster_url",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'store' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
