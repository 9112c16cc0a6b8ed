"""Camera frames at the gateway's edge: how many per append, what each must be, how large, and
how many a second per connection, each refused with the seed's ``invalid_video_frames``."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from contract import messages as m
from gateway.protocol.actions import AppendCommands, SendFrame
from gateway.protocol.bounds import (
    MAX_STRING_CHARS,
    VideoBounds,
    VideoBudget,
    video_frame_bytes,
)
from gateway.protocol.connection import ConnectionCore
from gateway.protocol.errors import ClientProtocolError
from gateway.protocol.parse import parse_client_frame
from gateway.settings import GatewaySettings
from tests.gateway.strict import validate_server_event

JPEG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4
PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)
GIF = b"GIF89a" + bytes(64)
SID = "sess_0123456789abcdefghijkl"


def b64(image: bytes) -> str:
    return base64.b64encode(image).decode()


def append(*frames: Any, **extra: Any) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA",
                       "video_frames": list(frames), "event_id": "e", **extra})


def refused(data: str) -> tuple[str, str | None]:
    with pytest.raises(ClientProtocolError) as caught:
        parse_client_frame(data, max_frame_bytes=1 << 24)
    assert caught.value.client_event_id == "e"
    return caught.value.code, caught.value.param


def test_jpeg_and_png_frames_pass_as_bare_base64() -> None:
    """A JPEG, a PNG as a data URL: both kept, in order, the prefix stripped."""
    parsed = parse_client_frame(append(b64(JPEG), f"data:image/png;base64,{b64(PNG)}"),
                                max_frame_bytes=1 << 20)
    assert isinstance(parsed.command, m.AppendAudio)
    assert parsed.command.video_frames == (b64(JPEG), b64(PNG))


@pytest.mark.parametrize(("frames", "param"), [
    ((b64(JPEG),) * 3, "video_frames"),  # the seed's two per append
    ((b64(GIF),), "video_frames[0]"),  # not an image the seed takes
    ((b64(JPEG), b64(b"plain text")), "video_frames[1]"),
    (("not base64!",), "video_frames[0]"),
    (("",), "video_frames[0]"),
    ((7,), "video_frames[0]"),
])
def test_frames_out_of_bounds_are_the_seeds_invalid_video_frames(
        frames: tuple[Any, ...], param: str) -> None:
    assert refused(append(*frames)) == ("invalid_video_frames", param)


def test_a_frame_longer_than_any_other_string_is_bounded_by_its_own_bound() -> None:
    """Camera frames are exempt from the string bound (a JPEG is larger), also inside a
    turn.signal's payload; any other long string is still refused."""
    big = JPEG * (MAX_STRING_CHARS // len(JPEG) + 1)
    assert len(b64(big)) > MAX_STRING_CHARS
    parsed = parse_client_frame(append(b64(big)), max_frame_bytes=1 << 24)
    assert isinstance(parsed.command, m.AppendAudio)
    assert refused(append(b64(JPEG), note="x" * (MAX_STRING_CHARS + 1))) == (
        "invalid_value", "note")


def test_the_size_of_a_frame_is_read_without_decoding_it() -> None:
    for size in (1, 2, 3, 4, 1000, 1001, 1002):
        assert video_frame_bytes(b64(bytes(size))) == size


def test_the_budget_refuses_a_large_frame_and_a_fast_sender() -> None:
    """A frame over the byte bound is refused whatever the rate; the rate has one second of
    burst (never less than one append's two frames) and refills with time; a refused append
    costs nothing."""
    budget = VideoBudget(VideoBounds(max_frame_bytes=len(JPEG), max_frames_per_s=1.0), 0.0)
    with pytest.raises(ClientProtocolError) as caught:
        budget.charge((b64(JPEG + b"x"),), 0.0, "e")
    assert (caught.value.code, caught.value.param) == ("invalid_video_frames", "video_frames[0]")
    budget.charge((b64(JPEG), b64(JPEG)), 0.0, None)  # the burst: one whole append
    with pytest.raises(ClientProtocolError) as caught:
        budget.charge((b64(JPEG),), 0.5, "e")
    assert (caught.value.code, caught.value.param) == ("invalid_video_frames", "video_frames")
    budget.charge((b64(JPEG),), 1.0, None)  # a second refilled one frame
    unlimited = VideoBudget(VideoBounds(max_frame_bytes=0, max_frames_per_s=0), 0.0)
    for _ in range(100):
        unlimited.charge((b64(JPEG * 10), b64(JPEG)), 0.0, None)


def test_the_settings_make_the_bounds() -> None:
    settings = GatewaySettings(max_video_frame_bytes=10, max_video_frames_per_s=0.5)
    assert settings.video_bounds == VideoBounds(max_frame_bytes=10, max_frames_per_s=0.5)
    assert GatewaySettings().video_bounds == VideoBounds()


def test_a_connection_refuses_frames_over_its_rate_and_keeps_the_session() -> None:
    """Through the connection core: appends within the rate go upstream; one over it is
    answered invalid_video_frames (its audio refused with it), nothing goes upstream for it,
    and the connection and session go on."""
    core = ConnectionCore(max_frame_bytes=1 << 20, url_model="loopback",
                          video=VideoBounds(max_frames_per_s=2.0))
    core.quiet_period_over()
    core.open_succeeded(SID, resume_token="tok", generation=1, model="loopback")
    core.actions_to_run()
    core.receive_frame(append(b64(JPEG), b64(PNG)), now=10.0)
    core.receive_frame(append(b64(JPEG)), now=10.1)
    core.receive_frame(append(b64(PNG)), now=11.1)
    actions = core.actions_to_run()
    upstream = [command for action in actions if isinstance(action, AppendCommands)
                for _, command in action.entries]
    assert [c.video_frames for c in upstream if isinstance(c, m.AppendAudio)] == [
        (b64(JPEG), b64(PNG)), (b64(PNG),)]
    errors = [json.loads(a.text) for a in actions if isinstance(a, SendFrame)]
    for error in errors:
        validate_server_event(error)
    assert [(e["error"]["code"], e["error"]["param"]) for e in errors] == [
        ("invalid_video_frames", "video_frames")]
    assert core.session_id == SID
