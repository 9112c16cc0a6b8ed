"""Checkpoints of the sessions a worker owns: taken at safe points, written in batches, and the
input an adopter would read back kept in each session's input log
(docs/design/hand-over.md).

A checkpoint is the conversation core's state (:meth:`ConversationCore.checkpoint`) with the
input position it reflects and the last event it reflects, written by
``store/lua/write_checkpoint.lua`` only where the output log ends at that event. At a
response's end it rides the write of the events that end it (:meth:`Checkpointer.at_write`),
where the session will be at a safe point once they land: a client whose next turn follows at
once leaves no other. Otherwise it is taken after a write that carried events (an item's
change) and at least every ``CHECKPOINT_INTERVAL_S`` while the session changed, whenever the
session is at a safe point with nothing unsent: between the state read here and the call
nothing can reach the store that the state does not reflect, and a write that came between
is caught by the script (``behind``: taken again). A frame backend's session's checkpoint
carries its slot's newest step records too, taken where the slot has applied all the core
asked of it, with the count of the input it holds unstepped, which the input log then keeps
for the adopter to read back (``inference_worker/slot_context.py``).

The input log keeps what an adopter needs (``inference_worker/input_hold.py``), within bounds:
a session off a safe point for long (a model that talks on) has its checkpoint overtaken by
the trim (forfeit, counted) and cannot move until its next one; its client is never refused
for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable

from inference_worker.conversation.checkpoint import CheckpointError, encode
from inference_worker.input_hold import Mark, SessionCheckpoints
from inference_worker.metrics import WorkerMetrics
from inference_worker.sessions import Session, SessionTable
from store import Scripts, StoreError
from store.checkpoints import CheckpointStatus, CheckpointWrite
from store.errors import raise_if_cancelled
from store.keys import session_keys
from store.outages import OutageLog

__all__ = ["Checkpointer"]

_log = logging.getLogger("inference_worker.worker")
# Sessions per checkpoint call: bounds one call's size (states are up to megabytes).
_MAX_CHECKPOINT_BATCH = 32
# The least time between two passes over the sessions.
_PASS_GAP_S = 0.05


class Checkpointer:
    """Takes and writes the checkpoints of one worker's sessions.

    Args:
        scripts: the store's scripts.
        sessions: the sessions served here.
        metrics: where outcomes, sizes, ages and forfeits are counted.
        outages: where a store outage is told once.
        interval_s: a changed session is checkpointed at least this often.
    """

    def __init__(self, scripts: Scripts, sessions: SessionTable, metrics: WorkerMetrics,
                 outages: OutageLog, *, interval_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._scripts = scripts
        self._sessions = sessions
        self._metrics = metrics
        self._outages = outages
        self._interval_s = interval_s
        self._clock = clock
        self.wake = asyncio.Event()
        self._written = asyncio.Event()  # set (and replaced) at each write with events
        self._watchers = 0  # how many wait for one (a drain's hand-overs)

    def events_written(self, session: Session) -> None:
        """``session``'s events were written: a checkpoint is due at its next safe point."""
        if session.checkpoints is not None:
            session.checkpoints.events_since = True
            self.wake.set()
        if self._watchers:
            written, self._written = self._written, asyncio.Event()
            written.set()

    async def next_write(self, timeout: float) -> None:
        """Until the next write with events landed (a response's end is one: a safe point
        may follow it), or ``timeout`` passed."""
        self._watchers += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._written.wait(), timeout)
        finally:
            self._watchers -= 1

    async def run(self) -> None:
        """Write the checkpoints due whenever a write woke it (a pass at most every
        :data:`_PASS_GAP_S`: writes come per relayed chunk), and every half interval."""
        while True:
            raise_if_cancelled()
            try:
                await asyncio.wait_for(self.wake.wait(), self._interval_s / 2)
            except TimeoutError:
                pass
            self.wake.clear()
            await self.write_due()
            await asyncio.sleep(_PASS_GAP_S)

    async def write_due(self) -> None:
        """Take the checkpoint of every session that is due and at a safe point, and write
        them, one call per home and batch."""
        now = self._clock()
        taken: dict[str, list[tuple[Session, CheckpointWrite, Mark]]] = {}
        oldest = 0.0
        for session_id, session in self._sessions.items():
            if session.checkpoints is None:
                continue
            oldest = max(oldest, now - session.checkpoints.written_at)
            found = self._take(session_id, session, session.checkpoints, now)
            if found is not None:
                home = session_keys(session_id).worker.worker_id
                taken.setdefault(home, []).append((session, *found))
        self._metrics.checkpoint_age_seconds.set(oldest)
        for batch in taken.values():
            for start in range(0, len(batch), _MAX_CHECKPOINT_BATCH):
                await self._write(batch[start:start + _MAX_CHECKPOINT_BATCH], now)

    def _take(self, session_id: str, session: Session, marks: SessionCheckpoints,
              now: float) -> tuple[CheckpointWrite, Mark] | None:
        """The session's checkpoint when it is due and at a safe point."""
        if (session.follower.next_index - 1, session.next_seq - 1) == (marks.applied,
                                                                        marks.seq):
            return None
        if not marks.events_since and now - marks.written_at < self._interval_s:
            return None
        return self.take_now(session_id, session, marks, now)

    def take_now(self, session_id: str, session: Session, marks: SessionCheckpoints,
                 now: float) -> tuple[CheckpointWrite, Mark] | None:
        """The session's checkpoint at a safe point with nothing unsent (None: off one, or
        it cannot be taken): the state, the input applied and the events written read
        together, nothing awaited between. Nothing applied yet is input position 0-0."""
        if session.unsent:
            return None
        return self._taken(session_id, session, marks, now)

    def at_write(self, session_id: str, session: Session) -> tuple[CheckpointWrite, Mark] | None:
        """The checkpoint the write of the session's unsent events carries (None: none):
        where they end a response and the session is at a safe point after them."""
        marks = session.checkpoints
        if marks is None or not session.unsent_ends_response:
            return None
        return self._taken(session_id, session, marks, self._clock())

    def written_with_events(self, session: Session, item: CheckpointWrite, keep: Mark) -> None:
        """A checkpoint :meth:`at_write` took landed with the events it reflects."""
        self._landed(session, item, keep, self._clock())

    def _taken(self, session_id: str, session: Session, marks: SessionCheckpoints,
               now: float) -> tuple[CheckpointWrite, Mark] | None:
        """The checkpoint of the session as it will be once its unsent events are written."""
        applied = session.follower.next_index - 1
        seq = session.next_seq + len(session.unsent) - 1
        if session.failed or session.core.active_response is not None:
            return None  # the common case off a safe point, without building a state
        state = session.core.checkpoint()
        if state is None:
            return None
        if session.slot_context is not None:
            place = session.slot_context.at(state)
            if place is None:
                return None  # its slot holds a change not yet reflected
            state = dataclasses.replace(state, model_context=place.records,
                                        model_unconsumed=place.unconsumed)
        heard, kept = session.core.input_audio
        kept = max(kept, state.model_unconsumed)  # the adopter reads both back
        try:
            keep = (marks.hold.buffer_start(heard, kept)
                    or marks.hold.at_end(session.applied_fence, applied, heard))
        except LookupError:
            self._metrics.checkpoint("input_gone")
            marks.written_at = now  # tried: not again before the interval
            return None
        try:
            core = encode(state)
        except CheckpointError as exc:
            self._metrics.checkpoint("too_large")
            _log.warning("session %s: no checkpoint: %s", session_id, exc)
            marks.written_at = now
            return None
        return CheckpointWrite(session_id=session_id, owner_epoch=session.owner_epoch,
                               applied=f"{session.applied_fence}-{applied}",
                               keep=f"{keep.fence}-{keep.index}", seq=seq, core=core), keep

    async def _write(self, batch: list[tuple[Session, CheckpointWrite, Mark]],
                     now: float) -> None:
        try:
            statuses = await self._scripts.write_checkpoints([item for _, item, _ in batch])
        except StoreError as exc:
            self._outages.failed(f"checkpoint write ({len(batch)} sessions)", exc)
            for _ in batch:
                self._metrics.checkpoint("unavailable")
            return
        self._outages.succeeded()
        for (session, item, keep), status in zip(batch, statuses, strict=True):
            if status is CheckpointStatus.OK:
                self._landed(session, item, keep, now)
            elif status is CheckpointStatus.BEHIND:
                self._metrics.checkpoint("behind")
            else:  # the flusher finds it ended or moved, and stops serving it
                self._metrics.checkpoint("ended")

    def _landed(self, session: Session, item: CheckpointWrite, keep: Mark, now: float) -> None:
        marks = session.checkpoints
        if marks is None:
            return
        marks.hold.written(keep)
        marks.written_at, marks.events_since = now, False
        marks.applied, marks.seq = int(item.applied.rsplit("-", 1)[1]), item.seq
        self._metrics.checkpoint("written")
        self._metrics.checkpoint_bytes.observe(len(item.core))
