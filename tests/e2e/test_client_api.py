"""The seed's session API on ``DuplexClient`` through real processes: typed commands with
``submit``, ``wait_closed`` and the ``async with`` block that closes the session."""

from __future__ import annotations

import asyncio

import pytest

from duplex_client import (
    DuplexClient,
    InputAudioBufferAppendEvent,
    InputAudioBufferCommitEvent,
    RealtimeEvent,
    ResponseCreateEvent,
    SessionCloseEvent,
    SessionUpdateEvent,
)
from tests.e2e.helpers import marked_chunk
from tests.e2e.stack import Stack
from tests.store._support import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

DEADLINE_S = 30.0


async def test_a_turn_through_submit_ends_with_the_block_and_the_reader_gets_the_close(
    stack: Stack,
) -> None:
    """A loopback turn sent with submit() plays the audio back; leaving the block closes the
    session while another task iterates events(): that reader gets session.closed (nothing is
    taken from it) and the block's exit returns once it did."""
    gateway = stack.gateway()
    stack.worker()
    sent = b"".join(marked_chunk(1, index) for index in range(5))
    events: list[RealtimeEvent] = []

    async def read(client: DuplexClient) -> None:
        async for event in client.events():
            events.append(event)

    async with asyncio.timeout(DEADLINE_S):
        async with await DuplexClient.connect(gateway.ws_url) as client:
            reader = asyncio.create_task(read(client))
            await client.submit(SessionUpdateEvent({"type": "realtime", "instructions": "Hi.",
                                               "audio": {"input": {"turn_detection": None}}}))
            await client.submit(InputAudioBufferAppendEvent(sent))
            await client.submit(InputAudioBufferCommitEvent())
            await client.submit(ResponseCreateEvent())
            await until(lambda: any(e.type == "response.done" for e in events),
                        "response.done")
        await reader
    played = b"".join(e.audio for e in events if e.type == "response.output_audio.delta")
    assert played == sent
    assert events[-1].type == "session.closed" and client.close_reason == "client_close"
    assert client.session["instructions"] == "Hi."
    assert client.capabilities["supports_barge_in"] is True
    assert client.capabilities["chunk_period_ms"] == 40  # the loopback's 40 ms chunks


async def test_wait_closed_reads_by_itself_and_returns_the_reason(stack: Stack) -> None:
    """With no one reading, wait_closed() reads up to the terminal event and returns the
    reason the close was sent with."""
    gateway = stack.gateway()
    stack.worker()
    client = await DuplexClient.connect(gateway.ws_url)
    await client.submit(SessionCloseEvent("all done"))
    assert await client.wait_closed(timeout=DEADLINE_S) == "all done"
    await client.detach()
