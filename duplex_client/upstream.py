"""Everything the client sends upstream, in call order: sequenced commands numbered and kept
until the input log holds them, unsequenced ones sent once, heartbeats on a timer."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

__all__ = ["ResendBuffer", "Upstream"]


class ResendBuffer:
    """Numbers commands ``client_seq`` 1, 2, 3, ... and keeps the last ``size`` of them until a
    resume says the input log holds them; no I/O (the client sends what it returns)."""

    def __init__(self, size: int) -> None:
        #: The ``client_seq`` of the last command numbered.
        self.client_seq = 0
        self._kept: deque[tuple[int, str]] = deque(maxlen=size)

    def number(self, message: dict[str, Any]) -> str:
        """Give ``message`` the next ``client_seq``, keep it, and return its JSON text."""
        self.client_seq += 1
        message["client_seq"] = self.client_seq
        text = json.dumps(message)
        self._kept.append((self.client_seq, text))
        return text

    def confirm(self, confirmed: int) -> tuple[int, int] | None:
        """Forget the commands the input log holds (``client_seq`` up to ``confirmed``).

        Returns the first and last ``client_seq`` of the commands that fell out of the buffer
        before the log had them (a hole no resend can fill), None when there are none.
        """
        # A fresh client object on an old session numbers on from the log, not from 1.
        self.client_seq = max(self.client_seq, confirmed)
        while self._kept and self._kept[0][0] <= confirmed:
            self._kept.popleft()
        if self._kept and self._kept[0][0] > confirmed + 1:
            return confirmed + 1, self._kept[0][0] - 1
        return None

    def unconfirmed(self) -> list[str]:
        """The kept commands' texts, in order: what a resume sends again."""
        return [text for _, text in self._kept]


class Upstream:
    """Sends on the current connection (``connection()``; None while there is none)."""

    def __init__(self, resend_buffer: int,
                 connection: Callable[[], ClientConnection | None]) -> None:
        self.buffer = ResendBuffer(resend_buffer)
        # Commands are numbered, buffered and sent under one lock, and a resume's resends
        # hold it too: client_seq reaches the gateway in order (the store drops a lower one).
        self.lock = asyncio.Lock()
        self._connection = connection
        self._last_sent_at = 0.0
        #: The ``client_seq`` of the last command a socket took: what a resume that does not
        #: say what the log holds (the seed's dialect) counts as delivered.
        self.last_sent = 0
        self._heartbeats: asyncio.Task[None] | None = None

    async def sequenced(self, message: dict[str, Any]) -> None:
        """Number ``message``, keep it, and send it when connected."""
        async with self.lock:
            text = self.buffer.number(message)
            ws = self._connection()
            if ws is not None:
                self.mark_sent()
                try:
                    await ws.send(text)
                except ConnectionClosed:
                    return  # kept in the resend buffer; the next resume sends it again
                self.last_sent = self.buffer.client_seq

    async def unsequenced(self, message: dict[str, Any]) -> None:
        """A frame that is not worth resending (an ack, a heartbeat): dropped when the
        connection is down."""
        async with self.lock:
            ws = self._connection()
            if ws is None:
                return
            self.mark_sent()
            try:
                await ws.send(json.dumps(message))
            except ConnectionClosed:
                pass

    async def resend(self, ws: ClientConnection) -> None:
        """Send every kept command on ``ws`` (a resumed connection); the caller holds
        :attr:`lock`."""
        for text in self.buffer.unconfirmed():
            try:
                await ws.send(text)
            except ConnectionClosed:
                return  # the reader sees the drop and resumes again; the buffer keeps them
        self.last_sent = self.buffer.client_seq
        self.mark_sent()

    def mark_sent(self) -> None:
        self._last_sent_at = asyncio.get_running_loop().time()

    async def _send_heartbeats(self, interval: float) -> None:
        """Keep the session from the idle TTL while the caller only listens."""
        loop = asyncio.get_running_loop()
        while True:
            due = self._last_sent_at + interval
            if loop.time() < due:
                await asyncio.sleep(due - loop.time())
                continue
            # Marked even when disconnected: the resume that follows is activity itself.
            self.mark_sent()
            await self.unsequenced({"type": "session.heartbeat"})

    def start_heartbeats(self, interval: float | None) -> None:
        """A ``session.heartbeat`` whenever nothing was sent for ``interval`` seconds (None:
        never); a timer already running is kept."""
        if interval is None or (self._heartbeats is not None and not self._heartbeats.done()):
            return
        self._heartbeats = asyncio.create_task(self._send_heartbeats(interval),
                                               name="duplex-client-heartbeats")

    def stop_heartbeats(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            self._heartbeats = None
