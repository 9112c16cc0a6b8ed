"""Bad input gets a documented error event or close code; the session keeps working."""

from __future__ import annotations

import asyncio
import json

import pytest
from redis.asyncio import Redis
from websockets.exceptions import ConnectionClosed

from gateway.client import DuplexClient
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
                             "audio": {"input": {"format": {"type": "audio/pcmu"}}}})
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
