"""gateway.input_frames: a pulling worker's input cut on the model's frame boundaries."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from contract.messages import AppendAudio, Command, CommitInput, Heartbeat
from gateway.input_frames import (
    DEFAULT_INPUT_FORMAT,
    AudioFormat,
    FrameCuts,
    audio_microseconds,
    frame_cuts_for,
    input_format_of,
)

pytestmark = pytest.mark.timeout(10)

FRAME_US = 80_000  # Moshi's chunk_period_ms


def pcm16(ms: int, rate: int = 24_000) -> AppendAudio:
    return AppendAudio(audio=b"\0\0" * (rate * ms // 1000))


def cuts_of(cuts: FrameCuts, commands: Sequence[Command]) -> list[int]:
    """The positions (1-based) of the commands after which the input is cut."""
    return [n for n, command in enumerate(commands, 1) if cuts.cut_after(command)]


def test_20_ms_chunks_are_cut_every_fourth() -> None:
    """A frame is four 20 ms chunks: each append carries a frame, sent with its last."""
    assert cuts_of(FrameCuts(FRAME_US), [pcm16(20)] * 12) == [4, 8, 12]


def test_chunks_that_do_not_divide_a_frame_follow_the_frame_grid() -> None:
    """30 ms chunks: cut at the first chunk past each frame's end (90, 180, 240 ms...),
    never by chunk count, so the appends stay on the model's frames."""
    assert cuts_of(FrameCuts(FRAME_US), [pcm16(30)] * 8) == [3, 6, 8]


def test_any_command_but_audio_is_cut_at_once() -> None:
    """A commit or a heartbeat goes with the audio before it; the frame count goes on."""
    commands: list[Command] = [pcm16(20), CommitInput(), pcm16(20), pcm16(20), Heartbeat(),
                               pcm16(20)]
    assert cuts_of(FrameCuts(FRAME_US), commands) == [2, 5, 6]


def test_an_unknown_frame_cuts_only_what_is_not_audio() -> None:
    """No frame known (a worker that published none): audio is held to the bound alone."""
    assert cuts_of(FrameCuts(None), [pcm16(20)] * 8 + [CommitInput()]) == [9]


@pytest.mark.parametrize(("command", "micros"), [
    (pcm16(20), 20_000),
    (AppendAudio(audio=b"\0" * 640, format="pcm16", sample_rate_hz=16_000), 20_000),
    (AppendAudio(audio=b"\0" * 160, format="audio/pcmu"), 20_000),
    (AppendAudio(audio=b"\0" * 160, format="g711_alaw"), 20_000),
    (AppendAudio(audio=b"\0" * 3840, format="pcm_f32le"), 40_000),
])
def test_an_appends_duration_is_its_bytes_at_the_encoding_it_names(
        command: AppendAudio, micros: int) -> None:
    assert audio_microseconds(command) == micros


def test_appends_that_name_no_format_are_measured_at_the_sessions() -> None:
    """A G.711 session (its object's audio.input.format) cut on its own 20 ms chunks of 160
    bytes, which at the default format would be 3.3 ms each."""
    g711 = input_format_of({"audio": {"input": {"format": {"type": "audio/pcmu"}}}})
    assert g711 == AudioFormat(1, 8_000)
    chunk = AppendAudio(audio=b"\xff" * 160)
    assert cuts_of(FrameCuts(FRAME_US, g711), [chunk] * 8) == [4, 8]
    assert cuts_of(FrameCuts(FRAME_US), [chunk] * 8) == []


@pytest.mark.parametrize(("session", "expected"), [
    ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16_000}}}},
     AudioFormat(2, 16_000)),
    ({"audio": {"input": {"format": {"type": "audio/pcma"}}}}, AudioFormat(1, 8_000)),
    ({"audio": {"input": {"format": {"type": "audio/opus"}}}}, DEFAULT_INPUT_FORMAT),
    ({"audio": "not an object"}, DEFAULT_INPUT_FORMAT),
    (None, DEFAULT_INPUT_FORMAT),
])
def test_a_sessions_input_format_or_the_default(session: dict[str, object] | None,
                                                 expected: AudioFormat) -> None:
    assert input_format_of(session) == expected


def test_an_attachments_cuts_come_from_its_session_and_capabilities() -> None:
    """The frame from the capabilities' chunk_period_ms, the format from the session object:
    a G.711 session on 80 ms frames is cut every fourth 20 ms chunk; without the period,
    only by the hold's bound."""
    session = {"audio": {"input": {"format": {"type": "audio/pcma"}}}}
    chunk = AppendAudio(audio=b"\xd5" * 160)
    assert cuts_of(frame_cuts_for(session, {"chunk_period_ms": 80}), [chunk] * 8) == [4, 8]
    assert cuts_of(frame_cuts_for(session, {}), [chunk] * 8) == []
    assert cuts_of(frame_cuts_for(None, {"chunk_period_ms": "80"}), [pcm16(20)] * 4) == []
