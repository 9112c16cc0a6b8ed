"""Bad input gets a documented error event or close code; the session keeps working."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import websockets
from redis.asyncio import Redis
from websockets.exceptions import ConnectionClosed

from duplex_client import DuplexClient, RealtimeEvent
from store.keys import SessionKeys
from tests.e2e.helpers import STREAM_SESSION, collect_until, next_event
from tests.e2e.stack import Stack
from tests.store._support import spublish, spublish_raw

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

MAX_FRAME = 64 * 1024

BAD_FRAMES: list[tuple[str | bytes, str, str | None]] = [
    ("{not json", "invalid_json", None),
    (b"\xff\xfe", "invalid_json", None),
    ("[1, 2]", "invalid_event", None),
    (json.dumps({"event_id": "e1"}), "invalid_event", None),
    (json.dumps({"type": "no.such.event", "event_id": "e2"}), "unknown_event", "type"),
    (json.dumps({"type": "session.update", "event_id": "e3"}), "missing_required_parameter",
     "session"),
    (json.dumps({"type": "input_audio_buffer.append", "event_id": "e4"}),
     "missing_required_parameter", "audio"),
    (json.dumps({"type": "input_audio_buffer.append", "audio": "***", "event_id": "e5"}),
     "invalid_value", "audio"),
    (json.dumps({"type": "input_audio_buffer.append", "audio": "AA==", "event_id": "e6"}),
     "invalid_value", "audio"),
    (json.dumps({"type": "response.create", "response": 5, "event_id": "e7"}),
     "invalid_type", "response"),
    (json.dumps({"type": "session.resume", "session_id": "x", "resume_token": "y",
                 "event_id": "e8"}), "unsupported_session_resume", None),
]


@pytest.fixture
def gateway_url(stack: Stack) -> str:
    stack.env["DUPLEX_GATEWAY_MAX_FRAME_BYTES"] = str(MAX_FRAME)
    url = stack.gateway().ws_url
    stack.worker()
    return url


async def test_bad_frames_get_documented_errors_and_session_survives(gateway_url: str) -> None:
    """Each bad frame gets its error code (and event_id echo); the session still answers."""
    async with await DuplexClient.connect(gateway_url, session=STREAM_SESSION) as client:
        await collect_until(client, "session.updated", [])
        for frame, code, param in BAD_FRAMES:
            await client.send_raw(frame)
            error = await next_event(client)
            assert error.type == "error", frame
            assert error.data["error"]["code"] == code, frame
            assert error.data["error"].get("param") == param, frame
            sent = json.loads(frame) if code not in ("invalid_json",) else None
            if isinstance(sent, dict) and "event_id" in sent:
                assert error.data["error"]["event_id"] == sent["event_id"]
        await client.heartbeat()
        ack = await next_event(client)
        assert ack.type == "session.heartbeat_ack"


async def test_worker_refusals_are_error_events(gateway_url: str) -> None:
    """Semantic refusals come from the worker, in order, and the session goes on."""
    async with await DuplexClient.connect(gateway_url) as client:
        await collect_until(client, "session.updated", [])
        await client.cancel_response()
        error = await next_event(client)
        assert error.data["error"]["code"] == "response_cancel_not_active"
        await client.commit()
        error = await next_event(client)
        assert error.data["error"]["code"] == "input_audio_buffer_commit_empty"
        await client.update({"type": "realtime",
                             "audio": {"input": {"format": {"type": "audio/opus"}}}})
        error = await next_event(client)
        assert error.data["error"]["code"] == "unsupported_audio_format"
        await client.heartbeat()
        assert (await next_event(client)).type == "session.heartbeat_ack"


async def test_oversized_frame_closes_1009_and_session_resumes(gateway_url: str) -> None:
    """A frame over the limit closes with 1009; the session is detached, not lost."""
    client = await DuplexClient.connect(gateway_url, session=STREAM_SESSION)
    await collect_until(client, "session.updated", [])
    await client.send_raw(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": "A" * MAX_FRAME}))
    codes = []
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            event = await asyncio.wait_for(client.recv(), 10)
            codes.append(event.data.get("error", {}).get("code"))
    assert "event_too_large" in codes
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    resumed = await client.resume()
    assert resumed.type == "session.resumed"
    await client.heartbeat()
    event = await next_event(client)
    while event.type != "session.heartbeat_ack":
        event = await next_event(client)
    await client.aclose()


async def test_resume_with_wrong_token_is_refused(gateway_url: str) -> None:
    """A wrong resume token gets invalid_resume_token and close 1008."""
    async with await DuplexClient.connect(gateway_url) as client:
        intruder = DuplexClient(gateway_url)
        intruder.session_id, intruder.resume_token = client.session_id, "forged"
        with pytest.raises(Exception) as refused:
            await intruder.resume()
        assert getattr(refused.value, "code", None) == "invalid_resume_token"
        await intruder.aclose()
        unknown = DuplexClient(gateway_url)
        unknown.session_id, unknown.resume_token = "sess_nope", "x"
        with pytest.raises(Exception) as refused:
            await unknown.resume()
        assert getattr(refused.value, "code", None) == "session_resume_expired"
        await unknown.aclose()


@pytest.mark.logs_errors
async def test_garbage_on_the_session_channel_is_dropped(stack: Stack) -> None:
    """Malformed pushes on a session's output channel (only our scripts publish there) are
    dropped by the gateway; the connection keeps delivering from the log."""
    gateway = stack.gateway()
    stack.worker()
    redis = Redis.from_url(stack.redis.url)
    try:
        async with await DuplexClient.connect(gateway.ws_url) as client:
            await collect_until(client, "session.updated", [])
            assert client.session_id is not None
            channel = SessionKeys(client.session_id).output_channel
            for garbage in ([b"e"], [b"e", b"x", []], [b"e", 1, 5], [b"e", 1, [7]], [b"r"]):
                await spublish(redis, channel, garbage)
            await spublish_raw(redis, channel, b"\xc1")
            await client.heartbeat()
            ack = await next_event(client)
            assert ack.type == "session.heartbeat_ack"
    finally:
        await redis.aclose()


# --------------------------------------------------------------------------- frame bounds


async def expect_error(client: DuplexClient, code: str) -> dict[str, Any]:
    """The next event, which must be an ``error`` with ``code``; its ``error`` object."""
    event = await next_event(client)
    assert event.type == "error", event.data
    error: dict[str, Any] = event.data["error"]
    assert error["code"] == code, error
    return error


async def assert_worker_answers(client: DuplexClient) -> None:
    """The session and its worker still work: a heartbeat comes back through the worker."""
    await client.heartbeat()
    assert (await next_event(client)).type == "session.heartbeat_ack"


def nested_objects(levels: int) -> dict[str, Any]:
    """``levels`` objects, each the only member of the one around it."""
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


async def test_500_level_nested_tools_are_refused_and_the_worker_lives(gateway_url: str) -> None:
    """The review's 3 KB frame that killed the worker (RecursionError) is refused by the
    gateway before it reaches Redis; the worker and the session go on."""
    async with await DuplexClient.connect(gateway_url, session=STREAM_SESSION) as client:
        await collect_until(client, "session.updated", [])
        frame = json.dumps({"type": "session.update", "event_id": "deep1",
                            "session": {"tools": [nested_objects(500)]}})
        await client.send_raw(frame)
        error = await expect_error(client, "invalid_json")
        assert error["event_id"] == "deep1"
        assert error["param"].startswith("session.tools[0].a")
        await assert_worker_answers(client)


async def test_600_nested_brackets_are_refused_and_the_worker_lives(gateway_url: str) -> None:
    """The review's 1.2 KB frame of 600 nested ``[`` is refused; the worker goes on."""
    async with await DuplexClient.connect(gateway_url, session=STREAM_SESSION) as client:
        await collect_until(client, "session.updated", [])
        await client.send_raw('{"type":"session.update","session":{"tools":'
                              + "[" * 600 + "]" * 600 + "}}")
        await expect_error(client, "invalid_json")
        await assert_worker_answers(client)


async def test_lone_surrogate_in_close_reason_is_invalid_value(gateway_url: str) -> None:
    """``session.close`` with a reason no UTF-8 encoder can write is refused at the edge,
    naming the field; the session is not closed and still works."""
    async with await DuplexClient.connect(gateway_url, session=STREAM_SESSION) as client:
        await collect_until(client, "session.updated", [])
        await client.send_raw('{"type":"session.close","reason":"a\\ud800b","event_id":"c1"}')
        error = await expect_error(client, "invalid_value")
        assert (error["param"], error["event_id"]) == ("reason", "c1")
        await assert_worker_answers(client)


async def test_infinite_number_is_refused_and_the_next_update_is_answered(
    gateway_url: str
) -> None:
    """``1e400`` parses as inf; once stored, no later session.updated could be encoded and
    each was dropped silently. It is refused, and the next valid update is answered."""
    async with await DuplexClient.connect(gateway_url, session=STREAM_SESSION) as client:
        await collect_until(client, "session.updated", [])
        await client.send_raw('{"type":"session.update","session":{"type":"realtime",'
                              '"tools":[{"type":"function","name":"f",'
                              '"parameters":{"type":"number","maximum":1e400}}]}}')
        error = await expect_error(client, "invalid_value")
        assert error["param"] == "session.tools[0].parameters.maximum"
        await client.update({"type": "realtime", "instructions": "Be brief."})
        updated = await next_event(client)
        assert updated.type == "session.updated"
        assert updated.data["session"]["instructions"] == "Be brief."


async def send_not_utf8_text(client: DuplexClient, payload: bytes) -> None:
    """Put ``payload`` on the wire as a text frame, bytes as they are: websockets does not
    check bytes sent with ``text=True``, unlike any ``str`` it is given."""
    connection = client._ws
    assert connection is not None
    await connection.send(payload, text=True)


async def test_text_frame_not_utf8_closes_1007_and_the_session_resumes(
    gateway_url: str
) -> None:
    """RFC 6455 §8.1: invalid UTF-8 in a text frame fails the connection. The client gets
    invalid_json, then close 1007; the session was detached, so it resumes."""
    client = await DuplexClient.connect(gateway_url, session=STREAM_SESSION)
    await collect_until(client, "session.updated", [])
    await send_not_utf8_text(client, b'{"type":"session.heartbeat","x":"\xff\xfe"}')
    error = await expect_error(client, "invalid_json")
    assert "UTF-8" in error["message"]
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(client.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
    resumed = await client.resume()
    assert resumed.type == "session.resumed"
    await assert_worker_answers(client)
    await client.aclose()


async def test_resume_with_a_lone_surrogate_is_invalid_session_resume(gateway_url: str) -> None:
    """A resume_token or control_id no UTF-8 encoder can write can never match: the answer is
    invalid_session_resume and the connection stays (it used to be internal_error and close
    1011, which tells the client to retry). A good resume then works on it."""
    client = await DuplexClient.connect(gateway_url)
    await collect_until(client, "session.updated", [])
    session_id, token = client.session_id, client.resume_token
    await client.aclose()  # detached: resumable
    good = {"type": "session.resume", "session_id": session_id, "resume_token": token}
    async with websockets.connect(gateway_url) as ws:
        for field in ("resume_token", "control_id"):
            bad = json.dumps({**good, field: "PLACEHOLDER"}).replace("PLACEHOLDER", "t\\udc00")
            await ws.send(bad)
            answer = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert answer["type"] == "error", answer
            assert (answer["error"]["code"], answer["error"]["param"]) == (
                "invalid_session_resume", field)
        await ws.send(json.dumps(good))
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "session.resumed"


async def test_long_non_ascii_close_reason_ends_with_a_valid_close_frame(
    gateway_url: str
) -> None:
    """The close reason is the session.close reason; 62 x "é" is 124 UTF-8 bytes, one over
    what a close frame holds, which made the whole frame invalid (the client saw 1006). It is
    cut by bytes, on a character boundary: the client gets 1000."""
    client = await DuplexClient.connect(gateway_url)
    await collect_until(client, "session.updated", [])
    await client.close("é" * 62)
    closed_event: RealtimeEvent = await collect_until(client, "session.closed", [])
    assert closed_event.data["reason"] == "é" * 62  # the event keeps the whole reason
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(client.recv(), 10)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1000, "é" * 61)
    await client.aclose()
