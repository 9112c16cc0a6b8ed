"""The relay benchmark's load: the frames a session sends and how it checks what comes back,
and the session that streams them in real time (the gateway's and the echo's protocol; the
python-socketio peer's session subclasses it in :mod:`duplex_gateway.bench.peer`).

Runs in the client processes the sweep starts (:mod:`duplex_gateway.bench.relay`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import random
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Final

from duplex_gateway.bench.spec import (
    CHUNK_BYTES,
    CHUNK_S,
    DRAIN_S,
    MAX_ERRORS,
    OPEN_TIMEOUT_S,
    RAMP_S,
    BenchError,
)

__all__ = ["ClientSpec", "LoadSession", "SessionLog", "append_message", "sleep_until"]

_MARK: Final = struct.Struct("<II")
# Random, not silent: permessage-deflate is negotiated, and real audio compresses poorly.
_FILL: Final = random.Random(20).randbytes(CHUNK_BYTES - _MARK.size)
# The loopback echoing each chunk at once, with no turn detector hearing the audio: the relay
# is what is measured, not a VAD (stream mode takes none; a new session starts with one).
_SESSION_UPDATE: Final = json.dumps(
    {"type": "session.update",
     "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}},
                 "extra_body": {"loopback_mode": "stream"}}})
# A frame backend echoes on its own clock and takes no loopback mode.
_FRAMES_SESSION_UPDATE: Final = json.dumps(
    {"type": "session.update",
     "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}})
_CLOSE: Final = json.dumps({"type": "session.close"})
# A frame backend's input is cut on 80 ms frames: a tail short of one waits for the rest.
_FRAME_CHUNKS: Final = 4
# The client modes that talk to a gateway (session.updated, session.close).
_GATEWAY_MODES: Final = frozenset({"gateway", "frames"})


# ============================================================================ frames


def _audio(session: int, chunk: int) -> bytes:
    """The chunk's pcm16 bytes: its marker, then the shared fill."""
    return _MARK.pack(session, chunk) + _FILL


def _append_frame(session: int, chunk: int) -> str:
    """The ``input_audio_buffer.append`` text frame of one chunk (client_seq from 1)."""
    b64 = base64.b64encode(_audio(session, chunk)).decode("ascii")
    return ('{"type":"input_audio_buffer.append","audio":"' + b64
            + '","client_seq":' + str(chunk + 1) + "}")


def append_message(session: int, chunk: int) -> dict[str, Any]:
    """The same append as a mapping: the payload of the peer's ``audio`` event."""
    return {"type": "input_audio_buffer.append",
            "audio": base64.b64encode(_audio(session, chunk)).decode("ascii"),
            "client_seq": chunk + 1}


def _returned_audio(data: dict[str, Any]) -> str | None:
    """The base64 audio a returned frame carries: a gateway delta or an echoed append."""
    kind = data.get("type")
    if kind == "response.output_audio.delta":
        return data.get("delta")
    if kind == "input_audio_buffer.append":
        return data.get("audio")
    return None


# ============================================================================ client side


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientSpec:
    """What one client process drives in one point."""

    urls: tuple[str, ...]  # session i connects to urls[i % len(urls)]
    mode: str  # "echo", "peer", "gateway" or "frames" (a gateway, a frame backend behind it)
    indices: tuple[int, ...]
    sessions: int
    seconds: float
    compression: bool


@dataclass(slots=True)
class SessionLog:
    """What one session saw; times are ``time.monotonic()`` seconds."""

    index: int
    open_s: float | None = None
    sent: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)  # send time minus due time
    received: dict[int, float] = field(default_factory=dict)
    duplicates: int = 0
    corrupt: int = 0
    misrouted: int = 0
    disconnected: bool = False
    errors: list[str] = field(default_factory=list)

    def error(self, text: str) -> None:
        """Keep the first few errors."""
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(text[:300])


class LoadSession:
    """One streaming session over a plain websocket (echo and gateway): connect, stream on an
    absolute clock, await the returns. :class:`duplex_gateway.bench.peer.PeerSession` changes
    only the transport."""

    def __init__(self, index: int, spec: ClientSpec, t0: float) -> None:
        self.log = SessionLog(index)
        self._spec = spec
        self._url = spec.urls[index % len(spec.urls)]
        self._start = t0 + RAMP_S * index / spec.sessions
        # Send phases spread evenly over the 20 ms period, as independent clients' would be;
        # the ramp alone would line every session up on the same phase (bursts).
        self._phase = t0 + CHUNK_S * index / spec.sessions
        self._end = t0 + spec.seconds
        self._ws: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._outstanding = 0
        self._sending = True
        self._settled = asyncio.Event()  # every sent chunk is back, or the reader ended

    async def run(self) -> None:
        """Open, stream until the common end time, then wait for the last returns."""
        await sleep_until(self._start)
        try:
            began = time.monotonic()
            await self._open()
            self.log.open_s = time.monotonic() - began
        except Exception as exc:  # any failure to open is a result, not a crash
            self.log.error(f"open: {exc!r}")
            return
        await self._stream()
        self._sending = False
        if self._outstanding > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), self._end + DRAIN_S
                                       - time.monotonic())

    async def _open(self) -> None:
        from websockets.asyncio.client import connect

        self._ws = await connect(self._url, max_size=None, open_timeout=OPEN_TIMEOUT_S,
                                 compression="deflate" if self._spec.compression else None)
        await self._ws.send(_FRAMES_SESSION_UPDATE if self._spec.mode == "frames"
                            else _SESSION_UPDATE)
        # The gateway answers session.created, then the worker's session.updated (stream
        # mode is on); the echo returns the update itself.
        wanted = "session.updated" if self._spec.mode in _GATEWAY_MODES else "session.update"
        while True:
            raw = await asyncio.wait_for(self._ws.recv(), OPEN_TIMEOUT_S)
            data = json.loads(raw)
            if data.get("type") == wanted:
                break
            if data.get("type") == "error":
                raise BenchError(f"open refused: {raw}")
        self._reader = asyncio.create_task(self._read())

    async def _send(self, chunk: int) -> bool:
        """Send one chunk; False once the connection is gone."""
        from websockets.exceptions import ConnectionClosed

        try:
            await self._ws.send(_append_frame(self.log.index, chunk))
        except ConnectionClosed as exc:
            self.log.error(f"send: {exc!r}")
            return False
        return True

    async def _stream(self) -> None:
        late = max(0.0, time.monotonic() - self._phase)
        begin = self._phase + math.ceil(late / CHUNK_S) * CHUNK_S  # next slot of this phase
        chunk = 0
        whole = _FRAME_CHUNKS if self._spec.mode == "frames" else 1
        while (due := begin + chunk * CHUNK_S) < self._end or chunk % whole:
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = time.monotonic()
            self.log.sent.append(sent)
            self.log.lag.append(sent - due)
            self._outstanding += 1
            if not await self._send(chunk):
                return
            chunk += 1

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in self._ws:
                self._on_frame(message, time.monotonic())
        except ConnectionClosed as exc:
            if self._sending or self._outstanding:
                self.log.error(f"recv: {exc!r}")
        self._on_disconnect()

    def _on_disconnect(self) -> None:
        self.log.disconnected = self._sending or self._outstanding > 0
        self._settled.set()

    def _on_frame(self, message: str | bytes, now: float) -> None:
        try:
            data = json.loads(message)
        except ValueError as exc:
            self.log.corrupt += 1  # not JSON
            self.log.error(f"bad frame: {exc!r}")
            return
        self._on_data(data, now)

    def _on_data(self, data: Any, now: float) -> None:
        """Match one returned message to its chunks: one a message from an echo, the
        loopback and the peer; from a frame backend's echo (the frame path) a frame of them,
        whole chunks and whole chunks of silence (what it speaks while it heard nothing)."""
        try:
            b64 = _returned_audio(data)
            audio = base64.b64decode(b64) if b64 is not None else None
        except (ValueError, TypeError, AttributeError) as exc:
            self.log.corrupt += 1  # audio that is not ours
            self.log.error(f"bad frame: {exc!r}")
            return
        if audio is None:
            if data.get("type") == "error":
                self.log.error(json.dumps(data.get("error")))
            return
        if len(audio) <= CHUNK_BYTES:
            self._on_chunk(audio, now)
            return
        for start in range(0, len(audio), CHUNK_BYTES):
            piece = audio[start:start + CHUNK_BYTES]
            if piece.count(0) != len(piece):
                self._on_chunk(piece, now)

    def _on_chunk(self, audio: bytes, now: float) -> None:
        try:
            session, chunk = _MARK.unpack_from(audio)
        except struct.error as exc:
            self.log.corrupt += 1  # audio that is not ours
            self.log.error(f"bad frame: {exc!r}")
            return
        if session != self.log.index or chunk >= len(self.log.sent):
            self.log.misrouted += 1
        elif chunk in self.log.received:
            self.log.duplicates += 1
        else:
            self.log.received[chunk] = now
            self.log.corrupt += audio[_MARK.size:] != _FILL
            self._outstanding -= 1
            if self._outstanding == 0 and not self._sending:
                self._settled.set()

    def _stop_counting(self) -> None:
        """Closing: what comes back (or fails) from now on is no longer a result."""
        self._sending = False
        self._outstanding = 0

    async def close(self) -> None:
        """End the session (``session.close`` on the gateway) and close the socket."""
        if self._ws is None:
            return
        self._stop_counting()
        with contextlib.suppress(Exception):
            if self._spec.mode in _GATEWAY_MODES:
                await self._ws.send(_CLOSE)
                if self._reader is not None:
                    # The gateway closes the socket after session.closed.
                    await asyncio.wait_for(asyncio.shield(self._reader), 3.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._ws.close(), 3.0)
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)


async def sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
