"""Store errors, split by blame.

::

    StoreError                    base of everything this package raises on purpose
    ├── LeaseLost                 the caller's fencing token is stale: a newer attach won
    ├── SessionGone               the session is closed or unknown
    ├── WorkerFenced              this worker was declared lost; it must stop writing
    ├── OutputMismatch            the worker's event numbers disagree with the log (a bug)
    ├── PlacementFailed           no live worker has a free slot (retryable)
    └── StoreUnavailable          Redis could not be reached or answered with an error

A Redis connection error is always re-raised as :class:`StoreUnavailable` ``from`` the cause,
so callers handle one type and the cause stays chained.
"""

from __future__ import annotations

import asyncio
import enum

__all__ = [
    "Gone",
    "LeaseLost",
    "Mismatch",
    "OutputMismatch",
    "PlacementFailed",
    "SessionGone",
    "StoreError",
    "StoreUnavailable",
    "WorkerFenced",
    "raise_if_cancelled",
]


class StoreError(Exception):
    """Base class of the store's errors."""


class LeaseLost(StoreError):
    """The fencing token (epoch, generation) is no longer current."""

    def __init__(self, session_id: str, current_generation: int) -> None:
        super().__init__(f"lease of {session_id} moved to generation {current_generation}")
        self.session_id = session_id
        self.current_generation = current_generation


class Gone(enum.StrEnum):
    """Why a session refused a write as gone."""

    #: Its terminal event is in the log.
    CLOSED = "closed"
    #: It never existed here (or is another tenant's, answered alike).
    UNKNOWN = "unknown"
    #: Its record is of another format (``store/formats.py``): nothing of it is read.
    OTHER_FORMAT = "other_format"
    #: Another worker serves it now (its record's owner epoch is past the writer's:
    #: ``docs/design/hand-over.md``); nothing was written.
    MOVED = "moved"


class Mismatch(enum.StrEnum):
    """How a worker's event numbers disagree with a session's log."""

    #: Events numbered past the log's end, or input applied past the input log's end.
    GAP = "gap"
    #: A resent event differs from the one stored under its number.
    CONFLICT = "conflict"


class SessionGone(StoreError):
    """The session is closed (its terminal event is in the log) or never existed."""

    def __init__(self, session_id: str, status: Gone) -> None:
        super().__init__(f"session {session_id} is {status}")
        self.session_id = session_id
        self.status = status


class WorkerFenced(StoreError):
    """The worker was declared lost; every write it attempts is refused."""


class OutputMismatch(StoreError):
    """The worker's numbering of a session's events disagrees with the log; nothing was written.

    The worker numbers its sessions' events itself, so this is a bug, never a network fault (a
    resend is recognised and skipped): events numbered past the log's end (``gap``), or a
    resent event that differs from the one stored under its number (``conflict``).
    """

    def __init__(self, session_id: str, status: Mismatch, first_seq: int, last_seq: int) -> None:
        super().__init__(f"session {session_id}: {status}: events from seq {first_seq}, the"
                         f" log ends at {last_seq}")
        self.session_id = session_id
        self.status = status
        self.first_seq = first_seq
        self.last_seq = last_seq


class PlacementFailed(StoreError):
    """No live worker with a free slot accepted the session; the client may retry."""


class StoreUnavailable(StoreError):
    """Redis is unreachable or failed the command."""


def raise_if_cancelled() -> None:
    """Raise ``CancelledError`` if the current task is being cancelled.

    redis-py can swallow a cancellation that lands while a command is in flight (the task
    stays "cancelling" but runs on); a loop that retries or polls would then never stop, and a
    shutdown that awaits it would hang. Every store call checks on its way out.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
