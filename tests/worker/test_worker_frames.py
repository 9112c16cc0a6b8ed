"""The worker with a frame backend, in process on a real Redis: engine, runners, failures."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
import pytest
from redis.asyncio import Redis

from contract import messages as msg
from contract.messages import encode_message
from inference_worker.backend import SlotConfig, SlotResult, SlotStep, VoicePrompt
from inference_worker.backends.fake import FakeBackend, FakeOptions
from inference_worker.settings import WorkerSettings
from inference_worker.worker import Worker
from store import Lease, Scripts
from store.keys import SessionKeys, WorkerKeys
from tests.store._support import events_of, open_session, spublish, spublish_raw, until

AUDIBLE = b"\x00\x10" * 1920  # 80 ms, loud



class Failing(FakeBackend):
    """The fake backend whose steps raise once ``broken`` is set; it records the slots it was
    told to stop the response of."""

    broken = False

    def __init__(self, *, max_slots: int, options: FakeOptions) -> None:
        super().__init__(max_slots=max_slots, options=options)
        self.stopped: list[int] = []

    def stop_response(self, slot: int) -> None:
        self.stopped.append(slot)
        super().stop_response(slot)

    def step(self, inputs: list[SlotStep]) -> list[SlotResult]:
        if self.broken:
            raise RuntimeError("device lost")
        return super().step(inputs)


@dataclass
class Running:
    """A worker serving on a task, and what the test needs to talk to it."""

    worker: Worker
    backend: Failing
    scripts: Scripts
    client: Redis


@pytest.fixture
async def running(redis_client: Redis) -> AsyncIterator[Running]:
    """A fake-backend worker (2 slots, 20 ms frames) running until the test ends."""
    settings = WorkerSettings(backend="fake", slots=2, heartbeat_interval_s=0.2,
                              heartbeat_ttl_s=5.0, drain_timeout_s=1.0)
    backend = Failing(max_slots=2, options=FakeOptions(frame_ms=20))
    worker = Worker(settings, redis_client, backend=backend)
    task = asyncio.create_task(worker.run())
    record = WorkerKeys(worker.worker_id).record

    async def registered() -> bool:
        return bool(await redis_client.exists(record))

    await until(registered, "registration")
    yield Running(worker, backend, Scripts(redis_client), redis_client)
    worker.stop()
    await asyncio.wait_for(task, 10)
    assert worker.engine is None  # the model thread is stopped on exit


async def append(running: Running, lease: Lease, *commands: msg.Command) -> None:
    """Append encoded commands to the session's input log, fenced on ``lease``."""
    await running.scripts.append_input(
        lease, [(None, encode_message(c)) for c in commands], max_entries=1000)


async def kinds_of(running: Running, session_id: str) -> list[str]:
    """The KIND of every output event of the session so far."""
    return [event.KIND for _, event in await events_of(running.client, session_id)]


async def test_audio_in_becomes_a_response_out(running: Running) -> None:
    """Appended audio reaches the engine; the echo opens a response and streams deltas."""
    opened = await open_session(running.scripts, running.worker.worker_id)
    await append(running, opened.lease, msg.UpdateSession(session={}),
                 msg.AppendAudio(audio=AUDIBLE))

    async def echoed() -> bytes:
        return b"".join(e.audio for _, e in await events_of(running.client, opened.session_id)
                        if isinstance(e, msg.AudioDelta))

    async def all_echoed() -> bool:
        return len(await echoed()) >= len(AUDIBLE)

    await until(all_echoed, "the whole input echoed")
    kinds = await kinds_of(running, opened.session_id)
    assert kinds[:6] == ["session.updated", "response.created", "output_item.added",
                         "item.added", "item.created", "content_part.added"]
    assert (await echoed()).startswith(AUDIBLE)
    ttfa = running.worker.metrics.registry.get_sample_value(
        "duplex_worker_time_to_first_audio_seconds_count", {"backend": "fake"})
    assert ttfa == 1
    engine = running.worker.engine
    assert engine is not None and engine.free_slots == 1


async def test_a_cancel_stops_the_model_and_nothing_of_the_answer_follows(
        running: Running) -> None:
    """response.cancel during the model's answer: the backend is told to stop that slot's
    response, and no audio of the cancelled response follows its response.done (the engine's
    frames of steps begun before the stop are fenced; the rest of the turn is muted)."""
    opened = await open_session(running.scripts, running.worker.worker_id)
    await append(running, opened.lease, msg.AppendAudio(audio=AUDIBLE * 25))  # 2 s of speech

    async def speaking() -> bool:
        return "audio.delta" in await kinds_of(running, opened.session_id)

    await until(speaking, "the model answering")
    await append(running, opened.lease, msg.CancelResponse())

    async def cancelled() -> bool:
        return "response.done" in await kinds_of(running, opened.session_id)

    await until(cancelled, "the cancelled response.done")

    async def stopped() -> bool:
        return bool(running.backend.stopped)

    await until(stopped, "the backend told to stop")
    await append(running, opened.lease, msg.Heartbeat())  # a marker, long after the cancel

    async def marked() -> bool:
        return "heartbeat_ack" in await kinds_of(running, opened.session_id)

    await until(marked, "the heartbeat answered")
    kinds = await kinds_of(running, opened.session_id)
    after = kinds[kinds.index("response.done") + 1:]
    until_next = after[:after.index("response.created")] if "response.created" in after else after
    assert "audio.delta" not in until_next
    assert running.backend.stopped == [0]


@pytest.mark.logs_errors
async def test_model_failure_closes_its_sessions_and_frees_the_slots(running: Running) -> None:
    """A step that raises ends the batch's sessions with model_error; slots come back."""
    sessions = [await open_session(running.scripts, running.worker.worker_id)
                for _ in range(2)]
    engine = running.worker.engine
    assert engine is not None

    async def adopted() -> bool:
        return engine.free_slots == 0

    await until(adopted, "both sessions adopted")
    running.backend.broken = True

    async def closed() -> bool:
        ends = [(await kinds_of(running, s.session_id))[-1:] for s in sessions]
        return all(end == ["session.closed"] for end in ends)

    await until(closed, "session.closed on both")
    for opened in sessions:
        _, last = (await events_of(running.client, opened.session_id))[-1]
        assert isinstance(last, msg.SessionClosed) and last.reason == "model_error"
    assert engine.free_slots == 2
    used = await running.client.hget(WorkerKeys(running.worker.worker_id).record, "used")
    assert used == b"0"
    running.backend.broken = False
    again = await open_session(running.scripts, running.worker.worker_id)
    await append(running, again.lease, msg.Heartbeat())

    async def acked() -> bool:
        return "heartbeat_ack" in await kinds_of(running, again.session_id)

    await until(acked, "the worker serving again")


async def test_client_close_releases_the_engine_slot(running: Running) -> None:
    """session.close ends the session and its engine slot is free for the next one."""
    opened = await open_session(running.scripts, running.worker.worker_id)
    engine = running.worker.engine
    assert engine is not None
    await append(running, opened.lease, msg.AppendAudio(audio=AUDIBLE), msg.CloseSession())

    async def released() -> bool:
        kinds = await kinds_of(running, opened.session_id)
        return kinds[-1:] == ["session.closed"] and engine.free_slots == 2

    await until(released, "the slot released")
    assert np.isfinite(engine.spec.frame_seconds)


@pytest.mark.logs_errors
async def test_a_malformed_notice_is_dropped_and_the_worker_serves_on(running: Running) -> None:
    """Garbage on the worker's input channel is logged and dropped, not fatal."""
    keys = WorkerKeys(running.worker.worker_id)
    for garbage in ([b"i"], [b"i", b"sess_x", b"not-a-number", []], [b"o"], [None, 1]):
        await spublish(running.client, keys.input_channel, garbage)
    await spublish_raw(running.client, keys.input_channel, b"\xc1")  # not MessagePack
    opened = await open_session(running.scripts, running.worker.worker_id)
    await append(running, opened.lease, msg.Heartbeat())

    async def acked() -> bool:
        return "heartbeat_ack" in await kinds_of(running, opened.session_id)

    await until(acked, "the worker serving after the garbage")


async def test_a_worker_loop_that_dies_stops_the_worker_loudly(redis_client: Redis) -> None:
    """A loop ending on a bug must not leave a worker that heartbeats but serves nothing."""
    settings = WorkerSettings(backend="fake", slots=1, heartbeat_interval_s=0.2,
                              heartbeat_ttl_s=5.0, input_poll_interval_s=0.05)
    worker = Worker(settings, redis_client, backend=FakeBackend(max_slots=1,
                                                                options=FakeOptions()))

    async def broken_poll() -> None:  # the fault: a bug that escapes the poll loop
        raise KeyError("a bug")

    worker._poll_loop = broken_poll  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="ended") as stopped:
        await asyncio.wait_for(worker.run(), 10)
    assert isinstance(stopped.value.__cause__, KeyError)
    assert worker.engine is None


async def test_drain_ends_an_active_response_before_the_session(redis_client: Redis) -> None:
    """A drain that outlasts its deadline lets each runner end its session: the active
    response gets response.done (cancelled), then session.closed worker_shutdown, numbered on
    without a gap: nothing the runner had is dropped."""
    settings = WorkerSettings(backend="fake", slots=1, heartbeat_interval_s=0.2,
                              heartbeat_ttl_s=5.0, drain_timeout_s=0.05)
    worker = Worker(settings, redis_client,
                    backend=FakeBackend(max_slots=1, options=FakeOptions(frame_ms=20)))
    task = asyncio.create_task(worker.run())
    scripts = Scripts(redis_client)

    async def registered() -> bool:
        return bool(await redis_client.exists(WorkerKeys(worker.worker_id).record))

    await until(registered, "registration")
    opened = await open_session(scripts, worker.worker_id)
    # Audio keeps coming (a client mid-turn): the echo's response is open when the drain ends.
    await scripts.append_input(opened.lease, [(None, encode_message(msg.AppendAudio(
        audio=AUDIBLE * 20)))], max_entries=1000)

    async def responding() -> bool:
        events = [e for _, e in await events_of(redis_client, opened.session_id)]
        return any(isinstance(e, msg.AudioDelta) for e in events)

    await until(responding, "a response streaming")
    worker.stop()
    await asyncio.wait_for(task, 10)
    logged = await events_of(redis_client, opened.session_id)
    assert [seq for seq, _ in logged] == list(range(1, len(logged) + 1))
    done, limits, closed = [event for _, event in logged[-3:]]
    assert isinstance(done, msg.ResponseDone)
    assert done.response["status"] == "cancelled"
    assert isinstance(limits, msg.RateLimitsUpdated)
    assert isinstance(closed, msg.SessionClosed) and closed.reason == "worker_shutdown"


async def test_a_session_update_reaches_the_backend_and_the_store(running: Running) -> None:
    """The seed's settings end to end in the worker: the slot's configuration (instructions,
    the decoded voice prompt) reaches the backend, and idle_timeout_s becomes the record's idle
    TTL once session.updated is stored."""
    opened = await open_session(running.scripts, running.worker.worker_id)
    prompt = b"RIFF voice prompt"
    session = {"instructions": "Be brief.", "idle_timeout_s": 42,
               "ref_audio": "data:audio/wav;base64," + base64.b64encode(prompt).decode()}
    await append(running, opened.lease, msg.UpdateSession(session=session),
                 msg.AppendAudio(audio=AUDIBLE))

    def configs() -> list[SlotConfig]:
        return [c for seen in running.backend.slot_configs.values() for c in seen]

    async def configured() -> bool:
        return any(c.ref_audio is not None for c in configs())

    await until(configured, "the voice prompt at the backend")
    [config] = [c for c in configs() if c.ref_audio is not None]
    assert config.ref_audio == VoicePrompt("audio/wav", prompt)
    assert (config.instructions, config.voice) == ("Be brief.", "fake")

    async def stored() -> bool:
        idle = await running.client.hget(SessionKeys(opened.session_id).record, "idle_ms")
        return idle == b"42000"

    await until(stored, "the session's idle TTL in its record")
