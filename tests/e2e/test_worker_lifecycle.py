"""A frame-backend worker's life: SIGKILL, SIGTERM drain, and admission by tick budget.

The workers run ``duplex-gateway worker --backend fake`` (torch-free), so these need no model.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
from redis import Redis

from duplex_client import DuplexClient, DuplexClientError, RealtimeEvent
from store.keys import WORKER_DIRECTORY, WorkerKeys, worker_of_session
from tests.e2e.helpers import collect_until
from tests.e2e.stack import Proc, Stack, wait_for

pytestmark = [pytest.mark.e2e]

HEARTBEAT_S = 0.25
REAPER_S = 0.05
# The defaults' ratio (TTL 1.5 s on a 1 s beat), scaled: the heartbeat lapses at most one TTL
# after the kill, and a reaper runs within REAPER_S of that, so the store closes the session
# within TTL + REAPER_S = 0.425 s < 2 heartbeat periods (DESIGN §5).
TTL_S = 0.375
LIFECYCLE_ENV = {
    "DUPLEX_GATEWAY_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S),
    "DUPLEX_GATEWAY_HEARTBEAT_TTL_S": str(TTL_S),
    "DUPLEX_GATEWAY_REAPER_INTERVAL_S": str(REAPER_S),
}
# Scheduling and delivery on a loaded CI box (process wake-ups, pub/sub, the websocket).
DELIVERY_SLACK_S = 0.35
AUDIBLE = b"\x00\x10" * 960  # 40 ms of a loud square-ish signal, pcm16 24 kHz


def fake_worker(stack: Stack, *, slots: int, options: str = "",
                drain_timeout: float = 30.0) -> Proc:
    """Start ``worker --backend fake`` and wait until it is in the directory."""
    client = Redis.from_url(stack.redis.url)
    before = set(client.zrange(WORKER_DIRECTORY, 0, -1))
    args = ["worker", "--redis-url", stack.redis.url, "--backend", "fake", "--slots", str(slots),
            "--drain-timeout", str(drain_timeout)]
    if options:
        args += ["--backend-options", options]
    proc = stack._spawn("worker", args)
    wait_for(lambda: len(set(client.zrange(WORKER_DIRECTORY, 0, -1)) - before) > 0
             or proc.process.poll() is not None, "worker registration")
    client.close()
    assert proc.process.poll() is None, "worker exited at start"
    return proc


def worker_field(stack: Stack, session_id: str | None, name: str) -> bytes | None:
    """A field of the record of the worker serving ``session_id``."""
    assert session_id is not None
    redis = Redis.from_url(stack.redis.url)
    try:
        value = redis.hget(WorkerKeys(worker_of_session(session_id)).record, name)
    finally:
        redis.close()
    assert value is None or isinstance(value, bytes)
    return value


async def open_session(gateway: Proc) -> DuplexClient:
    """Open a session and wait for its session.updated."""
    client = await DuplexClient.connect(gateway.ws_url)
    await collect_until(client, "session.updated", [])
    return client


async def hear_the_echo(client: DuplexClient) -> list[RealtimeEvent]:
    """Speak 120 ms and collect events up to the first echoed audio delta."""
    for _ in range(3):
        await client.append_audio(AUDIBLE)
    log: list[RealtimeEvent] = []
    await collect_until(client, "response.output_audio.delta", log)
    return log


async def test_sigkill_closes_every_session_worker_lost_within_two_heartbeats(
        stack: Stack) -> None:
    """SIGKILL: each session gets session.closed worker_lost within 2 heartbeat periods."""
    stack.env.update(LIFECYCLE_ENV)
    gateway = stack.gateway()
    worker = fake_worker(stack, slots=3)
    clients = [await open_session(gateway) for _ in range(3)]
    log = await hear_the_echo(clients[0])  # the engine is ticking with sessions on it
    assert [e.type for e in log[:2]] == ["response.created", "response.output_item.added"]
    killed = time.monotonic()
    worker.kill()

    async def closed_after(client: DuplexClient) -> float:
        event = await collect_until(client, "session.closed", [], timeout=10)
        assert event.data["reason"] == "worker_lost"
        return time.monotonic() - killed

    elapsed = await asyncio.gather(*(closed_after(c) for c in clients))
    bound = 2 * HEARTBEAT_S + DELIVERY_SLACK_S
    assert max(elapsed) <= bound, f"closed after {elapsed} s; bound {bound} s"
    session_id = clients[0].session_id
    wait_for(lambda: worker_field(stack, session_id, "used") == b"0", "slots released")
    assert worker_field(stack, session_id, "state") == b"lost"
    for client in clients:
        await client.aclose()


@pytest.mark.timeout(90)
async def test_sigterm_drains_refuses_new_sessions_and_exits_zero(stack: Stack) -> None:
    """SIGTERM: no new placements; sessions finish or end worker_shutdown at the deadline."""
    drain_s = 3.0
    gateway = stack.gateway()
    worker = fake_worker(stack, slots=4, drain_timeout=drain_s)
    finishing, lingering = await open_session(gateway), await open_session(gateway)
    await hear_the_echo(finishing)
    terminated = time.monotonic()
    worker.process.send_signal(signal.SIGTERM)
    wait_for(lambda: worker_field(stack, finishing.session_id, "state") == b"draining",
             "draining state")
    with pytest.raises(DuplexClientError) as refused:
        await DuplexClient.connect(gateway.ws_url)
    assert refused.value.code == "resource_exhausted"
    await hear_the_echo(lingering)  # running sessions are still served while draining
    await finishing.close()
    event = await collect_until(finishing, "session.closed", [])
    assert event.data["reason"] == "client_close"
    event = await collect_until(lingering, "session.closed", [], timeout=drain_s + 10)
    assert event.data["reason"] == "worker_shutdown"
    assert time.monotonic() - terminated >= drain_s - 0.5
    assert worker.process.wait(timeout=20) == 0
    for client in (finishing, lingering):
        await client.aclose()


async def test_slow_ticks_stop_admission_until_the_worker_recovers(stack: Stack) -> None:
    """p99 tick time over budget -> busy (resource_exhausted); idle again -> admits."""
    gateway = stack.gateway()
    fake_worker(stack, slots=4, options="step_ms=120")  # 80 ms frames, 120 ms steps
    slow = await open_session(gateway)
    wait_for(lambda: worker_field(stack, slow.session_id, "state") == b"busy", "busy state")
    with pytest.raises(DuplexClientError) as refused:
        await DuplexClient.connect(gateway.ws_url)
    assert refused.value.code == "resource_exhausted"
    await slow.close()
    await collect_until(slow, "session.closed", [])
    await slow.aclose()
    wait_for(lambda: worker_field(stack, slow.session_id, "state") == b"live", "live state")
    again = await open_session(gateway)
    await again.aclose()
