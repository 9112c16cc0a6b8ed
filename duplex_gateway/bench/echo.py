"""The relay benchmark's baseline: a bare websocket echo served by the gateway's own stack.

Same server software as ``duplex-gateway serve`` (a Starlette websocket route under uvicorn
with the gateway's uvicorn options: its loop, websocket protocol and deflate setting), same
path, but nothing in between: every text frame goes back as is, every binary frame too.
What the gateway costs on top of this is what ``duplex-gateway bench relay`` reports.

Run it as ``python -m duplex_gateway.bench.echo --port P``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway.settings import GatewaySettings

__all__ = ["create_echo_app", "main"]


async def _echo(websocket: WebSocket) -> None:
    """Accept, then send every frame back unchanged until the client goes away."""
    await websocket.accept()
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is not None:
                await websocket.send_text(text)
            else:
                await websocket.send_bytes(message.get("bytes") or b"")
    except (WebSocketDisconnect, RuntimeError, OSError):
        return


async def _ready(request: Request) -> Response:
    return PlainTextResponse("ready")


def create_echo_app() -> Starlette:
    """The echo application: ``/v1/realtime`` (websocket) and ``/readyz``."""
    return Starlette(routes=[WebSocketRoute("/v1/realtime", _echo), Route("/readyz", _ready)])


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the echo app with the uvicorn options of ``duplex-gateway serve``."""
    import uvicorn

    from duplex_gateway.cli import gateway_server_options

    parser = argparse.ArgumentParser(prog="python -m duplex_gateway.bench.echo",
                                     description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-level", default="warning",
                        choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    # The gateway's own uvicorn options (loop, websocket protocol, frame limit, deflate): the
    # baseline differs from `serve` only in the app.
    uvicorn.run(create_echo_app(), host=args.host, port=args.port, log_level=args.log_level,
                **gateway_server_options(GatewaySettings()))


if __name__ == "__main__":
    main()
