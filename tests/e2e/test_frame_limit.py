"""A frame just over the gateway's MAX_FRAME_BYTES gets event_too_large, then close 1009."""

from __future__ import annotations

import asyncio
import json

import pytest
from websockets.exceptions import ConnectionClosed

from gateway.client import DuplexClient
from tests.e2e.helpers import STREAM_SESSION, collect_until
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# Small, so the frames are cheap; the margin is what the websocket layer lets through beyond it.
MAX_FRAME_BYTES = 4096


def append_frame(size: int) -> str:
    """An ``input_audio_buffer.append`` frame of exactly ``size`` bytes (ASCII): valid base64
    pcm16 audio (a multiple of 8 characters), padded to the size with JSON whitespace."""
    empty = json.dumps({"type": "input_audio_buffer.append", "audio": ""})
    audio = "A" * ((size - len(empty)) // 8 * 8)  # 6 bytes a step: whole pcm16 samples
    frame = json.dumps({"type": "input_audio_buffer.append", "audio": audio})
    return frame + " " * (size - len(frame))


async def error_codes_until_closed(client: DuplexClient) -> tuple[list[str | None], int | None]:
    """Every error code the gateway sends until it closes, and the close code it sent."""
    codes: list[str | None] = []
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            event = await asyncio.wait_for(client.recv(), 10)
            codes.append(event.data.get("error", {}).get("code"))
    received = closed.value.rcvd
    return codes, None if received is None else received.code


@pytest.mark.parametrize("over", [1, 1024, 256 * 1024])
async def test_frame_over_the_configured_limit_gets_event_too_large(stack: Stack,
                                                                    over: int) -> None:
    """A frame ``over`` bytes above MAX_FRAME_BYTES is answered event_too_large then 1009."""
    stack.env["DUPLEX_GATEWAY_MAX_FRAME_BYTES"] = str(MAX_FRAME_BYTES)
    gateway = stack.gateway()
    stack.worker(slots=1)
    client = await DuplexClient.connect(gateway.ws_url, session=STREAM_SESSION)
    await collect_until(client, "session.updated", [])
    await client.send_raw(append_frame(MAX_FRAME_BYTES + over))
    codes, close_code = await error_codes_until_closed(client)
    assert codes[-1:] == ["event_too_large"]
    assert close_code == 1009


async def test_frame_at_the_limit_is_accepted(stack: Stack) -> None:
    """A frame of exactly MAX_FRAME_BYTES is taken: the session goes on (a heartbeat acks)."""
    stack.env["DUPLEX_GATEWAY_MAX_FRAME_BYTES"] = str(MAX_FRAME_BYTES)
    gateway = stack.gateway()
    stack.worker(slots=1)
    async with await DuplexClient.connect(gateway.ws_url, session=STREAM_SESSION) as client:
        await collect_until(client, "session.updated", [])
        await client.send_raw(append_frame(MAX_FRAME_BYTES))
        await client.heartbeat()
        seen: list[str] = []
        while "session.heartbeat_ack" not in seen:
            event = await asyncio.wait_for(client.recv(), 10)
            assert event.type != "error", event.data
            seen.append(event.type)
