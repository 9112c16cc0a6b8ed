"""Resume as the official openai SDK and real clients do it, through any gateway.

The SDK connects every time with ``?model=NAME``, so the gateway opens a session for the URL at
once; a ``session.resume`` as the client's first event gives that one up and resumes. A resume
whose answer was lost is retried through the other gateway with the same ``control_id``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from typing import Any

import pytest
from openai import AsyncOpenAI
from redis.asyncio import Redis
from websockets.asyncio.client import ClientConnection, connect

from duplex_client import DuplexClient
from store.keys import SessionKeys, WorkerKeys, worker_of_session
from tests.e2e.helpers import STREAM_SESSION, collect_until, next_event
from tests.e2e.stack import Proc, Stack
from tests.gateway.strict import validate_server_event
from tests.store._support import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PCM = bytes(range(256)) * 75  # 0.4 s of audio: played back over several deltas


def sdk(gateway: Proc) -> AsyncOpenAI:
    """The official client, pointed at ``gateway``."""
    return AsyncOpenAI(api_key="sk-test", base_url=gateway.http_url + "/v1",
                       websocket_base_url=gateway.ws_url.removesuffix("/realtime"),
                       max_retries=0)


async def recv_json(conn: Any) -> dict[str, Any]:
    """The next server event of an SDK connection, as JSON, strictly validated."""
    data: dict[str, Any] = json.loads(await asyncio.wait_for(conn.recv_bytes(), 10))
    validate_server_event(data)
    return data


async def used_slots(redis: Redis, session_id: str) -> int:
    """Slots held on the worker that serves ``session_id``."""
    used = await redis.hget(WorkerKeys(worker_of_session(session_id)).record, "used")
    return int(used or 0)


async def test_the_sdk_resumes_through_another_gateway_with_session_resume(stack: Stack) -> None:
    """Open with the SDK on gateway A, leave mid-response, resume through another SDK
    connection on gateway B: every event after the last one seen arrives once, in order, the
    audio is what was sent, and B's own URL session is given up (no slot held for it)."""
    a, b = stack.gateway(), stack.gateway()
    stack.worker()
    redis = Redis.from_url(stack.redis.url)
    audio = bytearray()
    seqs: list[int] = []
    async with sdk(a) as client_a, client_a.realtime.connect(model="loopback") as conn:
        created = await recv_json(conn)
        assert created["type"] == "session.created"
        session_id, token = created["session_id"], created["resume_token"]
        await conn.input_audio_buffer.append(audio=base64.b64encode(PCM).decode())
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        while not audio:
            event = await recv_json(conn)
            if "server_event_seq" in event:
                seqs.append(event["server_event_seq"])
            if event["type"] == "response.output_audio.delta":
                audio += base64.b64decode(event["delta"])
        # Leave mid-response: the SDK closes the socket (no session.close).
    assert len(audio) < len(PCM)
    async with sdk(b) as client_b, client_b.realtime.connect(model="loopback") as conn:
        url_session = await recv_json(conn)
        assert url_session["type"] == "session.created"
        assert url_session["session_id"] != session_id
        # Our extension, sent as the SDK sends any event; its types know only OpenAI's.
        resume: Any = {"type": "session.resume", "session_id": session_id,
                       "resume_token": token, "last_received_server_event_seq": seqs[-1],
                       "control_id": "sdk-reconnect-1"}
        await conn.send(resume)
        resumed = await recv_json(conn)
        assert resumed["type"] == "session.resumed", resumed
        assert resumed["session_id"] == session_id and resumed["replay_from"] == seqs[-1] + 1
        while True:
            event = await recv_json(conn)
            seqs.append(event["server_event_seq"])
            if event["type"] == "response.output_audio.delta":
                audio += base64.b64decode(event["delta"])
            if event["type"] == "response.done":
                assert event["response"]["status"] == "completed"
                break
        assert seqs == list(range(seqs[0], seqs[-1] + 1)), seqs
        assert bytes(audio) == PCM
        given_up = SessionKeys(url_session["session_id"]).record
        assert await redis.hmget(given_up, "state", "reason") == [b"closed", b"open_abandoned"]
        # One session holds one slot: the resumed one. B's URL session gave its slot back.
        assert await used_slots(redis, session_id) == 1
    await redis.aclose()


async def resume_frame(session_id: str, token: str, control_id: str, last: int) -> str:
    """A ``session.resume`` frame."""
    return json.dumps({"type": "session.resume", "session_id": session_id,
                       "resume_token": token, "last_received_server_event_seq": last,
                       "control_id": control_id})


async def answer_of(ws: ClientConnection) -> dict[str, Any]:
    """The first answer of a connection."""
    data: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 10))
    return data


async def test_a_resume_whose_answer_was_lost_is_retried_through_the_other_gateway(
    stack: Stack,
) -> None:
    """100 resumes whose answer never reaches the client (half read and dropped, so surely
    landed; half cut off right after sending, landed or not) are each retried through the
    other gateway with the same control_id and the token they presented: every retry gets
    session.resumed (the same token as the lost answer, when it is known), 0 sessions lost,
    and the session still answers at the end."""
    a, b = stack.gateway(), stack.gateway()
    stack.worker()
    client = await DuplexClient.connect(a.ws_url, session=STREAM_SESSION)
    await collect_until(client, "session.updated", [])
    assert client.session_id is not None and client.resume_token is not None
    session_id, token = client.session_id, client.resume_token
    await client.drop_connection()
    succeeded = same_token = 0
    for attempt in range(100):
        first, retry = (b, a) if attempt % 2 else (a, b)
        control_id = secrets.token_hex(8)
        frame = await resume_frame(session_id, token, control_id, 0)
        lost_token = None
        async with connect(first.ws_url) as ws:
            await ws.send(frame)
            if attempt % 4 < 2:  # the answer comes, and is lost on the way to the client
                lost = await answer_of(ws)
                assert lost["type"] == "session.resumed", lost
                lost_token = lost["resume_token"]
            ws.transport.abort()
        async with connect(retry.ws_url) as ws:
            await ws.send(frame)
            answer = await answer_of(ws)
            assert answer["type"] == "session.resumed", (attempt, answer)
            succeeded += 1
            if lost_token is not None:
                assert answer["resume_token"] == lost_token
                same_token += 1
            token = answer["resume_token"]
    assert (succeeded, same_token) == (100, 50)
    client.resume_token = token
    await client.resume(b.ws_url)
    await client.heartbeat()
    event = await next_event(client)
    while event.type != "session.heartbeat_ack":
        assert event.type != "session.closed", event
        event = await next_event(client)
    await client.aclose()


async def test_another_control_id_with_the_old_token_is_refused(stack: Stack) -> None:
    """The old token is void after a resume, but for a retry of that very resume."""
    gateway = stack.gateway()
    stack.worker()
    client = await DuplexClient.connect(gateway.ws_url)
    assert client.session_id is not None and client.resume_token is not None
    old = client.resume_token
    await client.drop_connection()
    async with connect(gateway.ws_url) as ws:
        await ws.send(await resume_frame(client.session_id, old, "first", 0))
        assert (await answer_of(ws))["type"] == "session.resumed"
    async with connect(gateway.ws_url) as ws:
        await ws.send(await resume_frame(client.session_id, old, "another", 0))
        answer = await answer_of(ws)
        assert answer["error"]["code"] == "invalid_resume_token"

    async def detached() -> bool:
        redis = Redis.from_url(stack.redis.url)
        try:
            state = await redis.hget(SessionKeys(client.session_id or "").record, "state")
        finally:
            await redis.aclose()
        return bool(state == b"detached")

    await until(detached, "the session to be detached again")
