"""The client: one session across connections, exactly once both ways (see the package's
docstring for the guarantees and an example)."""

from __future__ import annotations

import asyncio
import itertools
import random
import secrets
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from duplex_client.commands import ClientCommand, CommandMethods, SessionEventAckEvent
from duplex_client.dial import dial, dial_and_open, dial_and_resume, recv_json
from duplex_client.errors import DuplexClientError, SessionReplaced
from duplex_client.events import RealtimeEvent, Resumed
from duplex_client.readers import Readers
from duplex_client.retry import (
    ATTEMPT_ERRORS,
    Attempt,
    ClientClosing,
    ClientSettings,
    Connected,
    Failure,
    as_client_error,
    failure_of,
    open_may_retry,
    resume_may_retry,
    retrying,
)
from duplex_client.upstream import Upstream

__all__ = ["DuplexClient"]

_TERMINAL = frozenset({"session.closed", "session.expired"})
#: The events whose ``session`` is the session object :attr:`DuplexClient.session` shows.
_SESSION_OBJECT_EVENTS = frozenset({"session.created", "session.updated", "session.resumed"})
_FATAL_RESUME_CODES = frozenset({
    "session_resume_expired", "invalid_resume_token", "invalid_session_resume",
    "unsupported_session_resume", "session_resume_conflict",
})
_REPLACED_CLOSE_CODE = 1000


class DuplexClient(CommandMethods):
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
        self._upstream = Upstream(resend_buffer, lambda: self._ws)
        self._last_error_code: str | None = None
        self._closing = False
        self._terminal: DuplexClientError | None = None
        self._close_reason: str | None = None
        self._session_object: dict[str, Any] = {}
        self._capabilities: dict[str, Any] = {}
        self._readers = Readers()

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
            connected = await client._retrying(open_at, open_may_retry, rotate_first=False)
        else:
            ws, answer = await open_at(client.url, client.settings.attempt_timeout_s)
            connected = Connected(ws, answer, client.url, 1)
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
        return await self._adopt_resumed(Connected(ws, answer, self.url, 1), after="")

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
        self._readers.notify()
        self._upstream.stop_heartbeats()
        if self._ws is not None:
            await self._ws.close()
            self._ws = None

    async def aclose(self) -> None:
        """The same as :meth:`detach`, under the name async resources share (for
        :func:`contextlib.aclosing`): the connection closes, the session stays resumable."""
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
        except ATTEMPT_ERRORS as exc:
            raise as_client_error(exc, failure_of(exc)) from exc

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
                changed = self._readers.changed
                if self._readers.busy():
                    await changed.wait()
                else:
                    await self._readers.drain_with(self._read_until_outcome)
        if self.closed:
            return self._close_reason
        if self._terminal is not None:
            raise self._terminal
        raise DuplexClientError("the client detached before the session ended",
                                code="client_detached")

    def _outcome_known(self) -> bool:
        return self.closed or self._terminal is not None or self._closing

    async def _read_until_outcome(self) -> None:
        self._upstream.start_heartbeats(self.settings.heartbeat_interval_s)
        try:
            while not self._outcome_known():
                await self._next_event_resuming()
        finally:
            self._upstream.stop_heartbeats()

    async def _dial(self, url: str | None = None,
                    timeout: float | None = None) -> ClientConnection:
        return await dial(url or self.url, api_key=self.api_key,
                          timeout=timeout or self.settings.attempt_timeout_s)

    async def _dial_and_open(self, url: str, session: dict[str, Any], timeout: float,
                             ) -> tuple[ClientConnection, dict[str, Any]]:
        return await dial_and_open(url, api_key=self.api_key, session=session, timeout=timeout)

    async def _dial_and_resume(self, url: str, control_id: str, attempt: int, timeout: float,
                               ) -> tuple[ClientConnection, dict[str, Any]]:
        """One resume attempt (``attempt`` counts the tries of ``control_id``)."""
        return await dial_and_resume(url, api_key=self.api_key, timeout=timeout, resume={
            "type": "session.resume", "session_id": self.session_id,
            "resume_token": self.resume_token,
            "last_received_server_event_seq": self.last_seq,
            "control_id": control_id, "attempt": attempt,
        })

    def _adopt_created(self, connected: Connected) -> None:
        created = connected.answer
        self.session_id = created["session_id"]
        self.resume_token = created["resume_token"]
        self.generation = created["lease_generation"]
        self._adopt_session(created)
        self.url = connected.url
        self._ws = connected.ws
        self._upstream.mark_sent()

    async def _adopt_resumed(self, connected: Connected, *, after: str) -> Resumed:
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
        async with self._upstream.lock:
            self._confirm(int(answer["last_client_seq"]), connected.ws)
            self._ws = connected.ws
            await self._upstream.resend(connected.ws)
        return Resumed("session.resumed", None, answer, url=connected.url,
                       attempts=connected.attempts, after=after)

    def _confirm(self, confirmed: int, ws: ClientConnection) -> None:
        """Forget the commands the input log holds; refuse to go on over a hole in the rest."""
        hole = self._upstream.buffer.confirm(confirmed)
        if hole is not None:
            ws.transport.abort()
            raise self._end(DuplexClientError(
                f"commands {hole[0]}..{hole[1]} fell out of the resend buffer before the "
                "gateway had them", code="resend_buffer_overflow"))

    # ------------------------------------------------------------------ retrying

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

    # ------------------------------------------------------------------ commands

    async def submit(self, command: ClientCommand) -> None:
        """Send any command (:mod:`duplex_client.commands`), in call order.

        A ``sequenced`` command is numbered (``client_seq``) and kept until a resume shows the
        input log holds it; one submitted while the connection is down goes out with the
        resume's resends. ``session.heartbeat`` and ``session.event_ack`` are sent once, and
        dropped while disconnected. Refusals come back later as ``error`` events whose
        ``error.event_id`` is the command's ``event_id``.
        """
        if command.sequenced:
            await self._upstream.sequenced(command.to_wire())
        else:
            await self._upstream.unsequenced(command.to_wire())

    async def ack(self, server_event_seq: int | None = None) -> None:
        """``session.event_ack``: the log may drop every event up to this seq (default: all
        handed out so far), which bounds Redis memory for this session. Not sent while
        disconnected: the next ack covers it."""
        seq = self.last_seq if server_event_seq is None else server_event_seq
        await self.submit(SessionEventAckEvent(seq))

    async def send_raw(self, data: str | bytes) -> None:
        """Send a frame as is (for tests of bad input)."""
        assert self._ws is not None
        await self._ws.send(data)

    # ------------------------------------------------------------------ events

    async def _recv_raw(self) -> dict[str, Any]:
        assert self._ws is not None
        return await recv_json(self._ws)

    async def recv(self) -> RealtimeEvent:
        """The next event not seen before, from the current connection (no resume).

        Raises:
            websockets.exceptions.ConnectionClosed: the connection dropped; call
                :meth:`resume` and go on (or read with :meth:`events`, which does).
        """
        try:
            await self._readers.enter()
            return await self._recv_event()
        finally:
            self._readers.leave()

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
            self._readers.notify()

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
            await self._readers.enter()
            self._upstream.start_heartbeats(self.settings.heartbeat_interval_s)
            while not self.closed:
                event = await self._next_event_resuming()
                if event is None:
                    return
                yield event
        finally:
            self._upstream.stop_heartbeats()
            self._readers.leave()

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
