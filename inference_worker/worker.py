"""The asyncio driver of one inference worker.

It registers and heartbeats, learns of sessions placed on it from its input channel (a
periodic read of its session set and input logs is the safety net for lost pushes), applies
each session's input log in order to the session's conversation core
(:class:`~inference_worker.conversation.core.ConversationCore`, one per session whatever the
backend), and appends what the core emits to the session's output log. Every write is fenced
in Redis: once this worker is declared lost its output appends are refused, the reaper ends
its sessions, and its next heartbeat stops it (DESIGN §2.9). Every input entry is checked
again against the token it was written under (:func:`~inference_worker.sessions.is_current`).
Sessions are checkpointed (:mod:`inference_worker.checkpoints`); a drain hands them over to
other workers (:mod:`inference_worker.hand_over`), and this worker takes over those handed to it.

With a frame backend (``fake``, ``moshi``, ``cascade``) each session holds a slot of the
:class:`~inference_worker.engine.Engine`, whose model thread steps all of them together, and
the worker reads its sessions' input itself after each tick
(:mod:`inference_worker.input_pull`). It admits new sessions (heartbeat ``admit``) only while
a slot is free and the rolling p99 tick time is inside ``tick_budget_fraction`` of the frame.

One session's failure ends that session alone (:mod:`inference_worker.sessions`). A failure
of the worker itself (one of its loops ends) stops the process, and the reaper then declares
it lost: its sessions move to other workers or end ``worker_lost``. The worker never takes
itself out of the directory: the reaper does once it reports the worker lost."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from typing import Any

from contract.reasons import CloseReason
from inference_worker.backend import Backend
from inference_worker.backends.registry import (
    BackendRequest,
    backend_entry,
    create_backend,
    parse_options as parse_backend_options,
)
from inference_worker.checkpoints import Checkpointer
from inference_worker.engine import Engine, TickReport
from inference_worker.hand_over import HandOver
from inference_worker.heartbeat import beat
from inference_worker.input_fences import FenceKeeper, PushVerdict, fence_raised, verdict
from inference_worker.input_pull import InputPuller
from inference_worker.metrics import WorkerMetrics
from inference_worker.output_writer import OutputWriter, Pending, trim_due
from inference_worker.session_factory import SessionFactory
from inference_worker.sessions import Session, SessionTable, log_ids
from inference_worker.settings import WorkerSettings
from inference_worker.turn_detection.silero import detector_factory, load_weights
from runtime.fairness import PushQueue
from runtime.loop_lag import watch_loop_lag
from store import Scripts, StoreError, WorkerFenced
from store.client import RedisClient
from store.directory import WorkerProfile, sessions_of_worker
from store.errors import raise_if_cancelled
from store.keys import WorkerKeys, new_worker_id, worker_of_session, worker_pulls_input
from store.logs import (
    InputEntry,
    SessionStart,
    WriteToken,
    log_ends,
    read_input_entries,
    session_start,
)
from store.outages import (
    OutageLog,
    RedisRefused,
    operator_mistake,
    redis_address,
    wait_for_redis_unless,
)
from store.pubsub import Subscriber
from store.pushes import (
    FenceRaised,
    InputBatch,
    InputPushed,
    Push,
    SessionEnded,
    SessionHandedOver,
    SessionPlaced,
)

__all__ = ["Worker"]

_log = logging.getLogger(__name__)
# How long a drain lets the flusher write the sessions' last events (then terminals alone).
_CLOSE_FLUSH_S = 5.0
# After a failed beat the next comes this soon: when an outage ends the reapers give the
# worker one TTL to beat, and this keeps the beat well inside it.
_BEAT_RETRY_S = 0.1
#: Pauses between tries of the registration while the store is away; the last one repeats.
_REGISTER_RETRY_S = (0.1, 0.2, 0.5, 1.0)


class Worker:
    """One worker process's sessions; ``run()`` until ``stop()`` or fencing."""

    #: The table that holds and isolates the sessions (a subclass may change its rules).
    session_table: type[SessionTable] = SessionTable


    def __init__(self, settings: WorkerSettings, client: RedisClient,
                 worker_id: str | None = None, *, backend: Backend | None = None,
                 metrics: WorkerMetrics | None = None) -> None:
        """Serve ``settings.backend``; a frame backend is built in :meth:`run` unless given."""
        self.settings = settings
        self.metrics = metrics or WorkerMetrics(settings.backend, model=settings.models[0])
        self._backend = backend
        # The turn detector of every session here; a vad=silero that cannot run stops the start.
        self._detector = detector_factory(settings.vad)
        self._factory = SessionFactory(settings, self._detector)
        self._engine: Engine | None = None
        self._background: set[asyncio.Task[None]] = set()
        # A frame backend reads its sessions' input on its own clock (inference_worker/
        # input_pull.py); its id says so, and the appends then push it nothing.
        self._frames = backend_entry(settings.backend).frames
        self.worker_id = worker_id or new_worker_id(pulls_input=self._frames)
        if worker_pulls_input(self.worker_id) and not self._frames:
            raise ValueError(f"worker id {self.worker_id} pulls its input: a frame backend's")
        self._client = client
        # The output flushes are a call per relayed chunk: on the store's own connection.
        self._scripts = Scripts(client, own_connection=True)
        self._keys = WorkerKeys(self.worker_id)
        # Every loop here reports to one outage log: an outage is told once, not per retry.
        self._redis_address = redis_address(settings.redis_url)
        self._outages = OutageLog(_log, self._redis_address)
        self._subscriber = Subscriber(client, outages=self._outages)
        # Sessions with something to write; one flusher writes them all concurrently, so a busy
        # worker pays one Redis round trip per batch of sessions, not per session in turn.
        self._pending = Pending()
        self._sessions = self.session_table(self.metrics, _log,
                                            mark_dirty=self._pending.mark_dirty,
                                            engine=lambda: self._engine)
        self._checkpointer = Checkpointer(self._scripts, self._sessions, self.metrics,
                                          self._outages,
                                          interval_s=settings.checkpoint_interval_s)
        self._writer = OutputWriter(
            self._scripts, self._sessions, self._pending, self._outages, fence=self._fence,
            spawn=self._spawn, checkpointer=self._checkpointer,
            forfeit=self.metrics.checkpoint_forfeits.inc)
        self._puller = InputPuller(client, self._sessions, self._offer, self._outages,
                                   self._spawn)
        self._notices: PushQueue[Push | None] = PushQueue()
        self._fences = FenceKeeper(client)
        self._hand_over = HandOver(
            client=client, scripts=self._scripts, sessions=self._sessions,
            factory=self._factory, checkpointer=self._checkpointer, writer=self._writer,
            fences=self._fences, subscriber=self._subscriber,
            notices=lambda notice: self._notices.put(notice), metrics=self.metrics,
            worker_id=lambda: self.worker_id, catch_up=self._catch_up, engine=lambda: self._engine)
        self._tick_wake = asyncio.Event()
        self._next_tick_at = 0.0  # when the tick loop will next look (monotonic)
        self._stopping = asyncio.Event()
        self._draining = False
        self.fenced = False
        #: Worker ids this process served under; a new one after each fencing.
        self.incarnations: list[str] = [self.worker_id]
        # What every new session here starts with, published on registration (see run).
        self._profile: WorkerProfile | None = None

    @property
    def session_ids(self) -> list[str]:
        """Sessions this worker is serving now."""
        return self._sessions.ids()

    @property
    def engine(self) -> Engine | None:
        """The frame engine (None on the loopback backend, or before :meth:`run`)."""
        return self._engine

    async def run(self) -> None:
        """Serve until stopped (SIGTERM drains).

        A worker declared lost (its heartbeat lapsed, or Redis lost its record in a restart)
        never writes under that id again; the process joins again as a new worker with a
        fresh id, so a transient stall costs its sessions but not the capacity.
        """
        await asyncio.to_thread(load_weights, self._detector)  # see load_weights
        await self._start_engine()
        try:
            self._profile = self._factory.profile(self._engine)
            # Bounded: a worker started before Redis (a deploy starting everything at once).
            if await wait_for_redis_unless(self._stopping, self._client, _log,
                                           self._redis_address,
                                           timeout_s=self.settings.redis_start_timeout_s):
                await self._serve()
        finally:
            await self._stop_engine()
            await self._scripts.aclose()

    async def _serve(self) -> None:
        while True:
            await self._serve_incarnation()
            if not self.fenced or self._draining:
                return
            self.worker_id = new_worker_id(pulls_input=self._frames)
            self._keys = WorkerKeys(self.worker_id)
            self.incarnations.append(self.worker_id)
            self.fenced = False
            self._stopping.clear()
            _log.warning("rejoining as worker %s", self.worker_id, extra=self._log_ids())

    async def _serve_incarnation(self) -> None:
        if not await self._register():
            return  # stopped before it could register: nothing to drain
        _log.info("worker %s registered; serving %d slots of model %s", self.worker_id,
                  self._capacity, ", ".join(self.settings.models), extra=self._log_ids())
        await self._subscriber.subscribe(self._keys.input_channel, self._notices.put)
        try:
            await self._discover()
        except StoreError as exc:  # the poll loop reads them again
            self._outages.failed("session discovery", exc)
        loops = [self._heartbeat_loop(), self._notice_loop(), self._tick_loop(),
                 self._poll_loop(), self._writer.run(),
                 watch_loop_lag(self.metrics.event_loop_lag_seconds.observe)]
        if self.settings.checkpoint_interval_s:
            loops.append(self._checkpointer.run())
        tasks = [asyncio.create_task(coro) for coro in loops]
        stopping: asyncio.Task[Any] = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
            # The loops run until cancelled (the heartbeat ends after fencing); one that ended
            # otherwise hit a bug: fail loudly rather than limp on holding sessions silently
            # (the process exits, its heartbeat lapses, the reaper ends its sessions).
            for task in tasks:
                if task.done() and (task.exception() or not self._stopping.is_set()):
                    raise RuntimeError(f"worker loop {task.get_coro()!r} ended") from (
                        task.exception())
            if not self.fenced:
                await self._drain()
        finally:
            # The closes still trying end with the incarnation: fenced, its writes are refused;
            # stopped, its heartbeat lapses and the reaper ends what is left worker_lost.
            for task in (stopping, *tasks, *self._background):
                task.cancel()
            await asyncio.gather(stopping, *tasks, *self._background, return_exceptions=True)
            await self._subscriber.unsubscribe(self._keys.input_channel)
            await self._hand_over.leave_homes()
            # The directory entry stays, whatever the way out: the reaper removes it once it
            # reports this worker lost (a crash's sessions ended worker_lost first).
            if self.fenced:
                self._notices = PushQueue()
            else:
                await self._subscriber.aclose()

    def _log_ids(self) -> dict[str, str]:  # what its own log lines carry: its id now
        return {"worker_id": self.worker_id}

    def stop(self) -> None:
        """Begin a graceful stop (SIGTERM): admit nothing new, let sessions finish."""
        self._draining = True
        self._stopping.set()

    # ------------------------------------------------------------------ the engine

    async def _start_engine(self) -> None:
        s = self.settings
        if not self._frames:
            return  # the loopback's cores play their sessions back themselves
        backend = self._backend
        if backend is None:  # loading weights takes a while: off the event loop
            request = BackendRequest(name=s.backend, slots=s.slots, model_path=s.model_path,
                                     device=s.device, dtype=s.dtype,
                                     options=parse_backend_options(s.backend_options),
                                     cuda_graphs=s.moshi_cuda_graphs)
            backend = await asyncio.to_thread(create_backend, request)
        self._backend = backend
        self._engine = Engine(backend, metrics=self.metrics, window=s.tick_window)
        self._engine.start(asyncio.get_running_loop(), self._on_tick)

    async def _stop_engine(self) -> None:
        engine, self._engine = self._engine, None
        if engine is None:
            return
        await asyncio.to_thread(engine.stop)
        close = getattr(engine.backend, "close", None)
        if callable(close):  # backends with threads of their own (the cascade's pool)
            await asyncio.to_thread(close)

    @property
    def _capacity(self) -> int:
        if self._engine is None:
            return self.settings.slots
        return min(self.settings.slots, self._engine.spec.max_slots)

    def _admitting(self) -> bool:
        """Free slot and tick time within budget (the loopback always admits)."""
        engine = self._engine
        if engine is None:
            return True
        return engine.free_slots > 0 and not engine.over_budget(
            self.settings.tick_budget_fraction)

    def _on_tick(self, report: TickReport) -> None:
        """One tick's outputs, on the event loop: feed each session's core."""
        now = time.monotonic()
        for serial, frame in report.outputs.items():
            self._sessions.feed(serial, frame, now)
        for serial in report.failed:
            session_id = self._sessions.holder_of(serial)
            if session_id is not None:
                _log.error("session %s: model failure (%s); closing it", session_id,
                           report.error or "its slot failed", extra=log_ids(session_id))
                self._sessions.end(session_id, CloseReason.MODEL_ERROR, time.monotonic())
        if worker_pulls_input(self.worker_id):
            self._puller.tick()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ lifecycle

    async def _heartbeat(self, *, register: bool = False) -> None:
        await beat(self._scripts, self._client, self.metrics, self.settings, self.worker_id,
                   capacity=self._capacity, admit=self._admitting(), draining=self._draining,
                   profile=self._profile, engine=self._engine, sessions=len(self._sessions),
                   register=register)

    async def _register(self) -> bool:
        """Register this incarnation, trying again while Redis is away (a rejoin after
        fencing often comes during an outage); False if stopped (SIGTERM) first.

        Raises:
            RedisRefused: Redis refuses this worker (its user may not run scripts, say).
        """
        for attempt in itertools.count():
            raise_if_cancelled()  # see _heartbeat_loop
            if self._draining:
                return False
            try:
                await self._heartbeat(register=True)
            except StoreError as exc:
                mistake = operator_mistake(exc)
                if mistake is not None:
                    raise RedisRefused(f"worker {self.worker_id} cannot register: {mistake}"
                                       ) from None
                self._outages.failed("registration", exc)
                await asyncio.sleep(_REGISTER_RETRY_S[min(attempt, len(_REGISTER_RETRY_S) - 1)])
                continue
            self._outages.succeeded()
            return True
        raise AssertionError("unreachable")  # itertools.count() never ends

    async def _heartbeat_loop(self) -> None:
        interval = self.settings.heartbeat_interval_s
        pause = interval
        while True:
            # Each loop that calls the store checks once per turn: a cancellation that landed
            # while a command was in flight can be swallowed (see raise_if_cancelled), and a
            # loop that ran on would hang the shutdown (or the rejoin after fencing).
            raise_if_cancelled()
            await asyncio.sleep(pause)
            try:
                await self._heartbeat()
                pause = interval
            except WorkerFenced:
                self._fence()
                return
            except StoreError as exc:
                self._outages.failed("heartbeat", exc)
                pause = min(interval, _BEAT_RETRY_S)
            else:
                self._outages.succeeded()

    async def _drain(self) -> None:
        try:
            await self._heartbeat()  # publishes the draining state: no new placements
        except WorkerFenced:
            self._fence()  # declared lost meanwhile: its sessions are not ours to end
            return
        except StoreError as exc:  # Redis away: the sessions still get their time below
            self._outages.failed("drain announcement", exc)
        deadline = time.monotonic() + self.settings.drain_timeout_s
        if self._sessions and self.settings.checkpoint_interval_s:
            await self._hand_over.hand_over_all(deadline)  # see inference_worker/hand_over.py
        if self._sessions:
            self._sessions.no_sessions.clear()
            # Sessions end on their own schedule (client close, expiry); wait for the last.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._sessions.no_sessions.wait(),
                                       max(0.0, deadline - time.monotonic()))
        if not self._sessions:
            return
        # Each core ends its session (an active response ends cancelled) and the flusher
        # writes what it has, then session.closed, in order; what it cannot write in time
        # (Redis away) gets the terminal event alone.
        self._sessions.no_sessions.clear()
        for session_id in self._sessions.ids():
            self._sessions.end(session_id, CloseReason.WORKER_SHUTDOWN, time.monotonic())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._sessions.no_sessions.wait(), _CLOSE_FLUSH_S)
        for session_id, session in self._sessions.items():
            await self._writer.close(session_id, CloseReason.WORKER_SHUTDOWN, retry=False,
                                     owner_epoch=session.owner_epoch)

    def _fence(self) -> None:
        # Fenced: a reaper declared it lost, or its record is gone (Redis lost its data).
        _log.error("worker %s was declared lost or its record is gone; it stops writing now",
                   self.worker_id, extra=self._log_ids())
        self.fenced = True
        for session_id in self._sessions.ids():
            self._sessions.forget(session_id)
        self._stopping.set()

    # ------------------------------------------------------------------ input

    async def _notice_loop(self) -> None:
        while True:
            raise_if_cancelled()  # see _heartbeat_loop
            notice = await self._notices.get()  # a turn of the loop first: runtime.fairness
            try:
                await self._on_notice(notice)
            except StoreError as exc:
                # Redis is failing over or restarting; the poll loop reads what was missed.
                self._outages.failed("push handling", exc)
            except (IndexError, KeyError, TypeError, ValueError, AttributeError):
                # Only our scripts publish here; a malformed notice is dropped, not obeyed,
                # and the poll loop still reads the logs.
                _log.exception("dropped a malformed notice: %r", notice,
                               extra=self._log_ids())

    async def _on_notice(self, notice: Push | None) -> None:
        match notice:
            # Pushes come on this worker's channel and on those of the homes of sessions it
            # took over (inference_worker/hand_over.py), whose other sessions it ignores.
            case InputPushed(session_id=session_id):
                await self._on_input(session_id, notice)
            case InputBatch(parts=parts):  # one input append for several sessions
                for part in parts:
                    await self._on_input(part.session_id, part)
            case FenceRaised(session_id=session_id, fence=fence):
                if session := self._sessions.get(session_id):
                    fence_raised(session, fence)
            case SessionEnded(session_id=session_id):
                await self._hand_over.ended(session_id)
                self._sessions.forget(session_id)
            case SessionPlaced(session_id=session_id):
                await self._adopt(session_id)
            case SessionHandedOver(session_id=session_id):
                await self._hand_over.take_over(session_id)
            case None:  # the subscription was re-established: catch up from Redis
                self._fences.resubscribed(session for _, session in self._sessions.items())
                await self._discover()

    async def _on_input(self, session_id: str, pushed: InputPushed) -> None:
        """Apply the entries of one session's input push, or read its log instead."""
        session = self._sessions.get(session_id) or await self._adopt(session_id)
        if session is None:
            return
        session.pushed = True
        match verdict(session, pushed):
            case PushVerdict.APPLY:
                await self._offer(session_id, session, pushed.entries())
            case PushVerdict.READ_LOG:
                await self._catch_up(session_id, session)
            case PushVerdict.STALE:
                self.metrics.stale_pushes.inc()

    async def _poll_loop(self) -> None:
        while True:
            raise_if_cancelled()  # see _heartbeat_loop
            await asyncio.sleep(self.settings.input_poll_interval_s)
            try:
                await self._discover()
            except StoreError as exc:
                self._outages.failed("input poll", exc)
            else:
                self._outages.succeeded()

    async def _discover(self) -> None:
        """Adopt sessions placed or handed here whose push was lost, and read every input
        log."""
        await self._hand_over.discover()
        for session_id in await sessions_of_worker(self._client, self.worker_id):
            if session_id not in self._sessions:
                await self._adopt(session_id)
        pulls = worker_pulls_input(self.worker_id)
        for session_id, session in self._sessions.items():
            if session.input_fence is None and not pulls:
                await self._fences.learn(session_id, session)
            quiet, session.pushed = not session.pushed, False
            if quiet or not pulls:  # a pull read a session that had input on the last tick
                await self._catch_up(session_id, session, check_rewind=quiet)
            if quiet and trim_due(session, self.metrics.checkpoint_forfeits.inc):
                self._pending.report_applied.add(session_id)  # see Session.trimmed_to
                self._pending.mark_dirty(session_id)
            if session.unsent:
                self._pending.mark_dirty(session_id)

    async def _adopt(self, session_id: str) -> Session | None:
        if (session_id in self._sessions or self.fenced
                or worker_of_session(session_id) != self.worker_id):  # not placed here
            return self._sessions.get(session_id)
        # The epoch this worker serves the session under: input written under another (a
        # record re-created after a lossy failover) is refused. The model its session.created
        # announced is the session's name (the one its client opened it with).
        reading = self._fences.reading()
        start = await session_start(self._client, session_id)
        if session_id in self._sessions or self.fenced:  # a push and a poll adopted it at once
            return self._sessions.get(session_id)
        if (start is None or start.closed or start.other_format
                or start.owner not in (None, self.worker_id)):
            # Ended (or expired) before this look: a late push or a stale member of the
            # worker's set must not take a slot and start a model for it. A record of
            # another format is other code's to serve, one another worker took over its.
            return None
        session = self._new_session(session_id, start)
        if session is None:
            self._spawn(self._writer.close(session_id, CloseReason.NO_FREE_SLOT))
            return None
        session.applied_under, session.owner_epoch = WriteToken(start.epoch, 0), start.owner_epoch
        session.output_log_max_entries = start.output_log_max_entries
        self._fences.learned(reading, session, start)
        self._sessions.add(session_id, session)
        await self._catch_up(session_id, session)
        return session

    def _new_session(self, session_id: str, start: SessionStart) -> Session | None:
        return self._factory.session(session_id, self._engine, start)

    async def _catch_up(self, session_id: str, session: Session, *,
                        check_rewind: bool = False) -> None:
        applied = session.follower.next_index - 1
        rows = await read_input_entries(self._client, session_id, applied,
                                        after_fence=session.applied_fence)
        if self._sessions.get(session_id) is not session:
            return  # abandoned or closed while the log was read
        if rows and rows[0].index > session.follower.next_index:
            # The commands after what this session applied are gone from its log (a failover
            # to a replica that lacked them): reading again would find them missing forever,
            # and applying what follows would run without them. The session ends log_rewound.
            missing = f"{session.follower.next_index}-{rows[0].index - 1}"
            self._writer.abandon(session_id, CloseReason.LOG_REWOUND,
                                 f"input {missing} is gone from the log before it was applied")
            return
        if rows:
            await self._offer(session_id, session, rows)
        elif check_rewind and applied:
            ends = await log_ends(self._client, session_id)
            # Nothing new, and the log ends before what was applied: it went back, and the
            # commands that will reuse those indices would look applied (see _offer). A log
            # that is gone (an input log exists from the open to the end) belongs to a
            # session that ended meanwhile, whose terminal event says so.
            if (ends.input_log_exists and ends.last_input < applied
                    and self._sessions.get(session_id) is session):
                self._writer.abandon(session_id, CloseReason.LOG_REWOUND,
                                     "its input log ends before what was applied (lost writes)")

    async def _offer(self, session_id: str, session: Session,
                     entries: list[InputEntry]) -> None:
        """Apply the entries ``entries[0].index, ...`` that were not applied yet, in order."""
        if session.failed or not entries or self._sessions.get(session_id) is not session:
            return  # ending, or no longer served (abandoned): its commands are not applied
        first, payloads = entries[0].index, [entry.payload for entry in entries]
        if session.follower.rewound_at(first, payloads) is not None:
            # Other commands under indices already applied: a Redis failover lost input this
            # worker acted on, and the log numbers on from there. The session's state here no
            # longer matches the store's; end it loudly rather than drop the new commands.
            self._writer.abandon(session_id, CloseReason.LOG_REWOUND,
                                 "its input log went back (lost writes)")
            return
        applied_before = session.follower.next_index - 1
        fresh, gap = session.follower.offer(first, payloads)
        if gap:
            # Read what lies between; _catch_up offers only a range that starts where this
            # session stands (else it ends the session), so this cannot come back here.
            await self._catch_up(session_id, session)
            return
        self._pending.applied(session_id, session, applied_before, fresh)  # apply() marks it
        # The follower delivers a suffix (what it had not delivered yet). Refused entries are
        # delivered too: the position moves past them, so they are never read again.
        self._sessions.apply(session_id, session, entries[len(entries) - len(fresh):],
                             time.monotonic())
        deadline = self._sessions.deadline_of(session_id, session)
        if deadline is not None and deadline < self._next_tick_at:
            # Only an earlier deadline wakes the tick loop (not each chunk: a rescan each).
            self._tick_wake.set()

    # ------------------------------------------------------------------ output

    async def _tick_loop(self) -> None:
        while True:
            # wait_for swallows a cancel that lands as its wait ends: see _heartbeat_loop.
            raise_if_cancelled()
            deadline, now = self._sessions.next_deadline(), time.monotonic()
            self._next_tick_at = deadline if deadline is not None else now + 1.0
            delay = max(0.0, self._next_tick_at - now)
            self._tick_wake.clear()
            try:
                await asyncio.wait_for(self._tick_wake.wait(), delay)
            except TimeoutError:
                pass
            self._sessions.tick_due(time.monotonic())
