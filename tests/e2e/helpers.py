"""Helpers shared by the end-to-end tests: audio with markers, strict event collection."""

from __future__ import annotations

import asyncio
import base64
import struct
import time

from duplex_client import DuplexClient, RealtimeEvent
from tests.gateway.strict import validate_server_event

#: ``turn_detection: null``: the client commits and creates responses itself. A new session
#: starts with OpenAI's server_vad, which would take loud appended audio for turns of its own.
PUSH_TO_TALK_SESSION = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
#: The loopback echoing every chunk at once (stream mode takes no turn detection).
STREAM_SESSION = {**PUSH_TO_TALK_SESSION, "extra_body": {"loopback_mode": "stream"}}
CHUNK_BYTES = 960  # 20 ms of pcm16 at 24 kHz


def marked_chunk(session: int, index: int) -> bytes:
    """20 ms of audio whose first bytes name its session and index (to match echoes)."""
    head = struct.pack("<II", session, index)
    return head + bytes(CHUNK_BYTES - len(head))


def chunk_index(audio: bytes) -> int:
    """The index :func:`marked_chunk` wrote."""
    return int(struct.unpack_from("<I", audio, 4)[0])


async def next_event(client: DuplexClient, timeout: float = 10.0) -> RealtimeEvent:
    """The next event, strictly validated against the SDK's types (or our extensions)."""
    event = await asyncio.wait_for(client.recv(), timeout)
    validate_server_event(event.data)
    return event


async def collect_until(client: DuplexClient, stop: str, sink: list[RealtimeEvent],
                        timeout: float = 10.0) -> RealtimeEvent:
    """Append events to ``sink`` until one of type ``stop`` arrives; returns it."""
    while True:
        event = await next_event(client, timeout)
        sink.append(event)
        if event.type == stop:
            return event


async def drain_echoes(client: DuplexClient, sink: list[RealtimeEvent], want: int) -> None:
    """Read events until ``want`` audio echoes in total were received."""
    while sum(e.type == "response.output_audio.delta" for e in sink) < want:
        sink.append(await next_event(client))


async def streaming_session(url: str, chunks: int) -> tuple[DuplexClient, list[RealtimeEvent]]:
    """A stream-mode session on the gateway at ``url`` that echoed ``chunks`` marked chunks;
    the client and every event so far."""
    client = await DuplexClient.connect(url, session=STREAM_SESSION)
    events: list[RealtimeEvent] = []
    await collect_until(client, "session.updated", events)
    for i in range(chunks):
        await client.append_audio(marked_chunk(0, i))
    await drain_echoes(client, events, chunks)
    return client, events


async def spoken_answer(client: DuplexClient, audio: bytes, sink: list[RealtimeEvent], *,
                        chunk_bytes: int = 4800, timeout: float = 60.0) -> bytes:
    """Stream ``audio`` (pcm16 24 kHz) in appends of ``chunk_bytes`` (100 ms), then read
    until the answer's ``response.done``, which must be completed; the answer's audio. Every
    event read is added to ``sink``."""
    for start in range(0, len(audio), chunk_bytes):
        await client.append_audio(audio[start:start + chunk_bytes])
    answer = bytearray()
    while True:
        event = await next_event(client, timeout=timeout)
        sink.append(event)
        if event.type == "response.output_audio.delta":
            answer += base64.b64decode(event.data["delta"])
        if event.type == "response.done":
            assert event.data["response"]["status"] == "completed", event.data
            return bytes(answer)


async def stream_in_real_time(clients: list[DuplexClient], chunks: int, *,
                              spread_s: float) -> None:
    """Each client streams ``chunks`` marked 20 ms chunks on a real-time clock, client ``n``
    starting ``n * spread_s`` after the first, and reads every echo: each must come once, in
    order."""
    chunk_s = CHUNK_BYTES / 2 / 24_000

    async def stream(n: int, client: DuplexClient, start: float) -> None:
        for i in range(chunks):
            # Real-time pacing is the load itself, not a wait for a condition.
            await asyncio.sleep(max(0.0, start + i * chunk_s - time.monotonic()))
            await client.append_audio(marked_chunk(n, i))

    async def read_echoes(client: DuplexClient) -> list[int]:
        echoed: list[int] = []
        while len(echoed) < chunks:
            event: RealtimeEvent = await next_event(client)
            if event.type == "response.output_audio.delta":
                echoed.append(chunk_index(event.audio))
        return echoed

    start = time.monotonic() + 0.1
    readers = [asyncio.create_task(read_echoes(client)) for client in clients]
    await asyncio.gather(*(stream(n, client, start + n * spread_s)
                           for n, client in enumerate(clients)))
    for echoed in await asyncio.gather(*readers):
        assert echoed == list(range(chunks)), "every chunk echoed once, in order"


def assert_once_in_order(log: list[RealtimeEvent], responses: int | None = None) -> None:
    """Each numbered event of ``log`` once and in order (no gap, no repeat), and each response
    created there ended once, in the order they began (``responses``: how many, if known)."""
    seqs = [e.server_event_seq for e in log if e.server_event_seq is not None]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "each event once, in order"
    created = [e.response_id for e in log if e.type == "response.created"]
    done = [e.response_id for e in log if e.type == "response.done"]
    assert created == done and len(done) == len(set(done)), "every response ends once"
    if responses is not None:
        assert len(done) == responses, f"{len(done)} responses, not {responses}"
