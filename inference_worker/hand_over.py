"""Hand-over between workers (docs/design/hand-over.md): a draining worker moves each of its
sessions to a live worker of the session's model, and a worker takes over the sessions handed
to it, so a rolling restart cuts no conversation.

The draining side (:meth:`HandOver.hand_over_all`), per session: reserve a slot on the
adopter (the least loaded live worker serving the session's model, itself and the session's
home left out), wait for the session's safe point (:meth:`Checkpointer.take_now`), then,
holding the session's lock so that none of its writes can come between: write its last
checkpoint, move its ownership naming that checkpoint (``adopt_session.lua``; from then on
Redis refuses this worker's writes for it), stop serving it without ending it, and wake the
adopter. A session with no safe point before the drain's deadline, or no worker with room,
stays, and ends as a drain ends sessions.

The adopting side (:meth:`HandOver.take_over`): reads the record (this worker must own it)
and the checkpoint, restores a fresh core from it with the input buffer's audio read back from
the input log, numbers its events on from the checkpoint's, and applies the input after the
checkpoint's position through the usual path. It listens on the input channel of each home it
serves sessions of, and lets its slot for a session go once it no longer serves it.

A frame backend's session moves with its engine slot: its checkpoint carries the slot's
newest step records (``inference_worker/slot_context.py``), and the adopter's slot resumes
from them at the checkpoint's epoch and input position. Only a session whose checkpoint is the
output log's last event moves so: a frame model's output after it cannot be replayed, so a
lost worker's frame session with events past its checkpoint ends ``worker_lost``, and a draining
one moves late only when nothing was written since its last checkpoint. A backend whose slots
cannot be continued (``FrameSpec.context_steps`` 0) takes no checkpoints: its sessions end as
a drain or a loss ends them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from contract.follower import LogFollower
from contract.messages import (
    AppendAudio,
    Event,
    MessageDecodeError,
    SessionUpdated,
    decode_command,
    decode_event,
    encode_message,
)
from contract.reasons import CloseReason
from inference_worker.audio_formats import AppendDecoder
from inference_worker.checkpoints import Checkpointer
from inference_worker.conversation.checkpoint import CheckpointError, CoreState, decode
from inference_worker.conversation.items import format_of
from inference_worker.engine import Engine, SlotResume
from inference_worker.input_fences import FenceKeeper
from inference_worker.input_hold import SessionCheckpoints
from inference_worker.metrics import WorkerMetrics
from inference_worker.output_writer import OutputWriter
from inference_worker.session_factory import SessionFactory
from inference_worker.sessions import Session, SessionTable, log_ids
from inference_worker.tail_replay import ReplayDiverged, replay_tail
from store import Scripts, StoreError
from store.checkpoints import (
    AdoptStatus,
    Checkpoint,
    CheckpointStatus,
    ReserveStatus,
    adopted_sessions,
    read_checkpoint,
    tell_adopter,
)
from store.client import RedisClient
from store.directory import list_workers, server_time_ms, worker_loads
from store.keys import WorkerKeys, worker_of_session
from store.logs import (
    InputEntry,
    SessionStart,
    WriteToken,
    log_ends,
    read_input_entries,
    read_input_range,
    read_output,
    session_start,
)
from store.pubsub import Subscriber
from store.pushes import Push

__all__ = ["HandOver", "UnreplayableTail", "slot_resume"]

_log = logging.getLogger("inference_worker.worker")
# A session waiting for its safe point is looked at again after each write with events (a
# response's end), and at least this often.
_SAFE_POINT_POLL_S = 0.02
# The most input entries after a checkpoint a take-over replays at once (the input log's own
# bound is far below it).
_REPLAY_READ = 1 << 20
# A session still off a safe point this close to its drain's deadline (or in the last quarter
# of a shorter drain) moves from its last checkpoint (what it wrote since reconciled by the
# adopter, an answer playing cut short).
_LATE_MOVE_S = 1.0
# A reservation on this worker for a session it does not serve, and that another worker
# owns, is let go after this long (a hand-over to here that failed after reserving).
_STALE_RESERVATION_MS = 60_000


def _entry_id(entry_id: str) -> tuple[int, int]:
    fence, index = entry_id.split("-")
    return int(fence), int(index)


def read_back(entries: Sequence[InputEntry], state: CoreState,
              keep: bool = True) -> tuple[bytes, bytes, list[int]]:
    """The input buffer's audio as ``state`` counts it (``keep`` False: none, for a core
    that does not keep its bytes: a frame model heard them already), the audio its engine
    slot had not stepped (``state.model_unconsumed``), both the newest audio decoded from
    the appends in ``entries`` as a core decodes them (in the session's input format, or the
    one an append names), and the decoded audio of each entry.

    Raises:
        ValueError: the appends hold less audio than either.
    """
    decoder = AppendDecoder(format_of(state.history.config["audio"]["input"]["format"]))
    heard: list[int] = []
    audio = bytearray()
    for entry in entries:
        try:
            command = decode_command(entry.payload)
        except MessageDecodeError:
            command = None
        decoded = (decoder.decode(command.audio, command.format, command.sample_rate_hz)
                   if isinstance(command, AppendAudio) else b"")
        chunk = decoded if isinstance(decoded, bytes) else b""
        audio += chunk
        heard.append(len(chunk))
    size = state.buffer.size if keep else 0
    if len(audio) < max(size, state.model_unconsumed):
        raise ValueError(f"{len(audio)} bytes of audio read back for a buffer of {size} and "
                         f"{state.model_unconsumed} its model had not heard")
    unconsumed = audio[len(audio) - state.model_unconsumed:] if state.model_unconsumed else b""
    return bytes(audio[len(audio) - size:]), bytes(unconsumed), heard


class UnreplayableTail(ValueError):
    """A frame model's events past the checkpoint: the replay drives the conversation core,
    not the model, so it cannot reproduce them, and the session is not continued."""


def slot_resume(state: CoreState, engine: Engine, tail: int) -> SlotResume:
    """Where the slot of a frame backend's session restored from ``state``, with
    ``tail`` events written past it, resumes.

    Raises:
        UnreplayableTail: there is a tail.
        ValueError: ``state`` carries no model context (not a frame backend's), or this
            worker's backend cannot continue a slot.
    """
    if tail:
        raise UnreplayableTail(f"a frame model's {tail} events past its checkpoint cannot be "
                               "replayed")
    if state.model_context is None:
        raise ValueError("its checkpoint carries no model context")
    if not engine.spec.context_steps:
        raise ValueError("this worker's backend cannot continue a slot")
    frame_ms = engine.spec.frame_seconds * 1000
    return SlotResume(context=state.model_context, epoch=state.model.epoch,
                      input_frames=round((state.model_input_ms or 0) / frame_ms))


class HandOver:
    """Both sides of the hand-over, for one worker (see the module docstring)."""

    def __init__(self, *, client: RedisClient, scripts: Scripts, sessions: SessionTable,
                 factory: SessionFactory, checkpointer: Checkpointer, writer: OutputWriter,
                 fences: FenceKeeper, subscriber: Subscriber,
                 notices: Callable[[Push | None], None], metrics: WorkerMetrics,
                 worker_id: Callable[[], str],
                 catch_up: Callable[[str, Session], Awaitable[None]],
                 engine: Callable[[], Engine | None]) -> None:
        self._client = client
        self._scripts = scripts
        self._sessions = sessions
        self._factory = factory
        self._checkpointer = checkpointer
        self._writer = writer
        self._fences = fences
        self._subscriber = subscriber
        self._notices = notices
        self._metrics = metrics
        self._worker_id = worker_id
        self._catch_up = catch_up
        self._engine = engine  # the worker's frame engine now (None: the loopback)
        self._homes: set[str] = set()  # the homes whose input channel this worker listens to
        # Per session being taken over: its lock and how many calls hold or await it.
        self._taking: dict[str, tuple[asyncio.Lock, int]] = {}

    # ------------------------------------------------------------------ handing over

    async def hand_over_all(self, deadline: float) -> None:
        """Hand every session served here over, each by ``deadline`` (monotonic): at a safe
        point, or off one from its last checkpoint once the drain's last second (its last
        quarter, for a shorter one) has come."""
        late = deadline - min(_LATE_MOVE_S, max(0.0, deadline - time.monotonic()) / 4)
        await asyncio.gather(*(self._hand_over(session_id, session, deadline, late)
                               for session_id, session in self._sessions.items()
                               if session.checkpoints is not None))

    async def _hand_over(self, session_id: str, session: Session, deadline: float,
                         late: float) -> None:
        started = time.monotonic()
        try:
            adopter = await self._reserve(session_id, session)
        except StoreError as exc:
            _log.warning("session %s: no hand-over: %s", session_id, exc,
                         extra=log_ids(session_id))
            self._metrics.hand_over("failed")
            return
        if adopter is None:
            self._metrics.hand_over("no_room")
            return
        outcome = "failed"
        try:
            outcome = await self._move_at_safe_point(session_id, session, adopter, deadline,
                                                     late)
        except StoreError as exc:
            # Whether the adoption landed is unknown: the reservation stays, and the adopter
            # takes the session over if it owns it, or lets the slot go if it does not.
            _log.warning("session %s: hand-over to %s unsettled: %s", session_id, adopter,
                         exc, extra=log_ids(session_id))
            self._metrics.hand_over("failed")
            return
        self._metrics.hand_over(outcome)
        if outcome not in ("moved", "late"):
            with contextlib.suppress(StoreError):
                await self._scripts.release_slot(adopter, session_id)
            return
        self._metrics.hand_over_seconds.observe(time.monotonic() - started)
        _log.info("session %s handed over to worker %s", session_id, adopter,
                  extra=log_ids(session_id))
        if worker_of_session(session_id) != self._worker_id():
            with contextlib.suppress(StoreError):  # its slot here, reserved when taken over
                await self._scripts.release_slot(self._worker_id(), session_id)
        with contextlib.suppress(StoreError):  # the adopter's poll finds it otherwise
            await tell_adopter(self._client, adopter, session_id)

    async def _reserve(self, session_id: str, session: Session) -> str | None:
        """The least loaded live worker of the session's model that reserved a slot for it."""
        model = session.core.session.get("model")
        wanted = model if isinstance(model, str) else ""
        now_ms = await server_time_ms(self._client)
        loads = await worker_loads(self._client, await list_workers(self._client, now_ms))
        left_out = {self._worker_id(), worker_of_session(session_id)}
        for load in loads:
            if (load.worker_id in left_out or load.state != "live" or load.free == 0
                    or (wanted and wanted not in load.models)):
                continue
            status = await self._scripts.reserve_slot(load.worker_id, session_id,
                                                      model=wanted)
            if status is ReserveStatus.OK:
                return load.worker_id
        return None

    async def _move_at_safe_point(self, session_id: str, session: Session, adopter: str,
                                  deadline: float, late: float) -> str:
        """Move the session once it is at a safe point, or off one from its last checkpoint
        from ``late`` on; its outcome."""
        marks = session.checkpoints
        while marks is not None and time.monotonic() < deadline:
            async with session.lock:
                if self._sessions.get(session_id) is not session or session.failed:
                    return "ended"  # on its own, meanwhile: nothing to move
                taken = self._checkpointer.take_now(session_id, session, marks,
                                                    time.monotonic())
                if taken is not None:
                    item, _ = taken
                    if await self._scripts.write_checkpoints([item]) != [CheckpointStatus.OK]:
                        return "failed"
                    return await self._move(session_id, session, adopter, item.seq, "moved")
                if time.monotonic() >= late and marks.hold.keep is not None and (
                        session.slot_context is None or marks.seq == session.next_seq - 1):
                    # No pause in time: the adopter continues from the last checkpoint and
                    # reconciles what was written since, as after a loss.
                    return await self._move(session_id, session, adopter, marks.seq, "late")
            await self._checkpointer.next_write(_SAFE_POINT_POLL_S)
        return "no_safe_point"

    async def _move(self, session_id: str, session: Session, adopter: str, seq: int,
                    outcome: str) -> str:
        """Move the session's ownership to ``adopter`` from its checkpoint of event ``seq``
        (its lock held); ``outcome`` when it moved."""
        adoption = await self._scripts.adopt_session(
            session_id, replaces_epoch=session.owner_epoch, adopter=adopter,
            checkpoint_seq=seq)
        if adoption.status is not AdoptStatus.OK:
            return "failed" if outcome == "moved" else "no_safe_point"
        # It lives on at the adopter: no terminal event; any write of ours still under way
        # is refused (moved).
        self._sessions.forget(session_id)
        return outcome

    # ------------------------------------------------------------------ taking over

    async def take_over(self, session_id: str) -> Session | None:
        """Serve ``session_id``, handed to this worker, from its checkpoint (None: it is not
        this worker's, or it could not be continued and was ended).

        One call at a time per session: a notice and a poll often ask at once, and two
        restores racing would both serve it, or one, finding the input the other's catch-up
        trimmed gone, would end the session the other serves.
        """
        lock, calls = self._taking.get(session_id, (asyncio.Lock(), 0))
        self._taking[session_id] = (lock, calls + 1)
        try:
            async with lock:
                return await self._take_over(session_id)
        finally:
            lock, calls = self._taking[session_id]
            if calls == 1:
                del self._taking[session_id]
            else:
                self._taking[session_id] = (lock, calls - 1)

    async def _take_over(self, session_id: str) -> Session | None:
        if (session := self._sessions.get(session_id)) is not None:
            return session
        reading = self._fences.reading()
        start = await session_start(self._client, session_id)
        if (start is None or start.closed or start.other_format
                or start.owner != self._worker_id()):
            return None
        checkpoint = await read_checkpoint(self._client, session_id)
        ends = await log_ends(self._client, session_id)
        try:
            restored = await self._restored(session_id, start, checkpoint, ends.last_output)
        except (ValueError, CheckpointError, ReplayDiverged) as exc:
            # Never continued on a guess: the session ends, as its worker's loss would. A
            # frame model's output past the checkpoint is a known limit, not a fault.
            _log.log(logging.WARNING if isinstance(exc, UnreplayableTail) else logging.ERROR,
                     "session %s: cannot be taken over (%s); ending it", session_id, exc,
                     extra=log_ids(session_id))
            self._metrics.take_over("ended")
            await self._writer.close(session_id, CloseReason.WORKER_LOST,
                                     owner_epoch=start.owner_epoch)
            return None
        if restored is None:  # no free slot: cannot happen while the reservation holds
            return None
        session, lost_response = restored
        session.owner_epoch = start.owner_epoch
        session.output_log_max_entries = start.output_log_max_entries
        self._fences.learned(reading, session, start)
        # Served before anything is awaited: its slot's first frames come with the next
        # ticks, and a frame for a slot no session holds is dropped.
        self._sessions.add(session_id, session)
        self._metrics.take_over("taken" if checkpoint is not None
                                and checkpoint.seq == ends.last_output else "reconciled")
        if lost_response:
            self._metrics.lost_responses.inc()
        await self._listen_to_home(worker_of_session(session_id))
        await self._catch_up(session_id, session)
        return session

    async def _restored(self, session_id: str, start: SessionStart,
                        checkpoint: Checkpoint | None,
                        last_output: int) -> tuple[Session, bool] | None:
        """A new session continuing ``checkpoint``, reconciled with the events its lost
        worker wrote past it (``inference_worker/tail_replay.py``), and whether that ended
        a response they left open; None: no engine slot is free.

        Raises:
            ValueError: there is none, or the input or events it needs are no longer there.
            CheckpointError: it is not a checkpoint this code can read.
            ReplayDiverged: replaying the input after it does not reproduce those events.
        """
        if checkpoint is None:
            raise ValueError("it has no checkpoint")
        tail = await self._tail(session_id, checkpoint.seq, last_output)
        state = decode(checkpoint.core)
        engine = self._engine()
        resume = None if engine is None else slot_resume(state, engine, len(tail))
        entries: list[InputEntry] = []
        if checkpoint.keep != "0-0":
            entries = await read_input_range(self._client, session_id, checkpoint.keep,
                                             checkpoint.applied)
            if not entries or entries[0].index != _entry_id(checkpoint.keep)[1]:
                raise ValueError("the input it needs read back is gone")
        buffered, unconsumed, heard = read_back(entries, state,
                                                self._factory.keeps_turn_audio)
        if resume is not None and unconsumed:  # its slot takes it first, as the old one would
            resume = dataclasses.replace(resume, unconsumed=unconsumed)
        session = self._factory.session(session_id, engine, start, resume)
        if session is None:
            return None
        session.core.restore(state, buffered)
        session.applied_under = WriteToken(start.epoch, 0)
        applied_fence, applied = _entry_id(checkpoint.applied)
        session.applied_fence, session.next_seq = applied_fence, last_output + 1
        session.trimmed_to = _entry_id(checkpoint.keep)[1]
        if session.checkpoints is not None:
            self._resume_hold(session.checkpoints, entries, heard, state.buffer.size)
            marks = session.checkpoints
            marks.applied, marks.seq = applied, checkpoint.seq
        lost_response = False
        if tail:
            applied, lost_response = await self._replayed(session_id, session, applied,
                                                          applied_fence, tail)
        session.follower = LogFollower(applied)
        return session, lost_response

    async def _replayed(self, session_id: str, session: Session, applied: int,
                        applied_fence: int, tail: list[Event]) -> tuple[int, bool]:
        """Replay the input after the checkpoint's position ``applied`` against ``tail``:
        the position the replay reached, and whether it ended a response the tail left
        open; the fresh events it gave are queued to send.

        Raises:
            ReplayDiverged: the replay does not reproduce ``tail``.
        """
        after = await read_input_entries(self._client, session_id, applied, _REPLAY_READ,
                                         after_fence=applied_fence)
        replayed = replay_tail(session, after, tail, now=time.monotonic())
        if replayed.applied:
            applied = after[replayed.applied - 1].index
        for event in replayed.events:
            session.unsent.append(encode_message(event))
            if isinstance(event, SessionUpdated):
                session.unsent_session = event.session
        if session.checkpoints is not None:
            session.checkpoints.events_since = True
        return applied, replayed.lost_response is not None

    async def _tail(self, session_id: str, seq: int, last_output: int) -> list[Event]:
        """The events the old owner wrote after event ``seq``, the log's last being
        ``last_output`` (none after a hand-over: it wrote its last checkpoint last).

        Raises:
            ValueError: they are not all there, or one is not an event.
        """
        if last_output <= seq:
            return []
        rows = await read_output(self._client, session_id, seq, last_output - seq)
        if [row_seq for row_seq, _ in rows] != list(range(seq + 1, last_output + 1)):
            raise ValueError(f"the events after its checkpoint's ({seq}) are not all there")
        try:
            return [decode_event(data) for _, data in rows]
        except MessageDecodeError as exc:
            raise ValueError(f"an event after its checkpoint is unreadable: {exc}") from exc

    @staticmethod
    def _resume_hold(marks: SessionCheckpoints, entries: Sequence[InputEntry],
                     heard: Sequence[int], buffered: int) -> None:
        """Hold what the checkpoint holds: the entries read back, the buffer their audio."""
        hold = marks.hold
        total = buffered - sum(heard)  # the audio heard before the first entry read back
        hold.resume(total)
        for entry, audio in zip(entries, heard, strict=True):
            total += audio
            hold.applied(entry.fence, entry.index, total, len(entry.payload))
        if (oldest := hold.oldest()) is not None:
            hold.written(oldest)

    async def _listen_to_home(self, home: str) -> None:
        if home != self._worker_id() and home not in self._homes:
            self._homes.add(home)
            await self._subscriber.subscribe(WorkerKeys(home).input_channel, self._notices)

    # ------------------------------------------------------------------ upkeep

    async def discover(self) -> None:
        """Take over what was handed here and not taken yet (its notice lost), let go of the
        slots of sessions no longer served here, and stop listening to homes none of whose
        sessions are."""
        me = self._worker_id()
        reserved = await adopted_sessions(self._client, me)
        now_ms = await server_time_ms(self._client) if reserved else 0
        for session_id, since_ms in reserved.items():
            if session_id in self._sessions or await self.take_over(session_id) is not None:
                continue
            start = await session_start(self._client, session_id)
            if (start is None or start.closed or start.other_format
                    or (start.owner != me and now_ms - since_ms > _STALE_RESERVATION_MS)):
                await self._scripts.release_slot(me, session_id)
        served = {worker_of_session(session_id) for session_id in self._sessions.ids()}
        for home in self._homes - served:
            self._homes.discard(home)
            await self._subscriber.unsubscribe(WorkerKeys(home).input_channel, self._notices)

    async def ended(self, session_id: str) -> None:
        """``session_id`` ended (told before it is forgotten): let its slot here go, when
        this worker served it and it was homed elsewhere. The home's other sessions' ends
        come on the same channel and concern it not; a reservation of one not taken over yet
        is let go by :meth:`discover`."""
        if session_id in self._sessions and worker_of_session(session_id) != self._worker_id():
            await self._scripts.release_slot(self._worker_id(), session_id)

    async def leave_homes(self) -> None:
        """Stop listening to every home (the incarnation ends)."""
        for home in self._homes:
            await self._subscriber.unsubscribe(WorkerKeys(home).input_channel, self._notices)
        self._homes.clear()
