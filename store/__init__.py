"""The only package that talks to Redis: session records, leases, logs, the worker directory.

Shared by the gateway and the inference worker; it imports neither.
"""

from __future__ import annotations

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
