"""A frame just over the gateway's MAX_FRAME_BYTES gets event_too_large, then close 1009."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import select
import socket

import pytest
from websockets.exceptions import ConnectionClosed

from duplex_client import DuplexClient
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


# The largest cannot sit in the sockets' buffers: the gateway refuses it with most of it unread.
@pytest.mark.parametrize("over", [1, 1024, 256 * 1024, 8 * 1024 * 1024])
async def test_frame_over_the_configured_limit_gets_event_too_large(stack: Stack,
                                                                    over: int) -> None:
    """A frame ``over`` bytes above MAX_FRAME_BYTES is answered event_too_large then 1009."""
    stack.env["DUPLEX_GATEWAY_MAX_FRAME_BYTES"] = str(MAX_FRAME_BYTES)
    gateway = stack.gateway()
    stack.worker(slots=1)
    client = await DuplexClient.connect(gateway.ws_url, session=STREAM_SESSION)
    await collect_until(client, "session.updated", [])
    # The gateway refuses a large frame while the client is still sending it: the send may
    # end with the close; what the client received before it is read below all the same.
    with contextlib.suppress(ConnectionClosed):
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


def _read_until_closed(sock: socket.socket) -> tuple[bytes, str | None]:
    """Everything the server sends until it closes its side, and how the socket ended:
    None (an orderly close: EOF) or the error a reset raised (its unread data lost)."""
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError as exc:
            return received, type(exc).__name__
        if not chunk:
            return received, None
        received += chunk


def _masked_header(opcode: int, length: int) -> bytes:
    """A client frame header (FIN set, masked, 64-bit length) with an all-zero mask."""
    return bytes([0x80 | opcode, 0x80 | 127]) + length.to_bytes(8, "big") + b"\0\0\0\0"


def _refuse_a_frame_still_being_sent(port: int) -> tuple[bytes, str | None]:
    """Open a websocket by hand, announce a frame far over the limit and send some of it;
    once the gateway's answer is here (unread), send more of the frame; then read it all."""
    key = base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                     f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                     f"Sec-WebSocket-Version: 13\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 101"), answer
        # The gateway refuses on reading the header, with most of the frame still to come.
        sock.sendall(_masked_header(0x1, 64 * 1024 * 1024) + b" " * 65536)
        readable, _, _ = select.select([sock], [], [], 10)
        assert readable, "no answer to the refused frame"
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b" " * (1024 * 1024))
        return _read_until_closed(sock)


def test_a_refused_frame_still_being_sent_gets_its_answer_not_a_reset(stack: Stack) -> None:
    """A client still sending a refused frame (its rest arriving after the refusal) gets
    event_too_large and the close 1009, then an orderly end: the gateway reads and drops the
    rest instead of closing a socket with unread data, which the kernel turns into a reset
    that can lose the answer. A raw socket, so the test holds the bytes off until it chooses;
    eight connections, since a reset loses the answer only when it overtakes the reading."""
    stack.env["DUPLEX_GATEWAY_MAX_FRAME_BYTES"] = str(MAX_FRAME_BYTES)
    gateway = stack.gateway()
    stack.worker(slots=8)
    for _ in range(8):
        received, ended_by = _refuse_a_frame_still_being_sent(gateway.port)
        assert ended_by is None, f"the connection was reset ({ended_by}): the answer was lost"
        # Written like every frame of the gateway's (encode_frame): compact JSON.
        assert b'"code":"event_too_large"' in received, received[:400]
        close_at = received.rfind(b"\x88")
        assert received[close_at + 2:close_at + 4] == (1009).to_bytes(2, "big"), received[-40:]
