"""Output backpressure through real processes: a client that stops reading in the middle of a
long loopback response. The gateway tells the worker (``output.backpressure``), which ends the
response ``failed`` / ``output_backpressure``; a client that never reads is closed 1013
``output_stalled`` and its session stays detached and resumable. Either way, once the client
reads every event arrives exactly once, in order.

The client's socket has a tiny receive buffer and the gateway a tiny send buffer
(``SOCKET_SEND_BUFFER_BYTES``), so the kernels hold little and the gateway's sends block soon.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import struct
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from store.keys import SessionKeys
from tests.e2e.helpers import PUSH_TO_TALK_SESSION
from tests.e2e.stack import Proc, Stack, http_answer, wait_for
from tests.gateway.strict import validate_server_event

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CHUNK_BYTES = 1920  # 40 ms of pcm16 at 24 kHz: what the loopback sends per audio delta
CHUNKS = 200  # an 8 s turn: the loopback plays it back at real-time pace
TINY_BUFFER = 4096
BACKPRESSURE_METRIC = "duplex_gateway_output_backpressure_total"
STALLS_METRIC = "duplex_gateway_output_stalls_total"

Event = dict[str, Any]


def metric(gateway: Proc, name: str) -> float:
    """One counter of the gateway's /metrics."""
    answer = http_answer(gateway.http_url + "/metrics")
    assert answer is not None and answer[0] == 200
    for line in answer[1].splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not exported")


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` (blocking calls) off the event loop, so the client's own writes
    keep going meanwhile; fails with ``what`` after the stack's deadline."""
    await asyncio.to_thread(wait_for, condition, what)


async def connect_client(url: str, *, receive_buffer: int | None = None) -> ClientConnection:
    """A raw websocket client; with ``receive_buffer``, on a socket whose kernel receive
    buffer is that small (set before connecting, so the TCP window is small too). It holds
    at most two frames of its own and sends no pings (a client that does not read could not
    answer the gateway's pong). No compression: the test's audio is mostly zeros, which
    would otherwise shrink to nothing on the wire."""
    address = urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (address.hostname, address.port))
    return await connect(url, sock=sock, max_queue=2, ping_interval=None, max_size=None,
                         compression=None)


async def receive(ws: ClientConnection) -> Event:
    """The next event, strictly validated as the SDK would."""
    event: Event = json.loads(await asyncio.wait_for(ws.recv(), 10))
    validate_server_event(event)
    return event


async def receive_until(ws: ClientConnection, stop: str, sink: list[Event]) -> Event:
    """Append events to ``sink`` until one of type ``stop``; returns it."""
    while True:
        event = await receive(ws)
        sink.append(event)
        if event["type"] == stop:
            return event


async def start_long_response(ws: ClientConnection) -> Event:
    """Open a push-to-talk session, commit CHUNKS marked 40 ms chunks and ask for the
    loopback's answer; returns ``session.created``."""
    audio = b"".join(struct.pack("<I", index) + bytes(CHUNK_BYTES - 4)
                     for index in range(CHUNKS))
    second = 25 * CHUNK_BYTES
    await ws.send(json.dumps({"type": "session.update", "session": PUSH_TO_TALK_SESSION}))
    for start in range(0, len(audio), second):
        await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                  "audio": base64.b64encode(audio[start:start + second]).decode()}))
    created = await receive(ws)
    assert created["type"] == "session.created", created
    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    await ws.send(json.dumps({"type": "response.create"}))
    return created


def played_chunks(events: list[Event]) -> list[int]:
    """The marker of every audio delta, in the order received."""
    return [int(struct.unpack_from("<I", base64.b64decode(e["delta"]))[0])
            for e in events if e["type"] == "response.output_audio.delta"]


def assert_exactly_once_in_order(events: list[Event]) -> None:
    """The log's events arrived numbered 1, 2, 3, ... with no gap and no repeat."""
    seqs = [e["server_event_seq"] for e in events if "server_event_seq" in e]
    assert seqs == list(range(1, len(seqs) + 1)), "0 lost, 0 duplicated, 0 reordered"


async def close_session(ws: ClientConnection, events: list[Event]) -> None:
    await ws.send(json.dumps({"type": "session.close"}))
    await receive_until(ws, "session.closed", events)
    await ws.close()


async def test_a_client_that_stops_reading_gets_its_response_ended_and_loses_nothing(
    stack: Stack,
) -> None:
    """The client stops reading once it asked for an 8 s answer. When more than 24 events are
    untaken the gateway tells the worker, once, and the answer ends failed with
    output_backpressure. When the client reads again it gets every event, in order, numbered
    without a gap or a repeat: the played audio is a prefix of the turn, cut short."""
    stack.env.update({"DUPLEX_GATEWAY_OUTPUT_BACKPRESSURE_EVENTS": "24",
                      "DUPLEX_GATEWAY_SOCKET_SEND_BUFFER_BYTES": str(TINY_BUFFER)})
    gateway = stack.gateway()
    stack.worker()
    ws = await connect_client(gateway.ws_url, receive_buffer=TINY_BUFFER)
    await start_long_response(ws)

    await until(lambda: metric(gateway, BACKPRESSURE_METRIC) >= 1,
                "the gateway's output backpressure")
    events: list[Event] = []
    done = await receive_until(ws, "response.done", events)
    assert done["response"]["status"] == "failed", done
    assert done["response"]["status_details"]["error"]["code"] == "output_backpressure", done
    assert_exactly_once_in_order(events)
    chunks = played_chunks(events)
    assert chunks == list(range(len(chunks))), "the audio arrived whole and in order"
    assert 0 < len(chunks) < CHUNKS, "the answer was cut short"
    assert metric(gateway, BACKPRESSURE_METRIC) == 1, "once per crossing"
    await close_session(ws, events)
    assert_exactly_once_in_order(events)
    print(f"\nbackpressure after {len(chunks)} of {CHUNKS} chunks;"
          f" {len(events)} events, each once, in order")


async def test_a_client_that_never_reads_is_closed_1013_and_resumes_without_a_gap(
    stack: Stack,
) -> None:
    """The client stops reading and never starts again by itself. Once a send has been
    blocked for OUTPUT_STALL_TIMEOUT_S the session is detached (not ended) and the connection
    closed: reading what it had buffered, the client finds close 1013 output_stalled after
    it. It resumes from the last event it got and receives the rest of the answer, which
    completed: every event once, in order, every chunk of the turn played."""
    stack.env.update({"DUPLEX_GATEWAY_OUTPUT_STALL_TIMEOUT_S": "2",
                      "DUPLEX_GATEWAY_SOCKET_SEND_BUFFER_BYTES": str(TINY_BUFFER)})
    gateway = stack.gateway()
    stack.worker()
    ws = await connect_client(gateway.ws_url, receive_buffer=TINY_BUFFER)
    created = await start_long_response(ws)
    session_id, token = created["session_id"], created["resume_token"]

    await until(lambda: metric(gateway, STALLS_METRIC) >= 1, "the gateway's stall close")
    events: list[Event] = []
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            events.append(await receive(ws))
    assert closed.value.rcvd is not None, "closed without a close frame (1006)"
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1013, "output_stalled")
    redis = Redis.from_url(stack.url)
    assert await redis.hget(SessionKeys(session_id).record, "state") == b"detached"
    await redis.aclose()

    last = max(e.get("server_event_seq", 0) for e in events)
    ws = await connect_client(gateway.ws_url)
    await ws.send(json.dumps({"type": "session.resume", "session_id": session_id,
                              "resume_token": token, "last_received_server_event_seq": last}))
    resumed = await receive(ws)
    assert resumed["type"] == "session.resumed", resumed
    assert resumed["replay_from"] == last + 1
    done = await receive_until(ws, "response.done", events)
    assert done["response"]["status"] == "completed", done
    assert_exactly_once_in_order(events)
    assert played_chunks(events) == list(range(CHUNKS)), "every chunk once, in order"
    await close_session(ws, events)
    print(f"\nstalled after {last} events, closed 1013, resumed: {len(events)} events, each"
          " once, in order")
