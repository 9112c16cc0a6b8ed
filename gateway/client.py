"""A Python client for the gateway: typed commands in, typed events out, resume built in.

Method names follow the seed's ``DuplexSessionHandle`` (``append_audio``, ``commit``,
``create_response``, ``cancel_response``, ``close``, ``events()``).

Exactly once, both directions, across lost connections:

* **Upstream.** Every command carries ``client_seq`` 1, 2, 3, ... and stays in a resend buffer.
  ``session.resumed`` reports the highest ``client_seq`` the input log holds; the client resends
  everything after it, and the store drops anything it already has.
* **Downstream.** The client remembers the highest ``server_event_seq`` it handed out, resumes
  from it, and drops any event at or below it.

Example::

    client = await DuplexClient.connect("ws://127.0.0.1:8000/v1/realtime")
    await client.append_audio(pcm)
    await client.commit()
    await client.create_response()
    async for event in client.events():
        if event.type == "response.done":
            break
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

__all__ = ["DuplexClient", "DuplexClientError", "RealtimeEvent"]

_TERMINAL = frozenset({"session.closed", "session.expired"})
_FATAL_RESUME_CODES = frozenset({
    "session_resume_expired", "invalid_resume_token", "invalid_session_resume",
    "unsupported_session_resume", "session_resume_conflict",
})


class DuplexClientError(Exception):
    """The gateway refused the session (open or resume), or the session is over."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class RealtimeEvent:
    """One server event: its ``type``, its ``server_event_seq`` (None for connection-level
    notices such as ``session.created``) and the whole JSON object."""

    type: str
    server_event_seq: int | None
    data: dict[str, Any] = field(repr=False)

    @property
    def audio(self) -> bytes:
        """The decoded audio of a ``response.output_audio.delta``."""
        return base64.b64decode(self.data.get("delta", ""))


class DuplexClient:
    """One session, possibly spanning several websocket connections."""

    def __init__(self, url: str, *, api_key: str | None = None,
                 resend_buffer: int = 4096) -> None:
        self.url = url
        self.api_key = api_key
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.generation = 0
        #: The highest server_event_seq handed to the caller.
        self.last_seq = 0
        self.closed = False
        self._ws: ClientConnection | None = None
        self._client_seq = 0
        self._unconfirmed: deque[tuple[int, str]] = deque(maxlen=resend_buffer)

    # ------------------------------------------------------------------ connecting

    @classmethod
    async def connect(cls, url: str, *, session: dict[str, Any] | None = None,
                      api_key: str | None = None) -> DuplexClient:
        """Open a new session; ``session`` is the initial ``session.update`` payload."""
        client = cls(url, api_key=api_key)
        client._ws = await client._dial()
        await client._send({"type": "session.update",
                            "session": session or {"type": "realtime"}})
        created = await client._recv_raw()
        if created.get("type") != "session.created":
            raise DuplexClientError(f"open refused: {created}",
                                    code=created.get("error", {}).get("code"))
        client.session_id = created["session_id"]
        client.resume_token = created["resume_token"]
        client.generation = created["lease_generation"]
        return client

    async def resume(self, url: str | None = None) -> RealtimeEvent:
        """Reconnect (to ``url``, e.g. another gateway) and resume from :attr:`last_seq`.

        Returns the ``session.resumed`` event; replayed events follow in :meth:`events`.

        Raises:
            DuplexClientError: the session cannot be resumed (expired, bad token, ...).
        """
        if self.session_id is None or self.resume_token is None:
            raise DuplexClientError("nothing to resume: the session was never opened")
        await self.drop_connection()
        self.url = url or self.url
        self._ws = await self._dial()
        await self._ws.send(json.dumps({
            "type": "session.resume", "session_id": self.session_id,
            "resume_token": self.resume_token,
            "last_received_server_event_seq": self.last_seq,
            "control_id": secrets.token_hex(8),
        }))
        answer = await self._recv_raw()
        if answer.get("type") != "session.resumed":
            code = answer.get("error", {}).get("code")
            raise DuplexClientError(f"resume refused: {answer}", code=code)
        self.resume_token = answer["resume_token"]
        self.generation = answer["lease_generation"]
        # Where the server's replay starts. Below our position only when the store lost events
        # we had (session.resync_required log_rewound follows): the next events reuse those
        # numbers and must not be dropped as seen.
        self.last_seq = int(answer["replay_from"]) - 1
        confirmed = int(answer["last_client_seq"])
        for client_seq, text in list(self._unconfirmed):
            if client_seq > confirmed:
                await self._ws.send(text)
        return RealtimeEvent("session.resumed", None, answer)

    async def drop_connection(self) -> None:
        """Abort the current connection without closing the session (a network loss)."""
        if self._ws is not None:
            self._ws.transport.abort()
            try:
                await asyncio.wait_for(self._ws.wait_closed(), 5)
            except TimeoutError:
                pass
            self._ws = None

    async def aclose(self) -> None:
        """Close the connection normally (1000). The session itself lives on, detached, in
        its disconnect grace; call :meth:`close` first to end it."""
        if self._ws is not None:
            await self._ws.close()
            self._ws = None

    async def __aenter__(self) -> DuplexClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _dial(self) -> ClientConnection:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        return await websockets.connect(self.url, additional_headers=headers, max_size=None)

    # ------------------------------------------------------------------ commands

    async def append_audio(self, pcm16: bytes) -> None:
        """``input_audio_buffer.append`` (pcm16 LE mono 24 kHz)."""
        await self._command({"type": "input_audio_buffer.append",
                             "audio": base64.b64encode(pcm16).decode()})

    async def commit(self) -> None:
        """``input_audio_buffer.commit``."""
        await self._command({"type": "input_audio_buffer.commit"})

    async def clear_input(self) -> None:
        """``input_audio_buffer.clear``."""
        await self._command({"type": "input_audio_buffer.clear"})

    async def create_response(self, options: dict[str, Any] | None = None) -> None:
        """``response.create`` with optional per-response options."""
        message: dict[str, Any] = {"type": "response.create"}
        if options is not None:
            message["response"] = options
        await self._command(message)

    async def cancel_response(self, response_id: str | None = None) -> None:
        """``response.cancel``."""
        message: dict[str, Any] = {"type": "response.cancel"}
        if response_id is not None:
            message["response_id"] = response_id
        await self._command(message)

    async def update(self, patch: dict[str, Any]) -> None:
        """``session.update``."""
        await self._command({"type": "session.update", "session": patch})

    async def heartbeat(self) -> None:
        """``session.heartbeat``."""
        await self._command({"type": "session.heartbeat"})

    async def close(self, reason: str = "client_close") -> None:
        """``session.close``: the session ends with ``session.closed`` (read it from events)."""
        await self._command({"type": "session.close", "reason": reason})

    async def ack(self, server_event_seq: int | None = None) -> None:
        """``session.event_ack``: the log may drop every event up to this seq (default: all
        handed out so far), which bounds Redis memory for this session."""
        seq = self.last_seq if server_event_seq is None else server_event_seq
        await self._send({"type": "session.event_ack", "server_event_seq": seq})

    async def send_raw(self, data: str | bytes) -> None:
        """Send a frame as is (for tests of bad input)."""
        assert self._ws is not None
        await self._ws.send(data)

    async def _command(self, message: dict[str, Any]) -> None:
        self._client_seq += 1
        message["client_seq"] = self._client_seq
        text = json.dumps(message)
        self._unconfirmed.append((self._client_seq, text))
        if self._ws is not None:
            try:
                await self._ws.send(text)
            except ConnectionClosed:
                pass  # kept in the resend buffer; resume() sends it again

    async def _send(self, message: dict[str, Any]) -> None:
        assert self._ws is not None
        await self._ws.send(json.dumps(message))

    # ------------------------------------------------------------------ events

    async def _recv_raw(self) -> dict[str, Any]:
        assert self._ws is not None
        data: dict[str, Any] = json.loads(await self._ws.recv())
        return data

    async def recv(self) -> RealtimeEvent:
        """The next event not seen before.

        Raises:
            websockets.exceptions.ConnectionClosed: the connection dropped; call
                :meth:`resume` and go on.
        """
        while True:
            data = await self._recv_raw()
            seq = data.get("server_event_seq")
            if isinstance(seq, int):
                if seq <= self.last_seq:
                    continue  # already delivered before a reconnect
                self.last_seq = seq
            if data.get("type") == "session.resync_required":
                # The next event's number: past a trim, or below ours after a rewound log.
                self.last_seq = int(data["replay_from"]) - 1
            event = RealtimeEvent(str(data.get("type")), seq, data)
            if event.type in _TERMINAL:
                self.closed = True
            return event

    async def events(self) -> AsyncIterator[RealtimeEvent]:
        """Every event once, in order, until the terminal one (which is yielded last)."""
        while not self.closed:
            yield await self.recv()

    @staticmethod
    def is_fatal_resume_error(error: DuplexClientError) -> bool:
        """Whether retrying the resume cannot help."""
        return error.code in _FATAL_RESUME_CODES
