"""Text frames that are not UTF-8, through a real uvicorn server running the real gateway app.

The server runs in this process (so its log records can be read) with the gateway's protocol
class, on a real socket and a real Redis; the client is the ``websockets`` library, which puts
the raw bytes on the wire in a text frame (``send(bytes, text=True)`` does not validate them).
No worker is needed: every frame here is refused before a session would be placed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.wsprotocol import GatewayWebSocketProtocol
from runtime.embedded import EmbeddedServer, free_port
from runtime.ratelog import RateLimitedLog
from tests.store._support import until

pytestmark = pytest.mark.timeout(60)

PROTOCOL_LOGGER = "gateway.wsprotocol"
NOT_UTF8 = b'{"type":"session.heartbeat","x":"\xc3\x28"}'  # \xc3 must be followed by 80-bf
DEADLINE_S = 10.0


class Clock:
    """Monotonic seconds that the test moves by hand (for the log's rate limit)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now



@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """A fresh rate-limited log on the protocol class, on a clock the test moves."""
    ticks = Clock()
    log = RateLimitedLog(logging.getLogger(PROTOCOL_LOGGER), interval_s=10.0, clock=ticks)
    monkeypatch.setattr(GatewayWebSocketProtocol, "invalid_text_log", log)
    return ticks


@pytest.fixture
async def gateway_url(redis_server: EmbeddedServer, clock: Clock,
                      caplog: pytest.LogCaptureFixture) -> AsyncIterator[str]:
    """A gateway served by uvicorn with the gateway's websocket protocol, in this process."""
    caplog.set_level(logging.INFO)
    port = free_port()
    config = uvicorn.Config(
        create_app(GatewaySettings(redis_url=redis_server.url)), host="127.0.0.1", port=port,
        ws=GatewayWebSocketProtocol, lifespan="on", log_config=None, log_level="info")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    await until(lambda: server.started or serving.done(), "uvicorn to start")
    assert not serving.done(), "uvicorn exited at start"
    yield f"ws://127.0.0.1:{port}/v1/realtime"
    server.should_exit = True
    await asyncio.wait_for(serving, DEADLINE_S)


async def answer(ws: ClientConnection) -> dict[str, Any]:
    """The next event the gateway sent."""
    event: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), DEADLINE_S))
    return event


async def close_code(ws: ClientConnection) -> int | None:
    """The close code the gateway sent, once the connection is closed."""
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(ws.recv(), DEADLINE_S)
    return None if closed.value.rcvd is None else closed.value.rcvd.code


def protocol_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == PROTOCOL_LOGGER]


def assert_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """No log record, from uvicorn or the gateway, carries a traceback or is an error."""
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []


async def test_text_that_is_not_utf8_gets_invalid_json_then_close_1007(
    gateway_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """RFC 6455 §8.1: the connection fails. The client first gets an invalid_json error
    saying why, then close 1007; the gateway logs one line, without a traceback."""
    async with websockets.connect(gateway_url) as ws:
        await ws.send(NOT_UTF8, text=True)
        error = await answer(ws)
        assert (error["type"], error["error"]["code"]) == ("error", "invalid_json")
        assert "UTF-8" in error["error"]["message"]
        assert await close_code(ws) == 1007
    (line,) = protocol_lines(caplog)
    assert "not UTF-8" in line and "1007" in line
    assert_no_traceback(caplog)


async def test_text_split_across_fragments_is_checked_whole(gateway_url: str) -> None:
    """A message whose fragments are each a piece of bad UTF-8 gets the same outcome; one
    whose fragments split a valid character passes as text."""
    async with websockets.connect(gateway_url) as ws:
        await ws.send([b'{"type":"nope","x":"\xc3', b'"}'], text=True)
        assert (await answer(ws))["error"]["code"] == "invalid_json"
        assert await close_code(ws) == 1007
    async with websockets.connect(gateway_url) as ws:
        await ws.send([b'{"type":"n\xc3', b'\xb6pe"}'], text=True)  # "nöpe", split inside ö
        error = await answer(ws)
        assert error["error"]["code"] == "unknown_event"
        assert "nöpe" in error["error"]["message"]


async def test_a_flood_of_bad_text_logs_one_line_per_interval(
    gateway_url: str, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Many clients sending bad text cost one log line per interval; the next line says how
    many were held back."""
    async def send_bad_text() -> None:
        async with websockets.connect(gateway_url) as ws:
            await ws.send(NOT_UTF8, text=True)
            assert (await answer(ws))["error"]["code"] == "invalid_json"
            assert await close_code(ws) == 1007

    for _ in range(4):
        await send_bad_text()
    assert len(protocol_lines(caplog)) == 1
    clock.now += 10.0
    await send_bad_text()
    lines = protocol_lines(caplog)
    assert len(lines) == 2
    assert "(3 similar lines suppressed since the last one)" in lines[1]
    assert_no_traceback(caplog)


async def test_valid_text_and_bad_binary_frames_keep_the_connection(gateway_url: str) -> None:
    """Only a text frame must be UTF-8: non-ASCII text passes as text, and a binary frame
    that is not UTF-8 is a plain invalid_json that keeps the connection open."""
    async with websockets.connect(gateway_url) as ws:
        await ws.send('{"type":"nöpe","event_id":"é1"}')
        error = await answer(ws)
        assert (error["error"]["code"], error["error"]["event_id"]) == ("unknown_event", "é1")
        await ws.send(NOT_UTF8)  # bytes: a binary frame
        assert (await answer(ws))["error"]["code"] == "invalid_json"
        await ws.send(NOT_UTF8)
        assert (await answer(ws))["error"]["code"] == "invalid_json"
