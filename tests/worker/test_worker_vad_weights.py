"""The worker loads its turn detector's weights at start, on a thread, before it registers
(in process, real Redis).

Loaded by the first session that turns detection on, they came in on the event loop: a cold
onnxruntime import and model load stalled every session's relay there, and on a busy machine
outlasted the heartbeat's slack, so the worker was declared lost.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest
from redis.asyncio import Redis

from inference_worker.settings import WorkerSettings
from inference_worker.turn_detection import silero
from inference_worker.turn_detection.silero import (
    SileroUnavailable,
    SpeechProbabilities,
    shared_model,
)
from inference_worker.weights import WeightsNotFound
from inference_worker.worker import Worker
from store.keys import WORKER_DIRECTORY, WorkerKeys


class Loads:
    """The Silero loads made while it is installed: on which thread, and whether that
    thread was running an event loop."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.on_a_loop: list[bool] = []

    def wrap(self, load: Callable[[], SpeechProbabilities]) -> Callable[[], SpeechProbabilities]:
        def recorded() -> SpeechProbabilities:
            self.threads.append(threading.current_thread())
            try:
                asyncio.get_running_loop()
                self.on_a_loop.append(True)
            except RuntimeError:
                self.on_a_loop.append(False)
            return load()
        return recorded


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Loads]:
    """Record the process's next Silero loads (its cached session is dropped first, so the
    next worker loads it again; the real model is loaded and cached all the same)."""
    seen = Loads()
    shared_model.cache_clear()
    monkeypatch.setattr(silero, "load_vad", seen.wrap(silero.load_vad))
    yield seen
    shared_model.cache_clear()


def settings_with(vad: str) -> WorkerSettings:
    return WorkerSettings(backend="loopback", slots=1, vad=vad, heartbeat_interval_s=0.2,
                          heartbeat_ttl_s=5.0, drain_timeout_s=0.1)


async def serve_until_registered(worker: Worker, client: Redis) -> None:
    """Run ``worker`` until it is listed, then stop it and wait for it to end."""
    task = asyncio.create_task(worker.run())
    while await client.zscore(WORKER_DIRECTORY, worker.worker_id) is None:
        assert not task.done(), f"the worker stopped before registering: {task.exception()!r}"
        await asyncio.sleep(0.01)
    worker.stop()
    await asyncio.wait_for(task, 10)


async def test_silero_is_loaded_on_a_thread_before_the_worker_registers(
        redis_client: Redis, loads: Loads) -> None:
    """vad=silero: one load, on a thread that runs no event loop, done by registration; the
    sessions' detectors then share it."""
    worker = Worker(settings_with("silero"), redis_client)
    await serve_until_registered(worker, redis_client)
    assert len(loads.threads) == 1
    assert loads.threads[0] is not threading.current_thread()
    assert loads.on_a_loop == [False]
    assert shared_model.cache_info().currsize == 1


async def test_the_energy_vad_loads_nothing(redis_client: Redis, loads: Loads) -> None:
    """vad=energy needs no weights: the worker starts without loading Silero."""
    worker = Worker(settings_with("energy"), redis_client)
    await serve_until_registered(worker, redis_client)
    assert loads.threads == []
    assert shared_model.cache_info().currsize == 0


async def test_weights_that_cannot_load_stop_the_start_with_a_named_setting(
        redis_client: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken install (weights missing) stops the worker before it registers, with a
    settings error naming the variable that runs it without Silero."""
    def missing() -> SpeechProbabilities:
        raise WeightsNotFound("silero_vad_v6.onnx is not where faster-whisper keeps it")

    shared_model.cache_clear()
    monkeypatch.setattr(silero, "load_vad", missing)
    worker = Worker(settings_with("silero"), redis_client)
    with pytest.raises(SileroUnavailable,
                       match=r"cannot load the Silero VAD: silero_vad_v6\.onnx .*"
                             r"DUPLEX_GATEWAY_VAD to energy"):
        await asyncio.wait_for(worker.run(), 10)
    assert not await redis_client.exists(WorkerKeys(worker.worker_id).record)
