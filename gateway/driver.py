"""The asyncio driver of one websocket: feeds :class:`ConnectionCore`, runs what it decides.

It does the I/O and nothing else: what a frame, a push, a store answer or the time means is the
core's to decide. Four tasks per connection: the reader (client frames), the pump (pushes, plus a
periodic safety read of the log), the writer (:class:`~gateway.input_writer.InputWriter`: input
appends, coalesced) and the housekeeping (the core's timer). Actions run under one lock so
frames reach the client in the order the core decided; a frame that decided only one command's
append (every audio chunk) queues it without the lock when no step is in progress (queuing
never waits). Frames go out by the protocol's direct send if the socket takes them, else ASGI.

Output backpressure: a client that does not read blocks the send in flight (and with it the lock).
Pushes are still counted as they arrive (:class:`OutputBacklog`), and when the client's untaken
output goes over its limits the writer, which never waits for that lock, appends one
``output.backpressure`` command: the worker ends the active response. A send blocked for
``OUTPUT_STALL_TIMEOUT_S`` detaches the session and closes the connection 1013.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import socket
import time
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from contract.messages import OutputBackpressure
from contract.reasons import CloseReason
from gateway.input_writer import InputWriter
from gateway.placement import place_session
from gateway.protocol.actions import (
    Action,
    AppendCommands,
    CheckLogEnd,
    CloseConnection,
    DetachLease,
    EndSession,
    FetchLog,
    GiveUpSession,
    OpenSession,
    ResumeSession,
    SendFrame,
    TrimLog,
)
from gateway.protocol.backlog import OutputBacklog, OutputLimits
from gateway.protocol.connection import OUTPUT_STALLED, ConnectionCore
from gateway.protocol.dialect import Handshake
from gateway.protocol.envelope import ResumeRequest
from gateway.protocol.errors import (
    ClientProtocolError,
    CloseCode,
    ErrorCode,
    InternalError,
    fit_close_reason,
)
from gateway.protocol.pacing import InputPacer, PacingLimits
from gateway.protocol.resume import ResumeAnswer, rotated_token
from gateway.protocol.transitions import ConnectionState
from gateway.push_queue import BoundedPushQueue
from gateway.services import GatewayServices
from gateway.wsprotocol import INVALID_TEXT_KEY, send_now_of, transport_of
from runtime.ratelog import RateLimitedLog
from store import Lease, StoreError, StoreUnavailable
from store.keys import SessionKeys
from store.logs import log_ends, read_output
from store.pushes import LeaseMoved, OutputPushed, Push

__all__ = ["ConnectionDriver"]

_log = logging.getLogger(__name__)
_stall_log = RateLimitedLog(_log, interval_s=10.0)
# Every connection of a cut-off gateway closes at once: one line per 10 s, with a count.
_lapse_log = RateLimitedLog(_log, interval_s=10.0)
_RESUME_ATTEMPTS = 3


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class ConnectionDriver:
    """Runs one accepted websocket until it closes."""

    def __init__(self, websocket: WebSocket, services: GatewayServices, *,
                 url_model: str | None, tenant: str = "anonymous",
                 initial_session: dict[str, Any] | None = None,
                 handshake: Handshake | None = None) -> None:
        self._ws = websocket
        self._svc = services
        self._tenant = tenant
        hs = handshake or Handshake()
        self._core = ConnectionCore(
            max_frame_bytes=services.settings.max_frame_bytes, url_model=url_model,
            autostart=hs.autostart, dialect=hs.dialect, initial_session=initial_session,
            delivered_retention_s=services.settings.delivered_retention_s,
            now=asyncio.get_running_loop().time(), video=services.settings.video_bounds)
        self._lock = asyncio.Lock()
        self._lease: Lease | None = None
        self._channel: str | None = None
        self._pushes = BoundedPushQueue()
        self._writer = InputWriter(self._core, services, self._store_failed)
        self._relay_out = services.metrics.relay_seconds.labels("out")
        self._resume_started: float | None = None
        self._held: str | None = None  # the session held under this gateway's lease
        s = services.settings
        self._pacer = InputPacer(PacingLimits(frames_per_s=s.max_frames_per_s,
                                              bytes_per_s=s.max_bytes_per_s,
                                              audio_speed=s.max_audio_speed),
                                 now=asyncio.get_running_loop().time())
        self._closed = asyncio.Event()
        self._transport = transport_of(websocket.scope)
        self._send_now = send_now_of(websocket.scope)
        if s.socket_send_buffer_bytes and self._transport is not None:
            self._transport.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDBUF, s.socket_send_buffer_bytes)
        self._output_limits = OutputLimits(max_events=s.output_backpressure_events,
                                           max_bytes=s.output_backpressure_bytes)
        self._backlog = OutputBacklog(self._output_limits)
        self._stall_s = s.output_stall_timeout_s or None
        self._stalled = False  # a send stalled: no frame goes out any more
        self._cut_batch = False  # ... and the rest of the actions in hand are dropped
        self._refusals_told: set[str] = set()  # duties whose refusal this connection logged

    async def run(self) -> None:
        """Serve the connection; returns once it is closed and the session detached or over."""
        tasks = [
            asyncio.create_task(self._read_frames(), name="ws-reader"),
            asyncio.create_task(self._pump_log(), name="ws-pump"),
            asyncio.create_task(self._writer.run(self._step_if_free), name="ws-writer"),
            asyncio.create_task(self._housekeeping(), name="ws-housekeeping"),
        ]
        closed = asyncio.create_task(self._closed.wait(), name="ws-closed")
        quiet = asyncio.create_task(self._open_when_quiet(), name="ws-quiet-open")
        try:
            await asyncio.wait([closed, *tasks], return_when=asyncio.FIRST_COMPLETED)
            await self._fail_if_broken(tasks)
        finally:
            for task in (closed, quiet, *tasks):
                task.cancel()
            await asyncio.gather(closed, quiet, *tasks, return_exceptions=True)
            if self._channel is not None:
                await self._svc.subscriber.unsubscribe(self._channel, self._take_push)
            if self._held is not None:
                self._svc.leases.release(self._held)

    async def _fail_if_broken(self, tasks: list[asyncio.Task[None]]) -> None:
        """A task that ended on a bug would leave a connection that reads but never delivers
        (or the reverse): close it 1011 instead; the session is detached, so the client
        resumes, through any gateway."""
        for task in tasks:
            if self._closed.is_set():
                return
            if task.done() and not task.cancelled() and task.exception() is not None:
                _log.error("connection task %s failed; closing 1011", task.get_name(),
                           exc_info=task.exception(), extra={"session_id": self._session_id})
                self._core.fail(InternalError(f"{task.get_name()} failed"))
                await self._step()
                return

    # ------------------------------------------------------------------ tasks

    async def _open_when_quiet(self) -> None:
        """Open the session a ``?model=`` URL names once no frame came for the quiet period
        (the core decides whether one is still wanted then)."""
        if not self._core.awaits_quiet_period:
            return
        delay = self._svc.settings.url_open_delay_s
        if delay > 0:
            await asyncio.sleep(delay)  # the quiet period itself, not a wait for a condition
        self._core.quiet_period_over()
        await self._step()

    async def _read_frames(self) -> None:
        loop = asyncio.get_running_loop()
        # The first frame is due this long after the handshake, whatever was opened meanwhile.
        first_due = loop.time() + self._svc.settings.first_message_timeout_s
        departed = False
        try:
            while True:
                if self._core.state is ConnectionState.AWAITING_FIRST:
                    try:
                        message = await asyncio.wait_for(self._ws.receive(),
                                                         max(0.0, first_due - loop.time()))
                    except TimeoutError:
                        if self._core.state is ConnectionState.AWAITING_FIRST:
                            raise
                        continue  # a quiet open went ahead meanwhile: no first-frame rule
                else:  # no timer (nor wait_for's own getpid and frames) per frame
                    message = await self._ws.receive()
                if message["type"] == "websocket.disconnect":
                    # A normal close (1000) without session.close is how the openai SDK
                    # leaves: the session keeps its slot only for the short grace.
                    departed = message.get("code") == CloseCode.NORMAL
                    break
                if message.get(INVALID_TEXT_KEY):  # a text frame that is not UTF-8
                    self._core.receive_invalid_text()
                    await self._step()
                    continue
                data = message.get("text")
                if data is None:
                    data = message.get("bytes") or b""
                audio_before = self._core.audio_bytes_received
                self._core.receive_frame(data, asyncio.get_running_loop().time())
                # With no step in progress, a frame that decided one client command's append
                # alone (every audio chunk) only has it queued for the writer, which never
                # waits: no step, and no lock to take and hand back.
                entries = None if self._lock.locked() else self._core.take_lone_append()
                if entries is None:
                    await self._step()
                else:
                    self._writer.queue(entries)
                await self._pace(len(data), self._core.audio_bytes_received - audio_before)
        except TimeoutError:
            self._core.first_message_timed_out()
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass
        self._core.connection_lost(departed=departed)
        await self._step()
        self._closed.set()

    async def _pace(self, frame_bytes: int, audio_bytes: int) -> None:
        """Hold the next read while this connection is over its rates: the client's sends
        back up in TCP (flow control), so a flood costs nothing downstream."""
        loop = asyncio.get_running_loop()
        delay = self._pacer.charge(frame_bytes=frame_bytes, audio_bytes=audio_bytes,
                                   now=loop.time())
        if delay > 0:
            self._svc.metrics.paced_seconds.inc(delay)
            await asyncio.sleep(delay)  # the pacing schedule itself, not a wait for a condition

    async def _pump_log(self) -> None:
        interval = self._svc.settings.log_poll_interval_s
        while True:
            # None also after `interval` without a push: a quiet channel, so read the log in
            # case a push was lost.
            push = await self._pushes.get(quiet_s=interval)
            if self._core.state is not ConnectionState.ATTACHED:
                continue
            taken = time.monotonic()
            match push:
                case OutputPushed(first_seq=first_seq, payloads=payloads):
                    self._core.receive_log_entries(first_seq, payloads)
                case LeaseMoved(generation=generation):
                    self._core.lease_moved(generation)
                case None:
                    await self._fetch(self._core.delivered_seq, quiet=True)
            await self._step()
            if push is not None:
                self._relay_out.observe(time.monotonic() - taken)

    def _take_push(self, push: Push | None) -> None:
        """Every push for this connection, as it arrives, also while a send is blocked: queue
        it for the pump, and count the output it announces."""
        self._pushes.put(push)
        if type(push) is OutputPushed:
            self._backlog.seen(push.first_seq, push.payloads)
            self._check_backlog()

    def _check_backlog(self) -> None:
        """Once per crossing, tell the session's worker (fenced, like the client's commands)
        that the client has too much output untaken: it ends the active response failed,
        ``output_backpressure``. Nothing written is dropped: the client gets it all when it
        reads."""
        if self._core.state is not ConnectionState.ATTACHED:
            return
        crossed = self._backlog.crossed(self._buffered_bytes())
        if crossed is None:
            return
        self._svc.metrics.output_backpressure.inc()
        self._writer.queue(((None, OutputBackpressure(pending_events=crossed.events,
                                                     pending_bytes=crossed.bytes)),))

    def _buffered_bytes(self) -> int:
        """What the transport holds that the kernel has not taken yet."""
        return 0 if self._transport is None else self._transport.get_write_buffer_size()

    async def _housekeeping(self) -> None:
        """On the core's timer: trim what the client took long ago (the trims, its activity and
        tenant place ride the lease rounds, :mod:`gateway.leases`). Once the lease holding the
        session may have lapsed (this gateway cut off from Redis, or paused), a reaper may
        have detached it: close 1012, so the client resumes elsewhere."""
        loop = asyncio.get_running_loop()
        while True:
            due = self._core.next_deadline()
            lapses = self._lease_lapses_at()
            # A periodic duty, not a wait for a condition.
            wake = due if lapses is None else min(due, lapses)
            await asyncio.sleep(max(0.0, wake - loop.time()))
            now = loop.time()
            lapses = self._lease_lapses_at()
            if lapses is not None and now >= lapses:
                _lapse_log.warning("lease", "no lease renewal answered for a whole lease: closing"
                                   " 1012", extra={"session_id": self._session_id})
                self._core.lease_lapsed()
                self._svc.metrics.lease_lapse_closes.inc()
            self._core.timer_fired(now, taken_seq=self._backlog.taken_seq)
            await self._step_if_free()

    def _lease_lapses_at(self) -> float | None:
        # None unless attached: once closing, a past lapse must not wake the loop on and on.
        if self._held is None or self._core.state is not ConnectionState.ATTACHED:
            return None
        return self._svc.leases.lapses_at(self._held)

    async def _step_if_free(self) -> None:
        """Run what the core decided, unless a step is in progress: that step runs it (it
        drains until nothing is left), and waiting for it would hold the caller behind a send
        the client does not take (the writer's output backpressure command above all)."""
        if self._core.has_actions and not self._lock.locked():
            await self._step()

    # ------------------------------------------------------------------ logging

    @property
    def _session_id(self) -> str | None:
        """The session this connection serves now, for its log lines; None before one."""
        return self._lease.session_id if self._lease is not None else self._held

    def _store_failed(self, duty: str, session_id: str, exc: StoreError) -> None:
        """A store call made for this session failed; ``duty`` names it in plain words.

        Redis not answering fails every session's calls at once: that is the process's
        outage, told once per change (``services.outages``), and here only at DEBUG. A
        refusal (a script's error, a bug) is this session's fault: a WARNING the first time
        per duty on this connection (housekeeping repeats every second), DEBUG after.
        """
        extra = {"session_id": session_id}
        if self._svc.outages.call_failed(duty, exc) or duty in self._refusals_told:
            _log.debug("%s failed for %s: %s", duty, session_id, exc, extra=extra)
            return
        self._refusals_told.add(duty)
        _log.warning("%s failed for %s: %s", duty, session_id, exc, extra=extra)

    # ------------------------------------------------------------------ actions

    async def _step(self) -> None:
        """Run every action the core decided, in order, until it decides no more."""
        async with self._lock:
            while actions := self._core.actions_to_run():
                self._cut_batch = False
                for action in actions:
                    if self._cut_batch and isinstance(action, SendFrame | CloseConnection):
                        continue  # decided before a send stalled; the log keeps the events
                    await self._run_action(action)

    async def _run_action(self, action: Action) -> None:
        match action:
            case SendFrame(text=text, seq=seq):
                await self._send(text, seq)
            case AppendCommands(entries=entries):
                self._writer.queue(entries)
            case FetchLog() | CheckLogEnd() | TrimLog():
                await self._run_log_action(action)
            case OpenSession(model=model):
                await self._open(model)
            case ResumeSession(request=request):
                await self._resume(request)
            case DetachLease(departed=departed):
                await self._detach(departed=departed)
            case GiveUpSession(session_id=session_id):
                await self._give_up(session_id)
            case EndSession(session_id=session_id, reason=reason):
                await self._end(session_id, reason)
            case CloseConnection(code=code, reason=reason):
                await self._close(code, reason)

    async def _run_log_action(self, action: FetchLog | CheckLogEnd | TrimLog) -> None:
        match action:
            case FetchLog(after_seq=after, rewound_to=rewound_to):
                await self._fetch(after, rewound_to=rewound_to)
                if self._resume_started is not None:  # the replay of a resume was read
                    self._svc.metrics.resume_seconds.observe(
                        time.monotonic() - self._resume_started)
                    self._resume_started = None
            case CheckLogEnd(after_seq=after):
                await self._check_log_end(after)
            case TrimLog(upto_seq=upto) if self._lease is not None:
                # Only memory is at stake: the next lease renewal carries it (the length cap
                # bounds the log meanwhile).
                self._svc.leases.trim(self._lease, upto)

    async def _send(self, text: str, seq: int) -> None:
        if self._stalled or self._ws.application_state is not WebSocketState.CONNECTED:
            return
        # The hot path: written at once when the socket takes it; else the ASGI send waits.
        if self._send_now is None or not self._send_now(text):
            limit = self._send_limit()
            try:
                if limit is None:  # no timeout to enter and leave when the send cannot wait
                    await self._ws.send_text(text)
                else:
                    async with asyncio.timeout(limit):
                        await self._ws.send_text(text)
            except TimeoutError:
                self._output_stalled()
                return
            except (WebSocketDisconnect, RuntimeError, OSError):
                self._core.connection_lost()
                return
        self._svc.metrics.frames_sent.inc()
        if seq:
            self._backlog.taken(seq, buffered_bytes=self._buffered_bytes())

    def _send_limit(self) -> float | None:
        """How long the next send may wait for the client. A transport whose buffer is at or
        under its low-water mark has not paused writing, so the send cannot wait: no timer
        on the hot path."""
        transport = self._transport
        if (transport is not None
                and transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[0]):
            return None
        return self._stall_s

    def _output_stalled(self) -> None:
        """A send waited ``OUTPUT_STALL_TIMEOUT_S``: the client reads nothing. The frames
        decided so far are dropped (their events stay in the log for the resume); the core
        detaches the session and closes 1013."""
        # Any client can stall at will: one line per 10 s for the whole process.
        _stall_log.log(logging.INFO, "stall", "a client took no output for %.1f s: closing it"
                       " 1013 %s, its session detached", self._stall_s, OUTPUT_STALLED,
                       extra={"session_id": self._session_id})
        self._svc.metrics.output_stalls.inc()
        self._stalled = self._cut_batch = True
        self._core.output_stalled()

    async def _fetch(self, after: int, *, quiet: bool = False,
                     rewound_to: int | None = None) -> None:
        """Read the log after ``after``; the core decides what the rows mean."""
        if self._lease is None:
            return
        session_id = self._lease.session_id
        # One entry of overlap: the core checks the log still holds the last one it delivered.
        start = after - 1 if after and rewound_to is None else after
        try:
            rows = await read_output(self._svc.client, session_id, start)
        except StoreError as exc:
            self._store_failed("output log read", session_id, exc)
            return
        if rows and rewound_to is None:
            self._backlog.seen(rows[0][0], [payload for _, payload in rows])
        self._core.log_read(after, rows, quiet=quiet, rewound_to=rewound_to)

    async def _check_log_end(self, after: int) -> None:
        if self._lease is None:
            return
        session_id = self._lease.session_id
        try:
            ends = await log_ends(self._svc.client, session_id)
        except StoreError as exc:
            self._store_failed("output log read", session_id, exc)
            return
        self._core.log_end_read(after, ends.last_output)

    async def _subscribe(self, session_id: str) -> None:
        channel = SessionKeys(session_id).output_channel
        if self._channel is not None and self._channel != channel:
            # Placement moved on to another worker, or the client resumed another session than
            # the one its URL opened: leave the old channel, and drop what it already pushed
            # (those entries belong to another session's log).
            await self._svc.subscriber.unsubscribe(self._channel, self._take_push)
            self._pushes.clear()
        self._channel = channel
        with contextlib.suppress(TimeoutError):
            # A missed confirmation only costs latency: the pump reads the log regardless.
            await self._svc.subscriber.subscribe(channel, self._take_push)

    async def _open(self, model: str | None) -> None:
        token = secrets.token_urlsafe(32)
        try:
            placed = await place_session(self._svc, token_digest=_digest(token),
                                         tenant=self._tenant, subscribe=self._subscribe,
                                         model=model)
        except ClientProtocolError as exc:
            self._core.open_failed(exc)
            return
        except StoreUnavailable:
            # The store did not take the open in time (busy, failing over, away) and placement
            # compensated: nothing is open, so the client may open again later.
            self._core.open_failed(ClientProtocolError(
                ErrorCode.RESOURCE_EXHAUSTED,
                "the session store did not take the open in time; retry later",
                close_code=CloseCode.TRY_AGAIN_LATER))
            return
        except StoreError as exc:
            self._core.open_failed(InternalError(str(exc)))
            return
        lease = placed.lease
        self._hold(lease.session_id)
        self._lease = lease
        self._writer.attach(lease, placed.session, placed.capabilities)
        self._svc.metrics.sessions_opened.inc()
        self._core.open_succeeded(lease.session_id, resume_token=token,
                                  generation=lease.generation, model=placed.model,
                                  session=placed.session, capabilities=placed.capabilities)
        self._backlog = OutputBacklog(self._output_limits)

    async def _resume(self, request: ResumeRequest) -> None:
        started = time.monotonic()
        try:
            SessionKeys(request.session_id)
        except ValueError:
            self._svc.metrics.resumes.labels(outcome=ErrorCode.SESSION_RESUME_EXPIRED).inc()
            self._svc.metrics.resume_seconds.observe(time.monotonic() - started)
            self._core.resume_failed(ClientProtocolError(
                ErrorCode.SESSION_RESUME_EXPIRED, "unknown session",
                client_event_id=request.event_id))
            return
        await self._subscribe(request.session_id)
        control_id = request.control_id or secrets.token_hex(16)
        token = rotated_token(request.resume_token, control_id)
        for attempt in range(_RESUME_ATTEMPTS):
            try:
                result = await self._svc.scripts.resume(
                    request.session_id, tenant=self._tenant,
                    presented_digest=_digest(request.resume_token),
                    new_digest=_digest(token), control_id=control_id,
                    holder=self._svc.holder, attempt=request.attempt)
                break
            except StoreError as exc:
                # Same control id: if the first try landed, the retry is recognised as such.
                if attempt == _RESUME_ATTEMPTS - 1:
                    self._svc.metrics.resume_seconds.observe(time.monotonic() - started)
                    self._core.fail(InternalError(str(exc)))
                    return
        lease = result.lease
        outcome = self._core.resume_answered(ResumeAnswer(
            outcome=result.status,
            generation=None if lease is None else lease.generation,
            last_client_seq=result.last_client_seq,
            first_retained_seq=result.first_retained_seq,
            last_server_event_seq=result.last_server_event_seq,
            session=result.session, capabilities=result.capabilities), rotated_token=token)
        self._svc.metrics.resumes.labels(outcome=outcome).inc()
        if lease is None or outcome != "ok":
            self._svc.metrics.resume_seconds.observe(time.monotonic() - started)
            return
        self._hold(lease.session_id)
        self._lease = lease
        self._writer.attach(lease, result.session, result.capabilities)
        self._resume_started = started  # observed once the replay was read
        # Counted from where the client stands (the replay starts there).
        self._backlog = OutputBacklog(self._output_limits, taken_seq=self._core.delivered_seq)

    def _hold(self, session_id: str) -> None:
        """This connection now holds ``session_id`` under the gateway's attachment lease."""
        if self._held is not None:
            self._svc.leases.release(self._held)
        self._svc.leases.hold(session_id, self._tenant)
        self._held = session_id

    async def _give_up(self, session_id: str) -> None:
        try:
            await self._svc.scripts.close_session(session_id, CloseReason.OPEN_ABANDONED)
        except StoreError as exc:
            # Nothing was ever sent to it: its idle TTL ends it.
            self._store_failed("abandoning an unopened session", session_id, exc)

    async def _end(self, session_id: str, reason: CloseReason) -> None:
        _log.error("the input log of %s went back (lost writes); ending it (%s)", session_id,
                   reason, extra={"session_id": session_id})
        try:
            await self._svc.scripts.close_session(session_id, reason)
        except StoreError as exc:
            self._store_failed(f"close ({reason})", session_id, exc)

    async def _detach(self, *, departed: bool = False) -> None:
        if self._lease is None:
            return
        # Commands read before the socket went (a session.close sent just before closing it,
        # above all) reach the log first: a detached session refuses appends, and the writer
        # is cancelled once the connection ends.
        await self._writer.flush()
        try:
            grace_s = self._svc.settings.departed_grace_s if departed else 0.0
            await self._svc.scripts.detach(self._lease, grace_ms=int(grace_s * 1000))
        except StoreError as exc:
            # The idle deadline still ends the session; the client can resume meanwhile.
            self._store_failed("detach", self._lease.session_id, exc)

    async def _close(self, code: int, reason: str) -> None:
        if self._ws.application_state is WebSocketState.CONNECTED:
            try:
                # A client that reads nothing never takes the close frame either: it gets as
                # long as any send, then its socket is dropped (it resumes, through any
                # gateway, from the last event it got).
                async with asyncio.timeout(self._stall_s):
                    # Cut by UTF-8 bytes: a longer reason makes the close frame itself invalid.
                    await self._ws.close(code, fit_close_reason(reason))
            except TimeoutError:
                if self._transport is not None:
                    self._transport.abort()
            except (RuntimeError, OSError, WebSocketDisconnect):
                pass
        self._closed.set()

