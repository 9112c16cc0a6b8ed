"""A Python client for the gateway: typed commands in, typed events out, resume built in.

Method names follow the seed's ``DuplexSessionHandle`` (``append_audio``, ``append_text``,
``commit``, ``create_response``, ``cancel_input``, ``cancel_response``, ``barge_in``,
``signal_turn``, ``ack_playback``, ``close``, ``events()``); each is :meth:`DuplexClient.submit`
of one typed command of :mod:`gateway.client_commands`.

Exactly once, both directions, across lost connections:

* **Upstream.** Every command carries ``client_seq`` 1, 2, 3, ... and stays in a resend buffer.
  ``session.resumed`` reports the highest ``client_seq`` the input log holds; the client resends
  everything after it, in order, and the store drops anything it already has.
* **Downstream.** The client remembers the highest ``server_event_seq`` it handed out, resumes
  from it, and drops any event at or below it.

Two ways to read:

* :meth:`DuplexClient.events` keeps the session going by itself. On a dropped connection (no
  close frame) or a close with 1011, 1012 or 1013 it reconnects (to the next of its URLs, with
  jittered exponential backoff), resumes with one ``control_id`` kept across that resume's
  retries, resends what the gateway lacks and yields a :class:`Resumed` marker where the resume
  happened. It ends after the session's terminal event, and raises a
  :class:`DuplexClientError` only when no retry can help (see :class:`ResumeRefused`,
  :class:`SessionReplaced`, :class:`RetriesExhausted`).
* :meth:`DuplexClient.recv` is the low-level call: the next event of the current connection,
  raising ``ConnectionClosed`` when it drops; :meth:`DuplexClient.resume` is then one resume.

Ending: :meth:`DuplexClient.close` asks the session to end and :meth:`DuplexClient.wait_closed`
waits for its terminal event (see there for who reads the events meanwhile);
:meth:`DuplexClient.detach` only closes the connection, leaving the session resumable. Leaving
``async with`` closes the session, as the seed's handle does.

Example (push-to-talk: a new session starts with OpenAI's ``server_vad``, which answers the
turns it hears by itself; ``turn_detection: null`` leaves committing and answering to the
client)::

    urls = ["ws://gw-a/v1/realtime", "ws://gw-b/v1/realtime"]
    push_to_talk = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    async with await DuplexClient.connect(urls, session=push_to_talk) as client:
        await client.submit(AppendAudio(pcm))
        await client.submit(CommitInput())
        await client.submit(CreateResponse())
        async for event in client.events():
            if isinstance(event, Resumed):
                continue  # nothing lost: the events go on where they stopped
            if event.type == "response.done":
                break
    # here the session is closed: session.close went out and session.closed came back
"""

from __future__ import annotations

import asyncio
import base64
import enum
import itertools
import json
import random
import secrets
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import (
    ConnectionClosed,
    InvalidMessage,
    InvalidStatus,
)
from websockets.protocol import State

from gateway.client_commands import (
    AckEvents,
    AckPlayback,
    AppendAudio,
    AppendText,
    BargeIn,
    CancelInput,
    CancelResponse,
    ClearInput,
    ClearOutputAudio,
    ClientCommand,
    CloseSession,
    CommitInput,
    CreateItem,
    CreateResponse,
    DeleteItem,
    Heartbeat,
    RetrieveItem,
    SignalTurn,
    TruncateItem,
    UpdateSession,
)

__all__ = [
    "AckEvents",
    "AckPlayback",
    "AppendAudio",
    "AppendText",
    "BargeIn",
    "CancelInput",
    "CancelResponse",
    "ClearInput",
    "ClearOutputAudio",
    "ClientCommand",
    "ClientSettings",
    "CloseSession",
    "CommitInput",
    "CreateItem",
    "CreateResponse",
    "DeleteItem",
    "DuplexClient",
    "DuplexClientError",
    "Heartbeat",
    "RealtimeEvent",
    "ResumeRefused",
    "Resumed",
    "RetriesExhausted",
    "RetrieveItem",
    "SessionReplaced",
    "SignalTurn",
    "TruncateItem",
    "UpdateSession",
]

_TERMINAL = frozenset({"session.closed", "session.expired"})
#: The events whose ``session`` is the session object :attr:`DuplexClient.session` shows.
_SESSION_OBJECT_EVENTS = frozenset({"session.created", "session.updated", "session.resumed"})
_FATAL_RESUME_CODES = frozenset({
    "session_resume_expired", "invalid_resume_token", "invalid_session_resume",
    "unsupported_session_resume", "session_resume_conflict",
})
#: Close codes after which the session is still there to resume: a gateway or store failure
#: (1011), a draining gateway (1012), try again later (1013).
_RETRYABLE_CLOSE_CODES = frozenset({1011, 1012, 1013})
#: Refusals of an open that say "later", not "no": nothing was opened, so opening again is safe.
_TRY_LATER_CODES = frozenset({"resource_exhausted", "rate_limit_exceeded"})
#: Error answers to a resume that another attempt can cure; every other code is final.
_RETRYABLE_RESUME_CODES = _TRY_LATER_CODES | {"internal_error"}
_REPLACED_CLOSE_CODE = 1000


class DuplexClientError(Exception):
    """The gateway refused the session (open or resume), or the session is over for this client.

    Attributes:
        code: the ``error.code`` the gateway sent, or a client-side code
            (``session_replaced``, ``resend_buffer_overflow``); None when there was none.
        close_code: the websocket close code that ended the connection, None when the socket
            dropped without a close frame or the refusal came as an ``error`` event.
    """

    def __init__(self, message: str, *, code: str | None = None,
                 close_code: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.close_code = close_code


class ResumeRefused(DuplexClientError):
    """The gateway refused a resume for good: the session ended or is unknown
    (``session_resume_expired``), the token is void (``invalid_resume_token``), or the request
    is malformed (``invalid_session_resume``)."""


class SessionReplaced(DuplexClientError):
    """Another connection resumed this session (``session.replaced``); this client is done."""


class RetriesExhausted(DuplexClientError):
    """Every attempt failed, or the retry deadline passed; ``code`` and ``close_code`` are the
    last attempt's, ``attempts`` how many connections were tried."""

    def __init__(self, message: str, *, attempts: int, code: str | None = None,
                 close_code: int | None = None) -> None:
        super().__init__(message, code=code, close_code=close_code)
        self.attempts = attempts


@dataclass(frozen=True, slots=True)
class RealtimeEvent:
    """One server event: its ``type``, its ``server_event_seq`` (None for connection-level
    notices such as ``session.created``) and the whole JSON object."""

    type: str
    server_event_seq: int | None
    data: dict[str, Any] = field(repr=False)

    @property
    def audio(self) -> bytes:
        """The decoded audio of a ``response.output_audio.delta``."""
        return base64.b64decode(self.data.get("delta", ""))


@dataclass(frozen=True, slots=True)
class Resumed(RealtimeEvent):
    """The marker :meth:`DuplexClient.events` yields where it resumed the session: the
    ``session.resumed`` answer (type ``session.resumed``, no ``server_event_seq``), plus how
    the client got there. The events after it continue those before it, with no gap and no
    duplicate (a gap the server cannot fill is a ``session.resync_required`` event next)."""

    #: The gateway URL the session was resumed through.
    url: str = ""
    #: Connections tried for this resume (1: the first one worked).
    attempts: int = 1
    #: What ended the previous connection: ``dropped`` (no close frame), ``closed 1012``, ...;
    #: empty for a resume the caller asked for.
    after: str = ""

    @property
    def replay_from(self) -> int:
        """The ``server_event_seq`` the replay starts at."""
        return int(self.data["replay_from"])

    @property
    def last_client_seq(self) -> int:
        """The highest ``client_seq`` the input log held; the commands after it were resent."""
        return int(self.data["last_client_seq"])


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How :meth:`DuplexClient.events` (and ``connect(retry_open=True)``) retries.

    The defaults fit the gateway's: a detached session is kept ``DISCONNECT_GRACE_S`` (30 s),
    so retrying longer than that cannot succeed.
    """

    #: Connection attempts after the first one, per outage (or per open): enough that
    #: ``retry_deadline_s`` ends the tries first, also through a Redis Cluster failover
    #: (cluster-node-timeout, 15 s by default, plus the election).
    max_retries: int = 20
    #: Give up an outage this long after it began.
    retry_deadline_s: float = 30.0
    #: The first backoff ceiling; it doubles per retry up to ``backoff_cap_s``.
    backoff_base_s: float = 0.05
    backoff_cap_s: float = 2.0
    #: One attempt: the websocket handshake plus the gateway's first answer.
    attempt_timeout_s: float = 10.0
    #: While :meth:`DuplexClient.events` runs, a ``session.heartbeat`` goes out whenever
    #: nothing was sent for this long, so a client that only listens keeps its session from
    #: the gateway's ``IDLE_TTL_S`` (300 s); None: never.
    heartbeat_interval_s: float | None = 10.0
    #: Leaving ``async with``: wait this long for the session's terminal event after
    #: ``session.close`` (a resume included, when the connection was gone).
    close_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if min(self.retry_deadline_s, self.attempt_timeout_s, self.close_timeout_s) <= 0:
            raise ValueError("retry_deadline_s, attempt_timeout_s and close_timeout_s must be > 0")
        if not 0 < self.backoff_base_s <= self.backoff_cap_s:
            raise ValueError("need 0 < backoff_base_s <= backoff_cap_s")
        if self.heartbeat_interval_s is not None and self.heartbeat_interval_s <= 0:
            raise ValueError("heartbeat_interval_s must be > 0 (or None: no heartbeats)")

    def backoff_s(self, retry: int, jitter: float) -> float:
        """The pause before retry ``retry`` (0 for the first), ``jitter`` in [0, 1).

        "Full jitter": uniform below a ceiling that doubles per retry, so the clients a gateway
        dropped all at once do not all come back at once.
        """
        ceiling = min(self.backoff_cap_s, self.backoff_base_s * 2.0 ** min(retry, 62))
        return ceiling * jitter


class _FailureKind(enum.Enum):
    UNREACHABLE = "unreachable"  # the handshake never completed: nothing reached the gateway
    HTTP = "http"  # the gateway answered the upgrade with an HTTP status
    CLOSED = "closed"  # an open websocket dropped or was closed
    REFUSED = "refused"  # the gateway answered with an ``error`` event


@dataclass(frozen=True, slots=True)
class _Failure:
    """Why one connection attempt, or a connection, failed."""

    kind: _FailureKind
    reason: str
    code: str | None = None
    close_code: int | None = None
    http_status: int | None = None


class _NoAnswer(TimeoutError):
    """The handshake worked and the first frame went out, but no answer came in time: as
    ambiguous as a connection dropped at that point."""


def _failure_of(exc: Exception) -> _Failure:
    if isinstance(exc, _NoAnswer):
        return _Failure(_FailureKind.CLOSED, "no answer")
    if isinstance(exc, ConnectionClosed):
        close_code = exc.rcvd.code if exc.rcvd is not None else None
        reason = "dropped" if close_code is None else f"closed {close_code}"
        return _Failure(_FailureKind.CLOSED, reason, close_code=close_code)
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        return _Failure(_FailureKind.HTTP, f"http {status}", http_status=status)
    if isinstance(exc, DuplexClientError):
        return _Failure(_FailureKind.REFUSED, f"refused: {exc.code}", code=exc.code,
                        close_code=exc.close_code)
    return _Failure(_FailureKind.UNREACHABLE, f"unreachable: {exc!r}")


def _http_may_retry(status: int | None) -> bool:
    # 503 while a gateway drains or its Redis is away; 429 from a balancer. A 401 is final.
    return status is not None and (status >= 500 or status == 429)


def _resume_may_retry(failure: _Failure) -> bool:
    """Whether another resume attempt can succeed after ``failure``."""
    if failure.kind is _FailureKind.REFUSED:
        return failure.code in _RETRYABLE_RESUME_CODES
    if failure.kind is _FailureKind.HTTP:
        return _http_may_retry(failure.http_status)
    if failure.kind is _FailureKind.CLOSED:
        return failure.close_code is None or failure.close_code in _RETRYABLE_CLOSE_CODES
    return True


def _open_may_retry(failure: _Failure) -> bool:
    """Whether opening again is safe and may succeed: only when nothing can have been opened.
    A connection that drops after the ``session.update`` went out may have opened a session;
    a second open would leave that one orphaned, so that is the caller's call."""
    if failure.kind is _FailureKind.REFUSED:
        return failure.code in _TRY_LATER_CODES
    if failure.kind is _FailureKind.HTTP:
        return _http_may_retry(failure.http_status)
    return failure.kind is _FailureKind.UNREACHABLE


def _as_client_error(exc: Exception, failure: _Failure) -> DuplexClientError:
    if isinstance(exc, DuplexClientError):
        return exc
    return DuplexClientError(f"connection failed: {failure.reason}", code=failure.code,
                             close_code=failure.close_code)


#: What a failed attempt may raise: everything else is a bug, not a connection problem.
_ATTEMPT_ERRORS = (OSError, InvalidMessage, InvalidStatus, ConnectionClosed, DuplexClientError)
_Attempt = Callable[[str, float], Awaitable[tuple[ClientConnection, dict[str, Any]]]]


@dataclass(frozen=True, slots=True)
class _Connected:
    """A connection the gateway answered: its first answer, where, after how many tries."""

    ws: ClientConnection
    answer: dict[str, Any]
    url: str
    attempts: int


class _ClientClosing(Exception):
    """:meth:`DuplexClient.detach` was called while a reconnection was under way."""


async def _recv_json(ws: ClientConnection) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(await ws.recv())
    return data


async def _first_answer(ws: ClientConnection, first: dict[str, Any],
                        timeout: float) -> dict[str, Any]:
    """Send ``first`` and read the gateway's answer; the socket is aborted on any failure (a
    cancellation included), so an attempt never leaks one."""
    try:
        await ws.send(json.dumps(first))
        try:
            return await asyncio.wait_for(_recv_json(ws), timeout)
        except TimeoutError:
            raise _NoAnswer(f"no answer within {timeout} s") from None
    except BaseException:
        ws.transport.abort()
        raise


def _refusal(answer: dict[str, Any], what: str) -> DuplexClientError:
    """The exception for an answer that is not the one hoped for (an ``error`` event)."""
    code = answer.get("error", {}).get("code")
    if what == "resume" and code not in _RETRYABLE_RESUME_CODES:
        return ResumeRefused(f"resume refused: {answer}", code=code)
    return DuplexClientError(f"{what} refused: {answer}", code=code)


class DuplexClient:
    """One session, possibly spanning several websocket connections.

    Args:
        url: one gateway URL (a load balancer) or a list of gateway URLs; a reconnection goes
            to the next one in turn.
        api_key: sent as ``Authorization: Bearer``.
        resend_buffer: commands kept for resending (a resume that finds more missing than
            this raises ``resend_buffer_overflow`` rather than leave a silent gap).
        settings: retries, backoff and heartbeats (:class:`ClientSettings`).
        jitter: the backoff's random source, a callable returning a float in [0, 1)
            (default :func:`random.random`); a test passes a seeded one.
    """

    def __init__(self, url: str | Sequence[str], *, api_key: str | None = None,
                 resend_buffer: int = 4096, settings: ClientSettings | None = None,
                 jitter: Callable[[], float] | None = None) -> None:
        self.urls: tuple[str, ...] = (url,) if isinstance(url, str) else tuple(url)
        if not self.urls:
            raise ValueError("at least one gateway URL is needed")
        #: The URL of the current (or last) connection.
        self.url = self.urls[0]
        self.api_key = api_key
        self.settings = settings or ClientSettings()
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.generation = 0
        #: The highest server_event_seq handed to the caller.
        self.last_seq = 0
        #: The session's terminal event (``session.closed`` / ``.expired``) was received.
        self.closed = False
        self._ws: ClientConnection | None = None
        self._url_index = 0
        self._jitter = jitter or random.random
        self._client_seq = 0
        self._unconfirmed: deque[tuple[int, str]] = deque(maxlen=resend_buffer)
        # Commands are numbered, buffered and sent under one lock, and a resume's resends
        # hold it too: client_seq reaches the gateway in order (the store drops a lower one).
        self._send_lock = asyncio.Lock()
        self._last_sent_at = 0.0
        self._last_error_code: str | None = None
        self._closing = False
        self._terminal: DuplexClientError | None = None
        self._heartbeats: asyncio.Task[None] | None = None
        self._close_reason: str | None = None
        self._session_object: dict[str, Any] = {}
        self._capabilities: dict[str, Any] = {}
        # Who reads the events: open events() iterators, pending recv() calls and a draining
        # wait_closed() each count one; wait_closed() reads by itself only when none does.
        self._readers = 0
        # Set (and replaced) whenever the readers or the session's outcome change: what
        # wait_closed() waits on while someone else reads.
        self._changed = asyncio.Event()
        # wait_closed()'s own reading, a task so that a reader arriving later can stop it.
        self._drain: asyncio.Task[None] | None = None
        # A resume is under way: not a point at which reading can be handed over.
        self._recovering = False

    @property
    def close_reason(self) -> str | None:
        """The ``reason`` of the session's terminal event (``session.closed`` /
        ``.expired``); None while it has not been received."""
        return self._close_reason

    @property
    def capabilities(self) -> Mapping[str, Any]:
        """What the session can do (the seed's ``DuplexCapabilities``: ``supports_barge_in``,
        ``supports_playback_ack``, ``chunk_period_ms``, ...), as ``session.created`` and
        ``session.resumed`` announce it: branch on these, not on a model's name. A read-only
        view; empty before the session was opened, or when its worker announced none."""
        return MappingProxyType(self._capabilities)

    @property
    def session(self) -> Mapping[str, Any]:
        """The session object of the last ``session.updated`` (or, before one, of
        ``session.created`` / ``.resumed``), with every default filled in (``audio``,
        ``turn_detection``, ``extra_body``, ...). A read-only view; empty before the session
        was opened."""
        return MappingProxyType(self._session_object)

    # ------------------------------------------------------------------ connecting

    @classmethod
    async def connect(cls, url: str | Sequence[str], *, session: dict[str, Any] | None = None,
                      api_key: str | None = None, retry_open: bool = False,
                      settings: ClientSettings | None = None,
                      jitter: Callable[[], float] | None = None) -> DuplexClient:
        """Open a new session; ``session`` is the initial ``session.update`` payload.

        ``retry_open``: when the gateway is unreachable, answers 5xx, or refuses with 1013
        (``resource_exhausted``, ``rate_limit_exceeded``), try again (the next URL, with
        backoff, per ``settings``) instead of raising at once. Off by default, so a refusal
        reaches the caller at once.

        Raises:
            DuplexClientError: the open was refused (``code``), or every retry failed
                (:class:`RetriesExhausted`).
        """
        client = cls(url, api_key=api_key, settings=settings, jitter=jitter)
        payload = session or {"type": "realtime"}

        async def open_at(target: str, timeout: float,
                          ) -> tuple[ClientConnection, dict[str, Any]]:
            return await client._dial_and_open(target, payload, timeout)

        if retry_open:
            connected = await client._retrying(open_at, _open_may_retry, rotate_first=False)
        else:
            ws, answer = await open_at(client.url, client.settings.attempt_timeout_s)
            connected = _Connected(ws, answer, client.url, 1)
        client._adopt_created(connected)
        return client

    async def resume(self, url: str | None = None) -> Resumed:
        """Reconnect (to ``url``, e.g. another gateway) and resume from :attr:`last_seq`: one
        attempt, with a fresh ``control_id``.

        Returns the ``session.resumed`` event; replayed events follow in :meth:`recv`.

        Raises:
            DuplexClientError: the session cannot be resumed (:class:`ResumeRefused` when no
                retry can help).
            websockets.exceptions.ConnectionClosed, OSError: the connection failed.
        """
        if self.session_id is None or self.resume_token is None:
            raise DuplexClientError("nothing to resume: the session was never opened")
        await self.drop_connection()
        self._closing = False
        self.url = url or self.url
        ws, answer = await self._dial_and_resume(self.url, secrets.token_hex(8), 1,
                                                 self.settings.attempt_timeout_s)
        return await self._adopt_resumed(_Connected(ws, answer, self.url, 1), after="")

    async def drop_connection(self) -> None:
        """Abort the current connection without closing the session (a network loss). While
        :meth:`events` runs, it resumes by itself."""
        ws = self._ws
        if ws is not None:
            ws.transport.abort()
            try:
                await asyncio.wait_for(ws.wait_closed(), 5)
            except TimeoutError:
                pass
            if self._ws is ws:  # events() may have reconnected meanwhile
                self._ws = None

    async def detach(self) -> None:
        """Close the connection normally (1000) and leave the session to its gateway:
        :meth:`events` ends without resuming, and the session lives on, detached, resumable
        for the gateway's departed grace (``DEPARTED_GRACE_S``, 2 s: a 1000 close without
        ``session.close`` is how a client says it left). To end the session, :meth:`close`
        it first (or leave ``async with``, which does)."""
        self._closing = True
        self._notify()
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            self._heartbeats = None
        if self._ws is not None:
            await self._ws.close()
            self._ws = None

    async def aclose(self) -> None:
        """The same as :meth:`detach` (its older name)."""
        await self.detach()

    async def __aenter__(self) -> DuplexClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        """Close the SESSION, as the seed's handle does, then the connection.

        ``session.close`` goes out and the terminal event is awaited for at most
        ``settings.close_timeout_s``; a connection already gone is resumed once (through the
        next URL) to deliver it. Nothing is sent when the session already ended, ended for this
        client (:class:`SessionReplaced`, :class:`ResumeRefused`, ...) or was :meth:`detach`-ed
        inside the block. Leaving with an exception closes the session too, and a failure to
        close is then added to that exception as a note, never raised over it; leaving
        normally raises the failure (a :class:`DuplexClientError`). A cancellation (or any
        other ``BaseException``) only closes the connection: it must not wait on the network.
        """
        try:
            if exc is None or isinstance(exc, Exception):
                await self._close_session_on_exit()
        except DuplexClientError as failure:
            if exc is None:
                raise
            exc.add_note(f"closing the session on leaving the block failed too: {failure}")
        finally:
            await self.detach()

    async def _close_session_on_exit(self) -> None:
        if self.closed or self._terminal is not None or self._closing:
            return
        await self.close()  # numbered and buffered: a resume resends it
        timeout = self.settings.close_timeout_s
        try:
            async with asyncio.timeout(timeout):
                if self._connection_gone():
                    await self._resume_once()
                await self.wait_closed()
        except TimeoutError:
            raise DuplexClientError(f"no terminal event within {timeout} s of session.close",
                                    code="close_timeout") from None

    def _connection_gone(self) -> bool:
        return self._ws is None or self._ws.state is not State.OPEN

    async def _resume_once(self) -> None:
        """One resume attempt, through the next URL (the current one may be what failed)."""
        try:
            await self.resume(self._next_url())
        except _ATTEMPT_ERRORS as exc:
            raise _as_client_error(exc, _failure_of(exc)) from exc

    async def wait_closed(self, timeout: float | None = None) -> str | None:
        """Until the session's terminal event was received; returns :attr:`close_reason`.

        Who reads the events meanwhile (the rule): whoever already does. While an
        :meth:`events` iterator is open (a task iterating it, or one it was not yet closed
        for) or a :meth:`recv` call is pending, that reader gets every event, the terminal
        one included, and this only waits for it; if the reader stops before the end (its
        loop broke out), this takes over. When no one reads, this reads by itself, as
        :meth:`events` would (resuming lost connections, heartbeating) and drops what it
        reads: the caller said it is not interested. So do not start :meth:`recv` or
        :meth:`events` while it reads, and do not call it from inside an ``async for`` over
        :meth:`events` (that loop is the reader and ends at the terminal event by itself).

        Raises:
            TimeoutError: ``timeout`` seconds passed first (the session goes on).
            DuplexClientError: the session cannot end for this client any more: what
                :meth:`events` raises (:class:`SessionReplaced`, :class:`ResumeRefused`,
                :class:`RetriesExhausted`, ...), or ``client_detached`` after :meth:`detach`.
        """
        async with asyncio.timeout(timeout):
            while not self._outcome_known():
                changed = self._changed
                if self._readers or self._drain is not None:
                    await changed.wait()
                else:
                    await self._drain_until_outcome()
        if self.closed:
            return self._close_reason
        if self._terminal is not None:
            raise self._terminal
        raise DuplexClientError("the client detached before the session ended",
                                code="client_detached")

    def _outcome_known(self) -> bool:
        return self.closed or self._terminal is not None or self._closing

    async def _drain_until_outcome(self) -> None:
        """Read (and drop) events until the session's end, in a task a reader arriving
        meanwhile stops (:meth:`_enter_reader`); its failure is this call's."""
        drain = self._drain = asyncio.create_task(self._read_until_outcome(),
                                                  name="duplex-client-drain")
        try:
            await asyncio.wait({drain})
        finally:
            if not drain.done():  # this call was cancelled (its timeout)
                drain.cancel()
                await asyncio.wait({drain})
            self._drain = None
            self._notify()
        if not drain.cancelled() and (error := drain.exception()) is not None:
            raise error

    async def _read_until_outcome(self) -> None:
        self._start_heartbeats()
        try:
            while not self._outcome_known():
                await self._next_event_resuming()
        finally:
            self._stop_heartbeats()

    async def _enter_reader(self) -> None:
        """A caller starts reading (events(), recv()): wait_closed()'s own reading, if any,
        stops first (websockets allows one recv at a time), at a point where nothing is lost:
        while it waits for a frame (a cancelled recv keeps the frame for the next one), never
        in the middle of a resume."""
        self._readers += 1
        drain = self._drain
        if drain is None:
            return
        while self._recovering and not drain.done():
            await self._changed.wait()
        drain.cancel()
        await asyncio.wait({drain})

    def _leave_reader(self) -> None:
        self._readers -= 1
        self._notify()

    def _notify(self) -> None:
        """Wake every wait_closed() waiting on the readers or the outcome."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def _dial(self, url: str | None = None,
                    timeout: float | None = None) -> ClientConnection:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        return await websockets.connect(
            url or self.url, additional_headers=headers, max_size=None,
            open_timeout=timeout or self.settings.attempt_timeout_s)

    async def _dial_and_open(self, url: str, session: dict[str, Any], timeout: float,
                             ) -> tuple[ClientConnection, dict[str, Any]]:
        """One open attempt: connect, send ``session.update``, read the answer."""
        ws = await self._dial(url, timeout)
        answer = await _first_answer(ws, {"type": "session.update", "session": session},
                                     timeout)
        if answer.get("type") != "session.created":
            ws.transport.abort()
            raise _refusal(answer, "open")
        return ws, answer

    async def _dial_and_resume(self, url: str, control_id: str, attempt: int, timeout: float,
                               ) -> tuple[ClientConnection, dict[str, Any]]:
        """One resume attempt (``attempt`` counts the tries of ``control_id``): connect, send
        ``session.resume``, read the answer."""
        ws = await self._dial(url, timeout)
        answer = await _first_answer(ws, {
            "type": "session.resume", "session_id": self.session_id,
            "resume_token": self.resume_token,
            "last_received_server_event_seq": self.last_seq,
            "control_id": control_id, "attempt": attempt,
        }, timeout)
        if answer.get("type") != "session.resumed":
            ws.transport.abort()
            raise _refusal(answer, "resume")
        return ws, answer

    def _adopt_created(self, connected: _Connected) -> None:
        created = connected.answer
        self.session_id = created["session_id"]
        self.resume_token = created["resume_token"]
        self.generation = created["lease_generation"]
        self._adopt_session(created)
        self.url = connected.url
        self._ws = connected.ws
        self._mark_sent()

    async def _adopt_resumed(self, connected: _Connected, *, after: str) -> Resumed:
        """Take over a resumed connection: the new token and position, then the resends."""
        answer = connected.answer
        self.resume_token = answer["resume_token"]
        self.generation = answer["lease_generation"]
        self._adopt_session(answer)
        self.url = connected.url
        # Where the server's replay starts. Below our position only when the store lost events
        # we had (session.resync_required log_rewound follows): the next events reuse those
        # numbers and must not be dropped as seen.
        self.last_seq = int(answer["replay_from"]) - 1
        self._last_error_code = None
        async with self._send_lock:
            self._confirm(int(answer["last_client_seq"]), connected.ws)
            self._ws = connected.ws
            await self._resend(connected.ws)
        return Resumed("session.resumed", None, answer, url=connected.url,
                       attempts=connected.attempts, after=after)

    def _confirm(self, confirmed: int, ws: ClientConnection) -> None:
        """Forget the commands the input log holds; refuse to go on over a hole in the rest."""
        # A fresh client object on an old session numbers on from the log, not from 1.
        self._client_seq = max(self._client_seq, confirmed)
        while self._unconfirmed and self._unconfirmed[0][0] <= confirmed:
            self._unconfirmed.popleft()
        if self._unconfirmed and self._unconfirmed[0][0] > confirmed + 1:
            ws.transport.abort()
            raise self._end(DuplexClientError(
                f"commands {confirmed + 1}..{self._unconfirmed[0][0] - 1} fell out of the "
                "resend buffer before the gateway had them", code="resend_buffer_overflow"))

    async def _resend(self, ws: ClientConnection) -> None:
        for _, text in self._unconfirmed:
            try:
                await ws.send(text)
            except ConnectionClosed:
                return  # the reader sees the drop and resumes again; the buffer keeps them
        self._mark_sent()

    # ------------------------------------------------------------------ retrying

    def _next_url(self) -> str:
        self._url_index = (self._url_index + 1) % len(self.urls)
        return self.urls[self._url_index]

    async def _retrying(self, attempt: _Attempt, may_retry: Callable[[_Failure], bool], *,
                        rotate_first: bool) -> _Connected:
        """Run ``attempt`` on URL after URL, backing off between tries, until one answers.

        Raises:
            DuplexClientError: a failure no retry can help, or :class:`RetriesExhausted`.
            _ClientClosing: the caller closed the client meanwhile.
        """
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.settings.retry_deadline_s
        last: _Failure | None = None
        tries = 0
        for retry in range(-1, self.settings.max_retries):
            if retry >= 0:
                pause = self.settings.backoff_s(retry, self._jitter())
                if loop.time() + pause >= give_up_at:
                    break
                await asyncio.sleep(pause)
            if self._closing:
                raise _ClientClosing
            url = self._next_url() if rotate_first or retry >= 0 else self.url
            budget = min(self.settings.attempt_timeout_s, max(give_up_at - loop.time(), 0.001))
            tries += 1
            try:
                ws, answer = await attempt(url, budget)
            except _ATTEMPT_ERRORS as exc:
                last = _failure_of(exc)
                if not may_retry(last):
                    raise _as_client_error(exc, last) from exc
                continue
            return _Connected(ws, answer, url, tries)
        reason = last.reason if last is not None else "no attempt fitted the deadline"
        raise RetriesExhausted(f"gave up after {tries} attempts: {reason}", attempts=tries,
                               code=last.code if last else None,
                               close_code=last.close_code if last else None)

    async def _recover(self, lost: Exception | None) -> Resumed:
        """The connection is gone (``lost`` says how; None: there was none): resume, or raise
        the terminal outcome."""
        self._recovering = True
        try:
            return await self._resume_after(lost)
        finally:
            self._recovering = False
            self._notify()

    async def _resume_after(self, lost: Exception | None) -> Resumed:
        failure = _failure_of(lost) if lost is not None else None
        if failure is not None and not _resume_may_retry(failure):
            raise self._end(DuplexClientError(
                f"the connection ended for good: {failure.reason}",
                code=self._last_error_code, close_code=failure.close_code))
        if self.session_id is None or self.resume_token is None:
            raise self._end(DuplexClientError("nothing to resume: the session was never opened"))
        self._forget_connection()
        # One id for this resume, kept across its retries: if an attempt landed but its answer
        # was lost, the gateway answers the retry as it answered the lost one. The tries are
        # numbered, so that an abandoned try which lands late (its gateway waited out a
        # failover) cannot take the session from a later one.
        control_id = secrets.token_hex(8)
        attempts = itertools.count(1)

        async def resume_at(url: str, timeout: float,
                            ) -> tuple[ClientConnection, dict[str, Any]]:
            return await self._dial_and_resume(url, control_id, next(attempts), timeout)

        try:
            connected = await self._retrying(resume_at, _resume_may_retry, rotate_first=True)
        except DuplexClientError as exc:
            self._end(exc)
            raise
        # Shielded: a reader cancelled here (a timeout around events() or wait_closed()) must
        # not leave the new connection adopted with only part of the resends sent.
        return await asyncio.shield(self._adopt_resumed(
            connected, after=failure.reason if failure is not None else "no connection"))

    def _forget_connection(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            ws.transport.abort()

    def _end(self, error: DuplexClientError) -> DuplexClientError:
        """Remember the terminal outcome: :meth:`events` raises it from now on."""
        self._terminal = error
        self._notify()
        return error

    # ------------------------------------------------------------------ commands

    async def submit(self, command: ClientCommand) -> None:
        """Send any command (:mod:`gateway.client_commands`), in call order.

        A ``sequenced`` command is numbered (``client_seq``) and kept until a resume shows the
        input log holds it; one submitted while the connection is down goes out with the
        resume's resends. ``session.heartbeat`` and ``session.event_ack`` are sent once, and
        dropped while disconnected. Refusals come back later as ``error`` events whose
        ``error.event_id`` is the command's ``event_id``.
        """
        if command.sequenced:
            await self._command(command.to_wire())
        else:
            await self._send_unsequenced(command.to_wire())

    async def append_audio(self, pcm16: bytes) -> None:
        """``input_audio_buffer.append`` (pcm16 LE mono 24 kHz)."""
        await self.submit(AppendAudio(pcm16))

    async def append_text(self, text: str) -> None:
        """``input.text.append``: text for the user's turn (at most 4096 characters)."""
        await self.submit(AppendText(text))

    async def commit(self) -> None:
        """``input_audio_buffer.commit``."""
        await self.submit(CommitInput())

    async def clear_input(self) -> None:
        """``input_audio_buffer.clear``."""
        await self.submit(ClearInput())

    async def cancel_input(self) -> None:
        """``input.cancel``: drop the pending input and stop the work in flight."""
        await self.submit(CancelInput())

    async def create_response(self, options: Mapping[str, Any] | None = None) -> None:
        """``response.create`` with optional per-response options."""
        await self.submit(CreateResponse(options))

    async def cancel_response(self, response_id: str | None = None) -> None:
        """``response.cancel``."""
        await self.submit(CancelResponse(response_id))

    async def barge_in(self) -> None:
        """``barge_in``: interrupt the active response at once."""
        await self.submit(BargeIn())

    async def clear_output_audio(self) -> None:
        """``output_audio_buffer.clear``."""
        await self.submit(ClearOutputAudio())

    async def signal_turn(self, event: str, payload: Mapping[str, Any] | None = None) -> None:
        """``turn.signal``: the turn transition ``event``; one that names a client event
        (``barge_in``, ``response.cancel``, ...) is that event, with its fields in
        ``payload``."""
        await self.submit(SignalTurn(event, payload))

    async def ack_playback(self, played_ms: int, *, response_id: str | None = None,
                           item_id: str | None = None, committed_ms: int | None = None) -> None:
        """``playback.ack``: ``played_ms`` of a response's audio was played; ``committed_ms``
        of it (default: all played) stays in the conversation. Without ids: the response
        playing now. Answered by ``playback.acknowledged``."""
        await self.submit(AckPlayback(played_ms, committed_ms=committed_ms,
                                      response_id=response_id, item_id=item_id))

    async def create_item(self, item: Mapping[str, Any],
                          previous_item_id: str | None = None) -> None:
        """``conversation.item.create``."""
        await self.submit(CreateItem(item, previous_item_id))

    async def retrieve_item(self, item_id: str) -> None:
        """``conversation.item.retrieve``."""
        await self.submit(RetrieveItem(item_id))

    async def delete_item(self, item_id: str) -> None:
        """``conversation.item.delete``."""
        await self.submit(DeleteItem(item_id))

    async def truncate_item(self, item_id: str, audio_end_ms: int,
                            content_index: int = 0) -> None:
        """``conversation.item.truncate``."""
        await self.submit(TruncateItem(item_id, audio_end_ms, content_index))

    async def update(self, patch: Mapping[str, Any]) -> None:
        """``session.update``."""
        await self.submit(UpdateSession(patch))

    async def heartbeat(self) -> None:
        """``session.heartbeat`` (unsequenced: dropped while disconnected)."""
        await self.submit(Heartbeat())

    async def close(self, reason: str = "client_close") -> None:
        """``session.close``: the session ends with ``session.closed``; read it from
        :meth:`events`, or wait for it with :meth:`wait_closed`."""
        await self.submit(CloseSession(reason))

    async def ack(self, server_event_seq: int | None = None) -> None:
        """``session.event_ack``: the log may drop every event up to this seq (default: all
        handed out so far), which bounds Redis memory for this session. Not sent while
        disconnected: the next ack covers it."""
        seq = self.last_seq if server_event_seq is None else server_event_seq
        await self.submit(AckEvents(seq))

    async def send_raw(self, data: str | bytes) -> None:
        """Send a frame as is (for tests of bad input)."""
        assert self._ws is not None
        await self._ws.send(data)

    async def _command(self, message: dict[str, Any]) -> None:
        async with self._send_lock:
            self._client_seq += 1
            message["client_seq"] = self._client_seq
            text = json.dumps(message)
            self._unconfirmed.append((self._client_seq, text))
            if self._ws is not None:
                self._mark_sent()
                try:
                    await self._ws.send(text)
                except ConnectionClosed:
                    pass  # kept in the resend buffer; the next resume sends it again

    async def _send_unsequenced(self, message: dict[str, Any]) -> None:
        """A frame that is not worth resending (an ack, a heartbeat): dropped when the
        connection is down."""
        async with self._send_lock:
            if self._ws is None:
                return
            self._mark_sent()
            try:
                await self._ws.send(json.dumps(message))
            except ConnectionClosed:
                pass

    def _mark_sent(self) -> None:
        self._last_sent_at = asyncio.get_running_loop().time()

    async def _send_heartbeats(self, interval: float) -> None:
        """Keep the session from the idle TTL while the caller only listens."""
        loop = asyncio.get_running_loop()
        while True:
            due = self._last_sent_at + interval
            if loop.time() < due:
                await asyncio.sleep(due - loop.time())
                continue
            # Marked even when disconnected: the resume that follows is activity itself.
            self._mark_sent()
            await self._send_unsequenced({"type": "session.heartbeat"})

    def _start_heartbeats(self) -> None:
        interval = self.settings.heartbeat_interval_s
        if interval is None or (self._heartbeats is not None and not self._heartbeats.done()):
            return
        self._heartbeats = asyncio.create_task(self._send_heartbeats(interval),
                                               name="duplex-client-heartbeats")

    def _stop_heartbeats(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            self._heartbeats = None

    # ------------------------------------------------------------------ events

    async def _recv_raw(self) -> dict[str, Any]:
        assert self._ws is not None
        return await _recv_json(self._ws)

    async def recv(self) -> RealtimeEvent:
        """The next event not seen before, from the current connection (no resume).

        Raises:
            websockets.exceptions.ConnectionClosed: the connection dropped; call
                :meth:`resume` and go on (or read with :meth:`events`, which does).
        """
        try:
            await self._enter_reader()
            return await self._recv_event()
        finally:
            self._leave_reader()

    async def _recv_event(self) -> RealtimeEvent:
        while True:
            data = await self._recv_raw()
            seq = data.get("server_event_seq")
            if isinstance(seq, int):
                if seq <= self.last_seq:
                    continue  # already delivered before a reconnect
                self.last_seq = seq
            if data.get("type") == "session.resync_required":
                # The next event's number: past a trim, or below ours after a rewound log.
                self.last_seq = int(data["replay_from"]) - 1
            event = RealtimeEvent(str(data.get("type")), seq, data)
            self._track(event)
            return event

    def _adopt_session(self, event: dict[str, Any]) -> None:
        """Remember the session object and capabilities an event carries."""
        session = event.get("session")
        if isinstance(session, dict):
            self._session_object = session
        capabilities = event.get("capabilities")
        if isinstance(capabilities, dict):
            self._capabilities = capabilities

    def _track(self, event: RealtimeEvent) -> None:
        """What the client remembers of the session from its events."""
        if event.type in _SESSION_OBJECT_EVENTS:
            self._adopt_session(event.data)
        elif event.type in _TERMINAL:
            reason = event.data.get("reason")
            self._close_reason = reason if isinstance(reason, str) else None
            self.closed = True
            self._notify()

    async def events(self) -> AsyncGenerator[RealtimeEvent, None]:
        """Every event once, in order, until the terminal one (which is yielded last), across
        lost connections.

        A dropped connection, or a close with 1011, 1012 or 1013, is resumed (see
        :class:`ClientSettings`); a :class:`Resumed` marker is yielded where that happened.
        ``session.resync_required`` is yielded as it comes: the events it announces are gone.
        Heartbeats go out on a timer while this runs. Ends without raising after the terminal
        event, or once :meth:`detach` was called.

        Raises:
            ResumeRefused: the session ended or is unknown, or the token was refused.
            SessionReplaced: another connection resumed the session.
            RetriesExhausted: no attempt got through within ``max_retries`` or the deadline.
            DuplexClientError: the connection was closed with a code no retry can help
                (``close_code``, and ``code`` from the ``error`` event before it).
        """
        try:
            await self._enter_reader()
            self._start_heartbeats()
            while not self.closed:
                event = await self._next_event_resuming()
                if event is None:
                    return
                yield event
        finally:
            self._stop_heartbeats()
            self._leave_reader()

    async def _next_event_resuming(self) -> RealtimeEvent | None:
        """The next event, resuming first when the connection is gone; None once the caller
        closed the client."""
        if self._terminal is not None:
            raise self._terminal
        if self._closing and self._ws is None:
            return None
        try:
            if self._ws is None:
                return await self._recover(None)
            try:
                event = await self._recv_event()
            except (ConnectionClosed, OSError) as exc:
                if self._closing:
                    return None
                return await self._recover(exc)
        except _ClientClosing:
            return None
        self._note(event)
        return event

    def _note(self, event: RealtimeEvent) -> None:
        if event.type == "error":
            self._last_error_code = event.data.get("error", {}).get("code")
        elif event.type == "session.replaced":
            self._forget_connection()
            raise self._end(SessionReplaced(
                "another connection resumed this session", code="session_replaced",
                close_code=_REPLACED_CLOSE_CODE))

    @staticmethod
    def is_fatal_resume_error(error: DuplexClientError) -> bool:
        """Whether retrying the resume cannot help."""
        return error.code in _FATAL_RESUME_CODES
