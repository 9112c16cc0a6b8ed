"""Attachment leases through real processes: a gateway that dies or pauses stops holding its
sessions; they are detached by a reaper elsewhere, then expire or are resumed."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import time
from typing import Any

import pytest
from redis.asyncio import Redis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from duplex_client import DuplexClient, RealtimeEvent
from store.keys import SessionKeys, held_member
from tests.e2e.helpers import (
    PUSH_TO_TALK_SESSION,
    STREAM_SESSION,
    chunk_index,
    collect_until,
    marked_chunk,
    next_event,
)
from tests.e2e.stack import Stack
from tests.store._support import assert_one_terminal, until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LEASE_S = 1.0
GRACE_S = 2.0
TEN_SECONDS = bytes(480_000)  # 10 s of pcm16 at 24 kHz: the model talks for 10 s


async def state_of(redis: Redis, session_id: str) -> list[bytes | None]:
    """The record's state and reason."""
    fields: Any = await redis.hmget(SessionKeys(session_id).record, "state", "reason")
    return list(fields)


async def test_a_killed_gateways_session_is_detached_then_expires_and_frees_its_slot(
    stack: Stack,
) -> None:
    """Gateway A is SIGKILLed while its session's model speaks and the client never comes
    back: the session is detached within 2 lease TTLs (by B's reaper), expires after its
    grace with exactly one terminal event, and its only slot then takes a new session."""
    stack.env["DUPLEX_GATEWAY_ATTACH_LEASE_S"] = str(LEASE_S)
    stack.env["DUPLEX_GATEWAY_DISCONNECT_GRACE_S"] = str(GRACE_S)
    a, b = stack.gateway(), stack.gateway()
    stack.worker(slots=1)
    redis = Redis.from_url(stack.redis.url)
    client = await DuplexClient.connect(a.ws_url, session=PUSH_TO_TALK_SESSION)
    assert client.session_id is not None
    session_id = client.session_id
    await client.append_audio(TEN_SECONDS)
    await client.commit()
    await client.create_response()
    event = await next_event(client)
    while event.type != "response.output_audio.delta":
        event = await next_event(client)
    a.kill()
    killed = time.monotonic()

    async def detached() -> bool:
        return (await state_of(redis, session_id))[0] == b"detached"

    await until(detached, "the session to be detached", timeout=10)
    detach_s = time.monotonic() - killed
    print(f"detached {detach_s:.2f} s after the kill (lease {LEASE_S} s)")
    assert detach_s <= 2 * LEASE_S + 0.5, detach_s  # a lapse, plus one reaper pass and a poll

    async def expired() -> bool:
        return await state_of(redis, session_id) == [b"closed", b"disconnect_grace_expired"]

    await until(expired, "the grace to expire", timeout=10)
    await assert_one_terminal(redis, session_id, "session.expired", "disconnect_grace_expired")
    fresh = await DuplexClient.connect(b.ws_url)  # the worker's one slot is free again
    assert fresh.session_id is not None and fresh.session_id != session_id
    await fresh.aclose()
    await client.drop_connection()
    await redis.aclose()


async def test_a_gateway_paused_past_its_lease_lets_its_client_resume(stack: Stack) -> None:
    """Gateway A is SIGSTOPped past its lease: the session is detached. SIGCONTed, A closes
    1012 on its own clock, before its client sends anything (no renewal was answered for a
    whole lease); the client resumes through B and every chunk is echoed once, in order."""
    stack.env["DUPLEX_GATEWAY_ATTACH_LEASE_S"] = str(LEASE_S)
    a, b = stack.gateway(), stack.gateway()
    stack.worker()
    redis = Redis.from_url(stack.redis.url)
    client = await DuplexClient.connect(a.ws_url, session=STREAM_SESSION)
    events: list[RealtimeEvent] = []
    await collect_until(client, "session.updated", events)
    assert client.session_id is not None
    session_id = client.session_id
    await client.append_audio(marked_chunk(0, 0))
    await collect_until(client, "response.output_audio.delta", events)
    a.process.send_signal(signal.SIGSTOP)
    try:
        async def detached() -> bool:
            return (await state_of(redis, session_id))[0] == b"detached"

        await until(detached, "the paused gateway's session to be detached", timeout=10)
    finally:
        a.process.send_signal(signal.SIGCONT)
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            events.append(await next_event(client))
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
    assert closed.value.rcvd.reason == "lease_lapsed"
    resumed = await client.resume(b.ws_url)
    assert resumed.type == "session.resumed"
    await client.append_audio(marked_chunk(0, 1))
    await client.append_audio(marked_chunk(0, 2))
    echoes = [chunk_index(e.audio) for e in events if e.type == "response.output_audio.delta"]
    while len(echoes) < 3:
        event = await next_event(client)
        if event.type == "response.output_audio.delta":
            echoes.append(chunk_index(event.audio))
    assert echoes == [0, 1, 2]
    await client.aclose()
    await redis.aclose()


async def test_the_sdk_way_of_leaving_keeps_no_lease(stack: Stack) -> None:
    """A connection that ends (cleanly) releases its hold: the gateway renews nothing for a
    worker it serves no session on, and a reaper never detaches a session twice."""
    stack.env["DUPLEX_GATEWAY_ATTACH_LEASE_S"] = str(LEASE_S)
    gateway = stack.gateway()
    stack.worker()
    redis = Redis.from_url(stack.redis.url)
    async with connect(gateway.ws_url + "?model=loopback") as ws:
        created = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert created["type"] == "session.created"
        session_id = created["session_id"]
        await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                  "audio": base64.b64encode(bytes(960)).decode()}))

    async def detached() -> bool:
        return (await state_of(redis, session_id))[0] == b"detached"

    await until(detached, "the clean close to detach the session")
    gateways = SessionKeys(session_id).worker.gateways
    holders: Any = await redis.zrange(gateways, 0, -1)
    holder = holders[0].decode()
    members: Any = await redis.zrange(SessionKeys(session_id).worker.held, 0, -1)
    mine = held_member(holder, "")
    held = {m.decode() for m in members if m.decode().startswith(mine)}
    assert held == set()
    await redis.aclose()
