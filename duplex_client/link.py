"""The connection half of :class:`~duplex_client.DuplexClient`: its state, the dial, open and
resume of one connection, the retries across gateways, and the reading of events (numbered,
deduplicated, typed, resumed through)."""

from __future__ import annotations

import asyncio
import itertools
import random
import secrets
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from duplex_client.dial import dial, dial_and_open, dial_and_resume, recv_json
from duplex_client.dialect import Dialect, dialect_url
from duplex_client.errors import DuplexClientError, SessionReplaced
from duplex_client.events import (
    ErrorEvent,
    RealtimeEvent,
    Resumed,
    SessionCreated,
    SessionResyncRequired,
    event_of,
)
from duplex_client.readers import Readers
from duplex_client.retry import (
    Attempt,
    ClientClosing,
    ClientSettings,
    Connected,
    Failure,
    failure_of,
    resume_may_retry,
    retrying,
)
from duplex_client.upstream import Upstream

__all__ = ["SessionLink"]

_TERMINAL = frozenset({"session.closed", "session.expired"})
#: The events whose ``session`` is the session object :attr:`DuplexClient.session` shows.
_SESSION_OBJECT_EVENTS = frozenset({"session.created", "session.updated", "session.resumed"})
_FATAL_RESUME_CODES = frozenset({
    "session_resume_expired", "invalid_resume_token", "invalid_session_resume",
    "unsupported_session_resume", "session_resume_conflict",
    # The seed's: its engine refused the lease (a newer attach won), or the session is gone.
    "runtime_resume_failed", "session_closed", "unknown_session",
})
_REPLACED_CLOSE_CODE = 1000


class SessionLink:
    """What :class:`~duplex_client.DuplexClient` is built on (its arguments are documented
    there): the state of one session across connections and the machinery below the public
    calls."""

    def __init__(self, url: str | Sequence[str], *, api_key: str | None = None,
                 resend_buffer: int = 4096, settings: ClientSettings | None = None,
                 jitter: Callable[[], float] | None = None, dialect: Dialect | str = Dialect.GA,
                 model: str | None = None) -> None:
        self.urls: tuple[str, ...] = (url,) if isinstance(url, str) else tuple(url)
        if not self.urls:
            raise ValueError("at least one gateway URL is needed")
        self.dialect = Dialect(dialect)
        self.model = model
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
        self._upstream = Upstream(resend_buffer, lambda: self._ws)
        self._last_error_code: str | None = None
        self._closing = False
        self._terminal: DuplexClientError | None = None
        self._close_reason: str | None = None
        self._session_object: dict[str, Any] = {}
        self._capabilities: dict[str, Any] = {}
        self._readers = Readers()
        # Events read by close() for a reader to come: recv() and events() hand them out first.
        self._held: deque[RealtimeEvent] = deque()

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

    @property
    def public_session(self) -> Mapping[str, Any]:
        """:attr:`session`, under the seed handle's name."""
        return self.session

    def _connection_gone(self) -> bool:
        return self._ws is None or self._ws.state is not State.OPEN

    async def _wait_outcome(self, *, hold: bool) -> str | None:
        """Until the outcome is known, reading when no one else does (``hold``: keeping what
        it reads for the readers to come). A caller's own :meth:`events` loop, paused at its
        ``yield`` in this very task, is no one else: waiting on it could never end."""
        while not self._outcome_known():
            changed = self._readers.changed
            if self._readers.busy_elsewhere():
                await changed.wait()
            else:
                await self._readers.drain_with(
                    lambda: self._read_until_outcome(hold=hold))
        if self.closed:
            return self._close_reason
        if self._terminal is not None:
            raise self._terminal
        raise DuplexClientError("the client detached before the session ended",
                                code="client_detached")

    def _outcome_known(self) -> bool:
        return self.closed or self._terminal is not None or self._closing

    async def _read_until_outcome(self, *, hold: bool) -> None:
        self._upstream.start_heartbeats(self.settings.heartbeat_interval_s)
        try:
            while not self._outcome_known():
                event = await self._next_event_resuming()
                if hold and event is not None:
                    self._held.append(event)
        finally:
            self._upstream.stop_heartbeats()

    async def _dial(self, url: str | None = None,
                    timeout: float | None = None) -> ClientConnection:
        return await dial(self._dialed(url or self.url), api_key=self.api_key,
                          timeout=timeout or self.settings.attempt_timeout_s)

    def _dialed(self, url: str) -> str:
        return dialect_url(url, self.dialect, self.model)

    async def _dial_and_open(self, url: str, session: dict[str, Any], timeout: float,
                             ) -> tuple[ClientConnection, dict[str, Any]]:
        return await dial_and_open(self._dialed(url), api_key=self.api_key, session=session,
                                   timeout=timeout)

    async def _dial_and_resume(self, url: str, control_id: str, attempt: int, timeout: float,
                               ) -> tuple[ClientConnection, dict[str, Any]]:
        """One resume attempt (``attempt`` counts the tries of ``control_id``)."""
        return await dial_and_resume(self._dialed(url), api_key=self.api_key, timeout=timeout,
                                     resume={
            "type": "session.resume", "session_id": self.session_id,
            "resume_token": self.resume_token,
            "last_received_server_event_seq": self.last_seq,
            "control_id": control_id, "attempt": attempt,
        })

    def _adopt_answer(self, answer: dict[str, Any]) -> None:
        """The credentials and session object of ``session.created`` / ``.resumed``, in
        either dialect's shape."""
        adopted = SessionCreated(str(answer.get("type")), None, answer)
        self.session_id = adopted.session_id or self.session_id
        self.resume_token = adopted.resume_token
        self.generation = adopted.generation if adopted.generation is not None \
            else self.generation + 1
        self._adopt_session(answer)

    def _adopt_created(self, connected: Connected) -> None:
        self._adopt_answer(connected.answer)
        self.url = connected.url
        self._ws = connected.ws
        self._upstream.mark_sent()

    async def _adopt_resumed(self, connected: Connected, *, after: str) -> Resumed:
        """Take over a resumed connection: the new token and position, then the resends."""
        answer = connected.answer
        self._adopt_answer(answer)
        self.url = connected.url
        marker = Resumed("session.resumed", None, answer, url=connected.url,
                         attempts=connected.attempts, after=after)
        # Where the server's replay starts. Below our position only when the store lost events
        # we had (session.resync_required log_rewound follows): the next events reuse those
        # numbers and must not be dropped as seen. The seed's dialect does not say: its replay
        # starts after the position the resume named.
        if marker.replay_from is not None:
            self.last_seq = marker.replay_from - 1
        self._last_error_code = None
        async with self._upstream.lock:
            # Without last_client_seq (the seed keeps no input numbers) what a socket took
            # counts as delivered, as for the seed's own client; what none took goes now.
            confirmed = marker.last_client_seq
            self._confirm(self._upstream.last_sent if confirmed is None else confirmed,
                          connected.ws)
            self._ws = connected.ws
            await self._upstream.resend(connected.ws)
        return marker

    def _confirm(self, confirmed: int, ws: ClientConnection) -> None:
        """Forget the commands the input log holds; refuse to go on over a hole in the rest."""
        hole = self._upstream.buffer.confirm(confirmed)
        if hole is not None:
            ws.transport.abort()
            raise self._end(DuplexClientError(
                f"commands {hole[0]}..{hole[1]} fell out of the resend buffer before the "
                "gateway had them", code="resend_buffer_overflow"))

    def _next_url(self) -> str:
        self._url_index = (self._url_index + 1) % len(self.urls)
        return self.urls[self._url_index]

    async def _retrying(self, attempt: Attempt, may_retry: Callable[[Failure], bool], *,
                        rotate_first: bool) -> Connected:
        return await retrying(attempt, may_retry, settings=self.settings, jitter=self._jitter,
                              first_url=None if rotate_first else self.url,
                              next_url=self._next_url, closing=lambda: self._closing)

    async def _recover(self, lost: Exception | None) -> Resumed:
        """The connection is gone (``lost`` says how; None: there was none): resume, or raise
        the terminal outcome."""
        self._readers.recovering = True
        try:
            return await self._resume_after(lost)
        finally:
            self._readers.recovering = False
            self._readers.notify()

    async def _resume_after(self, lost: Exception | None) -> Resumed:
        failure = failure_of(lost) if lost is not None else None
        if failure is not None and not resume_may_retry(failure):
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
            connected = await self._retrying(resume_at, resume_may_retry, rotate_first=True)
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
        self._readers.notify()
        return error

    async def _recv_raw(self) -> dict[str, Any]:
        assert self._ws is not None
        return await recv_json(self._ws)

    async def _recv_event(self) -> RealtimeEvent:
        while True:
            data = await self._recv_raw()
            seq = data.get("server_event_seq")
            if isinstance(seq, int):
                if seq <= self.last_seq:
                    continue  # already delivered before a reconnect
                self.last_seq = seq
            event = event_of(data)
            if isinstance(event, SessionResyncRequired) and event.replay_from is not None:
                # The next event's number: past a trim, or below ours after a rewound log.
                self.last_seq = event.replay_from - 1
            self._track(event)
            return event

    def _adopt_session(self, event: dict[str, Any]) -> None:
        """Remember the session object and capabilities an event carries."""
        session = event.get("session")
        if isinstance(session, dict):
            self._session_object = session
        capabilities = SessionCreated("", None, event).capabilities
        if capabilities is not None:
            self._capabilities = capabilities

    def _track(self, event: RealtimeEvent) -> None:
        """What the client remembers of the session from its events."""
        if event.type in _SESSION_OBJECT_EVENTS:
            self._adopt_session(event.data)
        elif event.type in _TERMINAL:
            reason = event.data.get("reason")
            self._close_reason = reason if isinstance(reason, str) else None
            self.closed = True
            self._readers.notify()

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
        except ClientClosing:
            return None
        self._note(event)
        return event

    def _note(self, event: RealtimeEvent) -> None:
        if isinstance(event, ErrorEvent):
            self._last_error_code = event.code
        elif event.type == "session.replaced":
            self._forget_connection()
            raise self._end(SessionReplaced(
                "another connection resumed this session", code="session_replaced",
                close_code=_REPLACED_CLOSE_CODE))

    @staticmethod
    def is_fatal_resume_error(error: DuplexClientError) -> bool:
        """Whether retrying the resume cannot help."""
        return error.code in _FATAL_RESUME_CODES

