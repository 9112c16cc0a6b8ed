"""Writing the sessions' output: what each session's conversation core emits goes to its output
log, many sessions in one fenced script call (they share this worker's slot in the store).

The writer is told which sessions have something new (:meth:`OutputWriter.mark_dirty`, from the
session table) and writes them all concurrently when its loop wakes, so a busy worker pays one
Redis round trip per batch of sessions, not per session in turn. It also ends sessions: with
their last events and the terminal event in order, or, when what this worker holds is no longer
trusted, with the terminal event alone (:meth:`OutputWriter.abandon`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from contract.reasons import CloseReason
from inference_worker.checkpoints import Checkpointer
from inference_worker.input_hold import Mark
from inference_worker.sessions import FAILED_REASON, OutputPart, Session, SessionTable, log_ids
from runtime.ratelog import RateLimitedLog
from store import (
    Mismatch,
    OutputAppend,
    OutputMismatch,
    Scripts,
    SessionGone,
    StoreError,
    WorkerFenced,
)
from store.answers import CheckpointFields
from store.checkpoints import CheckpointWrite
from store.errors import raise_if_cancelled
from store.logs import INPUT_TRIM_EVERY
from store.outages import OutageLog, plain_reason

__all__ = ["REPORT_APPLIED_BYTES", "REPORT_APPLIED_EVERY", "OutputWriter", "Pending", "trim_due"]

_log = logging.getLogger("inference_worker.worker")
# Sessions per output script call: bounds one call's size (and its time inside Redis).
_MAX_FLUSH_BATCH = 256
#: Pauses between tries of a session's close while the store is away; the last one repeats.
_CLOSE_RETRY_S = (0.1, 0.2, 0.5, 1.0, 2.0)
# A close that keeps failing leaves a client waiting on a session this worker no longer
# serves: worth a line of its own (which session), at most one per 5 s for all of them.
_close_failures = RateLimitedLog(_log, interval_s=5.0)
#: A session's input log is trimmed to what this worker applied whenever it writes for the
#: session, and the gateway refuses input once the log holds INPUT_LOG_MAX_ENTRIES. A session
#: that answers nothing for a while (audio buffered in a turn) would fill it with commands
#: applied already, so its position is also written without events every this many commands:
#: one small script call per that many commands, and at most that many applied entries kept.
REPORT_APPLIED_EVERY = 64
#: The same by size: large commands (camera frames ride appends, up to megabytes each) kept
#: after they were applied would take the room INPUT_LOG_MAX_BYTES leaves unread input, so
#: the position is also written once this many bytes of commands were applied since.
REPORT_APPLIED_BYTES = 512 * 1024


def trim_due(session: Session, forfeit: Callable[[], None]) -> int:
    """The input position a write for ``session`` trims its input log to (0: none): what it
    applied, no further than its checkpoints hold (``inference_worker/input_hold.py``; a
    hold past its bounds is overtaken and ``forfeit`` called), when the write has no events
    (it is sent to trim) or the position crossed a multiple of INPUT_TRIM_EVERY since the
    last trim, so a busy session costs one trim per that many commands, not one per chunk."""
    applied = session.follower.next_index - 1
    if applied <= session.trimmed_to:
        return 0
    if session.unsent and applied // INPUT_TRIM_EVERY <= session.trimmed_to // INPUT_TRIM_EVERY:
        return 0
    if session.checkpoints is None:
        return applied
    heard, kept = session.core.input_audio
    if session.slot_context is not None:  # its engine slot's unstepped input is read back too
        kept = max(kept, session.slot_context.queued())
    bound, overtaken = session.checkpoints.hold.trim_to(applied, heard, kept)
    if overtaken:
        forfeit()
    return bound if bound > session.trimmed_to else 0


class Pending:
    """What the writer has to write next: the session table marks sessions (it is built before
    the writer, which reads it), and the writer takes them all at once when it wakes."""

    __slots__ = ("dirty", "report_applied", "wake")

    def __init__(self) -> None:
        #: Sessions with events to write.
        self.dirty: set[str] = set()
        #: Sessions whose applied input position is due to be written even without events.
        self.report_applied: set[str] = set()
        self.wake = asyncio.Event()

    def applied(self, session_id: str, session: Session, applied_before: int,
                fresh: Sequence[tuple[int, bytes]]) -> None:
        """``fresh`` commands were applied after ``applied_before``: the position is due to
        be reported when it crossed a multiple of :data:`REPORT_APPLIED_EVERY`, or
        :data:`REPORT_APPLIED_BYTES` were applied since it last was."""
        session.unreported_bytes += sum(len(payload) for _, payload in fresh)
        if ((applied_before + len(fresh)) // REPORT_APPLIED_EVERY
                > applied_before // REPORT_APPLIED_EVERY
                or session.unreported_bytes >= REPORT_APPLIED_BYTES):
            session.unreported_bytes = 0
            self.report_applied.add(session_id)

    def mark_dirty(self, session_id: str) -> None:
        """``session_id`` has something new to write: the next flush takes it."""
        self.dirty.add(session_id)
        self.wake.set()


class OutputWriter:
    """The flusher of one worker: batches the dirty sessions' output into script calls."""

    def __init__(self, scripts: Scripts, sessions: SessionTable, pending: Pending,
                 outages: OutageLog, *, fence: Callable[[], None],
                 spawn: Callable[[Coroutine[Any, Any, None]], None],
                 checkpointer: Checkpointer | None = None,
                 forfeit: Callable[[], None] = lambda: None) -> None:
        """Write through ``scripts`` what ``pending`` names of the sessions of ``sessions``; a
        write refused because this worker was declared lost calls ``fence``; ``spawn`` runs
        a close in the background; ``checkpointer`` adds the checkpoint a response's end
        carries and is told of each session whose events landed (its checkpoint is due),
        ``forfeit`` of each trim that overtook one."""
        self._scripts = scripts
        self._sessions = sessions
        self._pending = pending
        self._outages = outages
        self._fence = fence
        self._spawn = spawn
        self._checkpointer = checkpointer
        self._forfeit = forfeit

    async def run(self) -> None:
        """Write what the dirty sessions hold whenever one is marked; runs until cancelled."""
        while True:
            raise_if_cancelled()  # see _heartbeat_loop
            pending = self._pending
            await pending.wake.wait()
            pending.wake.clear()
            dirty, pending.dirty = pending.dirty, set()
            report_applied, pending.report_applied = pending.report_applied, set()
            sessions = [(session_id, session) for session_id in sorted(dirty)
                        if (session := self._sessions.get(session_id)) is not None]
            # Each session's lock keeps its server_event_seq in order against close(). They
            # are taken and let go by hand, not through an AsyncExitStack: this runs about
            # once per relayed chunk, and the stack cost several calls per session.
            held: list[asyncio.Lock] = []
            try:
                for _, session in sessions:
                    await session.lock.acquire()
                    held.append(session.lock)
                # Each session's part is encoded and checked alone, so that one session's bad
                # data fails that session, never the whole batch.
                batch = [part for session_id, session in sessions
                         if (part := self._part_of(session_id, session, report_applied))
                         is not None]
                for start in range(0, len(batch), _MAX_FLUSH_BATCH):
                    if not await self._write(batch[start:start + _MAX_FLUSH_BATCH]):
                        break
            finally:
                for lock in reversed(held):
                    lock.release()

    def _part_of(self, session_id: str, session: Session,
                 report_applied: set[str]) -> OutputPart | None:
        """The session's part of the next write: its output, or, when it has none but its
        applied input is due to be reported (see :data:`REPORT_APPLIED_EVERY`), a part with
        no events, which only moves the input log's trim point."""
        part = self._sessions.output_of(session_id, session)
        if part is None and session_id in report_applied:
            part = (session_id, session, None)
        return part

    async def _write(self, batch: list[OutputPart]) -> bool:
        """One script call for the output of many sessions (they share this worker's slot).

        Returns False when writing must stop (fenced).
        """
        trims = {session_id: trim for session_id, session, _ in batch
                 if (trim := trim_due(session, self._forfeit))}
        checkpoints = {session_id: taken for session_id, session, reason in batch
                       if reason is None and self._checkpointer is not None
                       and (taken := self._checkpointer.at_write(session_id, session))}
        routes = self._scripts.route_changes
        try:
            outcomes = await self._scripts.append_output_many(
                [OutputAppend(session_id=session_id, events=session.unsent,
                              first_seq=session.next_seq, close_reason=reason,
                              input_trim_to=trims.get(session_id, 0),
                              input_trim_fence=session.applied_fence,
                              output_log_max_entries=session.output_log_max_entries,
                              session=session.unsent_session,
                              top_known_at=session.output_known_at,
                              owner_epoch=session.owner_epoch,
                              checkpoint=None if (taken := checkpoints.get(session_id)) is None
                              else CheckpointFields(applied=taken[0].applied,
                                                    keep=taken[0].keep, core=taken[0].core))
                 for session_id, session, reason in batch])
        except WorkerFenced:
            self._fence()
            return False
        except StoreError as exc:
            # Kept in unsent: the next flush (tick or poll) retries them first.
            self._outages.failed(f"output write ({len(batch)} sessions)", exc)
            for session_id, _, _ in batch:
                self._pending.dirty.add(session_id)
            return True
        except Exception as exc:  # not Redis: a session's part could not even be sent
            return await self._write_apart(batch, exc)
        self._outages.succeeded()
        for session_id, session, _ in batch:
            if session_id in trims:
                session.trimmed_to = max(session.trimmed_to, trims[session_id])
        self._settle(batch, outcomes,
                     routes if self._scripts.route_changes == routes else None, checkpoints)
        return True

    async def _write_apart(self, batch: list[OutputPart], exc: Exception) -> bool:
        """After a batch failed on its own arguments (a bug: each part is checked before),
        write each session alone so that only the culprit fails. Resending is safe: the
        events are numbered, so any that landed are not stored twice."""
        if len(batch) > 1:
            for part in batch:
                if not await self._write([part]):
                    return False
            return True
        session_id, session, _ = batch[0]
        self._sessions.fail(session_id, "write", exc)
        # Its output itself cannot be written: the terminal event goes alone.
        self._sessions.forget(session_id)
        self._spawn(self.close(session_id, FAILED_REASON, owner_epoch=session.owner_epoch))
        return True

    def _settle(self, batch: list[OutputPart],
                outcomes: list[int | SessionGone | OutputMismatch], routes: int | None,
                checkpoints: dict[str, tuple[CheckpointWrite, Mark]]) -> None:
        """Apply the outcome of a write to each of its sessions; ``routes``: the store's
        route changes it was answered at (None: they changed meanwhile); ``checkpoints``:
        those it carried."""
        for (session_id, session, reason), outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, SessionGone):
                self._sessions.forget(session_id)
                continue
            if isinstance(outcome, OutputMismatch):
                # A gap: the logs fell behind what this worker wrote or read (a failover lost
                # acknowledged writes). A conflict: a bug. Either way, end the session loudly.
                self.abandon(session_id,
                              CloseReason.LOG_REWOUND if outcome.status is Mismatch.GAP
                              else CloseReason.INTERNAL_ERROR,
                              f"{outcome.status}: events from seq {outcome.first_seq},"
                              f" the log ends at {outcome.last_seq}")
                continue
            if session.unsent:
                session.output_known_at = routes
                if self._checkpointer is not None:
                    self._checkpointer.events_written(session)
                    if (taken := checkpoints.get(session_id)) is not None:
                        self._checkpointer.written_with_events(session, *taken)
            session.next_seq += len(session.unsent)
            session.unsent, session.unsent_session = [], None
            session.unsent_ends_response = False
            if reason is not None:
                self._sessions.forget(session_id)

    def abandon(self, session_id: str, reason: CloseReason, why: str) -> None:
        """Stop serving a session whose state here no longer matches the store's, and end it
        with ``reason`` (the terminal event alone: what this worker holds is not trusted)."""
        _log.error("session %s: %s; ending it", session_id, why, extra=log_ids(session_id))
        session = self._sessions.get(session_id)
        self._sessions.forget(session_id)
        self._spawn(self.close(session_id, reason,
                               owner_epoch=1 if session is None else session.owner_epoch))

    async def close(self, session_id: str, reason: CloseReason, *, retry: bool = True,
                    owner_epoch: int = 1) -> None:
        """End ``session_id`` (served under ``owner_epoch``) with ``session.closed``
        ``reason``. A session this worker stops serving must not stay open and silent, its
        client heartbeating into a void: while the store is away (its slot failing over, say)
        the close is tried again, with backoff, until it lands, the session is gone (or moved
        on), or this incarnation ends (``retry`` False: one try, for a shutdown whose
        leftovers the reaper ends worker_lost)."""
        for attempt in itertools.count():
            try:
                await self._scripts.append_output(session_id, [], close_reason=reason,
                                                  owner_epoch=owner_epoch)
                self._outages.succeeded()
                break
            except (SessionGone, WorkerFenced):
                break
            except StoreError as exc:
                self._outages.failed(f"close of session {session_id}", exc)
                if not retry:
                    break
                _close_failures.warning("close", "closing %s failed (%s); trying again",
                                        session_id, plain_reason(exc),
                                        extra=log_ids(session_id))
                await asyncio.sleep(_CLOSE_RETRY_S[min(attempt, len(_CLOSE_RETRY_S) - 1)])
        self._sessions.forget(session_id)
