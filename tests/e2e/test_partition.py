"""Partitions, not only kills: a gateway or a worker cut off from Redis in a network
namespace while everything else still reaches it (tests/netns.py; root only, skipped with the
reason elsewhere)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from websockets.exceptions import ConnectionClosed

from duplex_client import DuplexClient, RealtimeEvent
from runtime.embedded import EmbeddedServer, start_server
from store.keys import WORKER_DIRECTORY, SessionKeys
from tests.e2e.conftest import FAST_ENV
from tests.e2e.helpers import (
    PUSH_TO_TALK_SESSION,
    STREAM_SESSION,
    chunk_index,
    collect_until,
    marked_chunk,
    next_event,
    stream_in_real_time,
)
from tests.e2e.stack import Proc, Stack
from tests.e2e.test_endpoints import get, metric_value
from tests.netns import Namespace, namespace
from tests.store._support import assert_one_terminal, until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LEASE_S = 1.0
TEN_SECONDS = bytes(480_000)  # 10 s of pcm16 at 24 kHz: the model talks for 10 s
# 1 s: an answer long enough to be cut, in an append small enough for a checkpoint to hold.
ONE_SECOND = bytes(48_000)


@pytest.fixture
def cut_off() -> Iterator[Namespace]:
    """A namespace with two links: one to Redis, one its clients come in by."""
    with namespace(links=2) as made:
        yield made


@pytest.fixture
def reachable_redis(cut_off: Namespace) -> Iterator[EmbeddedServer]:
    """A Redis on loopback and on the host side of the namespace's Redis link."""
    server = start_server("auto", extra_args=["--bind", "127.0.0.1", cut_off.links[0].host])
    yield server
    server.stop()


async def test_a_gateway_cut_off_from_redis_closes_1012_and_its_client_resumes_elsewhere(
        cut_off: Namespace, reachable_redis: EmbeddedServer) -> None:
    """Gateway A runs in a namespace, its client connected to it over one link and Redis
    reached over another. The Redis link goes down (packets vanish, no reset): A lets its
    lease lapse and closes its client 1012 ``lease_lapsed`` although the client still reaches
    it; B's reaper detaches the session; the client resumes through B and every chunk is
    echoed once, in order. Healed, A holds nothing and serves again."""
    redis_link, client_link = cut_off.links
    stack = Stack(redis=reachable_redis, env={**FAST_ENV,
                                              "DUPLEX_GATEWAY_ATTACH_LEASE_S": str(LEASE_S)})
    redis = Redis.from_url(reachable_redis.url)
    try:
        stack.worker()
        b = stack.gateway()
        a = stack.gateway(host=client_link.inside, prefix=cut_off.prefix,
                          redis_url=f"redis://{redis_link.host}:{reachable_redis.port}/0")
        client = await DuplexClient.connect(a.ws_url, session=STREAM_SESSION)
        events: list[RealtimeEvent] = []
        await collect_until(client, "session.updated", events)
        assert client.session_id is not None
        record = SessionKeys(client.session_id).record
        await client.append_audio(marked_chunk(0, 0))
        await collect_until(client, "response.output_audio.delta", events)

        cut_off.cut(redis_link)
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                events.append(await next_event(client))
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
        assert closed.value.rcvd.reason == "lease_lapsed"
        _, metrics = await asyncio.to_thread(get, a.http_url + "/metrics")
        assert metric_value(metrics, "duplex_gateway_lease_lapse_closes_total") == 1

        async def detached() -> bool:
            return await redis.hget(record, "state") == b"detached"

        await until(detached, "B's reaper to detach the cut-off gateway's session", timeout=10)
        resumed = await client.resume(b.ws_url)
        assert resumed.type == "session.resumed"
        await client.append_audio(marked_chunk(0, 1))
        await client.append_audio(marked_chunk(0, 2))
        echoes = [chunk_index(e.audio) for e in events
                  if e.type == "response.output_audio.delta"]
        while len(echoes) < 3:
            event = await next_event(client)
            if event.type == "response.output_audio.delta":
                echoes.append(chunk_index(event.audio))
        assert echoes == [0, 1, 2]

        cut_off.heal(redis_link)
        again = await DuplexClient.connect(a.ws_url, session=STREAM_SESSION)
        await collect_until(again, "session.updated", [])
        await again.aclose()
        await asyncio.wait_for(client.aclose(), 10)
    finally:
        stack.stop()
        await redis.aclose()


async def _on_a_cut_off_worker(
        stack: Stack, cut_off: Namespace, server: EmbeddedServer, redis: Redis,
) -> tuple[Proc, bytes, DuplexClient, list[RealtimeEvent]]:
    """A gateway, a worker in the namespace (reaching Redis over its first link), and a
    push-to-talk session on it: the gateway, the worker's id, the client and its events."""
    gateway = stack.gateway()
    stack.worker(prefix=cut_off.prefix,
                 redis_url=f"redis://{cut_off.links[0].host}:{server.port}/0")
    listed: Any = await redis.zrange(WORKER_DIRECTORY, 0, -1)
    client = await DuplexClient.connect(gateway.ws_url, session=PUSH_TO_TALK_SESSION)
    events: list[RealtimeEvent] = []
    await collect_until(client, "session.updated", events)
    return gateway, listed[0], client, events


async def _cut_while_it_answers(client: DuplexClient, audio: bytes,
                                events: list[RealtimeEvent], cut_off: Namespace) -> None:
    """A turn of ``audio``; once its answer plays, the worker's Redis link goes down."""
    await client.append_audio(audio)
    await client.commit()
    await client.create_response()
    await collect_until(client, "response.output_audio.delta", events)
    cut_off.cut(cut_off.links[0])


@pytest.mark.logs_errors  # the worker's own line: declared lost, it stops writing
async def test_a_worker_cut_off_from_redis_is_declared_lost_and_rejoins_as_another(
        cut_off: Namespace, reachable_redis: EmbeddedServer) -> None:
    """The worker runs in a namespace and its Redis link goes down while its model speaks
    (ten seconds of loopback playback): the gateways' reapers declare it lost and the
    session ends ``worker_lost``, exactly once and last (no other worker to move it to).
    Healed, the worker finds itself fenced: what it generated meanwhile and sends
    once the link is back is refused, so the log still ends with that terminal event, and it
    rejoins under a new id that serves new sessions."""
    redis_link = cut_off.links[0]
    stack = Stack(redis=reachable_redis, env=dict(FAST_ENV))
    redis = Redis.from_url(reachable_redis.url)
    try:
        gateway, first_id, client, events = await _on_a_cut_off_worker(
            stack, cut_off, reachable_redis, redis)
        assert client.session_id is not None
        session_id = client.session_id
        await _cut_while_it_answers(client, TEN_SECONDS, events, cut_off)
        closed = await collect_until(client, "session.closed", events, timeout=20)
        assert closed.data["reason"] == "worker_lost"
        seqs = [e.server_event_seq for e in events if e.server_event_seq is not None]
        assert seqs == list(range(1, len(seqs) + 1))

        cut_off.heal(redis_link)

        async def rejoined() -> bool:
            return any(member != first_id
                       for member in await redis.zrange(WORKER_DIRECTORY, 0, -1))

        await until(rejoined, "the fenced worker to rejoin under a new id", timeout=60)
        await assert_one_terminal(redis, session_id, "session.closed", "worker_lost")
        fresh = await DuplexClient.connect(gateway.ws_url, session=STREAM_SESSION)
        await collect_until(fresh, "session.updated", [])
        await fresh.append_audio(marked_chunk(1, 0))
        echoed = await collect_until(fresh, "response.output_audio.delta", [])
        assert chunk_index(echoed.audio) == 0
        await fresh.aclose()
        await asyncio.wait_for(client.aclose(), 10)
    finally:
        stack.stop()
        await redis.aclose()


@pytest.mark.logs_errors  # the cut-off worker's own line: declared lost, it stops writing
async def test_a_cut_off_worker_s_session_moves_to_the_other_worker_and_talks_on(
        cut_off: Namespace, reachable_redis: EmbeddedServer) -> None:
    """Two workers; the session's, in a namespace, loses its Redis link while its model
    speaks. The reapers declare it lost and re-place the session on the other worker from its
    checkpoint: the answer the cut interrupted ends once (``failed`` ``worker_lost``), the
    session is not closed, and its next turn is answered by the other worker. Healed, the cut
    worker's writes are refused (each event once, in order), and it rejoins under a new id."""
    redis_link = cut_off.links[0]
    stack = Stack(redis=reachable_redis, env=dict(FAST_ENV))
    redis = Redis.from_url(reachable_redis.url)
    try:
        _, cut_id, client, events = await _on_a_cut_off_worker(
            stack, cut_off, reachable_redis, redis)
        stack.worker()
        assert client.session_id is not None
        record = SessionKeys(client.session_id).record
        for index in range(5):  # 100 ms: the least a commit takes
            await client.append_audio(marked_chunk(0, index))
        await client.commit()
        await client.create_response()
        await collect_until(client, "response.done", events)

        async def checkpointed() -> bool:
            return bool(await redis.hexists(record, "ck_core"))

        await until(checkpointed, "a checkpoint after the first answer")
        await _cut_while_it_answers(client, ONE_SECOND, events, cut_off)
        done = await collect_until(client, "response.done", events, timeout=20)
        assert done.data["response"]["status"] == "failed", done.data
        assert done.data["response"]["status_details"]["error"]["code"] == "worker_lost"

        async def moved() -> bool:
            owner = await redis.hget(record, "owner")
            return owner is not None and owner != cut_id

        await until(moved, "the session re-placed on the other worker")
        for index in range(10, 15):
            await client.append_audio(marked_chunk(0, index))
        await client.commit()
        await client.create_response()
        answered = await collect_until(client, "response.done", events, timeout=20)
        assert answered.data["response"]["status"] == "completed"
        played = b"".join(e.audio for e in events[events.index(done) + 1:]
                          if e.type == "response.output_audio.delta")
        assert played == b"".join(marked_chunk(0, index) for index in range(10, 15))

        cut_off.heal(redis_link)

        owner = await redis.hget(record, "owner")

        async def rejoined() -> bool:
            return any(member not in (cut_id, owner)
                       for member in await redis.zrange(WORKER_DIRECTORY, 0, -1))

        await until(rejoined, "the fenced worker to rejoin under a new id", timeout=60)
        await client.heartbeat()
        await collect_until(client, "session.heartbeat_ack", events)
        assert not [e for e in events if e.type in ("session.closed", "session.expired")]
        seqs = [e.server_event_seq for e in events if e.server_event_seq is not None]
        assert seqs == list(range(1, len(seqs) + 1)), "each event once, in order"
        created = [e.response_id for e in events if e.type == "response.created"]
        assert created == [e.response_id for e in events if e.type == "response.done"]
        await asyncio.wait_for(client.aclose(), 10)
    finally:
        stack.stop()
        await redis.aclose()


async def _stream_behind(cut_off: Namespace, redis_server: EmbeddedServer,
                         during: Callable[[], Coroutine[Any, Any, None]] | None = None,
                         ) -> None:
    """A gateway and a worker in the namespace, reaching Redis over its first link; three
    sessions stream 150 chunks each in real time (``during`` runs beside them until they are
    done): every chunk is echoed once, in order, and every session is still attached at the
    end, at the default heartbeat timings."""
    redis_link, client_link = cut_off.links
    redis_url = f"redis://{redis_link.host}:{redis_server.port}/0"
    env = {**FAST_ENV, "DUPLEX_GATEWAY_HEARTBEAT_INTERVAL_S": "1.0",
           "DUPLEX_GATEWAY_HEARTBEAT_TTL_S": "1.5"}
    stack = Stack(redis=redis_server, env=env)
    redis = Redis.from_url(redis_server.url)
    try:
        stack.worker(prefix=cut_off.prefix, redis_url=redis_url)
        gateway = stack.gateway(host=client_link.inside, prefix=cut_off.prefix,
                                redis_url=redis_url)
        clients = [await DuplexClient.connect(gateway.ws_url, session=STREAM_SESSION)
                   for _ in range(3)]
        for client in clients:
            await collect_until(client, "session.updated", [])
        fault = asyncio.create_task(during()) if during is not None else None
        try:
            await stream_in_real_time(clients, 150, spread_s=0.005)
        finally:
            if fault is not None:
                fault.cancel()
                await asyncio.gather(fault, return_exceptions=True)
        for client in clients:
            assert client.session_id is not None
            state: Any = await redis.hget(SessionKeys(client.session_id).record, "state")
            assert state == b"attached"
            await asyncio.wait_for(client.aclose(), 10)
    finally:
        stack.stop()
        await redis.aclose()


async def test_a_flapping_redis_link_under_streaming_loses_nothing(
        cut_off: Namespace, reachable_redis: EmbeddedServer) -> None:
    """Redis's link goes down for 0.15 s every half second while three sessions stream
    (packets lost in bursts, resent late by TCP, the calls delayed): nothing is lost and
    nobody is declared lost."""
    redis_link = cut_off.links[0]

    async def flap() -> None:
        try:
            while True:
                # The fault's own schedule, not a wait for a condition.
                await asyncio.sleep(0.35)
                await asyncio.to_thread(cut_off.cut, redis_link)
                await asyncio.sleep(0.15)
                await asyncio.to_thread(cut_off.heal, redis_link)
        finally:
            cut_off.heal(redis_link)

    await _stream_behind(cut_off, reachable_redis, flap)


#: Redis's link slow and lossy both ways: netem on each end's device delays every packet
#: 5 ms give or take 3 and drops one in 200 (TCP resends it, a retransmission timeout later).
NETEM: list[str] = ["netem", "delay", "5ms", "3ms", "loss", "0.5%"]


async def test_a_delayed_and_lossy_redis_link_under_streaming_loses_nothing(
        cut_off: Namespace, reachable_redis: EmbeddedServer) -> None:
    """Redis's link delays, jitters and drops packets (netem) in both directions while three
    sessions stream: nothing is lost and nobody is declared lost."""
    cut_off.impair(cut_off.links[0], NETEM)
    await _stream_behind(cut_off, reachable_redis)
