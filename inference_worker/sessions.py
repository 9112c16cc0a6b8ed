"""The sessions one worker serves: their records, their engine slots, and every call into
their conversation cores, each isolated from the others.

A :class:`SessionTable` holds each session's :class:`Session` by id and, on a frame backend,
which session holds which engine handle. The worker reaches a session's core only through
it: to apply its commands (:meth:`~SessionTable.apply`), feed it a model tick
(:meth:`~SessionTable.feed`), run its timers (:meth:`~SessionTable.tick_due`), end it
(:meth:`~SessionTable.end`) and prepare its part of a batched write
(:meth:`~SessionTable.output_of`). Reading input and writing output (Redis) stay the worker's.

Sessions are isolated from one another: an exception while one session's command is applied,
its timer or tick is run, its events are drained or encoded, or its output is prepared for
the batched write ends that session alone with ``session.closed`` ``internal_error`` (counted
in ``duplex_worker_session_failures_total``, its traceback logged once per cause per minute);
the other sessions never notice.

Fencing holds here too, not only in the store's scripts (DESIGN §2.3): each input entry carries
the (store epoch, generation) of the lease that wrote it, and an entry written under an older
generation than the newest one applied, or under another epoch than the session's, is refused
(not applied; counted in ``duplex_worker_stale_commands_total``). The scripts already refuse
such writers, so a refusal here means a writer went around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from contract.follower import LogFollower
from contract.messages import (
    CloseSession,
    Event,
    JsonObject,
    MessageDecodeError,
    ResponseDone,
    SessionUpdated,
    decode_command,
    encode_message,
)
from contract.reasons import CloseReason
from inference_worker.audio_frames import FrameOutput
from inference_worker.conversation.core import ConversationCore
from inference_worker.engine import Engine, SlotHandle
from inference_worker.input_hold import SessionCheckpoints
from inference_worker.metrics import WorkerMetrics
from inference_worker.slot_context import SlotContext
from runtime.ratelog import RateLimitedLog, cause_of
from store.keys import worker_of_session
from store.logs import InputEntry, WriteToken

__all__ = [
    "FAILED_REASON",
    "OutputPart",
    "Session",
    "SessionTable",
    "is_current",
    "log_ids",
]

# A session that fails inside this worker (its bug, or data it cannot handle) ends with this.
FAILED_REASON = CloseReason.INTERNAL_ERROR
# Each cause of a session failure is logged with its traceback at most once per this long.
_FAILURE_LOG_PERIOD_S = 60.0
# Refused input is logged at most once per this long (with a count of the rest): a writer that
# went around the scripts could send it at the rate of audio chunks.
_STALE_LOG_PERIOD_S = 10.0


def log_ids(session_id: str) -> dict[str, str]:
    """What a log line about ``session_id`` carries (``extra=``): its id and its worker's (the
    session id names the worker it was placed on, the one serving it)."""
    ids = {"session_id": session_id}
    with contextlib.suppress(ValueError):  # not an id the store allocated (a test's own)
        ids["worker_id"] = worker_of_session(session_id)
    return ids


def is_current(token: WriteToken | None, newest: WriteToken | None) -> bool:
    """Whether input written under ``token`` may be applied to a session whose newest applied
    token is ``newest`` (None: nothing known yet, any token is taken).

    It may unless it was written under an older generation (a connection that a resume
    replaced) or another epoch (the record was re-created). An entry without a token is never
    current: no lease vouches for it.
    """
    if token is None:
        return False
    if newest is None:
        return True
    return token.epoch == newest.epoch and token.generation >= newest.generation


@dataclass
class Session:
    """One session served here: its conversation core, engine slot, input position and unsent
    output."""

    core: ConversationCore
    # The engine slot of a frame backend's session (None on the loopback).
    handle: SlotHandle | None = None
    follower: LogFollower = field(default_factory=LogFollower)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Encoded events not yet accepted by Redis: kept, in order, until an append succeeds.
    unsent: list[bytes] = field(default_factory=list)
    # The session object of the newest session.updated among ``unsent`` (None: none there):
    # the write that carries them stores it in the session's record, for session.resumed.
    unsent_session: JsonObject | None = None
    # A response.done is among ``unsent``: the write that carries it ends a response, and the
    # session may be at a safe point right after it (its checkpoint is taken there).
    unsent_ends_response: bool = False
    # The server_event_seq of unsent[0]. This worker is the only writer of the session's events
    # (the store adds only the terminal one), so it numbers them and a resend is exactly-once.
    next_seq: int = 1
    # The fencing token of the newest input applied (see is_current). Its epoch is the
    # record's when the session was adopted, its generation 0 until input is applied; None
    # when the record was gone by then (the first entry applied sets it).
    applied_under: WriteToken | None = None
    # The input position this session's input log was last trimmed to (a write trims to the
    # position applied when it has no events, else once the position crossed a multiple of
    # INPUT_TRIM_EVERY): a session gone quiet past it gets a write without events from the
    # poll, so nothing applied stays.
    trimmed_to: int = 0
    # The store's route changes (Scripts.route_changes) when an append of its events was last
    # answered: while they stay the same, its output log ends before next_seq and the next
    # append need not read its end (store/output_appends.py). None: not known.
    output_known_at: int | None = None
    # The bound of its output log (its record's): each append names it, so none reads it.
    output_log_max_entries: int | None = None
    # The write fence of the newest input entry applied: with its index, that entry's ID,
    # which the trim of the input log names (store/lua/prelude.lua).
    applied_fence: int = 0
    # The write fence its input log is under, as this worker knows it (the record's when
    # adopted or re-read, then each FenceRaised notice); None while not known, when an input
    # push is only a wake-up to read the log (inference_worker/input_fences.py).
    input_fence: int | None = None
    # Bytes of commands applied since the position was last due to be reported by size.
    unreported_bytes: int = 0
    # An input push arrived since the last poll: pushes show a rewound log themselves, so the
    # poll checks the log's end only for sessions that were quiet.
    pushed: bool = False
    # The worker failed on this session (see SessionTable.fail): its core is never called
    # again, and the flusher writes the events encoded before the failure, then
    # session.closed internal_error.
    failed: bool = False
    # The owner epoch this worker serves it under (its record's when adopted): every write
    # names it, and the store refuses one under an epoch a hand-over left behind.
    owner_epoch: int = 1
    # Its checkpoints and the input they hold (None: this worker takes none).
    checkpoints: SessionCheckpoints | None = None
    # A frame backend's slot as its checkpoints carry it (None: not checkpointed, or no slot).
    slot_context: SlotContext | None = None


# One session's part of a batched output write: its id, its record and its close reason.
OutputPart = tuple[str, Session, str | None]


class SessionTable:
    """The sessions one worker serves, by id and by engine slot.

    Args:
        metrics: where the session count and the failures are counted.
        log: where failures are logged (the worker's logger, with its other lines).
        mark_dirty: called with a session's id when it has something new to write.
        engine: the worker's frame engine now (None on the loopback, or once it stopped).
    """

    def __init__(self, metrics: WorkerMetrics, log: logging.Logger, *,
                 mark_dirty: Callable[[str], None],
                 engine: Callable[[], Engine | None]) -> None:
        self._metrics = metrics
        self._log = log
        self._mark_dirty = mark_dirty
        self._engine = engine
        self._sessions: dict[str, Session] = {}
        self._by_serial: dict[int, str] = {}  # engine handle serial -> session id
        self._failure_log = RateLimitedLog(log, interval_s=_FAILURE_LOG_PERIOD_S)
        self._stale_log = RateLimitedLog(log, interval_s=_STALE_LOG_PERIOD_S)
        self.no_sessions = asyncio.Event()  # set whenever the last session leaves

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: str) -> Session | None:
        """The session's record, or None when it is not served here."""
        return self._sessions.get(session_id)

    def ids(self) -> list[str]:
        """The sessions served now (a copy: callers forget sessions while they go through)."""
        return list(self._sessions)

    def items(self) -> list[tuple[str, Session]]:
        """The sessions served now with their records (a copy, as :meth:`ids`)."""
        return list(self._sessions.items())

    def holder_of(self, serial: int) -> str | None:
        """The session that holds the engine handle ``serial`` (None once it let it go)."""
        return self._by_serial.get(serial)

    def add(self, session_id: str, session: Session) -> None:
        """Serve ``session`` here, and the engine slot it holds."""
        if session.handle is not None:
            self._by_serial[session.handle.serial] = session_id
        self._sessions[session_id] = session
        self._metrics.sessions.set(len(self._sessions))
        # One line when a session starts here and one when it leaves: an operator following
        # a session through the logs finds which worker served it, and when.
        self._log.info("serving session %s", session_id, extra=log_ids(session_id))

    def release_slot(self, session: Session) -> None:
        """Give the session's engine slot back (idempotent): no tick feeds its core again."""
        if session.handle is None:
            return
        self._by_serial.pop(session.handle.serial, None)
        engine = self._engine()
        if engine is not None:
            engine.close(session.handle)

    def forget(self, session_id: str) -> None:
        """Stop serving ``session_id`` here, releasing its engine slot."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self.release_slot(session)
            self._log.info("no longer serving session %s", session_id,
                           extra=log_ids(session_id))
        self._metrics.sessions.set(len(self._sessions))
        if not self._sessions:
            self.no_sessions.set()

    # ------------------------------------------------------------------ isolation

    # Every call into a core below sits in ``try: ... except Exception as exc:
    # self.fail(session_id, stage, exc)``: any bug, or data the core cannot handle, ends that
    # session alone; a BaseException that is no Exception (a cancellation) propagates. A plain
    # try, not a context manager: it runs several times per relayed chunk, and a context
    # manager costs an object and four calls each time (a try costs nothing until it catches).

    def fail(self, session_id: str, stage: str, exc: Exception) -> None:
        """End one session over a failure of this worker's own at ``stage`` (one of
        ``metrics.FAILURE_STAGES``): its slot is freed at once, and the flusher writes what
        was encoded before the failure, then ``session.closed`` ``internal_error``."""
        session = self._sessions.get(session_id)
        if session is None or session.failed:
            return
        session.failed = True
        self._metrics.session_failed(stage)
        self._failure_log.exception(
            (stage, *cause_of(exc)),
            f"session {session_id}: the worker failed on it ({stage}); ending it"
            f" {FAILED_REASON}", exc, extra=log_ids(session_id))
        self.release_slot(session)
        self._mark_dirty(session_id)

    # ------------------------------------------------------------------ core steps

    def apply(self, session_id: str, session: Session, entries: Sequence[InputEntry],
              now: float) -> None:
        """Apply the session's new input entries in order, and hand the engine the input they
        produced. An entry that is not current (see :func:`is_current`) is refused: skipped,
        counted and logged; the caller's log position moves past it all the same."""
        if entries:
            session.applied_fence = entries[-1].fence
        hold = session.checkpoints.hold if session.checkpoints is not None else None
        try:
            for entry in entries:
                if self._admit(session_id, session, entry):
                    try:
                        command = decode_command(entry.payload)
                    except MessageDecodeError:
                        self._log.error("undecodable input entry for %s; skipped", session_id,
                                        extra=log_ids(session_id))
                    else:
                        session.core.receive(command, now)
                if hold is not None:  # what the input log must keep for a checkpoint
                    hold.applied(entry.fence, entry.index, session.core.input_audio[0],
                                 len(entry.payload))
            self._pump(session)
        except Exception as exc:
            self.fail(session_id, "receive", exc)
        self._mark_dirty(session_id)

    def _admit(self, session_id: str, session: Session, entry: InputEntry) -> bool:
        """Check the entry's token against the newest the session applied; note a newer one,
        count and log a refusal."""
        if is_current(entry.token, session.applied_under):
            session.applied_under = entry.token
            return True
        self._metrics.stale_commands.inc()
        self._stale_log.warning(
            "stale_input", "session %s: refused input entry %d written under %s (newest"
            " applied: %s)", session_id, entry.index, entry.token, session.applied_under,
            extra=log_ids(session_id))
        return False

    def _pump(self, session: Session) -> None:
        """Hand the engine what the session's commands asked of it: configure the slot, stop
        the model's cancelled response, drop queued input, take new input."""
        engine, handle = self._engine(), session.handle
        if engine is None or handle is None:
            return
        pending = session.core.take_input()
        if pending.config is not None:  # before the input that follows the update
            engine.configure(handle, pending.config)
        for _ in range(pending.stops):  # first: the cancelled response goes before new input
            engine.stop_response(handle)
        if pending.clear:
            engine.clear_input(handle)
        if pending.audio or pending.video:
            engine.push_audio(handle, pending.audio, pending.video)

    def feed(self, serial: int, frame: FrameOutput, now: float) -> None:
        """Hand one tick's output to the core of the session that holds handle ``serial``."""
        session_id = self._by_serial.get(serial)
        if session_id is None:
            return  # closed (or failed) while the tick ran
        session = self._sessions.get(session_id)
        if session is None:
            return
        core = session.core
        try:
            core.on_frame(frame, now)
            if session.slot_context is not None:
                session.slot_context.consumed(frame)
            for latency in core.take_first_audio_latencies():
                self._metrics.time_to_first_audio.observe(latency)
        except Exception as exc:
            self.fail(session_id, "tick", exc)
        self._mark_dirty(session_id)

    def deadline_of(self, session_id: str, session: Session) -> float | None:
        """When the session's core next needs a tick (None: never, or it failed)."""
        if session.failed:
            return None
        try:
            return session.core.next_deadline()
        except Exception as exc:
            self.fail(session_id, "tick", exc)
        return None  # it raised: the session is failed now

    def next_deadline(self) -> float | None:
        """The earliest of the sessions' deadlines (None: none needs a tick)."""
        deadlines = [d for session_id, s in self.items()
                     if (d := self.deadline_of(session_id, s)) is not None]
        return min(deadlines) if deadlines else None

    def tick_due(self, now: float) -> None:
        """Run the timers of the sessions whose deadline has come."""
        for session_id, session in self.items():
            deadline = self.deadline_of(session_id, session)
            if deadline is not None and deadline <= now:
                try:
                    session.core.tick(now)
                except Exception as exc:
                    self.fail(session_id, "tick", exc)
                self._mark_dirty(session_id)

    def end(self, session_id: str, reason: str, now: float) -> None:
        """Tell a session's core to end with ``reason``; the flusher writes its last events
        and the terminal one, then forgets the session."""
        session = self._sessions.get(session_id)
        if session is None or session.failed:
            return  # a failed session is ending already
        try:
            session.core.receive(CloseSession(reason=reason), now)
        except Exception as exc:
            self.fail(session_id, "receive", exc)
        self._mark_dirty(session_id)

    # ------------------------------------------------------------------ output

    def output_of(self, session_id: str, session: Session) -> OutputPart | None:
        """Encode what the session's core produced into its unsent events and pick its close
        reason: its part of the next write, or None when it has nothing to write."""
        if not session.failed:
            events: list[Event] = []
            try:
                events = session.core.events_to_send()
            except Exception as exc:
                self.fail(session_id, "events", exc)
            try:
                for event in events:  # those encoded before a failure are still written
                    session.unsent.append(encode_message(event))
                    if isinstance(event, SessionUpdated):
                        session.unsent_session = event.session
                    elif isinstance(event, ResponseDone):
                        session.unsent_ends_response = True
            except Exception as exc:
                self.fail(session_id, "encode", exc)
        reason = self.close_reason_of(session_id, session)
        if session.unsent or reason is not None:
            return session_id, session, reason
        return None

    def close_reason_of(self, session_id: str, session: Session) -> str | None:
        """The reason to end the session with now, checked to be sendable."""
        if not session.failed:
            try:
                reason = session.core.close_requested
                if reason is not None:
                    # Redis's client encodes it as strict UTF-8, and one that cannot be would
                    # fail the whole batch. The cores replace such reasons already; this
                    # keeps a bug in one from reaching the batch.
                    reason.encode("utf-8")
                return reason
            except Exception as exc:
                self.fail(session_id, "write", exc)
        return FAILED_REASON
