"""SIGKILL a gateway or a worker under load and count what the clients see."""

from __future__ import annotations

import asyncio
import re
import signal

import pytest
from redis import Redis
from websockets.exceptions import ConnectionClosed

from duplex_client import DuplexClient, RealtimeEvent
from store.keys import GATEWAY_DIRECTORY, WorkerKeys, worker_of_session
from tests.e2e.helpers import STREAM_SESSION, chunk_index, collect_until, marked_chunk, next_event
from tests.e2e.stack import Proc, Stack, http_answer, wait_for

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


def worker_reaps(gateway: Proc) -> int:
    """The gateway's ``duplex_gateway_worker_reaps_total``, from its /metrics."""
    answer = http_answer(gateway.http_url + "/metrics")
    assert answer is not None and answer[0] == 200
    found = re.search(r"^duplex_gateway_worker_reaps_total (\S+)$", answer[1], re.MULTILINE)
    assert found is not None, "the gateway counts its worker reaps"
    return int(float(found.group(1)))


async def test_one_reaper_per_worker_of_three_gateways_still_sees_it_die(stack: Stack) -> None:
    """With REAPERS_PER_WORKER=1, once the three gateways list one another one of them alone
    reaps the worker (the others' counts stand still), and a SIGKILLed worker's sessions,
    opened through another gateway, still end worker_lost."""
    stack.env["DUPLEX_GATEWAY_REAPERS_PER_WORKER"] = "1"
    gateways = [stack.gateway() for _ in range(3)]
    worker = stack.worker(slots=2)
    clients = [await DuplexClient.connect(gateways[0].ws_url, session=STREAM_SESSION)
               for _ in range(2)]
    for client in clients:
        await collect_until(client, "session.updated", [])
    redis = Redis.from_url(stack.redis.url)
    wait_for(lambda: redis.zcard(GATEWAY_DIRECTORY) == 3, "the gateways to list one another")
    counts = [worker_reaps(gateway) for gateway in gateways]
    # A pass that read the list before its last gateway joined may still be running: let
    # every gateway make several more before counting.
    wait_for(lambda: sum(map(worker_reaps, gateways)) >= sum(counts) + 10, "more reaps")
    counts = [worker_reaps(gateway) for gateway in gateways]
    wait_for(lambda: sum(map(worker_reaps, gateways)) >= sum(counts) + 10, "more reaps")
    grew = [worker_reaps(gateway) > count for gateway, count in zip(gateways, counts,
                                                                    strict=True)]
    assert sorted(grew) == [False, False, True], grew
    worker.kill()
    for client in clients:
        closed = await collect_until(client, "session.closed", [], timeout=20)
        assert closed.data["reason"] == "worker_lost"
        await client.aclose()
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
    # Its reaping share goes to the others at once: it left the gateway directory as it
    # stopped, well before its listing would have run out.
    with Redis.from_url(stack.redis.url) as redis:
        assert redis.zcard(GATEWAY_DIRECTORY) == 1, "the stopped gateway unlisted itself"
    await client.resume(gateway_b.ws_url)
    await client.append_audio(marked_chunk(0, 1))
    echo = await collect_until(client, "response.output_audio.delta", log)
    assert chunk_index(echo.audio) == 1
    seqs = [e.server_event_seq for e in log if e.server_event_seq is not None]
    assert seqs == list(range(1, len(seqs) + 1))
    await client.aclose()
