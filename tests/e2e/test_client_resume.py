"""``DuplexClient.events()`` with real processes: the gateway a session streams through is
SIGKILLed, and the client carries on through the other gateway by itself."""

from __future__ import annotations

import asyncio

import pytest

from duplex_client import DuplexClient, RealtimeEvent, Resumed
from tests.e2e.helpers import STREAM_SESSION, chunk_index, marked_chunk
from tests.e2e.stack import Stack
from tests.gateway.strict import validate_server_event
from tests.store._support import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CHUNKS = 60
ECHO = "response.output_audio.delta"


async def test_events_resume_through_the_other_gateway_after_a_sigkill(stack: Stack) -> None:
    """A stream-mode session on gateway A (the client knows A and B) streams marked chunks;
    A is SIGKILLed halfway with echoes in flight. events() resumes through B without help:
    one Resumed marker, every server_event_seq once, every chunk echoed exactly once, in
    order, and the session's close arrives last."""
    gateway_a, gateway_b = stack.gateway(), stack.gateway()
    stack.worker()
    client = await DuplexClient.connect([gateway_a.ws_url, gateway_b.ws_url],
                                        session=STREAM_SESSION)
    events: list[RealtimeEvent] = []

    def echoes() -> int:
        return sum(e.type == ECHO for e in events)

    async def read() -> None:
        async for event in client.events():
            validate_server_event(event.data)
            events.append(event)

    reader = asyncio.create_task(read())
    await until(lambda: any(e.type == "session.updated" for e in events), "session.updated")
    for i in range(CHUNKS):
        if i == CHUNKS // 2:
            await until(lambda: echoes() > 0, "a first echo through gateway A")
            gateway_a.kill()  # mid-stream: the last chunks' echoes are in flight
        await client.append_audio(marked_chunk(0, i))
        await asyncio.sleep(0.005)  # pacing the sender, not waiting for a condition
    await until(lambda: echoes() >= CHUNKS, "every echo", timeout=30)
    await client.close()
    await asyncio.wait_for(reader, 20)  # events() ends after session.closed

    markers = [e for e in events if isinstance(e, Resumed)]
    seqs = [e.server_event_seq for e in events if e.server_event_seq is not None]
    echoed = [chunk_index(e.audio) for e in events if e.type == ECHO]
    print(f"events={len(events)} numbered={len(seqs)} echoes={len(echoed)} "
          f"resumes={len(markers)} resent_after={[m.last_client_seq for m in markers]}")
    assert len(markers) == 1 and markers[0].url == gateway_b.ws_url, markers
    assert client.generation == 2
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    assert echoed == list(range(CHUNKS)), "an upstream loss or duplicate"
    assert events[-1].type == "session.closed" and client.closed
    await client.aclose()
