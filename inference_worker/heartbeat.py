"""One heartbeat of a worker: what it publishes of itself each beat (and at registration),
and the capacity gauges that go with it."""

from __future__ import annotations

from inference_worker.engine import Engine
from inference_worker.metrics import WorkerMetrics
from inference_worker.settings import WorkerSettings
from store import Scripts
from store.census import NO_ENGINE, TickTime
from store.client import RedisClient
from store.directory import WorkerProfile, announce_worker

__all__ = ["beat"]


async def beat(scripts: Scripts, client: RedisClient, metrics: WorkerMetrics,
               settings: WorkerSettings, worker_id: str, *, capacity: int, admit: bool,
               draining: bool, profile: WorkerProfile | None, engine: Engine | None,
               sessions: int, register: bool) -> None:
    """Register or renew ``worker_id`` (``admit``: a slot is free and the tick time is within
    budget; ``sessions``: how many it serves) and list it in the directory until its
    heartbeat lapses.

    Raises:
        WorkerFenced: it was declared lost.
        StoreError: Redis failed.
    """
    admitting = admit and not draining
    metrics.admitting.set(int(admitting))
    metrics.slots.set(capacity)
    metrics.free_slots.set(max(0, capacity - sessions) if admitting else 0)
    answer = await scripts.worker_heartbeat(
        worker_id, slots=capacity, ttl_ms=int(settings.heartbeat_ttl_s * 1000),
        register=register, drain=draining, admit=admit, profile=profile,
        backend=settings.backend, tick=_tick_time(engine), models=settings.models)
    await announce_worker(client, worker_id, answer.alive_until_ms)


def _tick_time(engine: Engine | None) -> TickTime:
    """What the heartbeat tells operators of the engine's tick time (``status``)."""
    if engine is None:
        return NO_ENGINE
    p99 = engine.tick_p99()
    return TickTime(engine=True, p99_ms=None if p99 is None else p99 * 1000)
