"""Input for a frame backend's worker, which reads its input once per tick itself: the gateway
holds a session's input up to ``PULLED_INPUT_HOLD_S`` (default 40 ms), so each append carries
several 20 ms chunks, and every command still lands once, in order."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest

from duplex_client import DuplexClient
from tests.e2e.helpers import collect_until
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

CHUNKS = 100  # 2 s of 20 ms chunks
CHUNK = b"\x00\x10" * 480  # 20 ms of pcm16 at 24 kHz
HOLD_S = 0.04  # PULLED_INPUT_HOLD_S's default


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    return 0.0


async def test_a_pulling_workers_input_goes_several_chunks_per_append(stack: Stack) -> None:
    """A client streams 2 s of audio in real time to a fake-backend session, then a heartbeat
    whose answer comes after every chunk was appended: all 101 commands appended, in at most
    60 % as many appends (chunks 20 ms apart, each append waiting 40 ms from its oldest). The
    relay histogram leaves the hold out: each observation would be 40 ms or more with it in."""
    gateway = stack.gateway()
    stack.worker(backend="fake", slots=1)
    async with await DuplexClient.connect(gateway.ws_url) as client:
        await collect_until(client, "session.updated", [])
        before = metric(gateway.http_url, 'duplex_gateway_relay_seconds_count{direction="in"}')
        before_s = metric(gateway.http_url, 'duplex_gateway_relay_seconds_sum{direction="in"}')
        start = time.monotonic()
        for i in range(CHUNKS):
            # Real-time pacing is the load itself, not a wait for a condition.
            await asyncio.sleep(max(0.0, start + i * 0.02 - time.monotonic()))
            await client.append_audio(CHUNK)
        await client.heartbeat()
        await collect_until(client, "session.heartbeat_ack", [])
        appended = metric(gateway.http_url, "duplex_gateway_commands_appended_total")
        appends = metric(gateway.http_url,
                         'duplex_gateway_relay_seconds_count{direction="in"}') - before
        relayed_s = metric(gateway.http_url,
                           'duplex_gateway_relay_seconds_sum{direction="in"}') - before_s
    assert appended >= CHUNKS + 1
    assert 0 < appends <= 0.6 * (CHUNKS + 1), f"{appends} appends for {CHUNKS + 1} commands"
    assert relayed_s / appends < HOLD_S, f"{relayed_s / appends:.3f} s per append relayed"
