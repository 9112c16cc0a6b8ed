"""SIGKILL a gateway or a worker under load and count what the clients see."""

from __future__ import annotations

import asyncio
import signal

import pytest
from redis import Redis
from websockets.exceptions import ConnectionClosed

from duplex_client import DuplexClient, RealtimeEvent
from store.keys import WorkerKeys, worker_of_session
from tests.e2e.helpers import STREAM_SESSION, chunk_index, collect_until, marked_chunk, next_event
from tests.e2e.stack import Stack, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SESSIONS = 4
CHUNKS = 60


async def stream_through_gateway_kill(stack: Stack) -> list[list[RealtimeEvent]]:
    gateway_a, gateway_b = stack.gateway(), stack.gateway()
    stack.worker(slots=SESSIONS)
    clients = [await DuplexClient.connect(gateway_a.ws_url, session=STREAM_SESSION)
               for _ in range(SESSIONS)]
    logs: list[list[RealtimeEvent]] = [[] for _ in clients]
    for client, log in zip(clients, logs, strict=True):
        await collect_until(client, "session.updated", log)

    async def run(n: int, client: DuplexClient, log: list[RealtimeEvent]) -> None:
        for i in range(CHUNKS):
            if i == CHUNKS // 2 and n == 0:
                gateway_a.kill()  # mid-stream, with echoes in flight
            await client.append_audio(marked_chunk(n, i))
            await asyncio.sleep(0.005)  # pacing the sender, not waiting for a condition
        echoes = 0
        while echoes < CHUNKS:
            try:
                event = await next_event(client)
            except (ConnectionClosed, OSError):
                await client.resume(gateway_b.ws_url)
                continue
            log.append(event)
            echoes += event.type == "response.output_audio.delta"

    await asyncio.gather(*(run(n, c, log) for n, (c, log) in enumerate(
        zip(clients, logs, strict=True))))
    for client, log in zip(clients, logs, strict=True):
        assert client.generation == 2, "each session resumed once, on gateway B"
        await client.close()
        await collect_until(client, "session.closed", log)
        await client.aclose()
    return logs


async def test_gateway_sigkill_loses_and_duplicates_nothing(stack: Stack) -> None:
    """Every session resumes on gateway B; both directions exactly once, in order."""
    logs = await stream_through_gateway_kill(stack)
    for n, log in enumerate(logs):
        seqs = [e.server_event_seq for e in log if e.server_event_seq is not None]
        assert seqs == list(range(1, len(seqs) + 1)), f"session {n}: {seqs}"
        echoed = [chunk_index(e.audio) for e in log if e.type == "response.output_audio.delta"]
        assert echoed == list(range(CHUNKS)), f"session {n} upstream loss or duplicate"
        assert log[-1].type == "session.closed"


async def test_worker_sigkill_closes_sessions_worker_lost(stack: Stack) -> None:
    """Each session of a killed worker ends with session.closed worker_lost; slots freed."""
    gateway = stack.gateway()
    worker = stack.worker(slots=2)
    clients = [await DuplexClient.connect(gateway.ws_url, session=STREAM_SESSION)
               for _ in range(2)]
    for client in clients:
        await collect_until(client, "session.updated", [])
    worker.kill()
    for client in clients:
        log: list[RealtimeEvent] = []
        closed = await collect_until(client, "session.closed", log, timeout=20)
        assert closed.data["reason"] == "worker_lost"
        assert [e.type for e in log][-1] == "session.closed"
        await client.aclose()
    assert clients[0].session_id is not None
    record = WorkerKeys(worker_of_session(clients[0].session_id)).record
    redis = Redis.from_url(stack.redis.url)
    wait_for(lambda: redis.hget(record, "used") == b"0", "slots released")
    assert redis.hget(record, "state") == b"lost"
    redis.close()


async def test_gateway_sigterm_closes_1012_and_sessions_survive(stack: Stack) -> None:
    """A draining gateway closes its sockets with 1012; sessions resume elsewhere."""
    gateway_a, gateway_b = stack.gateway(), stack.gateway()
    stack.worker()
    client = await DuplexClient.connect(gateway_a.ws_url, session=STREAM_SESSION)
    log: list[RealtimeEvent] = []
    await collect_until(client, "session.updated", log)
    await client.append_audio(marked_chunk(0, 0))
    await collect_until(client, "response.output_audio.delta", log)
    gateway_a.process.send_signal(signal.SIGTERM)
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            log.append(await asyncio.wait_for(client.recv(), 10))
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
    # uvicorn re-raises the signal after its graceful shutdown; anything else is a crash.
    assert gateway_a.process.wait(timeout=30) in (0, -signal.SIGTERM)
    await client.resume(gateway_b.ws_url)
    await client.append_audio(marked_chunk(0, 1))
    echo = await collect_until(client, "response.output_audio.delta", log)
    assert chunk_index(echo.audio) == 1
    seqs = [e.server_event_seq for e in log if e.server_event_seq is not None]
    assert seqs == list(range(1, len(seqs) + 1))
    await client.aclose()
