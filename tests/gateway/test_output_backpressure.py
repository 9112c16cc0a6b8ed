"""The I/O-free half of output backpressure: what :class:`OutputBacklog` counts and when it
reports a crossing, and what :class:`ConnectionCore` decides when a send to the client stalled.

No Redis and no clock: inputs are method calls, outputs values and actions; only the last test
serves a websocket (with real uvicorn) to find its socket as the driver does. The end-to-end
behaviour (a real client that stops reading) is ``tests/e2e/test_output_backpressure.py``.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect

from contract import messages as m
from gateway.protocol.actions import CloseConnection, DetachLease, SendFrame
from gateway.protocol.backlog import Backlog, OutputBacklog, OutputLimits
from gateway.protocol.connection import OUTPUT_STALLED, ConnectionCore
from gateway.protocol.errors import CloseCode
from gateway.protocol.transitions import ConnectionState
from gateway.wsprotocol import GatewayWebSocketProtocol, transport_of

SID = "sess_0123456789abcdefghijkl"
ENTRY = b"x" * 300  # one log entry: 300 bytes in the log, 400 as the client gets it
ENTRY_CLIENT_BYTES = 400
UNLIMITED = OutputLimits(max_events=0, max_bytes=0)


def entries(n: int) -> list[bytes]:
    return [ENTRY] * n


def attached() -> ConnectionCore:
    """A core attached to a freshly opened session, its actions drained."""
    core = ConnectionCore(max_frame_bytes=1 << 16, url_model="loopback")
    core.quiet_period_over()
    core.open_succeeded(SID, resume_token="tok", generation=3, model="loopback")
    core.actions_to_run()
    return core


# --------------------------------------------------------------------------- what is counted


def test_events_after_the_last_taken_one_count_up_to_the_highest_known() -> None:
    """Every event numbered after the last one the websocket took counts, also those known
    only by number (a push whose payloads the connection never saw in full)."""
    backlog = OutputBacklog(UNLIMITED)
    backlog.seen(1, entries(3))
    assert backlog.backlog().events == 3
    backlog.taken(1)
    assert backlog.backlog().events == 2
    backlog.seen(10, entries(1))  # 4..9 are in the log too, unseen
    assert backlog.backlog() == Backlog(events=9, bytes=3 * ENTRY_CLIENT_BYTES)


def test_bytes_are_the_untaken_events_as_the_client_gets_them_plus_the_write_buffer() -> None:
    """An entry counts a third more than the log keeps (audio becomes base64), once however
    often it is seen, until it is taken; the transport's write buffer adds its bytes."""
    backlog = OutputBacklog(UNLIMITED)
    backlog.seen(1, entries(2))
    backlog.seen(1, entries(2))  # a read of what a push announced
    assert backlog.backlog(buffered_bytes=50).bytes == 2 * ENTRY_CLIENT_BYTES + 50
    backlog.taken(2)
    assert backlog.backlog() == Backlog(events=0, bytes=0)


def test_a_connection_starts_counting_where_its_client_stands() -> None:
    """A resumed connection counts from the client's position: entries it already has are
    never counted, even when a read returns them."""
    backlog = OutputBacklog(UNLIMITED, taken_seq=5)
    backlog.seen(4, entries(4))
    assert backlog.backlog() == Backlog(events=2, bytes=2 * ENTRY_CLIENT_BYTES)


def test_a_jump_forward_drops_every_skipped_event() -> None:
    """A frame taken far ahead (a resync skipped trimmed events) leaves nothing behind."""
    backlog = OutputBacklog(UNLIMITED)
    backlog.seen(1, entries(2))
    backlog.seen(4000, entries(1))
    backlog.taken(4000)
    assert backlog.backlog() == Backlog(events=0, bytes=0)


def test_an_older_frame_taken_after_a_rewind_moves_nothing() -> None:
    """Numbers reused after a rewound log never raise the count."""
    backlog = OutputBacklog(UNLIMITED)
    backlog.seen(1, entries(5))
    backlog.taken(5)
    backlog.taken(3)
    assert backlog.backlog().events == 0 and backlog.taken_seq == 5


# --------------------------------------------------------------------------- crossings


def test_a_crossing_is_reported_once_and_again_only_after_falling_to_half() -> None:
    """Over 4 events: reported once, not again while it stays over, nor after falling only to
    3 and rising again; once at 2 (half) it is re-armed, and the next crossing is reported."""
    backlog = OutputBacklog(OutputLimits(max_events=4, max_bytes=0))
    backlog.seen(1, entries(4))
    assert backlog.crossed() is None  # at the limit is not over it
    backlog.seen(5, entries(1))
    assert backlog.crossed() == Backlog(events=5, bytes=5 * ENTRY_CLIENT_BYTES)
    assert backlog.crossed() is None
    backlog.taken(2)  # 3 left: over half
    backlog.seen(6, entries(2))
    assert backlog.crossed() is None
    backlog.taken(5)  # 2 left: half
    backlog.seen(8, entries(3))
    crossed = backlog.crossed()
    assert crossed is not None and crossed.events == 5


def test_the_byte_limit_counts_the_write_buffer_and_needs_both_under_half_to_rearm() -> None:
    """Bytes alone cross (the write buffer included), and the crossing is re-armed only once
    events and bytes are both at or under half."""
    backlog = OutputBacklog(OutputLimits(max_events=100, max_bytes=1000))
    backlog.seen(1, entries(2))  # 800 bytes
    assert backlog.crossed(buffered_bytes=100) is None
    assert backlog.crossed(buffered_bytes=300) == Backlog(events=2, bytes=1100)
    backlog.taken(2, buffered_bytes=600)  # nothing untaken, but the buffer is over half
    backlog.seen(3, entries(3))
    assert backlog.crossed() is None
    backlog.taken(5, buffered_bytes=500)
    backlog.seen(6, entries(3))
    assert backlog.crossed() == Backlog(events=3, bytes=1200)


def test_limits_of_zero_never_cross() -> None:
    """0 turns a bound off: any backlog is allowed."""
    backlog = OutputBacklog(UNLIMITED)
    backlog.seen(1, entries(10_000))
    assert backlog.crossed(buffered_bytes=1 << 30) is None


# --------------------------------------------------------------------------- the core


def test_each_logged_event_frame_names_its_seq_and_the_gateways_own_frames_none() -> None:
    """The driver learns from SendFrame.seq which event the websocket took; a notice (here
    session.created) carries 0."""
    core = ConnectionCore(max_frame_bytes=1 << 16, url_model="loopback")
    core.quiet_period_over()
    core.open_succeeded(SID, resume_token="tok", generation=1, model="loopback")
    created = [a for a in core.actions_to_run() if isinstance(a, SendFrame)]
    assert [a.seq for a in created] == [0]
    core.receive_log_entries(1, [m.encode_message(m.HeartbeatAck())] * 2)
    frames = [a for a in core.actions_to_run() if isinstance(a, SendFrame)]
    assert [a.seq for a in frames] == [1, 2]
    assert [json.loads(a.text)["server_event_seq"] for a in frames] == [1, 2]


def test_a_stalled_send_detaches_the_session_then_closes_1013() -> None:
    """The session is detached first (the full grace: not departed), then the connection is
    closed 1013 output_stalled; nothing is delivered after that."""
    core = attached()
    core.output_stalled()
    assert core.actions_to_run() == [
        DetachLease(generation=3),
        CloseConnection(code=CloseCode.TRY_AGAIN_LATER, reason=OUTPUT_STALLED),
    ]
    assert core.state is ConnectionState.CLOSED
    core.receive_log_entries(1, [m.encode_message(m.HeartbeatAck())])
    assert core.actions_to_run() == []


def test_a_stall_after_the_terminal_event_was_decided_still_closes_1013() -> None:
    """The terminal event's frame stalled with the rest: the client never got it, so it is
    told to come back (1013) and replays it; there is no session left to detach."""
    core = attached()
    core.receive_log_entries(1, [m.encode_message(m.SessionClosed(reason="client_close"))])
    core.actions_to_run()
    core.output_stalled()
    assert core.actions_to_run() == [
        CloseConnection(code=CloseCode.TRY_AGAIN_LATER, reason=OUTPUT_STALLED)]


# --------------------------------------------------------------------------- the socket


@pytest.mark.timeout(30)
async def test_the_driver_reaches_the_socket_of_a_websocket_served_by_uvicorn() -> None:
    """ASGI hides the socket; the driver finds it through uvicorn's protocol (the gateway's own
    websocket protocol class, as it serves). Without it the write buffer would go uncounted
    and SOCKET_SEND_BUFFER_BYTES unapplied, silently: so a real server is asked here."""
    reached: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

    async def handler(websocket: WebSocket) -> None:
        await websocket.accept()
        transport = transport_of(websocket.scope)
        if transport is None:
            reached.set_result(None)
        else:
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            reached.set_result(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
        await websocket.close()

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # connections wait in the backlog until uvicorn accepts them
    server = uvicorn.Server(uvicorn.Config(
        Starlette(routes=[WebSocketRoute("/ws", handler)]), ws=GatewayWebSocketProtocol,
        lifespan="off", log_level="warning"))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        port = listener.getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}/ws") as client:
            await client.wait_closed()
        send_buffer = await reached
        assert send_buffer is not None, "no transport under the websocket"
        assert 4096 <= send_buffer < 16384  # set: Linux doubles it; its default is 16 KiB
    finally:
        server.should_exit = True
        await serving
        listener.close()
