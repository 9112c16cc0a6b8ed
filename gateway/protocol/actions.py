"""What :class:`~gateway.protocol.connection.ConnectionCore` asks its driver to do.

Each action is a typed, frozen value; the driver runs them in the order decided and answers
the ones that ask a question (an open, a resume, a read) with the core's matching input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from contract.messages import Command
from contract.reasons import CloseReason
from gateway.protocol.envelope import ResumeRequest

__all__ = [
    "Action",
    "AppendCommands",
    "CheckLogEnd",
    "CloseConnection",
    "DetachLease",
    "EndSession",
    "FetchLog",
    "GiveUpSession",
    "OpenSession",
    "ResumeSession",
    "SendFrame",
    "TrimLog",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class SendFrame:
    """Send one text frame to the client; ``seq`` is the ``server_event_seq`` of the log
    event it carries (0: one of the gateway's own frames)."""

    text: str
    seq: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CloseConnection:
    """Close the websocket; nothing is sent after this."""

    code: int
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenSession:
    """Place a new session on a worker serving ``model`` (None: the deployment's default);
    answer with :meth:`ConnectionCore.open_succeeded` or :meth:`ConnectionCore.open_failed`."""

    model: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeSession:
    """Resume; answer with :meth:`ConnectionCore.resume_answered` (the store's answer) or
    :meth:`ConnectionCore.fail` (no answer)."""

    request: ResumeRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendCommands:
    """Append commands to the input log under the current lease (fenced)."""

    entries: tuple[tuple[int | None, Command], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchLog:
    """Read output entries after ``after_seq`` and feed them to :meth:`ConnectionCore.log_read`.

    ``rewound_to``: the log was found to end there, behind what was delivered; these entries
    are the ones around it, re-read to find where the log differs from what was sent.
    """

    after_seq: int
    rewound_to: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckLogEnd:
    """A poll found nothing after ``after_seq``: read where the output log ends, and answer
    with :meth:`ConnectionCore.log_end_read` (a lossy failover may have taken it back behind
    what was delivered, which no read after ``after_seq`` can show)."""

    after_seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TrimLog:
    """The client acknowledged every event up to ``upto_seq``: the log may drop them."""

    upto_seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DetachLease:
    """The client vanished without ``session.close``: start the disconnect grace (the short
    one when it closed its socket normally, ``departed``)."""

    generation: int
    departed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class GiveUpSession:
    """End a session this connection opened for its URL and the client never used (it resumed
    another instead): its slot and tenant place are released, and it gets its one terminal
    event (``open_abandoned``)."""

    session_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EndSession:
    """End ``session_id`` for ``reason`` (its terminal event says so), then catch up with the
    log's terminal event."""

    session_id: str
    reason: CloseReason


Action: TypeAlias = (
    SendFrame | CloseConnection | OpenSession | ResumeSession | AppendCommands | FetchLog
    | CheckLogEnd | TrimLog | DetachLease | GiveUpSession | EndSession
)
