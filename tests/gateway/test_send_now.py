"""``GatewayWebSocketProtocol.send_text_now``: the gateway's direct send, through a real uvicorn.

It writes a text message at once only where the ASGI send would neither wait nor refuse, and
says False otherwise, so the driver falls back to the ASGI send: writes paused at the
transport's high-water mark, a close sent by the app, a close received from the client. The
server runs in this process (so the app can reach the protocol) on a real socket; the client
is the ``websockets`` library, with and without permessage-deflate.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from types import MethodType
from typing import Any, cast

import pytest
import uvicorn
import websockets
from websockets.exceptions import ConnectionClosed

from gateway.wsprotocol import SEND_NOW_KEY, GatewayWebSocketProtocol
from runtime.embedded import free_port
from tests.store._support import until

pytestmark = pytest.mark.timeout(60)

DEADLINE_S = 10.0
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Recorder:
    """The app: what ``send_text_now`` answered at each step of one scripted connection."""

    def __init__(self) -> None:
        self.answers: dict[str, bool] = {}
        self.done = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        assert (await receive())["type"] == "websocket.connect"
        send_now = cast(Callable[[str], bool], scope["extensions"][SEND_NOW_KEY])
        protocol = cast(GatewayWebSocketProtocol, cast(MethodType, send_now).__self__)
        self.answers["before accept"] = send_now("never")
        await send({"type": "websocket.accept"})
        self.answers["open"] = send_now("one")
        protocol.pause_writing()  # what the transport calls at its high-water mark
        self.answers["paused"] = send_now("never")
        protocol.resume_writing()
        self.answers["resumed"] = send_now("two")
        if scope["path"] == "/app-closes":
            await send({"type": "websocket.close", "code": 1000})
            self.answers["closed"] = send_now("never")
        else:  # the client closes once it has both messages
            assert (await receive())["type"] == "websocket.disconnect"
            self.answers["closed"] = send_now("never")
        self.done.set()


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, Recorder]]:
    app = Recorder()
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, ws=GatewayWebSocketProtocol,
                            lifespan="on", log_config=None)
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    await until(lambda: server.started or serving.done(), "uvicorn to start")
    assert not serving.done(), "uvicorn exited at start"
    yield f"ws://127.0.0.1:{port}", app
    server.should_exit = True
    await asyncio.wait_for(serving, DEADLINE_S)


@pytest.mark.parametrize("compression", ["deflate", None])
@pytest.mark.parametrize("closer", ["app", "client"])
async def test_it_sends_only_where_the_asgi_send_would_not_wait(
        served: tuple[str, Recorder], compression: str | None, closer: str) -> None:
    url, app = served
    path = "/app-closes" if closer == "app" else "/client-closes"
    async with websockets.connect(url + path, compression=compression) as ws:
        received = [await asyncio.wait_for(ws.recv(), DEADLINE_S) for _ in range(2)]
        assert received == ["one", "two"]  # text frames, in order, nothing else
        if closer == "app":
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), DEADLINE_S)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
    await asyncio.wait_for(app.done.wait(), DEADLINE_S)
    assert app.answers == {"before accept": False, "open": True, "paused": False,
                           "resumed": True, "closed": False}
