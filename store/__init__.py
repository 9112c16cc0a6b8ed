"""The only package that talks to Redis: session records, leases, logs, the worker directory.

Shared by the gateway and the inference worker; it imports neither.

The names below are loaded on first use (PEP 562), as websockets does: the I/O-free cores
import the store's contract (``store.messages``, ``store.follower``, ``store.errors``) without
loading the Redis client, and ``from store import Scripts`` still works for the drivers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from store.client import create_client, is_cluster_url
    from store.errors import (
        LeaseLost,
        OutputMismatch,
        PlacementFailed,
        SessionGone,
        StoreError,
        StoreUnavailable,
        WorkerFenced,
    )
    from store.follower import LogFollower
    from store.scripts import (
        AppendResult,
        AttachmentHolder,
        EndedSession,
        Lease,
        OpenStatus,
        OutputAppend,
        Reaped,
        ResumeResult,
        ResumeStatus,
        Scripts,
        SessionPolicy,
        WorkerBeat,
    )

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
    "LogFollower": "store.follower",
    "AppendResult": "store.scripts",
    "AttachmentHolder": "store.scripts",
    "EndedSession": "store.scripts",
    "Lease": "store.scripts",
    "OpenStatus": "store.scripts",
    "OutputAppend": "store.scripts",
    "Reaped": "store.scripts",
    "ResumeResult": "store.scripts",
    "ResumeStatus": "store.scripts",
    "Scripts": "store.scripts",
    "SessionPolicy": "store.scripts",
    "WorkerBeat": "store.scripts",
}

__all__ = [
    "AppendResult",
    "AttachmentHolder",
    "EndedSession",
    "Lease",
    "LeaseLost",
    "LogFollower",
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
    "WorkerBeat",
    "WorkerFenced",
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
