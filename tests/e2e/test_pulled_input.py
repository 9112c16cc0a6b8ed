"""Input for a frame backend's worker, which reads its input once per tick itself: the gateway
holds a session's input until it completes a model frame (``gateway/input_frames.py``), so
each append carries a frame of 20 ms chunks, and every command still lands once, in order."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest

from duplex_client import DuplexClient, RealtimeEvent
from tests.e2e.helpers import collect_until
from tests.e2e.stack import Stack
from tests.store._support import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

CHUNKS = 100  # 2 s of 20 ms chunks
CHUNK = b"\x00\x10" * 480  # 20 ms of pcm16 at 24 kHz
#: The fake backend's frame (its chunk_period_ms): four chunks.
FRAME_CHUNKS = 4
#: Well under any hold: the relay histogram's time per append, which leaves the hold out.
RELAY_S = 0.04


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    return 0.0


async def test_a_pulling_workers_input_goes_a_frame_per_append(stack: Stack) -> None:
    """A client streams 2 s of audio in real time to a fake-backend session (80 ms frames),
    then a heartbeat whose answer comes after every chunk was appended: all 101 commands
    appended, about one append per frame (four chunks), the heartbeat its own: at most 30 %
    as many appends as commands (a hold that ended before the frame did, 40 ms from the
    oldest, made 34). The relay histogram leaves the hold out: each observation would be
    60 ms or more with it in."""
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
    frames = CHUNKS // FRAME_CHUNKS
    assert 0 < appends <= 0.3 * (CHUNKS + 1), f"{appends} appends for {frames} frames"
    assert relayed_s / appends < RELAY_S, f"{relayed_s / appends:.3f} s per append relayed"


SIGKILL_CHUNKS = 60


async def test_a_gateway_sigkill_loses_and_duplicates_no_pulled_input(stack: Stack) -> None:
    """A fake-backend session (echo: the worker speaks back what it heard) streams distinct
    20 ms chunks through gateway A in real time, its input going as packed plain appends; A
    is SIGKILLed halfway with appends and echoes in flight. The client resumes through B by
    itself and resends what the store had not taken (the resume reads the highest client seq
    from a packed entry): the audio that comes back is every chunk exactly once, in order."""
    gateway_a, gateway_b = stack.gateway(), stack.gateway()
    stack.worker(backend="fake", slots=1)
    client = await DuplexClient.connect([gateway_a.ws_url, gateway_b.ws_url])
    chunks = [bytes([1 + n % 250, 0x20]) * 480 for n in range(SIGKILL_CHUNKS)]
    audio = bytearray()
    events: list[RealtimeEvent] = []

    async def read() -> None:
        async for event in client.events():
            events.append(event)
            if event.type == "response.output_audio.delta":
                audio.extend(event.audio)

    def heard() -> bytes:
        """The echo without the silence a frame model speaks while it hears none."""
        samples = memoryview(bytes(audio)).cast("H")
        return b"".join(sample.to_bytes(2, "little") for sample in samples if sample)

    reader = asyncio.create_task(read())
    await until(lambda: any(e.type == "session.updated" for e in events), "session.updated")
    start = time.monotonic()
    for i, chunk in enumerate(chunks):
        if i == SIGKILL_CHUNKS // 2:
            await until(lambda: len(heard()) > 0, "a first echo through gateway A")
            gateway_a.kill()  # mid-stream: appends held and echoes in flight
        # Real-time pacing is the load itself, not a wait for a condition.
        await asyncio.sleep(max(0.0, start + i * 0.02 - time.monotonic()))
        await client.append_audio(chunk)
    expected = b"".join(chunks)
    await until(lambda: len(heard()) >= len(expected), "every chunk echoed", timeout=30)
    await client.close()
    await asyncio.wait_for(reader, 20)
    assert client.generation == 2, "the session resumed once, on gateway B"
    assert heard() == expected, "an upstream loss, duplicate or reordering"
    await client.aclose()
