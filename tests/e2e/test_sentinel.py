"""A gateway and a worker on ``redis+sentinel://``: a session streams across a failover."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import pytest
from redis import Redis as SyncRedis
from websockets.exceptions import ConnectionClosed

from duplex_client import DuplexClient
from tests.e2e.conftest import FAST_ENV
from tests.e2e.helpers import (
    chunk_index,
    collect_until,
    drain_echoes,
    marked_chunk,
    next_event,
    streaming_session,
)
from tests.e2e.stack import Stack
from tests.sentinel_trio import Trio, start_trio

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture
def sentinel_stack() -> Iterator[tuple[Stack, Trio]]:
    """A stack whose processes reach Redis through a Sentinel (the master serves the checks
    made before any failover)."""
    trio = start_trio("redis")
    # The suite's short heartbeat TTL (1 s) is shorter than a promotion: workers are not
    # declared lost because reapers give them a TTL once Redis is back (gateway/reaper.py).
    stack = Stack(redis=trio.master, env=dict(FAST_ENV), redis_url=trio.url)
    yield stack, trio
    stack.stop()
    trio.stop()


async def test_session_streams_across_a_failover(sentinel_stack: tuple[Stack, Trio]) -> None:
    """Echoes before and after the promotion arrive once each, in order; new sessions open."""
    stack, trio = sentinel_stack
    gateway = stack.gateway()
    stack.worker()
    client, events = await streaming_session(gateway.ws_url, 20)

    await asyncio.to_thread(trio.fail_over)

    for i in range(20, 40):
        await client.append_audio(marked_chunk(0, i))
    await drain_echoes(client, events, 40)
    echoed = [chunk_index(e.audio) for e in events if e.type == "response.output_audio.delta"]
    assert echoed == list(range(40))
    seqs = [e.server_event_seq for e in events if e.server_event_seq is not None]
    assert seqs == list(range(1, len(seqs) + 1))
    async with await DuplexClient.connect(gateway.ws_url) as fresh:
        await collect_until(fresh, "session.updated", [])
    await client.close()
    await collect_until(client, "session.closed", events)
    await client.aclose()


@pytest.mark.logs_errors
async def test_a_lossy_failover_is_never_silent(sentinel_stack: tuple[Stack, Trio]) -> None:
    """The master dies while its replica lags: acknowledged writes are lost. The client is
    told (resync_required log_rewound, then the session ends log_rewound), and never waits on
    a silent gap."""
    stack, trio = sentinel_stack
    gateway = stack.gateway()
    stack.worker()
    client, events = await streaming_session(gateway.ws_url, 10)
    trio.wait_for_replica()

    # The replica stops, and the master drops its link: what follows exists on the master only.
    trio.replica.process.send_signal(signal.SIGSTOP)
    with SyncRedis(port=trio.master.port) as master:
        assert master.execute_command("CLIENT", "KILL", "TYPE", "replica") == 1
    for i in range(10, 30):
        await client.append_audio(marked_chunk(0, i))
    await drain_echoes(client, events, 30)  # acknowledged by the master alone
    trio.master.process.send_signal(signal.SIGKILL)
    trio.replica.process.send_signal(signal.SIGCONT)
    await asyncio.to_thread(trio.wait_for_master, trio.replica.port)

    told = False
    i = 30
    while not told:
        await client.append_audio(marked_chunk(0, i))
        i += 1
        try:
            event = await next_event(client, timeout=10)
        except (ConnectionClosed, TimeoutError) as exc:
            raise AssertionError(f"silent after the failover: {exc!r}") from exc
        events.append(event)
        assert i < 100, f"never told: {[e.type for e in events[-5:]]}"
        told = event.type in ("session.resync_required", "session.closed", "session.expired")
    # The worker saw its input log go back and ended the session; the gateway saw the end
    # arrive under a number it had delivered: resync first, so the client takes it.
    assert (event.type, event.data["reason"]) == ("session.resync_required", "log_rewound")
    closed = await collect_until(client, "session.closed", events)
    assert closed.data["reason"] == "log_rewound"
    await client.aclose()
