"""Gateway-level wire messages: the ones that never travel to a worker.

Client envelopes (``session.resume``, ``session.event_ack``) are answered by the gateway from the
session record and the output log (DESIGN.md §2.7); server notices (``session.created``,
``session.resumed``, ``session.replaced``, ``session.resync_required``) are about the connection,
not the conversation, so the gateway writes them itself and they carry no ``server_event_seq``.

Everything else a client sends becomes a typed :data:`contract.messages.Command`, and everything a
worker says is a typed :data:`contract.messages.Event`; the codec renders both kinds of server
message as Realtime JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

from contract.messages import Command

__all__ = [
    "ClientEnvelope",
    "EventAck",
    "Notice",
    "ParsedFrame",
    "ResumeRequest",
    "ResyncRequiredNotice",
    "SessionCreatedNotice",
    "SessionReplacedNotice",
    "SessionResumedNotice",
]

# --------------------------------------------------------------------------- client -> gateway


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeRequest:
    """``session.resume``: re-attach to a live session, as the first message of a connection.

    Attributes:
        session_id: the id from ``session.created``.
        resume_token: the newest token the client holds (rotated on every resume).
        last_received_server_event_seq: the highest ``server_event_seq`` the client has; the
            gateway replays every event after it (0: replay everything still in the log).
        control_id: makes a retried resume idempotent (DESIGN.md §2.7): a retry of a resume
            that landed, under the same id, is accepted and keeps the token it rotated to.
        attempt: which try of this ``control_id`` this is (1, 2, 3, ...; 0: not counted). A
            late copy of an earlier try is refused once a later one attached the session, so
            it cannot take the session from the connection the client now uses.
        event_id: the client's ``event_id``, echoed in errors.
    """

    session_id: str
    resume_token: str
    last_received_server_event_seq: int = 0
    control_id: str | None = None
    attempt: int = 0
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EventAck:
    """``session.event_ack``: the client holds every event up to ``server_event_seq``.

    The gateway trims the output log to it, which is what bounds Redis memory per session.
    """

    server_event_seq: int
    event_id: str | None = None


ClientEnvelope: TypeAlias = ResumeRequest | EventAck


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedFrame:
    """One parsed client frame: exactly one of ``command`` and ``envelope`` is set.

    Attributes:
        command: a typed command for the worker's input log.
        envelope: a message the gateway answers itself.
        client_seq: our extension: the client's sequence number for this frame, used to
            deduplicate commands resent after a crash (exactly once upstream). Only commands
            are deduplicated; on an envelope it is validated and otherwise ignored.
    """

    command: Command | None = None
    envelope: ClientEnvelope | None = None
    client_seq: int | None = None

    def __post_init__(self) -> None:
        if (self.command is None) == (self.envelope is None):
            raise ValueError("ParsedFrame needs exactly one of command and envelope")


# --------------------------------------------------------------------------- gateway -> client


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionCreatedNotice:
    """``session.created``: the first server message of a new session.

    Attributes:
        session_id: the server-allocated id, never reused.
        resume_token: the secret for ``session.resume`` (only its digest is stored).
        lease_generation: the attach generation this connection serves.
        session: the effective Realtime session object (``model``, ``audio``, ...): the
            serving worker's default session; ``id`` and ``object`` are filled in by the codec.
        capabilities: what the session can do (the worker's profile; None: a worker that
            published none, and the field is left out).
    """

    session_id: str
    resume_token: str
    lease_generation: int
    session: dict[str, Any]
    capabilities: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionResumedNotice:
    """``session.resumed``: the resume landed; replayed events follow, then live ones.

    Attributes:
        session_id: the resumed session.
        resume_token: the rotated token; the one presented is no longer valid.
        lease_generation: the new attach generation.
        last_client_seq: the highest ``client_seq`` the input log holds; the client resends
            every command after it.
        replay_from: the ``server_event_seq`` of the first replayed event (the client's last
            received + 1); the replay ends where live delivery begins.
        session: the session's current public session object (the last ``session.updated``
            the worker wrote, else what ``session.created`` showed); None: the store holds
            none (its worker published no profile), left out.
        capabilities: what the session can do, as ``session.created`` said; None: left out.
    """

    session_id: str
    resume_token: str
    lease_generation: int
    last_client_seq: int
    replay_from: int
    session: dict[str, Any] | None = None
    capabilities: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionReplacedNotice:
    """``session.replaced``: another connection resumed this session; this one closes (1000)."""

    session_id: str
    lease_generation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ResyncRequiredNotice:
    """``session.resync_required``: the client's position cannot be replayed; no silent gap.

    Attributes:
        session_id: the session.
        reason: ``log_trimmed`` (events it lacks were trimmed) or ``log_rewound`` (it holds
            events the log lost in a failover).
        replay_from: the ``server_event_seq`` of the next event it gets: its new position
            (below its old one after a rewind, so it must not drop those as seen).
    """

    session_id: str
    reason: str
    replay_from: int


Notice: TypeAlias = (
    SessionCreatedNotice | SessionResumedNotice | SessionReplacedNotice | ResyncRequiredNotice
)
