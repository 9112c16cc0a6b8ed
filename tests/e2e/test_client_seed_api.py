"""``DuplexClient`` used as the seed's handle is, through real processes (a gateway and a
loopback worker): typed events, ``close()`` that waits for ``session.closed``,
``session_closed`` after the end, and the resume constructor taking a session over from
``(session_id, resume_token)`` alone."""

from __future__ import annotations

import asyncio

import pytest

from duplex_client import (
    AudioDelta,
    DuplexClient,
    RealtimeEvent,
    ResponseCreated,
    ResponseDone,
    ResumeRefused,
    SessionClosed,
    SessionClosedError,
)
from tests.e2e.helpers import PUSH_TO_TALK_SESSION, marked_chunk
from tests.e2e.stack import Stack
from tests.gateway.strict import validate_server_event

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

DEADLINE_S = 30.0
CHUNKS = 10


async def test_a_turn_read_by_type_then_close_inside_the_loop(stack: Stack) -> None:
    """A loopback turn read with isinstance: the answer's AudioDelta events play the question
    back; close() called inside the events() loop at ResponseDone returns once session.closed
    came, the loop then reads on to it and ends; every event is GA-valid; a second close()
    does nothing; a command after the end raises session_closed."""
    gateway = stack.gateway()
    stack.worker()
    sent = b"".join(marked_chunk(1, index) for index in range(CHUNKS))
    events: list[RealtimeEvent] = []
    reasons: list[str | None] = []
    async with asyncio.timeout(DEADLINE_S):
        client = await DuplexClient.connect(gateway.ws_url, session=PUSH_TO_TALK_SESSION)
        await client.append_audio(sent, format="audio/pcm", sample_rate_hz=24000)
        await client.commit()
        await client.create_response()
        async for event in client.events():
            validate_server_event(event.data)
            events.append(event)
            if isinstance(event, ResponseDone):
                reasons.append(await client.close())
        assert await client.close() == "client_close"
    await client.detach()
    played = b"".join(e.audio for e in events if isinstance(e, AudioDelta))
    assert played == sent
    created = next(e for e in events if isinstance(e, ResponseCreated))
    done = next(e for e in events if isinstance(e, ResponseDone))
    assert created.response_id == done.response_id is not None and done.status == "completed"
    assert all(e.response_id == done.response_id for e in events if isinstance(e, AudioDelta))
    assert reasons == ["client_close"] and isinstance(events[-1], SessionClosed)
    assert client.closed and client.close_reason == "client_close"
    with pytest.raises(SessionClosedError) as after:
        await client.append_audio(marked_chunk(1, 0))
    assert after.value.code == "session_closed"


async def test_close_then_recv_hands_out_what_close_read(stack: Stack) -> None:
    """With no one reading, close() reads up to session.closed itself and keeps what it read:
    recv() hands those events out next, session.closed last."""
    gateway = stack.gateway()
    stack.worker()
    async with asyncio.timeout(DEADLINE_S):
        client = await DuplexClient.connect(gateway.ws_url)
        assert await client.close("all done") == "all done"
        held = [await client.recv()]
        while not isinstance(held[-1], SessionClosed):
            held.append(await client.recv())
    await client.detach()
    assert held[0].type == "session.updated"  # the opening's, read by close()
    seqs = [e.server_event_seq for e in held]
    assert seqs == list(range(1, len(held) + 1))


async def test_resume_session_takes_a_session_over_from_its_id_and_token(stack: Stack) -> None:
    """Client A starts an answer and loses its connection at the first audio; a new client,
    given only A's session_id, resume_token and position, resumes it: the rest of the answer
    arrives once, in order, the two halves are the question, and A's token is void after."""
    gateway = stack.gateway()
    stack.worker()
    sent = b"".join(marked_chunk(2, index) for index in range(CHUNKS))
    first: list[RealtimeEvent] = []
    async with asyncio.timeout(DEADLINE_S):
        a = await DuplexClient.connect(gateway.ws_url, session=PUSH_TO_TALK_SESSION)
        await a.append_audio(sent)
        await a.commit()
        await a.create_response()
        async for event in a.events():
            first.append(event)
            if isinstance(event, AudioDelta):
                await a.drop_connection()  # as a lost network would
                break
        assert a.session_id is not None and a.resume_token is not None
        b = await DuplexClient.resume_session(
            gateway.ws_url, session_id=a.session_id, resume_token=a.resume_token,
            last_received_server_event_seq=a.last_seq)
        rest: list[RealtimeEvent] = []
        async for event in b.events():
            validate_server_event(event.data)
            rest.append(event)
            if isinstance(event, ResponseDone):
                break
        assert b.generation == 2
        with pytest.raises(ResumeRefused) as void:
            await a.resume()
        assert await b.close() == "client_close"
    await b.detach()
    assert void.value.code == "invalid_resume_token"
    played = b"".join(e.audio for e in [*first, *rest] if isinstance(e, AudioDelta))
    assert played == sent
    seqs = [e.server_event_seq for e in [*first, *rest] if e.server_event_seq is not None]
    assert seqs == list(range(1, len(seqs) + 1))


async def test_the_duplex_dialect_opens_resumes_and_closes(stack: Stack) -> None:
    """dialect="duplex" dials ?duplex=1&autostart=0, opens with its own session.update, and
    reads the answer in whichever shape the gateway gives it (the GA one, or the seed's once
    the gateway speaks that dialect): the id, the token, the generation, the capabilities;
    a resume moves the generation on; close() ends the session."""
    gateway = stack.gateway()
    stack.worker()
    async with asyncio.timeout(DEADLINE_S):
        client = await DuplexClient.connect(gateway.ws_url, dialect="duplex")
        assert client.session_id and client.resume_token and client.generation == 1
        assert client.capabilities.get("supports_session_resume") is True
        await client.drop_connection()
        await client.resume()
        assert client.generation == 2
        await client.heartbeat()
        assert await client.close() == "client_close"
    await client.detach()
