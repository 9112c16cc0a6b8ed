"""What the store's scripts answer: the typed values and enums ``store/scripts.py`` returns.

Every status a script can answer is a member of one of these enums (their values are the
scripts' own words), and every answer with more than a status is a frozen dataclass, so a
caller matches on members, never on strings. :func:`reply_text` reads a reply's text,
:func:`json_argument` writes a JSON object as an argument.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass

from contract.messages import JsonObject

__all__ = [
    "DEFAULT_ATTACHMENT_LEASE_MS",
    "AbandonStatus",
    "AppendResult",
    "AttachmentHolder",
    "CheckpointFields",
    "CloseStatus",
    "DetachStatus",
    "EndedSession",
    "Lease",
    "OpenStatus",
    "OutputAppend",
    "Reaped",
    "ResumeResult",
    "ResumeStatus",
    "SessionPolicy",
    "TenantStatus",
    "TrimStatus",
    "WorkerBeat",
    "WorkerState",
    "json_argument",
    "reply_text",
]


def reply_text(value: object) -> str:
    """A reply (bytes from the store's own connections, str from a decoding client) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def json_argument(value: JsonObject | None) -> str:
    """A JSON object as a script argument ('' for None)."""
    return "" if value is None else json.dumps(value, separators=(",", ":"), allow_nan=False)


class OpenStatus(enum.StrEnum):
    """Outcome of placing a session on one worker."""

    OK = "ok"
    ABANDONED = "abandoned"
    EXISTS = "exists"
    UNAVAILABLE = "unavailable"
    FULL = "full"
    #: The worker does not serve the model name the open asked for.
    OTHER_MODEL = "other_model"


class ResumeStatus(enum.StrEnum):
    """Outcome of a resume compare-and-set."""

    OK = "ok"
    CLOSED = "closed"
    UNKNOWN = "unknown"
    BAD_TOKEN = "bad_token"
    #: An earlier attempt of a resume whose later attempt attached the session already.
    STALE = "stale"
    #: The session record is of another format (``store/formats.py``): nothing of it is read.
    OTHER_FORMAT = "other_format"


class DetachStatus(enum.StrEnum):
    """Outcome of a detach (the disconnect grace starts, fenced on the lease)."""

    #: Detached, or detached already under this lease (the grace keeps its start).
    OK = "ok"
    #: A newer attach holds the session: this lease may not detach it.
    STALE = "stale"
    CLOSED = "closed"
    #: No such session, or another tenant's.
    UNKNOWN = "unknown"
    OTHER_FORMAT = "other_format"


class TrimStatus(enum.StrEnum):
    """Outcome of an output trim (the client acknowledged events up to a seq)."""

    OK = "ok"
    STALE = "stale"
    UNKNOWN = "unknown"
    #: The acknowledged seq is past the log's end (the log went back in a failover, and the
    #: numbers now name events the client has not seen): nothing was trimmed.
    AHEAD = "ahead"
    OTHER_FORMAT = "other_format"


class CloseStatus(enum.StrEnum):
    """Outcome of closing a session from outside its worker."""

    #: This call ended it.
    OK = "ok"
    #: It had ended already.
    CLOSED = "closed"
    UNKNOWN = "unknown"
    OTHER_FORMAT = "other_format"


class AbandonStatus(enum.StrEnum):
    """Outcome of abandoning an open whose outcome the gateway does not know."""

    #: The open had landed: this call closed the session.
    CLOSED_OPEN = "closed_open"
    #: The open had not landed: a tombstone now refuses it.
    TOMBSTONED = "tombstoned"
    ALREADY_CLOSED = "already_closed"
    OTHER_FORMAT = "other_format"


class TenantStatus(enum.StrEnum):
    """Outcome of counting a session against its tenant's cap."""

    OK = "ok"
    #: The tenant is at its cap: the session was not counted.
    FULL = "full"
    #: A renewal of a place that was released already (the session ended): not taken back.
    RELEASED = "released"


class WorkerState(enum.StrEnum):
    """A worker's state as its record holds it, or as a reap or heartbeat found it."""

    #: Beating and taking new sessions.
    LIVE = "live"
    #: Beating, serving its sessions, not taking new ones until a later beat says so.
    BUSY = "busy"
    #: Serving its sessions, never taking new ones again.
    DRAINING = "draining"
    #: Declared lost: fenced for good.
    LOST = "lost"
    #: Declared lost, and still the home of sessions other workers took over: its slot holds
    #: their leases and deadlines, so the reapers visit it on (docs/design/hand-over.md).
    HOME = "home"
    #: No record (a reap of a worker whose record is gone).
    UNKNOWN = "unknown"
    #: A record of another format (``store/formats.py``): neither read nor written.
    OTHER_FORMAT = "other_format"


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """The fencing token of one attachment: (store epoch, generation) of one session, held by
    ``tenant`` (every fenced script checks the tenant too: a session is its opener's)."""

    session_id: str
    epoch: str
    generation: int
    tenant: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionPolicy:
    """Per-session limits written into the record at open (so every reaper agrees). No field
    has a default: each is a gateway setting's value (``gateway/settings.py``), the one place
    its default lives."""

    disconnect_grace_ms: int
    idle_ttl_ms: int
    output_log_max_entries: int
    input_log_max_entries: int
    #: Bytes of Redis memory a session's input log may take (0: no bound).
    input_log_max_bytes: int
    closed_retention_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeResult:
    """What a resume found: the new lease, where the output log stands, and (with ``OK`` and
    ``CLOSED`` only) the session's current public session object and its capabilities, as
    the record holds them (None: its open stored none, its worker having published no
    profile)."""

    status: ResumeStatus
    lease: Lease | None
    last_client_seq: int
    last_server_event_seq: int
    first_retained_seq: int
    session: JsonObject | None = None
    capabilities: JsonObject | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendResult:
    """A fenced input append: how many entries were new, the highest client seq, and the
    input log's last index after it (its new entries end there).

    ``backlog_full``: the session's unread input was at the cap, so none of the entries was
    appended (``appended`` 0, ``last_client_seq`` as before: they may be sent again once the
    worker caught up). The store never drops input the worker has not read.
    """

    appended: int
    last_client_seq: int
    last_index: int = 0
    backlog_full: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointFields:
    """A checkpoint written by the append that carries the events it reflects, the last of
    them its event (``store/checkpoints.py`` has the fields' meaning): taken at a response's
    end, where a client's next turn may follow before any later call.

    Attributes:
        applied: the ID of the last input entry the state reflects.
        keep: the ID of the oldest input entry an adopter reads back.
        core: the conversation core's state, encoded.
    """

    applied: str
    keep: str
    core: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputAppend:
    """One session's part of :meth:`Scripts.append_output_many`.

    Attributes:
        session_id: the session, placed on the calling worker.
        events: encoded events, in order.
        first_seq: the ``server_event_seq`` of ``events[0]``. The worker numbers its sessions'
            events itself (it is their only writer until the end), so a resend after a lost
            reply, or a retry that adds events, stores each event once. 0: after whatever the
            log holds (not safe to resend).
        close_reason: end the session after the events with ``session.closed`` this reason
            (a :class:`~contract.reasons.CloseReason`, or a client's own ``session.close``
            reason).
        input_trim_to: trim the session's input log to this index (the worker applied the
            commands before it; the entry itself is kept: 0, leave the log alone).
        input_trim_fence: the fence that entry was written under (its ID is
            ``<fence>-<index>``, see ``store/lua/prelude.lua``).
        output_log_max_entries: the session's output log bound (its record's, which the
            worker read when it adopted the session); None: the script reads it from the
            record, one read more.
        session: the session object of the newest ``session.updated`` among ``events``, stored
            in the record with them (what a resume announces); None: leave it.
        top_known_at: :attr:`Scripts.route_changes` when an append of this session that
            ended just before ``first_seq`` was answered (None: not known). While it stays
            the same, the append skips reading the log's end (``store/output_appends.py``).
        owner_epoch: the owner epoch the worker serves the session under (1 from its open;
            each hand-over adds one): under another than the record's, nothing is written
            (``Gone.MOVED``).
        checkpoint: the session's checkpoint after ``events`` (which it needs), written
            with them; None: none.
    """

    session_id: str
    events: Sequence[bytes]
    first_seq: int = 0
    close_reason: str | None = None
    input_trim_to: int = 0
    input_trim_fence: int = 0
    output_log_max_entries: int | None = None
    session: JsonObject | None = None
    top_known_at: int | None = None
    owner_epoch: int = 1
    checkpoint: CheckpointFields | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EndedSession:
    """A session that ended, handed to one reaper so that its tenant place is released."""

    tenant: str
    session_id: str

    @classmethod
    def parse_all(cls, entries: Sequence[object]) -> list[EndedSession]:
        """The ``'<tenant> <session id>'`` entries of a worker's ended list, as a reap took
        them."""
        ended = []
        for entry in entries:
            text = entry.decode() if isinstance(entry, bytes) else str(entry)
            tenant, _, session_id = text.partition(" ")
            ended.append(cls(tenant=tenant, session_id=session_id))
        return ended


@dataclass(frozen=True, slots=True, kw_only=True)
class Reaped:
    """What one reap of one worker did.

    Attributes:
        state: the worker's state.
        ended: sessions this call ended (worker lost, grace or idle expiry).
        released: sessions that ended anywhere since a reaper last asked; the caller releases
            their tenant places (no other reaper gets them).
        detached: sessions detached because their gateway's attachment lease lapsed.
        outage_ms: how long no reaper had reached the worker's slot, when this call ended
            such an outage (0: none); the worker, its gateways and clients got time from now.
        settled: a lost worker had no session left to end when this reap began: its keys
            are gone, and no reaper needs to visit it again.
        moved: sessions of a lost worker this call moved to live workers instead of ending
            them (``store/replacement.py``).
    """

    state: WorkerState
    ended: int
    released: tuple[EndedSession, ...] = ()
    detached: int = 0
    outage_ms: int = 0
    settled: bool = True
    moved: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class AttachmentHolder:
    """A gateway process as the holder of attachment leases: the sessions it attaches are its
    until its lease on their worker lapses (renewed in bulk, one call per worker)."""

    gateway_id: str
    lease_ms: int


#: A gateway's attachment lease unless its settings say otherwise (``ATTACH_LEASE_S`` takes
#: its default from here), and what a reaper assumes a lapsed gateway had.
DEFAULT_ATTACHMENT_LEASE_MS = 5_000



@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerBeat:
    """A worker heartbeat's answer."""

    state: WorkerState
    alive_until_ms: int

