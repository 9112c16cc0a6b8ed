"""The relay benchmark's peer: what a Python team would deploy for one Redis hop, nothing durable.

A python-socketio cluster: ``AsyncServer`` with its ``AsyncRedisManager`` over a real Redis,
served as an ASGI app by uvicorn with the options of ``duplex-gateway serve`` (the gateway's
own server stack, so the comparison differs in the relay, not the web server). Each ``audio``
event (the same ``input_audio_buffer.append`` mapping the project's clients send, base64 audio
and all) is emitted back to the sender's room through the manager. python-socketio (5.x)
delivers to a client on the emitting server at once and publishes every emit to Redis for the
other servers, each of which decodes every message: the cost of a Socket.IO cluster's one hop.

Run the server as ``python -m duplex_gateway.bench.peer --port P --redis-url URL``; its load
sessions (:class:`PeerSession`) run in the relay bench's client processes, beside the
websocket ones. Needs the ``[bench]`` extra (python-socketio, and aiohttp for its client).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import time
from collections.abc import Sequence
from typing import Any, Final

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from duplex_gateway.bench.load import LoadSession, append_message
from gateway.settings import GatewaySettings

__all__ = ["EVENT", "PeerSession", "create_peer_app", "main"]

#: The event that carries a chunk, both ways.
EVENT: Final = "audio"
_OPEN_TIMEOUT_S: Final = 10.0
_CLOSE_TIMEOUT_S: Final = 3.0
_REDIS_CONNECTIONS: Final = 4096


def _socketio() -> Any:
    """python-socketio, imported by name: it ships no type information."""
    return importlib.import_module("socketio")


async def _ready(request: Request) -> Response:
    return PlainTextResponse("ready")


def create_peer_app(redis_url: str) -> Any:
    """The peer's ASGI app: Socket.IO at ``/socket.io/``, ``/readyz`` beside it."""
    socketio = _socketio()
    # redis-py (8) caps an asyncio pool at 100 connections and refuses the 101st concurrent
    # publish ("Too many connections"); every chunk in flight is one publish, so a deployment
    # raises the cap past its sessions, as this does.
    manager = socketio.AsyncRedisManager(redis_url,
                                         redis_options={"max_connections": _REDIS_CONNECTIONS})
    server = socketio.AsyncServer(async_mode="asgi", client_manager=manager)

    async def echo_to_sender(sid: str, data: Any) -> None:
        await server.emit(EVENT, data, to=sid)

    server.on(EVENT, echo_to_sender)
    return socketio.ASGIApp(server, other_asgi_app=Starlette(routes=[Route("/readyz",
                                                                           _ready)]))


class PeerSession(LoadSession):
    """One load session on the peer: a python-socketio ``AsyncClient`` over a websocket (no
    long-polling), streaming and matching chunks exactly as :class:`LoadSession` does."""

    _http: Any = None

    async def _open(self) -> None:
        # The client's own aiohttp session is left open when a disconnect does not finish
        # (aiohttp then warns "Unclosed client session" per session at exit): this one is
        # closed by close() whatever the disconnect did.
        self._http = importlib.import_module("aiohttp").ClientSession()
        client = _socketio().AsyncClient(reconnection=False, http_session=self._http)
        client.on(EVENT, self._on_event)
        client.on("disconnect", self._on_peer_disconnect)
        await asyncio.wait_for(client.connect(self._url, transports=["websocket"],
                                              wait_timeout=_OPEN_TIMEOUT_S), _OPEN_TIMEOUT_S)
        self._ws = client

    async def _on_event(self, data: Any) -> None:
        self._on_data(data, time.monotonic())

    async def _on_peer_disconnect(self, *reason: Any) -> None:
        self._on_disconnect()

    async def _send(self, chunk: int) -> bool:
        try:
            await self._ws.emit(EVENT, append_message(self.log.index, chunk))
        except Exception as exc:  # the client's errors have no common base: any is a result
            self.log.error(f"send: {exc!r}")
            return False
        return True

    async def close(self) -> None:
        """Disconnect (the peer keeps nothing to end)."""
        try:
            if self._ws is not None:
                self._stop_counting()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._ws.disconnect(), _CLOSE_TIMEOUT_S)
        finally:
            if self._http is not None:
                await self._http.close()


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the peer with the uvicorn options of ``duplex-gateway serve``."""
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m duplex_gateway.bench.peer",
                                     description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--log-level", default="warning",
                        choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    # Keep in step with duplex_gateway.bench.echo and duplex_gateway.cli._serve.
    uvicorn.run(create_peer_app(args.redis_url), host=args.host, port=args.port,
                log_level=args.log_level, ws_max_size=GatewaySettings().max_frame_bytes + 1024,
                timeout_graceful_shutdown=5, lifespan="on", ws="websockets-sansio")


if __name__ == "__main__":
    main()
