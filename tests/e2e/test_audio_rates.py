"""Audio at the seed's rates through a real stack, with raw websockets: 16 kHz pcm16 appends
naming their rate are heard for as long as they last, and a session's output rate is the
rate its deltas come in."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import pytest
import websockets
from websockets.asyncio.client import ClientConnection

from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

IN_RATE = 16000
CHUNK_MS = 20
CHUNK_BYTES = IN_RATE * CHUNK_MS // 1000 * 2  # one append: 20 ms of pcm16 at 16 kHz


def session_update(input_rate: int | None, output_rate: int) -> dict[str, Any]:
    """The seed client's session keys (pcm16 at ``input_rate`` in, None: GA's 24 kHz; pcm16 at
    ``output_rate`` out), push to talk: the loopback answers a committed turn with its
    audio."""
    rates = {} if input_rate is None else {"sample_rate_hz": input_rate}
    return {"type": "session.update", "session": {
        "type": "realtime", "input_audio_format": "pcm16", "output_audio_format": "pcm16",
        **rates, "audio": {"input": {**rates, "turn_detection": None},
                           "output": {"sample_rate_hz": output_rate}}}}


async def next_of(ws: ClientConnection, kinds: set[str]) -> dict[str, Any]:
    """The next event of one of ``kinds``, failing on any ``error`` before it."""
    while True:
        event: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert event["type"] != "error", event
        if event["type"] in kinds:
            return event


async def echoed_audio(ws: ClientConnection, question: bytes) -> list[bytes]:
    """Stream ``question`` as the seed client does (20 ms appends, each naming its format and
    rate), commit, ask for a response; the decoded audio deltas of the answer."""
    for offset in range(0, len(question), CHUNK_BYTES):
        chunk = question[offset:offset + CHUNK_BYTES]
        await ws.send(json.dumps({
            "type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode(),
            "format": "pcm16", "sample_rate_hz": IN_RATE, "duration_ms": CHUNK_MS}))
    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    await next_of(ws, {"input_audio_buffer.committed"})
    await ws.send(json.dumps({"type": "response.create"}))
    deltas: list[bytes] = []
    while True:
        event = await next_of(ws, {"response.output_audio.delta", "response.done"})
        if event["type"] == "response.done":
            assert event["response"]["status"] == "completed", event
            return deltas
        deltas.append(base64.b64decode(event["delta"]))


def tone_16k(seconds: float) -> bytes:
    t = np.arange(int(IN_RATE * seconds)) / IN_RATE
    return np.round(0.3 * 32767 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes()


@pytest.mark.parametrize(("input_rate", "output_rate"), [
    (IN_RATE, 24000), (IN_RATE, 22050),
    (None, 24000),  # a 24 kHz session: each append's own rate is what counts
])
async def test_16k_in_is_answered_for_as_long_at_the_sessions_output_rate(
        stack: Stack, input_rate: int | None, output_rate: int) -> None:
    """One second of 16 kHz pcm16 comes back as one second (within one 20 ms chunk) of pcm16
    at the session's output rate, shown as format objects in session.updated."""
    gateway = stack.gateway()
    stack.worker()
    async with websockets.connect(gateway.ws_url + "?model=loopback", max_size=None) as ws:
        await next_of(ws, {"session.created"})
        await ws.send(json.dumps(session_update(input_rate, output_rate)))
        updated = await next_of(ws, {"session.updated"})
        audio = updated["session"]["audio"]
        assert audio["input"]["format"] == {"type": "audio/pcm", "rate": input_rate or 24000}
        assert audio["output"]["format"] == {"type": "audio/pcm", "rate": output_rate}
        deltas = await echoed_audio(ws, tone_16k(1.0))
    assert deltas and all(len(delta) % 2 == 0 for delta in deltas)
    samples = sum(len(delta) for delta in deltas) // 2
    assert abs(samples - output_rate) <= output_rate * CHUNK_MS // 1000
    heard = np.frombuffer(b"".join(deltas), dtype="<i2").astype(np.float64) / 32768
    middle = heard[len(heard) // 4:3 * len(heard) // 4]
    # The same tone: its level, and 440 Hz where the spectrum peaks.
    assert abs(np.sqrt(np.mean(middle ** 2)) - 0.3 / np.sqrt(2)) < 0.01
    peak_hz = np.argmax(np.abs(np.fft.rfft(middle))) * output_rate / len(middle)
    assert abs(peak_hz - 440) < 5
