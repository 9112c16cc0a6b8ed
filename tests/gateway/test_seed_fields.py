"""The seed's fields on append, commit and output clear: parsed, typed and carried through
the input log unchanged (what each means is the worker's: tests/worker)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contract import messages as m
from gateway.protocol import ClientProtocolError
from gateway.protocol.parse import parse_client_frame

_JPEG = "/9j/4AAQSkZJRg=="


def _command(frame: dict[str, Any]) -> m.Command:
    parsed = parse_client_frame(json.dumps(frame), max_frame_bytes=1 << 20)
    assert parsed.command is not None
    # What the worker reads back from the log is what the gateway parsed.
    assert m.decode_command(m.encode_message(parsed.command)) == parsed.command
    return parsed.command


def test_a_ga_append_carries_nothing_else() -> None:
    command = _command({"type": "input_audio_buffer.append", "audio": "AAAA", "event_id": "e"})
    assert command == m.AppendAudio(audio=b"\0\0\0", event_id="e")


def test_the_seed_clients_append_keeps_every_field() -> None:
    command = _command({
        "type": "input_audio_buffer.append", "audio": "AAAA", "format": "pcm16",
        "sample_rate_hz": 16000, "duration_ms": 200, "audio_end_ms": 1200, "is_speech": True,
        "video_frames": [f"data:image/jpeg;base64,{_JPEG}", _JPEG], "vad": {"is_speech": True},
        "unknown": 1})
    assert command == m.AppendAudio(
        audio=b"\0\0\0", format="pcm16", sample_rate_hz=16000, is_speech=True,
        hints={"audio_end_ms": 1200, "duration_ms": 200, "vad": {"is_speech": True}},
        video_frames=(_JPEG, _JPEG))


def test_the_seeds_other_names_are_read() -> None:
    command = _command({"type": "input_audio_buffer.append", "delta": "AAAA",
                        "input_audio_format": "pcm_f32le", "sample_rate": 24000})
    assert command == m.AppendAudio(audio=b"\0\0\0", format="pcm_f32le", sample_rate_hz=24000)


def test_an_append_of_frames_alone_has_no_audio() -> None:
    command = _command({"type": "input_audio_buffer.append", "video_frames": [_JPEG]})
    assert command == m.AppendAudio(audio=b"", video_frames=(_JPEG,))


@pytest.mark.parametrize(("extra", "code", "param"), [
    ({"video_frames": ["not base64!"]}, "invalid_value", "video_frames[0]"),
    ({"video_frames": [""]}, "invalid_value", "video_frames[0]"),
    ({"video_frames": [7]}, "invalid_value", "video_frames[0]"),
    ({"video_frames": "x"}, "invalid_type", "video_frames"),
    ({"sample_rate_hz": 0}, "invalid_value", "sample_rate_hz"),
    ({"sample_rate_hz": 16000.5}, "invalid_type", "sample_rate_hz"),
    ({"format": 16}, "invalid_type", "format"),
    ({"is_speech": "yes"}, "invalid_type", "is_speech"),
])
def test_bad_seed_fields_are_refused_by_name(extra: dict[str, Any], code: str, param: str) -> None:
    frame = {"type": "input_audio_buffer.append", "audio": "AAAA", **extra}
    with pytest.raises(ClientProtocolError) as caught:
        parse_client_frame(json.dumps(frame), max_frame_bytes=1 << 20)
    assert (caught.value.code, caught.value.param) == (code, param)


def test_an_append_with_neither_audio_nor_frames_needs_audio() -> None:
    with pytest.raises(ClientProtocolError) as caught:
        parse_client_frame(json.dumps({"type": "input_audio_buffer.append", "format": "pcm16"}),
                           max_frame_bytes=1 << 20)
    assert (caught.value.code, caught.value.param) == ("missing_required_parameter", "audio")


@pytest.mark.parametrize(("frame", "expected"), [
    ({}, m.CommitInput()),
    ({"final": False, "response_create": True, "is_speech": False},
     m.CommitInput(final=False, create_response=True, is_speech=False)),
    ({"create_response": False}, m.CommitInput(create_response=False)),
])
def test_commit_options(frame: dict[str, Any], expected: m.CommitInput) -> None:
    assert _command({"type": "input_audio_buffer.commit", **frame}) == expected


def test_output_clear_names_its_response() -> None:
    command = _command({"type": "output_audio_buffer.clear", "response_id": "resp_1"})
    assert command == m.ClearOutputAudio(response_id="resp_1")
