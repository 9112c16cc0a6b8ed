"""Tenants and limits through real gateways and workers: no tenant touches another's session, a
session.close is never lost, places are released when sessions end, limits hold per connection
and per tenant while other sessions stream on."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from redis.asyncio import Redis
from websockets.exceptions import ConnectionClosed

from duplex_client import DuplexClient, DuplexClientError
from gateway.auth import tenant_of_key
from store.keys import SessionKeys, tenant_sessions
from tests.e2e.helpers import (
    STREAM_SESSION,
    chunk_index,
    collect_until,
    marked_chunk,
    next_event,
    streaming_session,
)
from tests.e2e.stack import Stack
from tests.store._support import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

K1, K2 = "key-one", "key-two"



async def test_another_tenant_cannot_resume_close_or_ack_a_session(stack: Stack) -> None:
    """k2 holding k1's session id and token is refused as if the session did not exist
    (session_resume_expired, close 1008); its close and ack frames reach nothing; k1 resumes
    with its token afterwards and the session is as it was."""
    stack.env["DUPLEX_GATEWAY_API_KEYS"] = f"{K1},{K2}"
    url = stack.gateway().ws_url
    stack.worker()
    owner = await DuplexClient.connect(url, session=STREAM_SESSION, api_key=K1)
    await collect_until(owner, "session.updated", [])
    intruder = DuplexClient(url, api_key=K2)
    intruder.session_id, intruder.resume_token = owner.session_id, owner.resume_token
    with pytest.raises(DuplexClientError) as refused:
        await intruder.resume()
    assert refused.value.code == "session_resume_expired"
    # The same answer as for a session that never existed: no oracle.
    stranger = DuplexClient(url, api_key=K2)
    assert owner.session_id is not None
    stranger.session_id = owner.session_id[:-4] + "0000"
    stranger.resume_token = "whatever"
    with pytest.raises(DuplexClientError) as unknown:
        await stranger.resume()
    assert unknown.value.code == refused.value.code
    # A resume with close and ack right behind it, before any answer: nothing gets through.
    raw = DuplexClient(url, api_key=K2)
    raw._ws = await raw._dial()
    await raw.send_raw(json.dumps({"type": "session.resume", "session_id": owner.session_id,
                                   "resume_token": owner.resume_token}))
    await raw.send_raw(json.dumps({"type": "session.close"}))
    await raw.send_raw(json.dumps({"type": "session.event_ack", "server_event_seq": 1}))
    answer = json.loads(await asyncio.wait_for(raw._ws.recv(), 10))
    assert answer["error"]["code"] == "session_resume_expired"
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await asyncio.wait_for(raw._ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    for client in (intruder, stranger, raw):
        await client.aclose()
    resumed = await owner.resume()
    assert resumed.type == "session.resumed"
    await owner.heartbeat()
    event = await next_event(owner)
    while event.type != "session.heartbeat_ack":
        assert event.type != "session.closed", event
        event = await next_event(owner)
    await owner.close()
    await collect_until(owner, "session.closed", [])
    await owner.aclose()


async def test_close_then_socket_close_ends_every_session_and_frees_every_place(
    stack: Stack,
) -> None:
    """session.close followed at once by an aborted socket, 100 times: 100 sessions end with
    client_close (not after the grace), and no tenant place is left held."""
    stack.env["DUPLEX_GATEWAY_API_KEYS"] = K1
    stack.env["DUPLEX_GATEWAY_TENANT_MAX_SESSIONS"] = "100"
    url = stack.gateway().ws_url
    stack.worker(slots=32)
    redis = Redis.from_url(stack.redis.url)
    session_ids: list[str] = []
    try:
        while len(session_ids) < 100:
            try:
                client = await DuplexClient.connect(url, api_key=K1)
            except DuplexClientError as exc:  # all 32 slots busy closing: try again
                assert exc.code == "resource_exhausted", exc
                await asyncio.sleep(0.02)
                continue
            assert client.session_id is not None
            session_ids.append(client.session_id)
            await client.close()
            await client.drop_connection()

        async def all_closed() -> bool:
            for sid in session_ids:
                fields = await redis.hmget(SessionKeys(sid).record, "state", "reason")
                if fields != [b"closed", b"client_close"]:
                    return False
            return True

        await until(all_closed, "every session to end client_close")

        async def no_place_held() -> bool:
            return await redis.zcard(tenant_sessions(tenant_of_key(K1))) == 0

        await until(no_place_held, "the tenant's places to be released", timeout=10)
    finally:
        await redis.aclose()


async def test_a_flooding_connection_is_paced_and_others_stream_on(stack: Stack) -> None:
    """2000 tiny appends sent at once are read no faster than MAX_FRAMES_PER_S (plus its one
    second burst), all arrive, in order; a session streaming beside it loses nothing."""
    rate = 100
    stack.env["DUPLEX_GATEWAY_MAX_FRAMES_PER_S"] = str(rate)
    url = stack.gateway().ws_url
    stack.worker()
    bystander, _ = await streaming_session(url, 0)
    flood = await DuplexClient.connect(url, session=STREAM_SESSION)
    await collect_until(flood, "session.updated", [])
    frames = 400
    started = time.monotonic()
    for i in range(frames):
        await flood.append_audio(i.to_bytes(2, "little"))

    async def stream_beside() -> list[int]:
        got: list[int] = []
        for i in range(100):
            await bystander.append_audio(marked_chunk(1, i))
            await asyncio.sleep(0.02)  # real time: a send schedule, not a wait
        while len(got) < 100:
            event = await next_event(bystander)
            if event.type == "response.output_audio.delta":
                got.append(chunk_index(event.audio))
        return got

    beside = asyncio.create_task(stream_beside())
    echoed: list[int] = []
    while len(echoed) < frames:
        event = await next_event(flood)
        if event.type != "response.output_audio.delta":
            continue
        echoed.append(int.from_bytes(event.audio, "little"))
        elapsed = time.monotonic() - started
        # The pacer lets ``rate`` frames through at once and ``rate`` per second after; the
        # update frame counted too. Slower is always fine: this is an upper bound.
        assert len(echoed) <= rate + rate * elapsed + 2, (len(echoed), elapsed)
    assert echoed == list(range(frames))
    assert await beside == list(range(100))
    for client in (flood, bystander):
        await client.aclose()


async def test_new_sessions_per_minute_per_tenant(stack: Stack) -> None:
    """The tenant's 4th session within a minute is refused rate_limit_exceeded (close 1013);
    another tenant opens on."""
    stack.env["DUPLEX_GATEWAY_API_KEYS"] = f"{K1},{K2}"
    stack.env["DUPLEX_GATEWAY_TENANT_SESSIONS_PER_MINUTE"] = "3"
    url = stack.gateway().ws_url
    stack.worker()
    opened = [await DuplexClient.connect(url, api_key=K1) for _ in range(3)]
    refused = DuplexClient(url, api_key=K1)
    refused._ws = await refused._dial()
    await refused.send_raw(json.dumps({"type": "session.update", "session": {}}))
    answer = json.loads(await asyncio.wait_for(refused._ws.recv(), 10))
    assert answer["type"] == "error"
    assert answer["error"]["code"] == "rate_limit_exceeded"
    assert answer["error"]["type"] == "rate_limit_error"
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(refused._ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
    other = await DuplexClient.connect(url, api_key=K2)
    assert other.session_id is not None
    for client in (*opened, refused, other):
        await client.aclose()
