"""Camera frames through real processes: every frame reaches the recording backend in order,
each with the audio unit of the append it rode; the loopback refuses the first with the
documented code and hears the audio; the gateway refuses frames out of bounds."""

from __future__ import annotations

import base64
import hashlib
import json
import re

import numpy as np
import pytest

from duplex_client import DuplexClient, RealtimeEvent
from inference_worker.output_writer import REPORT_APPLIED_BYTES
from store.keys import SessionKeys
from tests.e2e.helpers import PUSH_TO_TALK_SESSION, collect_until, next_event
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

MODEL_FRAME = 1920  # the fake's (and recording's) 80 ms at 24 kHz
UNIT_FRAMES = 6  # a 480 ms unit: whole model frames, so each append starts a model frame
UNITS = 5
_SAID = re.compile(r"<frame ([0-9a-f]{16}) unit (\d+)>")
UNIT_MS = 80 * UNIT_FRAMES


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def unit_audio(index: int) -> bytes:
    """Unit ``index``'s audio: loud enough to be echoed, a level of its own."""
    return np.full(MODEL_FRAME * UNIT_FRAMES, 2000 + 500 * index, dtype="<i2").tobytes()


def image(index: int) -> bytes:
    """A JPEG-headed image of its own per unit (the gateway checks the header only)."""
    return b"\xff\xd8\xff\xe0" + f"camera frame {index}".encode() * 40


def append(audio: bytes, frames: list[bytes], event_id: str) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "event_id": event_id,
                       "audio": base64.b64encode(audio).decode(),
                       "video_frames": [base64.b64encode(f).decode() for f in frames]})


async def test_every_frame_reaches_the_recording_backend_with_its_unit(stack: Stack) -> None:
    """Five units of audio, each with its own camera frame (the fourth with two, the
    seed's most), then silence: the echo's transcript names every frame, in order, each with
    the place of the audio unit it rode (its start, in ms of the session's input). (Sent at
    once, faster than a camera: the frame rate bound is off here, tested below.)"""
    stack.env["DUPLEX_GATEWAY_MAX_VIDEO_FRAMES_PER_S"] = "0"
    url = stack.gateway().ws_url
    stack.worker(backend="recording")
    frames = [[image(i)] for i in range(UNITS)]
    frames[3].append(b"\x89PNG\r\n\x1a\n" + b"composite of unit 3")
    expected = [(digest(f), str(UNIT_MS * i)) for i in range(UNITS) for f in frames[i]]
    events: list[RealtimeEvent] = []
    async with await DuplexClient.connect(url, session=PUSH_TO_TALK_SESSION) as client:
        await collect_until(client, "session.updated", events)
        assert client.capabilities["optional_input_modalities"] == ["video"]
        for i in range(UNITS):
            await client.send_raw(append(unit_audio(i), frames[i], f"unit_{i}"))
        await client.append_audio(bytes(MODEL_FRAME * 2 * 15))  # 1.2 s of silence ends it
        said = ""
        while len(_SAID.findall(said)) < len(expected):
            event = await next_event(client, timeout=20.0)
            events.append(event)
            assert event.type != "error", event.data
            if event.type == "response.output_audio_transcript.delta":
                said += event.data["delta"]
    assert _SAID.findall(said) == expected


async def test_the_loopback_refuses_the_first_frame_once_and_hears_the_audio(
        stack: Stack) -> None:
    """The loopback sees no video: its capabilities say so, the first append with frames is
    answered invalid_input_modality (param video_frames, the append's event_id), later ones
    are not, and the audio of every one is heard (the echo plays all of it back)."""
    url = stack.gateway().ws_url
    stack.worker()
    events: list[RealtimeEvent] = []
    session = {**PUSH_TO_TALK_SESSION, "extra_body": {"loopback_mode": "stream"}}
    async with await DuplexClient.connect(url, session=session) as client:
        await collect_until(client, "session.updated", events)
        assert client.capabilities["optional_input_modalities"] == []
        audio = bytes(4800)
        for i in range(3):
            await client.send_raw(append(audio, [image(i)], f"a{i}"))
        await client.send_raw(json.dumps({"type": "session.heartbeat"}))
        seen = await collect_until(client, "session.heartbeat_ack", events)
    errors = [e.data["error"] for e in events if e.type == "error"]
    assert [(e["code"], e["param"], e["event_id"]) for e in errors] == [
        ("invalid_input_modality", "video_frames", "a0")]
    echoed = sum(len(base64.b64decode(e.data["delta"])) for e in events
                 if e.type == "response.output_audio.delta")
    assert echoed == 3 * len(audio) and seen.type == "session.heartbeat_ack"


async def test_frames_out_of_bounds_are_refused_at_the_gateway(stack: Stack) -> None:
    """A GIF, three frames in one append, one over MAX_VIDEO_FRAME_BYTES and a sender over
    MAX_VIDEO_FRAMES_PER_S: each invalid_video_frames, and the session goes on."""
    stack.env["DUPLEX_GATEWAY_MAX_VIDEO_FRAME_BYTES"] = "1000"
    stack.env["DUPLEX_GATEWAY_MAX_VIDEO_FRAMES_PER_S"] = "2"
    url = stack.gateway().ws_url
    stack.worker(backend="recording")
    async with await DuplexClient.connect(url, session=PUSH_TO_TALK_SESSION) as client:
        await collect_until(client, "session.updated", [])
        audio = bytes(MODEL_FRAME * 2)
        bad = [
            (append(audio, [b"GIF89a" + bytes(20)], "gif"), "video_frames[0]"),
            (append(audio, [image(0)] * 3, "three"), "video_frames"),
            (append(audio, [b"\xff\xd8" + bytes(2000)], "large"), "video_frames[0]"),
        ]
        for frame, param in bad:
            await client.send_raw(frame)
            error = await next_event(client)
            assert (error.data["error"]["code"], error.data["error"]["param"]) == (
                "invalid_video_frames", param)
        await client.send_raw(append(audio, [image(0), image(1)], "burst"))
        await client.send_raw(append(audio, [image(2)], "fast"))
        error = await next_event(client)
        assert (error.data["error"]["code"], error.data["error"]["event_id"]) == (
            "invalid_video_frames", "fast")
        await client.send_raw(json.dumps({"type": "session.heartbeat"}))
        assert (await next_event(client)).type == "session.heartbeat_ack"


async def test_a_sessions_input_log_stays_small_however_much_video_it_carried(
        stack: Stack) -> None:
    """Twenty-four appends of a 150 kB camera frame each (3.6 MB of video), each sent once
    the model saw the one before: the session's input log never holds more than
    REPORT_APPLIED_BYTES and the append that crossed it (MEMORY USAGE), not the video it
    carried, though the events the echo writes would trim it only every 16 commands."""
    stack.env["DUPLEX_GATEWAY_MAX_VIDEO_FRAMES_PER_S"] = "0"
    url = stack.gateway().ws_url
    stack.worker(backend="recording")
    sent, largest = 0, 0
    async with await DuplexClient.connect(url, session=PUSH_TO_TALK_SESSION) as client:
        await collect_until(client, "session.updated", [])
        assert client.session_id is not None
        keys = SessionKeys(client.session_id)
        reader = stack.reader()
        said = ""
        for i in range(24):
            frame = image(i) + bytes(150_000)
            data = append(unit_audio(i)[:MODEL_FRAME * 2 * 2], [frame], f"a{i}")
            sent += len(data)
            await client.send_raw(data)
            while digest(frame) not in said:  # the model stepped it: applied, nothing unread
                event = await next_event(client)
                assert event.type != "error", event.data
                if event.type == "response.output_audio_transcript.delta":
                    said += event.data["delta"]
            memory = reader.memory_usage(keys.input_log)
            largest = max(largest, int(memory or 0))
        reader.close()
    bound = REPORT_APPLIED_BYTES + len(data) + 64 * 1024  # and the stream's own overhead
    assert largest < bound < sent / 4
