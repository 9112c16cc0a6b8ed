"""One session's failure inside a worker ends that session alone (in process, real Redis).

Poisoned commands go straight into the input log with the store's own scripts, as a gateway
that let them through would write them. Real poison (what crashed a worker before: a
``session.update`` nested hundreds of levels deep, a close reason with a lone surrogate) must
be answered like any bad value; a planted bug at each stage of the worker's per-session work
(applying a command, a timer or a model tick, draining events, encoding one, preparing or
sending the write) must end its session ``internal_error`` while another session on the
same worker keeps streaming, in order.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from redis.asyncio import Redis

from contract import messages as msg
from contract.messages import encode_message, is_terminal
from inference_worker.audio_frames import FrameOutput
from inference_worker.backends.fake import FakeBackend, FakeOptions
from inference_worker.backends.registry import frame_core, loopback_core
from inference_worker.conversation.core import ConversationCore
from inference_worker.metrics import FAILURE_STAGES
from inference_worker.sessions import Session, SessionTable
from inference_worker.settings import WorkerSettings
from inference_worker.worker import Worker
from store import Lease, Scripts
from store.logs import SessionStart
from tests.store._support import assert_one_terminal, events_of, open_session, until

POISON = "poison"  # the event id of the heartbeat that arms a planted bug
STREAM = {"extra_body": {"loopback_mode": "stream"},
          "audio": {"input": {"turn_detection": None}}}
CHUNK = 960  # 20 ms of pcm16 at 24 kHz
AUDIBLE = b"\x00\x10" * 1920  # 80 ms, loud


def marked(index: int) -> bytes:
    """A chunk whose first bytes say its index, to check echoes arrive in order."""
    return struct.pack("<I", index) + bytes(CHUNK - 4)



class PlantedLoopback(ConversationCore):
    """The loopback runner with a bug at ``stage``, armed by a heartbeat with id POISON."""

    stage = ""
    armed = False

    def receive(self, command: msg.Command, now: float) -> None:
        if isinstance(command, msg.Heartbeat) and command.event_id == POISON:
            self.armed = True
            if self.stage == "receive":
                raise KeyError("a planted bug in receive")
            return
        super().receive(command, now)

    def next_deadline(self) -> float | None:
        if self.armed and self.stage == "tick":
            return 0.0  # due at once
        return super().next_deadline()

    def tick(self, now: float) -> None:
        if self.armed and self.stage == "tick":
            raise ZeroDivisionError("a planted bug in tick")
        super().tick(now)

    def events_to_send(self) -> list[msg.Event]:
        events = super().events_to_send()
        if self.armed and self.stage == "events":
            raise RuntimeError("a planted bug in events_to_send")
        if self.armed and self.stage == "encode":
            self.armed = False  # one event that JSON cannot hold: bytes inside the session
            events.append(msg.SessionUpdated(session={"audio": b"\x00\x01"}))
        return events

    @property
    def close_requested(self) -> str | None:
        if self.armed and self.stage in ("write", "write-batch"):
            return "a\ud800b"  # as the runner did before it replaced such reasons
        return super().close_requested


class PlantedWorker(Worker):
    """A loopback worker whose sessions run :class:`PlantedLoopback` (the fault injection);
    everything else is the real worker."""

    def __init__(self, *args: Any, stage: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stage = stage

    def _new_session(self, session_id: str, start: SessionStart) -> Session | None:
        session = super()._new_session(session_id, start)
        if session is not None:
            planted = loopback_core(session_id, core=PlantedLoopback)
            assert isinstance(planted, PlantedLoopback)
            planted.stage = self.stage
            session.core = planted
        return session


class UncheckedSessions(SessionTable):
    """The session table without the check of each session's close reason before the batch."""

    def close_reason_of(self, session_id: str, session: Session) -> str | None:
        return "internal_error" if session.failed else session.core.close_requested


class UncheckedWorker(PlantedWorker):
    """Also without the check of each session's close reason before the batch, so a bad one
    reaches the batched script call itself (which must then not fail the others)."""

    session_table = UncheckedSessions


def settings(backend: str = "loopback") -> WorkerSettings:
    """A worker that beats often, keeps sessions long and drains fast."""
    return WorkerSettings(backend=backend, slots=4, heartbeat_interval_s=0.2,
                          heartbeat_ttl_s=5.0, input_poll_interval_s=0.2, drain_timeout_s=0.2)


@asynccontextmanager
async def serving(worker: Worker, client: Redis) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``worker`` until the block ends; the block gets its task."""
    task = asyncio.create_task(worker.run())

    async def registered() -> bool:
        return bool(await client.zscore("dg:workers", worker.worker_id)) or task.done()

    await until(registered, "registration")
    try:
        yield task
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)


async def append(scripts: Scripts, lease: Lease, *commands: msg.Command) -> None:
    """Append commands to the session's input log, as a gateway does."""
    await scripts.append_input(lease, [(None, encode_message(c)) for c in commands],
                               max_entries=1000)


async def events(client: Redis, session_id: str) -> list[msg.Event]:
    """The session's output log, decoded, checked to be numbered 1, 2, 3, ..."""
    logged = await events_of(client, session_id)
    assert [seq for seq, _ in logged] == list(range(1, len(logged) + 1))
    return [event for _, event in logged]


async def echoed(client: Redis, session_id: str) -> list[int]:
    """The indices of the chunks echoed to the session so far, in log order."""
    return [struct.unpack_from("<I", e.audio)[0] for e in await events(client, session_id)
            if isinstance(e, msg.AudioDelta)]


async def ended(client: Redis, session_id: str) -> bool:
    """Whether the session's log ends with its terminal event."""
    logged = await events(client, session_id)
    return bool(logged) and is_terminal(logged[-1])


def failures(worker: Worker) -> dict[str, float]:
    """duplex_worker_session_failures_total by stage."""
    return {stage: worker.metrics.registry.get_sample_value(
        "duplex_worker_session_failures_total",
        {"backend": worker.settings.backend, "stage": stage}) or 0.0
        for stage in FAILURE_STAGES}


async def stream_and_check(scripts: Scripts, client: Redis, lease: Lease, first: int,
                           last: int) -> None:
    """Send chunks ``first..last-1`` to a stream-mode session and wait for every echo so far,
    in order."""
    await append(scripts, lease, *(msg.AppendAudio(audio=marked(i)) for i in range(first, last)))

    async def all_back() -> bool:
        return len(await echoed(client, lease.session_id)) >= last

    await until(all_back, f"echoes up to {last}")
    assert await echoed(client, lease.session_id) == list(range(last))


async def test_real_poison_is_refused_and_the_other_session_streams_on(
        redis_client: Redis) -> None:
    """What ended a whole worker before: nested tools (500 objects, 600 arrays) are refused
    with error invalid_value, a close reason with a lone surrogate ends the session
    client_close; the other session's echoes keep coming in order, and nothing counts as a
    failure of the worker."""
    worker = Worker(settings(), redis_client)
    scripts = Scripts(redis_client)
    async with serving(worker, redis_client) as task:
        a = await open_session(scripts, worker.worker_id)
        b = await open_session(scripts, worker.worker_id)
        await append(scripts, a.lease, msg.UpdateSession(session=STREAM))
        await stream_and_check(scripts, redis_client, a.lease, 0, 5)
        objects: Any = {}
        for _ in range(500):
            objects = {"properties": objects}
        arrays: Any = []
        for _ in range(600):
            arrays = [arrays]
        await append(scripts, b.lease, *(
            msg.UpdateSession(session={"tools": [{"type": "function", "name": "f",
                                                  "parameters": deep}]}, event_id=f"deep{n}")
            for n, deep in enumerate((objects, arrays))))
        await stream_and_check(scripts, redis_client, a.lease, 5, 10)
        await append(scripts, b.lease, msg.Heartbeat(), msg.CloseSession(reason="a\ud800b"))
        await until(lambda: ended(redis_client, b.session_id), "the poisoned session's end")
        await stream_and_check(scripts, redis_client, a.lease, 10, 15)
        logged = await assert_one_terminal(redis_client, b.session_id, "session.closed",
                                           "client_close")
        kinds = [event for _, event in logged]
        assert [(e.code, e.client_event_id) for e in kinds if isinstance(e, msg.ErrorEvent)] == [
            ("invalid_value", "deep0"), ("invalid_value", "deep1")]
        assert isinstance(kinds[-2], msg.HeartbeatAck)  # it served on after the refusals
        assert not any(is_terminal(e) for e in await events(redis_client, a.session_id))
        assert not task.done()
        assert set(failures(worker).values()) == {0.0}


@pytest.mark.parametrize("stage", ["receive", "tick", "events", "encode", "write",
                                   "write-batch"])
@pytest.mark.logs_errors
async def test_a_session_that_fails_ends_internal_error_alone(redis_client: Redis,
                                                              stage: str) -> None:
    """A bug planted at one stage of one session's work ends that session with exactly one
    session.closed internal_error, counted under its stage; the other session on the worker
    keeps getting its echoes in order, before, during and after."""
    kind = UncheckedWorker if stage == "write-batch" else PlantedWorker
    worker = kind(settings(), redis_client, stage=stage)
    scripts = Scripts(redis_client)
    async with serving(worker, redis_client) as task:
        a = await open_session(scripts, worker.worker_id)
        b = await open_session(scripts, worker.worker_id)
        await append(scripts, a.lease, msg.UpdateSession(session=STREAM))
        await stream_and_check(scripts, redis_client, a.lease, 0, 5)
        # The poison and more of the healthy stream at once: with luck they share a flush.
        await asyncio.gather(append(scripts, b.lease, msg.Heartbeat(event_id=POISON)),
                             append(scripts, a.lease, msg.AppendAudio(audio=marked(5))))
        await until(lambda: ended(redis_client, b.session_id), "the failed session's end")
        await stream_and_check(scripts, redis_client, a.lease, 6, 12)
        await assert_one_terminal(redis_client, b.session_id, "session.closed",
                                  "internal_error")
        assert not any(is_terminal(e) for e in await events(redis_client, a.session_id))
        assert not task.done(), "the worker kept running"
        assert worker.session_ids == [a.session_id]
        counted = "write" if stage == "write-batch" else stage
        assert failures(worker) == {s: float(s == counted) for s in FAILURE_STAGES}


class PlantedDuplex(ConversationCore):
    """The frame backends' runner, whose model output handling fails once armed."""

    armed = False

    def receive(self, command: msg.Command, now: float) -> None:
        if isinstance(command, msg.Heartbeat) and command.event_id == POISON:
            self.armed = True
            return
        super().receive(command, now)

    def on_frame(self, frame: FrameOutput, now: float) -> None:
        if self.armed:
            raise IndexError("a planted bug in on_frame")
        super().on_frame(frame, now)


class PlantedFrameWorker(Worker):
    """A fake-backend worker whose sessions run :class:`PlantedDuplex`."""

    def _new_session(self, session_id: str, start: SessionStart) -> Session | None:
        session = super()._new_session(session_id, start)
        engine = self.engine
        if session is not None and engine is not None:
            session.core = frame_core(session_id, model="fake",
                                        frame_seconds=engine.spec.frame_seconds, core=PlantedDuplex)
        return session


@pytest.mark.logs_errors
async def test_a_frame_session_that_fails_on_a_tick_frees_its_slot_alone(
        redis_client: Redis) -> None:
    """On a frame backend, a runner failing on its tick's output ends internal_error and
    gives its engine slot back at once; the other session keeps hearing its echo."""
    backend = FakeBackend(max_slots=2, options=FakeOptions(frame_ms=20))
    worker = PlantedFrameWorker(settings("fake"), redis_client, backend=backend)
    scripts = Scripts(redis_client)
    async with serving(worker, redis_client) as task:
        a = await open_session(scripts, worker.worker_id)
        b = await open_session(scripts, worker.worker_id)
        engine = worker.engine
        assert engine is not None

        async def audio_to_a() -> int:
            return sum(len(e.audio) for e in await events(redis_client, a.session_id)
                       if isinstance(e, msg.AudioDelta))

        async def both_held() -> bool:
            return engine.free_slots == 0

        await until(both_held, "both sessions in the engine")
        await append(scripts, a.lease, msg.AppendAudio(audio=AUDIBLE))

        async def heard(at_least: int) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                return await audio_to_a() >= at_least
            return check

        await until(await heard(len(AUDIBLE)), "the first echo")
        await append(scripts, b.lease, msg.Heartbeat(event_id=POISON))
        await until(lambda: ended(redis_client, b.session_id), "the failed session's end")
        await assert_one_terminal(redis_client, b.session_id, "session.closed",
                                  "internal_error")
        assert engine.free_slots == 1
        await append(scripts, a.lease, msg.AppendAudio(audio=AUDIBLE))
        await until(await heard(2 * len(AUDIBLE)), "the echo after the failure")
        assert not task.done()
        assert failures(worker)["tick"] == 1
