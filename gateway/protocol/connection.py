"""The I/O-free core of one client connection.

The gateway holds no session state (DESIGN.md "Who owns what"): this object lives exactly as
long as one websocket and decides, from its inputs alone, what the driver must do. Inputs are
method calls (a client frame arrived, the store answered, log entries arrived, the lease moved,
the timer fired, the socket dropped); outputs are :mod:`~gateway.protocol.actions`, drained
with :meth:`ConnectionCore.actions_to_run`, the swap idiom of python-websockets. No asyncio, no
Redis, no clock: the driver says what time it is.

Every state change goes through :data:`~gateway.protocol.transitions.TRANSITIONS` (drawn by
:func:`~gateway.protocol.transitions.mermaid`).

A resume never depends on capacity (DESIGN §2.7): a ``?model=`` URL (what the openai SDK sends
on every connection, resumes included) opens its session only at the first client frame that
is not ``session.resume``, or once the driver says the quiet period is over (clients that wait
for ``session.created`` send nothing). A quiet open refused for a retryable reason (no slot,
a tenant limit) is held, not answered: a ``session.resume`` that comes next resumes as if the
URL had asked for nothing, a command opens again, and only the first-message timeout answers
the refusal. So no ``error`` comes before ``session.resumed``.

Frames that arrive while an open or resume is in flight are parsed at once (errors are
answered in order) and their commands queued until the lease exists.

:class:`gateway.protocol.backlog.OutputBacklog` is the other I/O-free part of a connection.
"""

from __future__ import annotations

from contract.follower import LogFollower
from contract.messages import (
    AppendAudio,
    Command,
    JsonObject,
    UpdateSession,
)
from contract.reasons import CloseReason
from gateway.protocol.actions import (
    Action,
    AppendCommands,
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
from gateway.protocol.bounds import VideoBounds, VideoBudget
from gateway.protocol.delivery import OutputDelivery
from gateway.protocol.dialect import Dialect
from gateway.protocol.envelope import (
    EventAck,
    ResumeRequest,
    ResyncRequiredNotice,
    SessionCreatedNotice,
    SessionReplacedNotice,
    SessionResumedNotice,
)
from gateway.protocol.errors import (
    ClientProtocolError,
    CloseCode,
    ErrorCode,
    GatewayError,
)
from gateway.protocol.parse import parse_client_frame
from gateway.protocol.render import encode_frame, render_error, render_event, render_notice
from gateway.protocol.render_duplex import DuplexRenderer, ExtraFrames
from gateway.protocol.resume import REFUSALS, ResumeAnswer
from gateway.protocol.retention import TIMER_S, DeliveredRetention
from gateway.protocol.transitions import ConnectionState, Trigger
from store.answers import ResumeStatus

__all__ = ["OUTPUT_STALLED", "ConnectionCore"]

#: The close reason of a connection whose client took nothing for ``OUTPUT_STALL_TIMEOUT_S``.
OUTPUT_STALLED = "output_stalled"


class ConnectionCore(OutputDelivery):
    """Drives one websocket connection; see the module docstring.

    Args:
        max_frame_bytes: frames above this size are refused with close 1009.
        url_model: the model the URL names (``?model=``): the session is opened for it
            without waiting for a command, once the quiet period is over
            (:meth:`quiet_period_over`), as the OpenAI server opens one at once. None: the
            first command opens the session.
        autostart: False (the URL said ``resume=1`` or ``autostart=0``): nothing is opened
            before the first client event; a session it opens is for the model its
            ``session.update`` names, else ``url_model``.
        dialect: what the connection speaks (:mod:`gateway.protocol.dialect`).
        initial_session: the session configuration of the client secret the connection
            presented; a session it opens runs it as its first ``session.update``, before any
            client command. A resume ignores it (that session is configured already).
        delivered_retention_s: events the client took this long ago are trimmed from the
            log (:mod:`gateway.protocol.retention`; 0: never by age).
        now: the driver's clock at the handshake; the timer is first due one period later.
        video: the bounds on camera frames (None: the defaults).
    """

    def __init__(self, *, max_frame_bytes: int, url_model: str | None = None,
                 autostart: bool = True, dialect: Dialect = Dialect.GA,
                 initial_session: JsonObject | None = None,
                 delivered_retention_s: float = 0.0, now: float = 0.0,
                 video: VideoBounds | None = None) -> None:
        self.state = ConnectionState.AWAITING_FIRST
        self.dialect = dialect
        self._extra_frames: ExtraFrames = []
        if dialect is Dialect.DUPLEX:
            renderer = DuplexRenderer(self._extra_frames)
            self._render_event, self._render_notice = renderer.event, renderer.notice
            self._render_error = renderer.error
        else:
            self._render_event, self._render_notice = render_event, render_notice
            self._render_error = render_error
        self.session_id: str | None = None
        self.generation = 0
        self._max_frame_bytes = max_frame_bytes
        self._actions: list[Action] = []
        self._pending: list[tuple[int | None, Command]] = []
        if initial_session is not None:
            self._pending.append((None, UpdateSession(session=initial_session)))
        self._follower = LogFollower()
        self._event_counter = 0
        #: Bytes of input audio in the frames received so far (the driver paces on it).
        self.audio_bytes_received = 0
        self._url_model = url_model
        self._autostart = autostart
        # The URL's session is opened after the quiet period (None: no such open pending).
        self._quiet_open_pending = url_model is not None and autostart
        self._autostarted = False  # the open in flight or landed is the URL's quiet open
        self._client_commands = 0  # commands the client sent (a secret's config is not one)
        self._give_up_opening = False  # the open in flight is given up when it lands
        self._held_refusal: ClientProtocolError | None = None  # a quiet open's, not answered
        self._retention = DeliveredRetention(delivered_retention_s)
        # The highest seq the client acknowledged under this lease, and the highest trimmed:
        # acks are trimmed on the timer, once for all of them, since the seed's client acks
        # every event and a trim per ack would be a store call per event.
        self._acked_seq = 0
        self._trimmed_seq = 0
        self._timer_at = now  # when the timer last fired
        self._video = VideoBudget(video or VideoBounds(), now)
        self._input_end = 0  # the highest input log index Redis assigned under this lease
        self._resume_request: ResumeRequest | None = None  # the resume in flight

    # ------------------------------------------------------------------ outputs

    def actions_to_run(self) -> list[Action]:
        """Drain the actions decided since the last call, in order."""
        actions, self._actions = self._actions, []
        return actions

    def take_lone_append(self) -> tuple[tuple[int | None, Command], ...] | None:
        """When all that was decided since the last drain is one :class:`AppendCommands`,
        drain it and return its entries; else None, with nothing drained. (The driver queues
        these for its writer without taking the lock its other actions run under.)"""
        actions = self._actions
        if len(actions) == 1 and type(actions[0]) is AppendCommands:
            self._actions = []
            return actions[0].entries
        return None

    @property
    def has_actions(self) -> bool:
        """Whether actions were decided since the last :meth:`actions_to_run`."""
        return bool(self._actions)

    # ------------------------------------------------------------------ inputs: client

    def receive_frame(self, data: str | bytes, now: float | None = None) -> None:
        """A frame from the client, read at ``now`` (None: the timer's last time)."""
        if self.state is ConnectionState.CLOSED:
            return
        try:
            frame = parse_client_frame(data, max_frame_bytes=self._max_frame_bytes,
                                       dialect=self.dialect)
        except ClientProtocolError as exc:
            self._refuse(exc)
            return
        if isinstance(frame.envelope, ResumeRequest):
            self._receive_resume(frame.envelope)
        elif isinstance(frame.envelope, EventAck):
            self._receive_ack(frame.envelope)
        else:
            assert frame.command is not None  # a ParsedFrame holds exactly one of the two
            if isinstance(frame.command, AppendAudio):
                if frame.command.video_frames and (refused := self._video.refusal(
                        frame.command, self._timer_at if now is None else now)):
                    self._refuse(refused)
                    return
                self.audio_bytes_received += len(frame.command.audio)
            self._receive_command(frame.client_seq, frame.command)

    def receive_invalid_text(self) -> None:
        """A text frame whose payload is not UTF-8.

        RFC 6455 §8.1 says the endpoint must fail the connection, so unlike a bad binary frame
        this one ends it: ``invalid_json``, then close 1007. An attached session is detached,
        resumable like after 1009.
        """
        if self.state is ConnectionState.CLOSED:
            return
        self._refuse(ClientProtocolError(
            ErrorCode.INVALID_JSON, "The text frame is not valid UTF-8.",
            close_code=CloseCode.INVALID_PAYLOAD_DATA,
        ))

    def _receive_resume(self, request: ResumeRequest) -> None:
        if self._url_session_unused():
            self._give_up_url_session()
        elif self.state is ConnectionState.AWAITING_FIRST:
            # The URL asked for a session the client does not want: none is opened, and a
            # quiet open's refusal for lack of room is not this resume's business.
            self._quiet_open_pending = False
            self._held_refusal = None
        else:
            self._refuse(ClientProtocolError(
                ErrorCode.UNSUPPORTED_SESSION_RESUME,
                "session.resume must be the first message of a connection",
                client_event_id=request.event_id,
            ))
            return
        self._move(Trigger.RESUME)
        self._pending = []  # a client secret's configuration is for new sessions only
        self._follower = LogFollower(request.last_received_server_event_seq)
        self._resume_request = request
        self._actions.append(ResumeSession(request=request))

    def _url_session_unused(self) -> bool:
        """The quiet open of a ``?model=`` URL (the openai SDK's every connection names one)
        is in flight or landed, and the client has sent no command for it yet."""
        return (self._autostarted and not self._client_commands
                and self.state in (ConnectionState.OPENING, ConnectionState.ATTACHED))

    def _give_up_url_session(self) -> None:
        """The client resumes another session as its first event: give up the one the URL
        opened, now or when its open lands (once: the resumed session is the client's)."""
        self._autostarted = False
        if self.state is ConnectionState.ATTACHED:
            assert self.session_id is not None
            self._actions.append(GiveUpSession(session_id=self.session_id))
            self.session_id, self.generation = None, 0
        else:
            self._give_up_opening = True

    def _receive_ack(self, ack: EventAck) -> None:
        if ack.server_event_seq > self.delivered_seq:
            self._refuse(ClientProtocolError(
                ErrorCode.INVALID_EVENT_ACK,
                f"server_event_seq {ack.server_event_seq} was never sent",
                param="server_event_seq", client_event_id=ack.event_id,
            ))
        elif self.state is ConnectionState.ATTACHED:
            self._acked_seq = max(self._acked_seq, ack.server_event_seq)

    def _receive_command(self, client_seq: int | None, command: Command) -> None:
        self._client_commands += 1
        if self.state is ConnectionState.ATTACHED:
            self._actions.append(AppendCommands(entries=((client_seq, command),)))
            return
        self._pending.append((client_seq, command))
        if self.state is ConnectionState.AWAITING_FIRST:
            # The first frame opens the session (a quiet open's held refusal is void: this is
            # a new try); a session.update configures it, anything else opens a default
            # session and then runs as its first command.
            self._quiet_open_pending = False
            self._held_refusal = None
            self._move(Trigger.OPEN)
            self._actions.append(OpenSession(model=self._model_to_open()))

    def _model_to_open(self) -> str | None:
        """The model a session opened now asks for: the URL's (when it may autostart), else
        the first one a queued ``session.update`` names (a client secret's configuration,
        then the client's first command), else the URL's; None: the deployment's default."""
        if self._url_model is not None and self._autostart:
            return self._url_model
        for _, command in self._pending:
            if isinstance(command, UpdateSession):
                model = command.session.get("model")
                if isinstance(model, str) and model:
                    return model
        return self._url_model

    @property
    def awaits_quiet_period(self) -> bool:
        """Whether the URL's session waits for :meth:`quiet_period_over` (or a command)."""
        return self._quiet_open_pending and self.state is ConnectionState.AWAITING_FIRST

    def quiet_period_over(self) -> None:
        """No client frame came for the quiet period after the handshake: open the session the
        URL names (the client may be waiting for ``session.created`` before it sends)."""
        if not self.awaits_quiet_period:
            return
        self._quiet_open_pending = False
        self._autostarted = True
        self._move(Trigger.OPEN)
        self._actions.append(OpenSession(model=self._url_model))

    def first_message_timed_out(self) -> None:
        """No first frame arrived in time: refuse, and place no session. After a quiet open
        that was refused for now, that refusal is the answer."""
        if self.state is not ConnectionState.AWAITING_FIRST:
            return
        if self._held_refusal is not None:
            self._fail(self._held_refusal)
            return
        self._fail(ClientProtocolError(
            ErrorCode.CONFIG_TIMEOUT, "no client event arrived in time to open a session"),
            close_code=CloseCode.POLICY_VIOLATION)

    def connection_lost(self, *, departed: bool = False) -> None:
        """The socket dropped (or timed out) without a terminal event; ``departed``: the
        client closed it normally (1000), without ``session.close``: it left."""
        self._force_closed(departed=departed)

    # ------------------------------------------------------------------ inputs: store

    def open_succeeded(
        self, session_id: str, *, resume_token: str, generation: int, model: str | None,
        session: JsonObject | None = None, capabilities: JsonObject | None = None,
    ) -> None:
        """The open script placed the session; announce it and release queued commands.

        ``session``: the session object to announce, from the serving worker's profile (its
        ``model`` is the session's, ``model``); None (a worker that published no profile):
        only ``{type, model}`` (``model`` left out when None). ``capabilities`` ride along
        when known.
        """
        if self._give_up_opening:  # the client resumed another session meanwhile
            self._give_up_opening = False
            self._actions.append(GiveUpSession(session_id=session_id))
            return
        if self._landed_after_close(session_id, generation):
            return
        self.session_id = session_id
        self.generation = generation
        self._move(Trigger.ATTACHED)
        announced = session
        if announced is None:
            announced = {"type": "realtime"} if model is None else {"type": "realtime",
                                                                     "model": model}
        self._notice(SessionCreatedNotice(
            session_id=session_id, resume_token=resume_token, lease_generation=generation,
            session=announced, capabilities=capabilities,
        ))
        self._actions.append(FetchLog(after_seq=self.delivered_seq))
        self._flush_pending()

    def open_failed(self, error: GatewayError) -> None:
        """The open did not land (no room, an unknown model, a store failure).

        Given up already (the client resumed meanwhile): nothing to say. A quiet open refused
        for a retryable reason (close 1013) before the client sent anything: held (see the
        module docstring). Otherwise answered, and the connection closed with its code.
        """
        if self._give_up_opening:
            self._give_up_opening = False
            return
        if (self.state is ConnectionState.OPENING and self._autostarted
                and not self._client_commands and isinstance(error, ClientProtocolError)
                and error.close_code == CloseCode.TRY_AGAIN_LATER):
            self._autostarted = False
            self._held_refusal = error
            self._move(Trigger.HELD)
            return
        self._fail(error)

    def fail(self, error: GatewayError) -> None:
        """The session could not be served (a store failure, a broken task): answer the
        error and close with its close code (1011 when it has none)."""
        self._fail(error)

    def resume_answered(self, answer: ResumeAnswer, *, rotated_token: str) -> str:
        """The store answered the resume in flight; ``rotated_token``: the token it rotated
        to (:func:`~gateway.protocol.resume.rotated_token`). Returns the outcome as the
        driver counts it: ``"ok"`` (attached), else the refusal's error code."""
        request = self._resume_request
        assert request is not None, "no resume in flight"
        refusal = REFUSALS.get(answer.outcome)
        if refusal is None and answer.generation is None:
            refusal = REFUSALS[ResumeStatus.BAD_TOKEN]
        if refusal is not None:
            code, message = refusal
            self.resume_failed(ClientProtocolError(code, message,
                                                   client_event_id=request.event_id))
            return code.value
        assert answer.generation is not None
        ok = answer.outcome is ResumeStatus.OK
        self.resume_succeeded(
            request.session_id,
            resume_token=rotated_token if ok else request.resume_token,
            generation=answer.generation, last_client_seq=answer.last_client_seq,
            first_retained_seq=answer.first_retained_seq,
            last_server_event_seq=answer.last_server_event_seq,
            session_over=answer.outcome is ResumeStatus.CLOSED,
            session=answer.session, capabilities=answer.capabilities)
        return "ok"

    def resume_succeeded(
        self, session_id: str, *, resume_token: str, generation: int, last_client_seq: int,
        first_retained_seq: int, last_server_event_seq: int, session_over: bool = False,
        session: JsonObject | None = None, capabilities: JsonObject | None = None,
    ) -> None:
        """The resume CAS landed: announce, then replay from the log (or ask for a resync).
        ``session_over``: the session has ended (its terminal event is the log's last).
        ``session`` and ``capabilities``: what the record holds (None: left out)."""
        if self._landed_after_close(session_id, generation):
            return
        self.session_id = session_id
        self.generation = generation
        self._move(Trigger.ATTACHED)
        rewound = self.delivered_seq > last_server_event_seq
        if rewound:
            # The client holds events the log does not: the store lost acknowledged writes (a
            # failover to a replica that lagged) or the client is wrong. Its position is void;
            # new events are numbered on from the log's end, so say so (never a silent gap).
            # A session that ended since (the worker saw its input log go back) has its
            # terminal event last, under a number the client holds: replay that one too.
            ended_at = last_server_event_seq if session_over else 0
            self._follower = LogFollower(max(ended_at - 1, 0) if ended_at
                                         else last_server_event_seq)
        self._notice(SessionResumedNotice(
            session_id=session_id, resume_token=resume_token, lease_generation=generation,
            last_client_seq=last_client_seq, replay_from=self._follower.next_index,
            session=session, capabilities=capabilities,
        ))
        if rewound:
            self._notice(ResyncRequiredNotice(session_id=session_id, reason="log_rewound",
                                              replay_from=self._follower.next_index))
        missing_from = self._follower.next_index
        trimmed = first_retained_seq == 0 or first_retained_seq > missing_from
        if missing_from <= last_server_event_seq and trimmed:
            # DESIGN §2.7: events the client lacks are gone; never a silent gap. Replay then
            # resumes at the oldest event still retained.
            resume_after = first_retained_seq - 1 if first_retained_seq else last_server_event_seq
            self._notice(ResyncRequiredNotice(session_id=session_id, reason="log_trimmed",
                                              replay_from=resume_after + 1))
            self._follower = LogFollower(resume_after)
        self._actions.append(FetchLog(after_seq=self.delivered_seq))
        self._flush_pending()

    def resume_failed(self, error: ClientProtocolError) -> None:
        """Unknown session, wrong token or a conflicting resume: refuse and close (1008)."""
        self._fail(error, close_code=CloseCode.POLICY_VIOLATION)

    def lease_moved(self, generation: int) -> None:
        """A newer attach took the session (resume elsewhere, or our write was fenced)."""
        if self.state is not ConnectionState.ATTACHED or generation <= self.generation:
            return
        assert self.session_id is not None
        self._notice(SessionReplacedNotice(session_id=self.session_id,
                                           lease_generation=self.generation))
        self._actions.append(CloseConnection(code=CloseCode.NORMAL, reason="session_replaced"))
        self._move(Trigger.REPLACED)

    def lease_lapsed(self) -> None:
        """The session was detached under this connection's own lease (the gateway did not
        renew its attachment in time): it lives on, resumable; close 1012 so the client
        resumes it, through any gateway. Nothing to detach: it is detached already."""
        if self.state is not ConnectionState.ATTACHED:
            return
        self._actions.append(CloseConnection(code=CloseCode.SERVICE_RESTART,
                                             reason="lease_lapsed"))
        self._move(Trigger.LEASE_LAPSED)
        self._pending = []

    def input_refused(self, commands: int, first_event_id: str | None) -> None:
        """The store took none of the ``commands`` just appended: with them, the commands the
        worker has not read yet would pass ``INPUT_LOG_MAX_ENTRIES``. Nothing more goes
        upstream from this connection (a later command that landed would overtake the refused
        ones, and move ``last_client_seq`` past them, so a resend would be dropped as a
        duplicate). The client is told (``input_backpressure``) and the connection closed
        1013; the session is detached, not ended, so the client resumes (after a pause the
        worker can catch up in) and resends everything after
        ``session.resumed.last_client_seq``, in order."""
        start = f"starting with event {first_event_id} " if first_event_id else ""
        self._fail(ClientProtocolError(
            ErrorCode.INPUT_BACKPRESSURE,
            f"The model worker is behind on this session's input: {commands} command(s) "
            f"{start}were not taken, nor anything after them. Resume and resend from"
            " last_client_seq.",
            client_event_id=first_event_id, close_code=CloseCode.TRY_AGAIN_LATER))

    def input_appended(self, first_index: int, last_index: int) -> None:
        """The store numbered the commands just appended ``first_index`` to ``last_index``.

        Under one lease the numbers only grow. A number this connection saw assigned before
        means the input log went back (a failover lost commands the client was told were
        taken, and the worker may never have read them): the session is ended loudly
        (:class:`EndSession`) rather than run on without them, and its terminal event read.
        """
        if first_index > self._input_end or self.session_id is None:
            self._input_end = max(self._input_end, last_index)
            return
        self._actions.append(EndSession(session_id=self.session_id,
                                        reason=CloseReason.LOG_REWOUND))
        self.session_gone()

    def next_deadline(self) -> float:
        """When :meth:`timer_fired` is next due, on the driver's clock."""
        return self._timer_at + TIMER_S

    def timer_fired(self, now: float, *, taken_seq: int) -> None:
        """The periodic timer: the client had taken every event up to ``taken_seq`` by
        ``now``. Events it acknowledged, or took long enough ago, are trimmed
        (:mod:`gateway.protocol.retention`)."""
        self._timer_at = now
        if self.state is not ConnectionState.ATTACHED:
            return
        upto = max(self._retention.sample(now, taken_seq) or 0, self._acked_seq)
        if upto > self._trimmed_seq:
            self._trimmed_seq = upto
            self._actions.append(TrimLog(upto_seq=upto))

    def session_gone(self) -> None:
        """A fenced write found the session closed: catch up with the log's terminal event."""
        if self.state is ConnectionState.ATTACHED:
            self._actions.append(FetchLog(after_seq=self.delivered_seq))

    def output_stalled(self) -> None:
        """A send to the client stayed blocked for ``OUTPUT_STALL_TIMEOUT_S``: it reads nothing.

        What it has not taken stays in the log, so the session is detached (the full
        disconnect grace, resumable through any gateway), never ended, and the connection is
        closed 1013 ``output_stalled``: the client resumes from the last event it got. No
        ``error`` event: it would wait behind everything the client does not read. The close
        is decided even after the session's terminal event was: the client never got that
        event, and gets it on resume. The driver drops the frames decided before this.
        """
        if self.state is ConnectionState.ATTACHED:
            # First: the close may wait for a client that never takes it.
            self._actions.append(DetachLease(generation=self.generation))
        self._actions.append(CloseConnection(code=CloseCode.TRY_AGAIN_LATER,
                                             reason=OUTPUT_STALLED))
        self._move(Trigger.OUTPUT_STALLED)
        self._pending = []

    def session_lost(self) -> None:
        """The store has no record of the session (a Redis restart or failover lost it): there
        is no terminal event to replay, so say so plainly and close; never hang silently."""
        if self.state is not ConnectionState.ATTACHED:
            return
        error = ClientProtocolError(
            ErrorCode.SESSION_LOST, "the store lost this session's state; open a new session")
        self._actions.append(SendFrame(text=encode_frame(self._render_error(
            error, self._next_event_id()))))
        self._actions.append(CloseConnection(code=CloseCode.INTERNAL_ERROR,
                                             reason=error.code))
        # No DetachLease: there is no record left to detach.
        self._move(Trigger.SESSION_LOST)
        self._pending = []

    # ------------------------------------------------------------------ helpers

    def _flush_pending(self) -> None:
        if self._pending:
            self._actions.append(AppendCommands(entries=tuple(self._pending)))
            self._pending = []

    def _refuse(self, error: ClientProtocolError) -> None:
        """Answer a bad frame; close only when the error says so."""
        self._actions.append(SendFrame(text=encode_frame(self._render_error(
            error, self._next_event_id()))))
        if error.close_code is not None:
            self._actions.append(CloseConnection(code=error.close_code, reason=error.code))
            self._force_closed()

    def _fail(self, error: GatewayError, close_code: int | None = None) -> None:
        if self.state is ConnectionState.CLOSED:
            return  # e.g. a store call that failed after the socket dropped
        self._actions.append(SendFrame(text=encode_frame(self._render_error(
            error, self._next_event_id()))))
        code = close_code or error.close_code or CloseCode.INTERNAL_ERROR
        self._actions.append(CloseConnection(code=code, reason=getattr(error, "code", "")))
        self._force_closed()

    def _landed_after_close(self, session_id: str, generation: int) -> bool:
        """An open or resume that lands after the socket dropped: hand the lease back.

        Without this the session would stay attached to no one until its idle expiry.
        """
        if self.state is not ConnectionState.CLOSED:
            return False
        if self.session_id is None:
            self.session_id = session_id
            self.generation = generation
            self._actions.append(DetachLease(generation=generation))
        return True

    def _force_closed(self, *, departed: bool = False) -> None:
        # Ending an attached connection without a terminal event leaves the session alive in
        # its disconnect grace, resumable through any gateway (DESIGN §2.6).
        if self.state is ConnectionState.ATTACHED:
            self._actions.append(DetachLease(generation=self.generation, departed=departed))
        self._move(Trigger.FAIL)
        self._pending = []
