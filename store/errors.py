"""Store errors, split by blame.

::

    StoreError                    base of everything this package raises on purpose
    ├── LeaseLost                 the caller's fencing token is stale: a newer attach won
    ├── SessionGone               the session is closed or unknown
    ├── WorkerFenced              this worker was declared lost; it must stop writing
    ├── PlacementFailed           no live worker has a free slot (retryable)
    └── StoreUnavailable          Redis could not be reached or answered with an error

A Redis connection error is always re-raised as :class:`StoreUnavailable` ``from`` the cause,
so callers handle one type and the cause stays chained.
"""

from __future__ import annotations

__all__ = [
    "LeaseLost",
    "PlacementFailed",
    "SessionGone",
    "StoreError",
    "StoreUnavailable",
    "WorkerFenced",
]


class StoreError(Exception):
    """Base class of the store's errors."""


class LeaseLost(StoreError):
    """The fencing token (epoch, generation) is no longer current."""

    def __init__(self, session_id: str, current_generation: int) -> None:
        super().__init__(f"lease of {session_id} moved to generation {current_generation}")
        self.session_id = session_id
        self.current_generation = current_generation


class SessionGone(StoreError):
    """The session is closed (its terminal event is in the log) or never existed."""

    def __init__(self, session_id: str, status: str) -> None:
        super().__init__(f"session {session_id} is {status}")
        self.session_id = session_id
        self.status = status


class WorkerFenced(StoreError):
    """The worker was declared lost; every write it attempts is refused."""


class PlacementFailed(StoreError):
    """No live worker with a free slot accepted the session; the client may retry."""


class StoreUnavailable(StoreError):
    """Redis is unreachable or failed the command."""
