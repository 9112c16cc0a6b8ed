"""The seed's ``?duplex=1`` dialect against a real gateway and worker, next to GA connections.

The seed's client dials ``/v1/realtime?duplex=1&model=M&autostart=0`` and opens with its own
``session.update``; these tests speak that dialect with a plain websocket, as it does.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.e2e.helpers import CHUNK_BYTES
from tests.e2e.stack import Stack
from tests.gateway.strict import validate_server_event

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

MODEL = "seed-model"
# Keys the worker takes today; the seed's own (sample_rate_hz, ref_audio, ...) are another
# change's.
HANDSHAKE_SESSION = {
    "instructions": "Be brief.",
    "audio": {"input": {"turn_detection": None}},
    "extra_body": {"loopback_mode": "stream"},
}
DEADLINE_S = 10.0


@pytest.fixture
def gateway_url(stack: Stack) -> str:
    # A short first-message wait: a connection that opens nothing is answered quickly.
    stack.env["DUPLEX_GATEWAY_FIRST_MESSAGE_TIMEOUT_S"] = "2"
    stack.env["DUPLEX_GATEWAY_URL_OPEN_DELAY_S"] = "0"
    url = stack.gateway().ws_url
    stack.worker(models=[MODEL])
    return url


async def receive(ws: ClientConnection) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), DEADLINE_S))
    return event


async def until(ws: ClientConnection, wanted: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The next ``wanted`` event, and every event before it."""
    before: list[dict[str, Any]] = []
    while True:
        event = await receive(ws)
        if event["type"] == wanted:
            return event, before
        before.append(event)


async def send(ws: ClientConnection, **event: Any) -> None:
    await ws.send(json.dumps(event))


async def acked(ws: ClientConnection) -> AsyncIterator[dict[str, Any]]:
    """Events as they come, each acknowledged as the seed's client does."""
    while True:
        event = await receive(ws)
        if "server_event_seq" in event:
            await send(ws, type="session.event_ack", server_event_seq=event["server_event_seq"])
        yield event


async def test_the_seed_handshake_opens_the_session_its_update_describes(
        gateway_url: str) -> None:
    """autostart=0: nothing opens before the client's session.update, which then opens the
    URL's model with that session; the seed's fields and aliases work end to end."""
    url = f"{gateway_url}?duplex=1&model={MODEL}&autostart=0"
    async with websockets.connect(url) as ws:
        await send(ws, type="session.update", session=HANDSHAKE_SESSION)
        created = await receive(ws)
        assert created["type"] == "session.created"
        assert created["session"]["model"] == MODEL
        assert created["attachment_generation"] == 1 and "lease_generation" not in created
        assert "capabilities" not in created and created["session"]["capabilities"]
        updated = await receive(ws)
        assert updated["type"] == "session.updated"
        assert updated["session"]["instructions"] == "Be brief."
        assert updated["session"]["capabilities"] == created["session"]["capabilities"]

        events = acked(ws)
        chunk = base64.b64encode(bytes(CHUNK_BYTES)).decode()
        for _ in range(6):  # 120 ms: a commit takes 100 ms or more
            await send(ws, type="input_audio_buffer.append", audio=chunk)
        seen: list[dict[str, Any]] = []
        async for event in events:
            seen.append(event)
            if sum(e["type"] == "response.output_audio.delta" for e in seen) == 6:
                break
        response = next(e for e in seen if e["type"] == "response.created")
        assert response["response_id"] == response["response"]["id"]
        deltas = [e for e in seen if e["type"] == "response.output_audio.delta"]
        assert {(d["format"], d["sample_rate_hz"]) for d in deltas} == {("pcm16", 24000)}

        await send(ws, type="input.commit")
        async for event in events:
            assert event["type"] != "error", event
            if event["type"] == "response.done":
                assert event["response_id"] == response["response_id"]
                break
        await send(ws, type="close", reason="bye")
        closed, _ = await until(ws, "session.closed")
        assert closed["reason"] == "bye"
        with pytest.raises(ConnectionClosed):
            await receive(ws)
        assert ws.close_code == 1000


async def test_autostart_0_opens_nothing_until_the_client_speaks(gateway_url: str) -> None:
    """The same URL with autostart on opens at once; with autostart=0 and nothing sent, the
    first-message wait ends the connection and no session was opened."""
    async with websockets.connect(f"{gateway_url}?duplex=1&model={MODEL}") as ws:
        created = await receive(ws)
        assert created["type"] == "session.created" and created["session"]["model"] == MODEL
    async with websockets.connect(f"{gateway_url}?duplex=1&model={MODEL}&autostart=0") as ws:
        error = await receive(ws)
        assert error["type"] == "error" and error["error"]["code"] == "config_timeout"
        with pytest.raises(ConnectionClosed):
            await receive(ws)
        assert ws.close_code == 1008


async def test_the_duplex_path_and_the_seed_codes(gateway_url: str) -> None:
    """/v1/duplex speaks the dialect; a refusal, the gateway's or the worker's, carries the
    seed's code."""
    url = gateway_url.replace("/v1/realtime", "/v1/duplex") + f"?model={MODEL}&autostart=0"
    async with websockets.connect(url) as ws:
        await send(ws, type="session.update", session=HANDSHAKE_SESSION)
        created, _ = await until(ws, "session.created")
        assert created["attachment_generation"] == 1
        await send(ws, type="conversation.item.delete", event_id="e1")
        error, _ = await until(ws, "error")
        assert error["error"]["code"] == "missing_item_id"
        assert error["error"]["event_id"] == "e1"
        await send(ws, type="input_audio_buffer.commit", event_id="e2")  # the worker's refusal
        error, _ = await until(ws, "error")
        assert error["error"]["code"] == "input_audio_buffer_empty"
        assert error["error"]["event_id"] == "e2" and error["server_event_seq"]


async def test_ga_connections_are_unchanged(gateway_url: str) -> None:
    """GA: GA names, strictly valid, and the seed's aliases refused unknown_event."""
    async with websockets.connect(f"{gateway_url}?model={MODEL}") as ws:
        created = await receive(ws)
        validate_server_event(created)
        assert created["lease_generation"] == 1 and "attachment_generation" not in created
        assert created["capabilities"] and "capabilities" not in created["session"]
        for alias in ("input.commit", "close", "close_session"):
            await send(ws, type=alias, event_id=alias)
            error, before = await until(ws, "error")
            for event in (*before, error):
                validate_server_event(event)
            assert error["error"]["code"] == "unknown_event"
            assert error["error"]["event_id"] == alias
        await send(ws, type="conversation.item.delete")
        error, _ = await until(ws, "error")
        assert error["error"]["code"] == "missing_required_parameter"


async def test_a_flag_the_gateway_cannot_read_is_refused_before_the_upgrade(
        gateway_url: str) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with websockets.connect(f"{gateway_url}?duplex=maybe"):
            pass
    assert refused.value.response.status_code == 400
    body = json.loads(refused.value.response.body or b"{}")
    assert body["error"]["code"] == "invalid_value" and body["error"]["param"] == "duplex"
