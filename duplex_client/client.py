"""The client: one session across connections, exactly once both ways (see the package's
docstring for the guarantees and an example)."""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import AsyncGenerator, Callable, Sequence
from types import TracebackType
from typing import Any

from websockets.asyncio.client import ClientConnection

from duplex_client.commands import (
    ClientCommand,
    CommandMethods,
    SessionCloseEvent,
    SessionEventAckEvent,
)
from duplex_client.dialect import Dialect
from duplex_client.errors import DuplexClientError, SessionClosedError
from duplex_client.events import RealtimeEvent, Resumed
from duplex_client.link import SessionLink
from duplex_client.retry import (
    ATTEMPT_ERRORS,
    ClientSettings,
    Connected,
    as_client_error,
    failure_of,
    open_may_retry,
    resume_may_retry,
)

__all__ = ["DuplexClient"]


class DuplexClient(SessionLink, CommandMethods):
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
        dialect: ``"ga"`` (the default) or ``"duplex"``, the seed's contract
            (:mod:`duplex_client.dialect`): every connection dials with ``duplex=1`` and
            ``autostart=0``.
        model: on the duplex dialect, the ``model`` query parameter (when the URL has none).
    """

    @classmethod
    async def connect(cls, url: str | Sequence[str], *, session: dict[str, Any] | None = None,
                      api_key: str | None = None, retry_open: bool = False,
                      settings: ClientSettings | None = None,
                      jitter: Callable[[], float] | None = None,
                      dialect: Dialect | str = Dialect.GA,
                      model: str | None = None) -> DuplexClient:
        """Open a new session; ``session`` is the initial ``session.update`` payload (default:
        ``{"type": "realtime"}``; on the duplex dialect ``{"model": model}``, or ``{}``).

        ``retry_open``: when the gateway is unreachable, answers 5xx, or refuses with 1013
        (``resource_exhausted``, ``rate_limit_exceeded``), try again (the next URL, with
        backoff, per ``settings``) instead of raising at once. Off by default, so a refusal
        reaches the caller at once.

        Raises:
            DuplexClientError: the open was refused (``code``), or every retry failed
                (:class:`RetriesExhausted`).
        """
        client = cls(url, api_key=api_key, settings=settings, jitter=jitter, dialect=dialect,
                     model=model)
        payload = session if session is not None else client._default_session()

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

    def _default_session(self) -> dict[str, Any]:
        if self.dialect is Dialect.DUPLEX:
            return {} if self.model is None else {"model": self.model}
        return {"type": "realtime"}

    @classmethod
    async def resume_session(cls, url: str | Sequence[str], *, session_id: str,
                             resume_token: str, last_received_server_event_seq: int = 0,
                             api_key: str | None = None, settings: ClientSettings | None = None,
                             jitter: Callable[[], float] | None = None,
                             dialect: Dialect | str = Dialect.GA,
                             model: str | None = None) -> DuplexClient:
        """A client for a session another client (another process) opened: it resumes from
        ``(session_id, resume_token)``, retrying as :meth:`events` does. The events after
        ``last_received_server_event_seq`` are replayed in :meth:`events` / :meth:`recv`;
        commands go on numbered after the input log's last one. The token presented is void
        afterwards: the new one is :attr:`resume_token`.

        Raises:
            ResumeRefused: the session ended or is unknown, or the token was refused.
            RetriesExhausted: no attempt got through.
        """
        client = cls(url, api_key=api_key, settings=settings, jitter=jitter, dialect=dialect,
                     model=model)
        client.session_id, client.resume_token = session_id, resume_token
        client.last_seq = last_received_server_event_seq
        control_id = secrets.token_hex(8)
        attempts = itertools.count(1)

        async def resume_at(target: str, timeout: float,
                            ) -> tuple[ClientConnection, dict[str, Any]]:
            return await client._dial_and_resume(target, control_id, next(attempts), timeout)

        connected = await client._retrying(resume_at, resume_may_retry, rotate_first=False)
        await client._adopt_resumed(connected, after="")
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
        await self.close()

    async def close(self, reason: str = "client_close", *,
                    timeout: float | None = None) -> str | None:
        """End the session, as the seed's handle does: ``session.close`` goes out and this
        returns once the terminal event was received (its ``reason``, also
        :attr:`close_reason`). A no-op once the session ended.

        Who reads meanwhile: as for :meth:`wait_closed`, except that what this reads itself
        is kept, not dropped: :meth:`recv` and :meth:`events` hand those events out next,
        the terminal one last. So a loop over :meth:`events` may call it (its next events are
        the rest, up to ``session.closed``), and so may a caller that then reads on with
        :meth:`recv`. A connection already gone is resumed once (through the next URL) to
        deliver the close when no one else reads.

        Args:
            timeout: how long to wait for the terminal event (default
                ``settings.close_timeout_s``).

        Raises:
            DuplexClientError: ``close_timeout`` when no terminal event came in time (the
                ``session.close`` stays buffered, resent by a later resume), or what ended the
                session for this client (:class:`SessionReplaced`, :class:`ResumeRefused`,
                ...).
        """
        if self.closed:
            return self._close_reason
        if self._terminal is not None:
            raise self._terminal
        limit = self.settings.close_timeout_s if timeout is None else timeout
        await self.submit(SessionCloseEvent(reason))  # numbered and buffered: resent on resume
        try:
            async with asyncio.timeout(limit):
                if self._connection_gone() and not self._readers.busy_elsewhere():
                    await self._resume_once()
                return await self._wait_outcome(hold=True)
        except TimeoutError:
            raise DuplexClientError(f"no terminal event within {limit} s of session.close",
                                    code="close_timeout") from None

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
            return await self._wait_outcome(hold=False)

    async def submit(self, command: ClientCommand) -> None:
        """Send any command (:mod:`duplex_client.commands`), in call order.

        A ``sequenced`` command is numbered (``client_seq``) and kept until a resume shows the
        input log holds it; one submitted while the connection is down goes out with the
        resume's resends. ``session.heartbeat`` and ``session.event_ack`` are sent once, and
        dropped while disconnected. Refusals come back later as ``error`` events whose
        ``error.event_id`` is the command's ``event_id``.

        Raises:
            SessionClosedError: (``code`` ``session_closed``) the session ended, or ended for
                this client (its terminal event came, or :meth:`events` raised); an ack or a
                heartbeat then has nothing left to do and is dropped instead.
        """
        if self.closed or self._terminal is not None:
            if not command.sequenced:
                return
            why = f"ended ({self._close_reason})" if self.closed else \
                f"is over for this client: {self._terminal}"
            raise SessionClosedError(f"session {self.session_id} {why}; {command.type} not sent",
                                     code="session_closed") from self._terminal
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

    async def recv(self) -> RealtimeEvent:
        """The next event not seen before, from the current connection (no resume).

        Raises:
            websockets.exceptions.ConnectionClosed: the connection dropped; call
                :meth:`resume` and go on (or read with :meth:`events`, which does).
        """
        while self._held:
            event = self._held.popleft()
            if not isinstance(event, Resumed):  # recv() hands out the server's events only
                return event
        try:
            await self._readers.enter()
            return await self._recv_event()
        finally:
            self._readers.leave()

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
            while self._held or not self.closed:
                event = self._held.popleft() if self._held else await self._next_event_resuming()
                if event is None:
                    return
                # Paused in the caller's task: a close() it calls now reads by itself.
                parked = self._readers.park()
                try:
                    yield event
                finally:
                    self._readers.unpark(parked)
        finally:
            self._upstream.stop_heartbeats()
            self._readers.leave()

