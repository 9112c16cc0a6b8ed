"""A Python client for the gateway: typed commands in, typed events out, resume built in.

Method names follow the seed's ``DuplexSessionHandle`` (``append_audio``, ``commit``,
``create_response``, ``cancel_response``, ``close``, ``events()``).

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

Example::

    client = await DuplexClient.connect(["ws://gw-a/v1/realtime", "ws://gw-b/v1/realtime"])
    await client.append_audio(pcm)
    await client.commit()
    await client.create_response()
    async for event in client.events():
        if isinstance(event, Resumed):
            continue  # nothing lost: the events go on where they stopped
        if event.type == "response.done":
            break
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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import (
    ConnectionClosed,
    InvalidMessage,
    InvalidStatus,
)

__all__ = [
    "ClientSettings",
    "DuplexClient",
    "DuplexClientError",
    "RealtimeEvent",
    "ResumeRefused",
    "Resumed",
    "RetriesExhausted",
    "SessionReplaced",
]

_TERMINAL = frozenset({"session.closed", "session.expired"})
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

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if self.retry_deadline_s <= 0 or self.attempt_timeout_s <= 0:
            raise ValueError("retry_deadline_s and attempt_timeout_s must be > 0")
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
    """:meth:`DuplexClient.aclose` was called while a reconnection was under way."""


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

    async def aclose(self) -> None:
        """Close the connection normally (1000); :meth:`events` then ends without resuming.
        The session itself lives on, detached, in its disconnect grace; call :meth:`close`
        first to end it."""
        self._closing = True
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            self._heartbeats = None
        if self._ws is not None:
            await self._ws.close()
            self._ws = None

    async def __aenter__(self) -> DuplexClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

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
        self.url = connected.url
        self._ws = connected.ws
        self._mark_sent()

    async def _adopt_resumed(self, connected: _Connected, *, after: str) -> Resumed:
        """Take over a resumed connection: the new token and position, then the resends."""
        answer = connected.answer
        self.resume_token = answer["resume_token"]
        self.generation = answer["lease_generation"]
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
        return await self._adopt_resumed(
            connected, after=failure.reason if failure is not None else "no connection")

    def _forget_connection(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            ws.transport.abort()

    def _end(self, error: DuplexClientError) -> DuplexClientError:
        """Remember the terminal outcome: :meth:`events` raises it from now on."""
        self._terminal = error
        return error

    # ------------------------------------------------------------------ commands

    async def append_audio(self, pcm16: bytes) -> None:
        """``input_audio_buffer.append`` (pcm16 LE mono 24 kHz)."""
        await self._command({"type": "input_audio_buffer.append",
                             "audio": base64.b64encode(pcm16).decode()})

    async def commit(self) -> None:
        """``input_audio_buffer.commit``."""
        await self._command({"type": "input_audio_buffer.commit"})

    async def clear_input(self) -> None:
        """``input_audio_buffer.clear``."""
        await self._command({"type": "input_audio_buffer.clear"})

    async def create_response(self, options: dict[str, Any] | None = None) -> None:
        """``response.create`` with optional per-response options."""
        message: dict[str, Any] = {"type": "response.create"}
        if options is not None:
            message["response"] = options
        await self._command(message)

    async def cancel_response(self, response_id: str | None = None) -> None:
        """``response.cancel``."""
        message: dict[str, Any] = {"type": "response.cancel"}
        if response_id is not None:
            message["response_id"] = response_id
        await self._command(message)

    async def update(self, patch: dict[str, Any]) -> None:
        """``session.update``."""
        await self._command({"type": "session.update", "session": patch})

    async def heartbeat(self) -> None:
        """``session.heartbeat``."""
        await self._command({"type": "session.heartbeat"})

    async def close(self, reason: str = "client_close") -> None:
        """``session.close``: the session ends with ``session.closed`` (read it from events)."""
        await self._command({"type": "session.close", "reason": reason})

    async def ack(self, server_event_seq: int | None = None) -> None:
        """``session.event_ack``: the log may drop every event up to this seq (default: all
        handed out so far), which bounds Redis memory for this session. Not sent while
        disconnected: the next ack covers it."""
        seq = self.last_seq if server_event_seq is None else server_event_seq
        await self._send_unsequenced({"type": "session.event_ack", "server_event_seq": seq})

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
            if event.type in _TERMINAL:
                self.closed = True
            return event

    async def events(self) -> AsyncIterator[RealtimeEvent]:
        """Every event once, in order, until the terminal one (which is yielded last), across
        lost connections.

        A dropped connection, or a close with 1011, 1012 or 1013, is resumed (see
        :class:`ClientSettings`); a :class:`Resumed` marker is yielded where that happened.
        ``session.resync_required`` is yielded as it comes: the events it announces are gone.
        Heartbeats go out on a timer while this runs. Ends without raising after the terminal
        event, or once :meth:`aclose` was called.

        Raises:
            ResumeRefused: the session ended or is unknown, or the token was refused.
            SessionReplaced: another connection resumed the session.
            RetriesExhausted: no attempt got through within ``max_retries`` or the deadline.
            DuplexClientError: the connection was closed with a code no retry can help
                (``close_code``, and ``code`` from the ``error`` event before it).
        """
        self._start_heartbeats()
        try:
            while not self.closed:
                event = await self._next_event_resuming()
                if event is None:
                    return
                yield event
        finally:
            self._stop_heartbeats()

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
                event = await self.recv()
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
