"""uvicorn's sans-I/O websocket protocol, with a documented outcome for text that is not UTF-8.

RFC 6455 §8.1: an endpoint that receives a text frame whose payload is not UTF-8 must fail the
connection. uvicorn does so itself, with close 1007, but logs a full traceback for every such
frame (a client could flood the log with them) and never tells the app, so the client gets no
``error`` event and the session is not detached the way other abnormal ends are.

:class:`GatewayWebSocketProtocol` hands such a payload to the app instead, as a receive event
the driver recognises by :data:`INVALID_TEXT_KEY`; the connection core then answers
``invalid_json`` and closes 1007 (``ConnectionCore.receive_invalid_text``). Each one is logged as
one line, rate-limited. A message over the size limit gets the ``event_too_large`` error
event before the close 1009 the websocket layer sends; the rest of that message (and whatever
follows) is then read and dropped until the client closes or goes quiet, so the close is not
a TCP reset that would lose the answer. A handshake refused with an HTTP
answer (a wrong key: 401) counts as complete, so uvicorn does not log an ERROR for each one.
The connection's transport is published to the app in ``scope["extensions"][TRANSPORT_KEY]``:
ASGI gives an app no handle on its socket, and the gateway measures a client that does not
read by the transport's write buffer (and may set its ``SO_SNDBUF``). So is
:meth:`GatewayWebSocketProtocol.send_text_now` (``SEND_NOW_KEY``): a text message written at
once when nothing would make the ASGI send wait or refuse it, without the coroutines the ASGI
send passes through for every frame (Starlette's WebSocket, its exception middleware's
wrapper, uvicorn's send).
Everything else is uvicorn's ``websockets-sansio`` implementation as is.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, cast

from uvicorn._types import ASGIReceiveEvent, ASGISendEvent
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState, PayloadTooBig
from websockets.frames import Frame, Opcode

from gateway.protocol.errors import ClientProtocolError, ErrorCode
from gateway.protocol.render import encode_frame, render_error
from runtime.ratelog import RateLimitedLog

__all__ = [
    "INVALID_TEXT_KEY",
    "SEND_NOW_KEY",
    "TRANSPORT_KEY",
    "GatewayWebSocketProtocol",
    "send_now_of",
    "transport_of",
]

#: Set (to True) on a ``websocket.receive`` event whose ``bytes`` are a text frame's payload
#: that is not UTF-8. No ASGI server sets it, so an app can tell such a frame from a binary one.
INVALID_TEXT_KEY = "duplex_gateway.invalid_text"
#: The ``scope["extensions"]`` key under which the connection's asyncio transport is given.
TRANSPORT_KEY = "duplex_gateway.transport"
#: The ``scope["extensions"]`` key of the connection's
#: :meth:`~GatewayWebSocketProtocol.send_text_now`.
SEND_NOW_KEY = "duplex_gateway.send_now"
# A connection whose message was too large keeps reading (and dropping) what the client still
# sends, so its close is not a reset: until the client has sent nothing for the first time
# (what it sent last is read by then), and never longer than the second.
_REFUSED_QUIET_S = 2.0
_REFUSED_DRAIN_MAX_S = 20.0


class GatewayWebSocketProtocol(WebSocketsSansIOProtocol):
    """``websockets-sansio`` with text that is not UTF-8 passed to the app, marked, not
    closed here with a traceback in the log."""

    #: One line per bad frame, at most every 10 s for the whole process (shared by all
    #: connections: many clients must not flood the log either).
    invalid_text_log: ClassVar[RateLimitedLog] = RateLimitedLog(
        logging.getLogger(__name__), interval_s=10.0)

    #: Set once a too-large message was refused: the rest of what the client sends is read
    #: and dropped until it closes (or goes quiet: :data:`_REFUSED_QUIET_S`).
    draining_refused: bool = False
    # The loop's time at which the drain began and at which the client last sent something.
    _drain_started: float = 0.0
    _drain_heard: float = 0.0

    def handle_parser_exception(self) -> None:
        # A message over the limit (uvicorn's ws_max_size is MAX_FRAME_BYTES): the websocket
        # layer has queued its close 1009; the client gets the documented error event first,
        # and the app the disconnect (the session is detached, resumable).
        if not isinstance(self.conn.parser_exc, PayloadTooBig):
            super().handle_parser_exception()
            return
        self.transport.write(_too_large_frame())
        assert self.conn.close_sent is not None
        self.queue.put_nowait({"type": "websocket.disconnect", "code": self.conn.close_sent.code,
                               "reason": self.conn.close_sent.reason})
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = self.draining_refused = True
        # Closing now, with the refused message's rest unread in the socket, would make the
        # kernel reset the connection, and a client that has not read our frames yet loses
        # them (it sees 1006, not event_too_large and 1009). So: finish our side (FIN after
        # the frames), drop what still comes until the client closes, bounded in time.
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._drain_started = self._drain_heard = self.loop.time()
        self.loop.call_later(_REFUSED_QUIET_S, self._end_drain)

    def _end_drain(self) -> None:
        """Close the drained socket once the client went quiet (a slow client may still be
        sending the refused message's rest, which a close now would meet with a reset) or
        the drain's bound passed; else look again when it could have."""
        now = self.loop.time()
        quiet_at = self._drain_heard + _REFUSED_QUIET_S
        give_up_at = self._drain_started + _REFUSED_DRAIN_MAX_S
        if now >= min(quiet_at, give_up_at) or self.transport.is_closing():
            self.transport.close()
            return
        self.loop.call_at(min(quiet_at, give_up_at), self._end_drain)

    def data_received(self, data: bytes) -> None:
        if self.draining_refused:
            # The rest of a refused message, or whatever follows it: dropped.
            self._drain_heard = self.loop.time()
            return
        super().data_received(data)

    async def run_asgi(self) -> None:
        extensions = cast(dict[str, object], self.scope.setdefault("extensions", {}))
        extensions[TRANSPORT_KEY] = self.transport
        extensions[SEND_NOW_KEY] = self.send_text_now
        await super().run_asgi()

    def send_text_now(self, text: str) -> bool:
        """Write one text message now, as the ASGI send would, when that send would neither
        wait nor refuse: the handshake done, no close sent or received, the connection up and
        the transport taking writes (not paused at its high-water mark).

        Returns:
            False, having sent nothing, when the caller must use the ASGI send instead: it
            waits for the transport, or raises for a connection that is over.
        """
        if (self.close_sent or self.disconnected or not self.handshake_complete
                or self.initial_response is not None or not self.writable.is_set()
                or self.transport.is_closing()):
            return False
        try:
            self.conn.send_text(text.encode())
        except InvalidState:  # a close received: the ASGI send says so (ClientDisconnected)
            return False
        self.transport.write(b"".join(self.conn.data_to_send()))
        return True

    async def send(self, message: ASGISendEvent) -> None:
        await super().send(message)
        if (message["type"] == "websocket.http.response.body"
                and not message.get("more_body", False)):
            # The handshake was answered with an HTTP response (a 401, a 503): it is over.
            # uvicorn would otherwise log an ERROR ("returned without completing handshake")
            # for every refused connection, which any client can repeat at will.
            self.handshake_complete = True

    def send_receive_event_to_app(self) -> None:
        # The common case: ASCII is UTF-8, so the check costs one C scan and no decode.
        if self.curr_msg_data_type != "text" or self.close_sent:
            super().send_receive_event_to_app()
            return
        payload = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
        if payload.isascii() or _is_utf8(payload):
            self.frames = [payload]  # joined once: the base class won't join again
            super().send_receive_event_to_app()
            return
        self.frames = []
        peer = f"{self.client[0]}:{self.client[1]}" if self.client else "unknown peer"
        self.invalid_text_log.warning(
            "invalid_utf8", "%s sent a text frame that is not UTF-8; closing 1007", peer)
        event = {"type": "websocket.receive", "bytes": bytes(payload), INVALID_TEXT_KEY: True}
        self.queue.put_nowait(cast(ASGIReceiveEvent, event))
        # As for any message: read no more until the app has taken this one.
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()


def _is_utf8(payload: bytes) -> bool:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _too_large_frame() -> bytes:
    """The ``event_too_large`` error event as one unmasked text frame (uncompressed, which a
    permessage-deflate connection allows per message)."""
    error = ClientProtocolError(ErrorCode.EVENT_TOO_LARGE,
                                "The frame is larger than the server's maximum frame size.")
    text = encode_frame(render_error(error, f"event_{secrets.token_hex(6)}"))
    return Frame(Opcode.TEXT, text.encode()).serialize(mask=False)


# What the driver uses of the socket's transport. Checked by its methods, not by class:
# uvloop's transports have them all but are no asyncio.WriteTransport subclass.
_TRANSPORT_METHODS = ("get_write_buffer_size", "get_write_buffer_limits", "get_extra_info", "abort")


def transport_of(scope: Mapping[str, Any]) -> asyncio.WriteTransport | None:
    """The socket transport under the websocket of ``scope``, as
    :class:`GatewayWebSocketProtocol` publishes it (:data:`TRANSPORT_KEY`), asyncio's or
    uvloop's. Under another server (a test client) this is None: the gateway then counts no
    write buffer, sets no socket option and cannot drop a socket whose client never takes the
    close frame.
    """
    transport = scope.get("extensions", {}).get(TRANSPORT_KEY)
    if all(callable(getattr(transport, name, None)) for name in _TRANSPORT_METHODS):
        return cast("asyncio.WriteTransport", transport)
    return None


def send_now_of(scope: Mapping[str, Any]) -> Callable[[str], bool] | None:
    """The connection's :meth:`GatewayWebSocketProtocol.send_text_now`, as it publishes it
    (:data:`SEND_NOW_KEY`); None under another server, whose sends all go through ASGI."""
    send_now = scope.get("extensions", {}).get(SEND_NOW_KEY)
    return cast("Callable[[str], bool]", send_now) if callable(send_now) else None
