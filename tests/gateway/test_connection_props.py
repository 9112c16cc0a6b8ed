"""Stateful property test of the connection core against a model of the store and the log.

A hypothesis :class:`RuleBasedStateMachine` plays client, store and worker at once: it sends
random frames (valid and invalid), answers the core's store calls (sometimes after the socket
dropped), writes events to a model of the session's output log, pushes them live with
duplicates, reordering and lost wake-ups, trims the log, answers log reads (and the checks of
where the log ends) in any order and late, numbers the appended input (sometimes going back, as
after a lossy failover), fires the connection's timer, moves the lease and drops the
connection. After every step it checks what the core decided against the promises of DESIGN.md
§2.5-§2.8.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from contract import messages as m
from contract.reasons import CloseReason
from gateway.protocol.actions import (
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
from gateway.protocol.connection import ConnectionCore
from gateway.protocol.errors import ClientProtocolError, CloseCode, ErrorCode, InternalError
from gateway.protocol.parse import parse_client_frame
from gateway.protocol.render import render_event
from gateway.protocol.resume import REFUSALS, ResumeAnswer
from gateway.protocol.retention import TIMER_S
from gateway.protocol.transitions import ConnectionState
from store.answers import ResumeStatus
from tests.gateway.strict import validate_server_event

LIMIT = 2048
SID = "sess_props_0123456789ab"
RETENTION_S = 2.5  # the connection's delivered retention, in timer periods of 1 s
TERMINAL_TYPES = frozenset({"session.closed", "session.expired"})

# --------------------------------------------------------------------------- the worker's log

_P: dict[str, Any] = {
    "response_id": "resp_1", "item_id": "item_1", "output_index": 0, "content_index": 0,
}
GOOD_EVENTS: list[m.Event] = [
    m.HeartbeatAck(),
    m.SessionUpdated(session={"type": "realtime", "model": "loopback"}),
    m.ErrorEvent(code="response_cancel_not_active", message="nothing to cancel"),
    m.InputCommitted(item_id="item_0"),
    m.InputCleared(),
    m.AudioDelta(**_P, audio=b"\x00\x01" * 3),
    m.TranscriptDelta(**_P, delta="hé"),
    m.AudioDone(**_P),
]
# Entries the gateway must skip without a frame (the seq still advances).
BAD_ENTRIES: list[bytes] = [
    b"garbage",
    b'{"k":"no.such.kind"}\0',
    m.encode_message(m.CommitInput()),  # a command in the output log
    m.encode_message(m.SessionUpdated(session={"temperature": math.nan})),  # not JSON-encodable
]
ENTRIES = st.one_of(st.sampled_from([m.encode_message(e) for e in GOOD_EVENTS]),
                    st.sampled_from(BAD_ENTRIES))
TERMINALS = st.sampled_from([m.SessionClosed(reason="client_close"),
                             m.SessionExpired(reason="grace_expired")])


def _renders(payload: bytes) -> bool:
    """Whether the core would send a frame for this entry."""
    try:
        event = m.decode_event(payload)
        json.dumps(render_event(event, server_event_seq=1, event_id="e"), allow_nan=False)
    except (m.MessageDecodeError, ValueError):
        return False
    return True


# --------------------------------------------------------------------------- client frames

_SEQ = st.one_of(st.none(), st.integers(1, 40))
_EVENT_ID = st.one_of(st.none(), st.sampled_from(["c1", "c2", "evt_x"]))
_B64 = base64.b64encode(b"\x01\x00\x02\x00").decode()

COMMAND_FRAMES = st.builds(
    lambda body, seq, event_id: json.dumps({
        **body,
        **({"client_seq": seq} if seq is not None else {}),
        **({"event_id": event_id} if event_id is not None else {}),
    }),
    st.sampled_from([
        {"type": "session.update", "session": {"instructions": "hi"}},
        {"type": "input_audio_buffer.append", "audio": _B64},
        {"type": "input_audio_buffer.commit"},
        {"type": "input_audio_buffer.clear"},
        {"type": "response.create"},
        {"type": "response.cancel", "response_id": "resp_1"},
        {"type": "session.heartbeat"},
        {"type": "session.close"},
    ]),
    _SEQ,
    _EVENT_ID,
)
BAD_FRAMES: st.SearchStrategy[str | bytes] = st.sampled_from([
    "{not json",
    "[]",
    '{"type": 5}',
    '{"no_type": 1}',
    '{"type": "no.such.event"}',
    '{"type": "conversation.item.create"}',
    '{"type": "session.update"}',
    '{"type": "input_audio_buffer.append", "audio": "!!"}',
    '{"type": "input_audio_buffer.commit", "client_seq": 0}',
    '{"type": "session.resume", "session_id": ""}',
    '{"type": "session.event_ack"}',
    b"\xff\xfe",
])
TOO_LARGE = "x" * (LIMIT + 1)

# Endings are drawn rarely (None: nothing happens), so that most runs get past the attach and
# stream events before something closes the connection.
ENDINGS = st.sampled_from([
    None, None, None, None, None, None,
    "socket_drops", "frame_too_large", "store_fails", "lease_moves", "worker_ends", "worker_ends",
])


def _command_of(data: str | bytes) -> tuple[int | None, m.Command] | None:
    """The (client_seq, command) a frame holds, if it parses to a command."""
    try:
        parsed = parse_client_frame(data, max_frame_bytes=LIMIT)
    except ClientProtocolError:
        return None
    return None if parsed.command is None else (parsed.client_seq, parsed.command)


# --------------------------------------------------------------------------- the machine


class ConnectionMachine(RuleBasedStateMachine):
    """One connection, its store answers and its session's output log."""

    def __init__(self) -> None:
        super().__init__()
        self.core = ConnectionCore(max_frame_bytes=LIMIT)
        self.log: list[bytes] = []
        self.first_retained = 1  # entries below it are trimmed from the stream
        self.terminal_written = False
        self.store_gen = 1
        self.pending: str | None = None  # "open" or "resume": a store call in flight
        self.store_calls = 0
        self.attach_called = False
        self.attached_gen = 0
        self.fetches: list[int] = []
        self.accepted: list[tuple[int | None, m.Command]] = []
        self.appended: list[tuple[int | None, m.Command]] = []
        # What the client saw.
        self.closed = False  # the core was CLOSED after some drain
        self.close_count = 0
        self.detach_count = 0
        self.last_seq = 0
        self.resync_pending = False
        self.terminal_sent = False
        self.replaced = False
        self.given_up = False  # the session a ?model= URL opened was given up for a resume
        self.resumed_first = False  # the client's first event was session.resume
        self.expected_token = ""  # the resume token session.resumed must carry
        self.errors: list[str] = []  # the codes of the error events the client got
        self.end_checks: list[int] = []  # CheckLogEnd actions not answered yet
        # The input log as the store numbers it, and whether it just went back.
        self.input_end = 0
        self.input_rewound = False
        self.sessions_ended = 0
        # The connection's clock, and what the client had taken at each tick.
        self.now = 0.0
        self.taken: list[tuple[float, int]] = []
        self.timer_trim = False  # the drain in progress follows a timer tick
        self.acked = 0  # the highest valid ack under the current lease

    # ------------------------------------------------------------------ setup

    @initialize(how=st.sampled_from(["autostart", "resume", "frame"]),
                prior=st.lists(ENTRIES, max_size=8), trimmed=st.integers(0, 9),
                last=st.integers(0, 9), prompt=st.booleans())
    def start(self, how: str, prior: list[bytes], trimmed: int, last: int, prompt: bool) -> None:
        """A connection (autostarted, resuming or awaiting a frame) and a prior session's log."""
        self.core = ConnectionCore(max_frame_bytes=LIMIT,
                                   url_model="m" if how == "autostart" else None,
                                   delivered_retention_s=RETENTION_S, now=self.now)
        self.log = list(prior)
        self.first_retained = min(trimmed, len(self.log)) + 1
        self._drain()
        if how == "resume":
            self.send_resume(last, None, prompt=False)
        self._answer_promptly(prompt)

    def _answer_promptly(self, prompt: bool) -> None:
        """Most store calls land at once; the others are answered by a later rule."""
        if prompt and self.pending == "open":
            self.open_lands()
        elif prompt and self.pending == "resume":
            self.resume_lands(0)

    # ------------------------------------------------------------------ checking

    def _drain(self, *, late_attach: bool = False) -> None:
        actions = self.core.actions_to_run()
        if self.closed:
            expected = [DetachLease(generation=self.attached_gen)] if late_attach else []
            assert actions == expected, f"after close: {actions}"
        close_seen = False
        for action in actions:
            if close_seen:
                assert isinstance(action, DetachLease), f"{action} after CloseConnection"
            close_seen = close_seen or isinstance(action, CloseConnection)
            self._check(action)
        if self.core.state is ConnectionState.CLOSED:
            self.closed = True

    def _check(self, action: Any) -> None:
        if isinstance(action, SendFrame):
            self._check_frame(action.text)
        elif isinstance(action, CloseConnection):
            self.close_count += 1
            assert self.close_count == 1
        elif isinstance(action, DetachLease):
            self.detach_count += 1
            assert self.detach_count == 1
            assert self.attach_called and action.generation == self.attached_gen
            assert not self.terminal_sent and not self.replaced
        elif isinstance(action, AppendCommands):
            assert self.attach_called and self.core.state is ConnectionState.ATTACHED
            self.appended.extend(action.entries)
        elif isinstance(action, FetchLog):
            assert self.attach_called
            # The log here never goes back behind what was delivered: no rewind re-read.
            assert action.rewound_to is None
            self.fetches.append(action.after_seq)
        elif isinstance(action, CheckLogEnd):
            assert self.attach_called and 0 < action.after_seq <= self.core.delivered_seq
            self.end_checks.append(action.after_seq)
        elif isinstance(action, TrimLog):
            assert 0 < action.upto_seq <= self.core.delivered_seq
            # Only on the timer, and only what the client acknowledged or had taken
            # RETENTION_S ago, never more.
            assert self.timer_trim, action
            old = [seq for at, seq in self.taken if self.now - at >= RETENTION_S]
            assert action.upto_seq <= max([*old, self.acked]), (action, self.taken, self.acked)
            self.first_retained = max(self.first_retained, action.upto_seq + 1)
        elif isinstance(action, EndSession):
            # Only for an input log that went back, once per rewind, for this session.
            assert self.input_rewound and action.reason is CloseReason.LOG_REWOUND
            assert action.session_id == SID
            self.input_rewound = False
            self.sessions_ended += 1
        elif isinstance(action, GiveUpSession):
            # A ?model= connection's own session, never used, given up for the client's
            # resume: from here on the connection is a resuming one.
            assert self.attach_called and not self.accepted and not self.given_up
            self.given_up = True
            self.attach_called = False
            self.store_calls = 0
        else:
            assert isinstance(action, OpenSession | ResumeSession)
            if isinstance(action, ResumeSession) and self.pending == "open":
                # Behind the URL's open, still in flight: that open is given up when it lands.
                assert not self.accepted and not self.given_up
                self.given_up = True
                self.store_calls = 0
            self.store_calls += 1
            assert self.store_calls == 1
            self.pending = "open" if isinstance(action, OpenSession) else "resume"

    def _check_frame(self, text: str) -> None:
        assert not self.terminal_sent, "a frame after the terminal event"
        obj = json.loads(text)
        validate_server_event(obj)
        kind = obj["type"]
        if kind == "error":
            self.errors.append(obj["error"]["code"])
        if kind == "error" and self.resumed_first:
            # DESIGN §2.7: a resume never depends on capacity, whatever the URL asked for.
            assert obj["error"]["code"] not in ("resource_exhausted", "rate_limit_exceeded"), obj
        if kind == "session.resync_required":
            # Only when events the client lacks are really gone (never a spurious resync).
            assert self.first_retained > self.last_seq + 1
            self.resync_pending = True
        elif kind == "session.replaced":
            self.replaced = True
        elif kind == "session.resumed":
            assert obj["resume_token"] == self.expected_token
        if "server_event_seq" not in obj:
            assert kind not in TERMINAL_TYPES
            return
        seq = obj["server_event_seq"]
        assert seq > self.last_seq
        if not self.resync_pending:
            # No gap: whatever lies between was skipped as corrupt, never lost.
            skipped = self.log[self.last_seq:seq - 1]
            assert not any(_renders(p) for p in skipped), (self.last_seq, seq)
        self.resync_pending = False
        self.last_seq = seq
        # The frame is exactly that log entry, with its deterministic event id.
        event = m.decode_event(self.log[seq - 1])
        assert obj["event_id"] == f"event_{SID[-12:]}_{seq}"
        assert obj == render_event(event, server_event_seq=seq, event_id=obj["event_id"],
                                   session_id=SID)
        self.terminal_sent = kind in TERMINAL_TYPES
        assert self.terminal_sent == m.is_terminal(event)

    @invariant()
    def commands_go_upstream_in_order(self) -> None:
        """Appended commands are the accepted ones, in order; all of them while attached."""
        assert self.appended == self.accepted[:len(self.appended)]
        if self.core.state is ConnectionState.ATTACHED:
            assert self.appended == self.accepted

    @invariant()
    def closed_stays_closed(self) -> None:
        """Once CLOSED, always CLOSED; at most one close, at most one detach."""
        if self.closed:
            assert self.core.state is ConnectionState.CLOSED
        assert self.close_count <= 1 and self.detach_count <= 1

    # ------------------------------------------------------------------ client

    @rule(data=st.one_of(COMMAND_FRAMES, BAD_FRAMES), prompt=st.booleans())
    def send_frame(self, data: str | bytes, prompt: bool = False) -> None:
        """A command or a malformed frame from the client."""
        command = _command_of(data)
        if command is not None and self.core.state is not ConnectionState.CLOSED:
            self.accepted.append(command)
        self.core.receive_frame(data)
        self._drain()
        self._answer_promptly(prompt)

    @rule(last=st.integers(0, 12), event_id=_EVENT_ID, prompt=st.booleans())
    def send_resume(self, last: int, event_id: str | None, prompt: bool) -> None:
        """session.resume, from a position the client can hold."""
        if not self.accepted and self.core.state is not ConnectionState.CLOSED:
            self.resumed_first = True
        self.core.receive_frame(json.dumps({
            "type": "session.resume", "session_id": SID, "resume_token": "tok",
            "last_received_server_event_seq": min(last, len(self.log)), "event_id": event_id,
        }))
        self._drain()
        self._answer_promptly(prompt)

    @rule(prompt=st.booleans())
    def quiet_period_ends(self, prompt: bool) -> None:
        """No frame came for the quiet period: a ?model= URL's session is opened."""
        self.core.quiet_period_over()
        self._drain()
        self._answer_promptly(prompt)

    @rule()
    def first_message_times_out(self) -> None:
        """The first-message deadline passed (a no-op once a frame came or a session opened)."""
        self.core.first_message_timed_out()
        self._drain()

    @rule(seq=st.integers(0, 12))
    def send_ack(self, seq: int) -> None:
        """session.event_ack, valid or beyond what was delivered."""
        valid = (self.core.state is ConnectionState.ATTACHED
                 and seq <= self.core.delivered_seq)
        self.core.receive_frame(json.dumps({"type": "session.event_ack", "server_event_seq": seq}))
        if valid:
            self.acked = max(self.acked, seq)
        self._drain()

    # ------------------------------------------------------------------ store answers

    def _attach(self) -> tuple[int, bool]:
        self.pending = None
        late = self.closed and not self.attach_called
        if not self.attach_called:
            self.store_gen += 1
            self.attached_gen = self.store_gen
            self.last_seq = self.core.delivered_seq
        self.attach_called = True
        return self.store_gen, late

    @precondition(lambda self: self.pending == "open")
    @rule()
    def open_lands(self) -> None:
        """The open script placed a new session (maybe after the socket dropped)."""
        self.log, self.first_retained, self.terminal_written = [], 1, False
        generation, late = self._attach()
        self.core.open_succeeded(SID, resume_token="tok0", generation=generation, model="m")
        self._drain(late_attach=late)

    @precondition(lambda self: self.pending == "resume")
    @rule(last_client_seq=st.integers(0, 5))
    def resume_lands(self, last_client_seq: int) -> None:
        """The resume CAS landed on the existing session (which may have ended since)."""
        retained = self.first_retained if self.first_retained <= len(self.log) else 0
        generation, late = self._attach()
        outcome = ResumeStatus.CLOSED if self.terminal_written else ResumeStatus.OK
        # A session that ended keeps the token the client holds; a live one rotates it.
        self.expected_token = "tok" if self.terminal_written else "tok1"
        counted = self.core.resume_answered(ResumeAnswer(
            outcome=outcome, generation=generation, last_client_seq=last_client_seq,
            first_retained_seq=retained, last_server_event_seq=len(self.log)),
            rotated_token="tok1")
        assert counted == "ok"
        self._drain(late_attach=late)

    @precondition(lambda self: self.pending is not None)
    @rule(code=st.sampled_from([ErrorCode.RESOURCE_EXHAUSTED, ErrorCode.INVALID_RESUME_TOKEN]),
          outcome=st.sampled_from([*REFUSALS, ResumeStatus.OK]))
    def store_refuses(self, code: ErrorCode, outcome: ResumeStatus) -> None:
        """The open found no slot, or the resume was refused (for its token or its session,
        never for capacity; an answer without a lease is a bad token)."""
        if self.pending == "open":
            self.core.open_failed(ClientProtocolError(code, "no",
                                                      close_code=CloseCode.TRY_AGAIN_LATER))
            if self.core.state is ConnectionState.AWAITING_FIRST:
                # A quiet open refused for room is held: the next frame makes a new call.
                self.store_calls = 0
        else:
            closed, before = self.core.state is ConnectionState.CLOSED, len(self.errors)
            counted = self.core.resume_answered(ResumeAnswer(outcome=outcome),
                                                rotated_token="tok1")
            refusal, _ = REFUSALS.get(outcome, REFUSALS[ResumeStatus.BAD_TOKEN])
            assert counted == refusal.value
            self.pending = None
            self._drain()
            assert self.errors[before:] == ([] if closed else [refusal.value])
            return
        self.pending = None
        self._drain()

    @rule()
    def session_gone(self) -> None:
        """A fenced append found the session closed."""
        self.core.session_gone()
        self._drain()

    @rule(behind=st.integers(0, 2))
    def stale_lease_notice(self, behind: int) -> None:
        """A lease notice for this generation or an older one arrives late."""
        self.core.lease_moved(max(0, self.store_gen - behind))
        self._drain()

    # ------------------------------------------------------------------ endings

    @rule(how=ENDINGS, terminal=TERMINALS, push=st.booleans())
    def something_ends(self, how: str | None, terminal: m.Event, push: bool) -> None:
        """Now and then, something ends the connection or the session."""
        if how == "socket_drops":
            self.core.connection_lost()
        elif how == "frame_too_large":
            self.send_frame(TOO_LARGE)
        elif how == "store_fails":  # under an open, a resume or an append
            self.core.fail(InternalError("redis://:secret@10.0.0.1 unreachable"))
            self.pending = None
        elif how == "lease_moves":  # another gateway resumed the session
            self.store_gen += 1
            self.core.lease_moved(self.store_gen)
        elif how == "worker_ends" and not self.terminal_written:
            # The session's one terminal event, always last in the log.
            self.log.append(m.encode_message(terminal))
            self.terminal_written = True
            if push:
                self.core.receive_log_entries(len(self.log), self.log[-1:])
        self._drain()

    # ------------------------------------------------------------------ the output log

    @precondition(lambda self: not self.terminal_written)
    @rule(entries=st.lists(ENTRIES, min_size=1, max_size=3), push=st.booleans())
    def worker_writes(self, entries: list[bytes], push: bool) -> None:
        """The worker appends events; the wake-up may be lost."""
        first = len(self.log) + 1
        self.log.extend(entries)
        if push:
            self.core.receive_log_entries(first, entries)
            self._drain()

    @precondition(lambda self: not self.terminal_written)
    @rule(entries=st.lists(ENTRIES, min_size=1, max_size=8), data=st.data())
    def worker_streams(self, entries: list[bytes], data: st.DataObject) -> None:
        """A burst of events whose one-entry pushes arrive reordered, duplicated or lost."""
        first = len(self.log) + 1
        self.log.extend(entries)
        pushes = data.draw(st.lists(st.integers(0, len(entries) - 1), max_size=2 * len(entries)))
        for index in pushes:
            self.core.receive_log_entries(first + index, entries[index:index + 1])
            self._drain()

    @precondition(lambda self: self.log)
    @rule(data=st.data())
    def stale_push(self, data: st.DataObject) -> None:
        """A duplicated or reordered push of entries already in the log."""
        first = data.draw(st.integers(1, len(self.log)))
        count = data.draw(st.integers(1, 4))
        self.core.receive_log_entries(first, self.log[first - 1:first - 1 + count])
        self._drain()

    @rule(count=st.integers(1, 4))
    def trim(self, count: int) -> None:
        """The log drops its oldest entries (age or size cap)."""
        self.first_retained = min(len(self.log) + 1, self.first_retained + count)

    def _read(self, after: int, *, quiet: bool = False) -> None:
        """Answer a log read the way the driver does."""
        start = max(after + 1, self.first_retained)
        rows = [(start + offset, entry) for offset, entry in enumerate(self.log[start - 1:])]
        self.core.log_read(after, rows, quiet=quiet)
        self._drain()

    @precondition(lambda self: self.fetches)
    @rule(data=st.data())
    def answer_a_read(self, data: st.DataObject) -> None:
        """One of the reads the core asked for lands, in any order."""
        self._read(self.fetches.pop(data.draw(st.integers(0, len(self.fetches) - 1))))

    @rule(after=st.integers(0, 12), quiet=st.booleans())
    def stale_read(self, after: int, quiet: bool) -> None:
        """A read issued long ago (or the periodic safety read of a quiet channel) lands."""
        self._read(min(after, self.core.delivered_seq), quiet=quiet)

    @precondition(lambda self: self.end_checks)
    @rule(data=st.data())
    def answer_an_end_check(self, data: st.DataObject) -> None:
        """Where the log ends, as a check the core asked for finds it (never behind what
        was delivered here: no failover loses writes in this model)."""
        after = self.end_checks.pop(data.draw(st.integers(0, len(self.end_checks) - 1)))
        self.core.log_end_read(after, len(self.log))
        self._drain()

    # ------------------------------------------------------------------ the input log

    @precondition(lambda self: self.core.state is ConnectionState.ATTACHED)
    @rule(count=st.integers(0, 3), back=st.integers(0, 3))
    def input_lands(self, count: int, back: int) -> None:
        """The store numbered an append's new commands; ``back`` > 0: the input log went back
        that far behind numbers this connection saw (a failover lost them)."""
        rewound = bool(self.input_end and back)
        first = max(1, self.input_end + 1 - back) if rewound else self.input_end + 1
        last = first + count - 1
        self.input_rewound = rewound
        if not rewound:
            self.input_end = max(self.input_end, last)
        ended = self.sessions_ended
        self.core.input_appended(first, last)
        self._drain()
        assert self.sessions_ended == ended + rewound
        assert not self.input_rewound, "the core ran on after the input log went back"

    # ------------------------------------------------------------------ the timer

    @rule(periods=st.integers(1, 3))
    def timer_fires(self, periods: int) -> None:
        """Time passes: the timer fires when the core says it is due."""
        for _ in range(periods):
            self.now = self.core.next_deadline()
            self.taken.append((self.now, self.core.delivered_seq))
            self.timer_trim = True
            try:
                self.core.timer_fired(self.now, taken_seq=self.core.delivered_seq)
                self._drain()
            finally:
                self.timer_trim = False
            assert self.core.next_deadline() == self.now + TIMER_S

    @precondition(lambda self: self.core.state is ConnectionState.ATTACHED)
    @rule()
    def catch_up(self) -> None:
        """With every read answered, nothing still retained in the log is left undelivered."""
        for _ in range(4 + len(self.log)):
            while self.fetches:
                self._read(self.fetches.pop(0))
            if self.core.state is not ConnectionState.ATTACHED:
                break
            self._read(self.core.delivered_seq)  # the driver's periodic safety read
        if self.core.state is ConnectionState.ATTACHED:
            assert self.core.delivered_seq == len(self.log) or self.first_retained > len(self.log)
        else:
            assert self.terminal_sent


ConnectionMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestConnectionMachine = ConnectionMachine.TestCase
