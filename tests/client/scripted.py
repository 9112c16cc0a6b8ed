"""A scripted gateway for the client's tests: a real websocket server on 127.0.0.1 that plays
one scripted connection after another (drops, close codes, lost answers, refusals, replays) and
records every frame the client sent, plus the server events the scripts send.

The scripts never guess what arrived: they wait for the client's ``session.event_ack`` (the
collector below acknowledges every numbered event) before they cut a connection, and a replay
starts from what the client says it holds, as the real gateway's does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve

from duplex_client import ClientSettings, DuplexClient, RealtimeEvent, Resumed

DEADLINE_S = 10.0
SESSION_ID = "sess_scripted"
#: Tiny pauses with a seeded jitter: backoff is deterministic and the tests are quick.
FAST = ClientSettings(backoff_base_s=0.001, backoff_cap_s=0.004, attempt_timeout_s=5.0,
                      heartbeat_interval_s=None)


def seeded_jitter() -> Callable[[], float]:
    return random.Random(20240611).random


# --------------------------------------------------------------------------- the scripted side


@dataclass
class Peer:
    """The gateway's end of one connection: what a script reads, sends and cuts."""

    ws: ServerConnection
    frames: list[dict[str, Any]] = field(default_factory=list)

    async def read(self) -> dict[str, Any]:
        frame: dict[str, Any] = json.loads(await self.ws.recv())
        self.frames.append(frame)
        return frame

    async def expect(self, kind: str) -> dict[str, Any]:
        """The next frame that is not an ack; it must be of type ``kind``."""
        frame = await self.read()
        while frame["type"] == "session.event_ack":
            frame = await self.read()
        assert frame["type"] == kind, frame
        return frame

    async def wait_ack(self, seq: int) -> None:
        """Until the client acknowledged ``seq``: everything up to it has arrived."""
        while True:
            frame = await self.read()
            if frame["type"] == "session.event_ack" and frame["server_event_seq"] >= seq:
                return

    async def send(self, *events: dict[str, Any]) -> None:
        for event in events:
            await self.ws.send(json.dumps(event))

    def drop(self) -> None:
        """Cut the connection without a close frame (a crash or a network loss)."""
        self.ws.transport.abort()

    async def close(self, code: int) -> None:
        await self.ws.close(code)


Script = Callable[[Peer], Awaitable[None]]


class ScriptedGateway:
    """A websocket server playing ``scripts[n]`` on its n-th connection; a connection beyond
    the scripts is cut at once (and counted). A failed script is kept for the test's end."""

    def __init__(self, scripts: list[Script]) -> None:
        self.scripts = scripts
        self.peers: list[Peer] = []
        self.failures: list[BaseException] = []
        self._server: Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"ws://127.0.0.1:{port}/v1/realtime"

    async def start(self) -> None:
        self._server = await serve(self._handle, "127.0.0.1", 0)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, ws: ServerConnection) -> None:
        peer = Peer(ws)
        self.peers.append(peer)
        index = len(self.peers) - 1
        if index >= len(self.scripts):
            peer.drop()
            return
        try:
            await self.scripts[index](peer)
        except Exception as exc:  # surfaced by the fixture: a script that failed is a failure
            self.failures.append(exc)
            peer.drop()

    def frames(self, connection: int) -> list[dict[str, Any]]:
        return self.peers[connection].frames


# --------------------------------------------------------------------------- server events


def created(token: str = "token-1") -> dict[str, Any]:
    return {"type": "session.created", "session_id": SESSION_ID, "resume_token": token,
            "lease_generation": 1}


def delta(seq: int) -> dict[str, Any]:
    return {"type": "response.output_audio.delta", "server_event_seq": seq,
            "delta": base64.b64encode(seq.to_bytes(4, "little")).decode()}


def resumed(*, token: str, generation: int, last_client_seq: int = 0,
            replay_from: int) -> dict[str, Any]:
    return {"type": "session.resumed", "session_id": SESSION_ID, "resume_token": token,
            "lease_generation": generation, "last_client_seq": last_client_seq,
            "replay_from": replay_from}


def closed(seq: int, reason: str = "client_close") -> dict[str, Any]:
    return {"type": "session.closed", "server_event_seq": seq, "reason": reason}


def error(code: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": "invalid_request_error", "code": code,
                                       "message": code}}


async def open_and_stream(peer: Peer, last: int) -> None:
    """The opening every script starts with: the session, events 1..last, all acknowledged."""
    await peer.expect("session.update")
    await peer.send(created(), *(delta(seq) for seq in range(1, last + 1)))
    await peer.wait_ack(last)


def resume_then(*, generation: int, then_last: int, token: str = "token-2",
                end: bool = True) -> Script:
    """A resume answered, replaying from where the client says it is up to ``then_last``
    (with the client's last event sent again, which the client must drop), then
    ``session.closed`` when ``end``."""
    async def script(peer: Peer) -> None:
        request = await peer.expect("session.resume")
        held = request["last_received_server_event_seq"]
        await peer.send(resumed(token=token, generation=generation, replay_from=held + 1))
        if held:
            await peer.send(delta(held))  # a duplicate on purpose
        await peer.send(*(delta(seq) for seq in range(held + 1, then_last + 1)))
        if end:
            await peer.send(closed(then_last + 1))
    return script


# --------------------------------------------------------------------------- the client side


async def collect(client: DuplexClient, into: list[RealtimeEvent]) -> list[RealtimeEvent]:
    """Everything ``events()`` yields, into ``into``, acknowledging every numbered event."""
    async with asyncio.timeout(DEADLINE_S):
        async for event in client.events():
            into.append(event)
            if event.server_event_seq is not None:
                await client.ack(event.server_event_seq)
    return into


def trace(events: list[RealtimeEvent]) -> list[int | str]:
    """The yielded stream in short: numbers for numbered events, names for the rest."""
    return [e.server_event_seq if e.server_event_seq is not None
            else "resumed" if isinstance(e, Resumed) else e.type for e in events]


async def connect(*urls: str, settings: ClientSettings = FAST,
                  retry_open: bool = False) -> DuplexClient:
    return await DuplexClient.connect(list(urls), settings=settings, jitter=seeded_jitter(),
                                      retry_open=retry_open)
