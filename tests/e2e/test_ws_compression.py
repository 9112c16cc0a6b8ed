"""permessage-deflate is negotiated only when WS_PER_MESSAGE_DEFLATE is on.

A real ``websockets`` client offers permessage-deflate (as browsers and the openai SDK do) to
a real gateway process; what the handshake agreed is read from the client's side, and a
stream of audio is relayed through the negotiated connection both ways.
"""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.extensions.permessage_deflate import PerMessageDeflate

from tests.e2e.helpers import STREAM_SESSION
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

DEADLINE_S = 10.0
# 20 ms of pcm16 at 24 kHz, not silent, so it has something to compress.
CHUNK = bytes(range(256)) * 3 + bytes(192)
STREAM = {"type": "session.update", "session": STREAM_SESSION}


async def next_of_type(ws: ClientConnection, wanted: str) -> dict[str, object]:
    """The next server event of type ``wanted``; an ``error`` on the way fails the test."""
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), DEADLINE_S))
        assert event["type"] != "error", event
        if event["type"] == wanted:
            return event  # type: ignore[no-any-return]


async def relay_one_chunk(url: str) -> list[type[object]]:
    """Open a stream session offering permessage-deflate, send one audio chunk, check it
    comes back intact; return the extensions the handshake agreed on."""
    async with connect(url, compression="deflate") as ws:
        assert ws.response is not None
        await ws.send(json.dumps(STREAM))
        await next_of_type(ws, "session.updated")
        audio = base64.b64encode(CHUNK).decode("ascii")
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
        delta = await next_of_type(ws, "response.output_audio.delta")
        assert delta["delta"] == audio
        return [type(extension) for extension in ws.protocol.extensions]


async def test_a_client_offering_deflate_gets_none_by_default(stack: Stack) -> None:
    """By default the gateway declines permessage-deflate: the client's offer is answered
    without the extension, and frames go uncompressed both ways."""
    gateway = stack.gateway()
    stack.worker(slots=1)
    assert await relay_one_chunk(gateway.ws_url) == []


async def test_a_client_offering_deflate_gets_it_when_the_setting_is_on(stack: Stack) -> None:
    """With WS_PER_MESSAGE_DEFLATE on, the offer is accepted and the relay works through the
    compressed connection."""
    stack.env["DUPLEX_GATEWAY_WS_PER_MESSAGE_DEFLATE"] = "true"
    gateway = stack.gateway()
    stack.worker(slots=1)
    assert await relay_one_chunk(gateway.ws_url) == [PerMessageDeflate]
