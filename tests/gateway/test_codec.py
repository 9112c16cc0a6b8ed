"""Golden tables for the gateway codec: client frames in, Realtime GA JSON out."""

from __future__ import annotations

import ast
import base64
import gc
import json
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from contract import messages as m
from gateway.metrics import GatewayMetrics
from gateway.protocol import (
    CLIENT_EVENT_TYPES,
    MAX_SEQ,
    PARSE_ERROR_CODES,
    UNSUPPORTED_CLIENT_EVENT_TYPES,
    ClientProtocolError,
    CloseCode,
    ErrorCode,
    EventAck,
    InternalError,
    ParsedFrame,
    ResumeRequest,
    ResyncRequiredNotice,
    SessionCreatedNotice,
    SessionReplacedNotice,
    SessionResumedNotice,
    encode_frame,
    parse_client_frame,
    render_error,
    render_event,
    render_notice,
)
from gateway.protocol.errors import MAX_CLOSE_REASON_BYTES, fit_close_reason
from gateway.protocol.parse import (
    MAX_CLOSE_REASON_CHARS,
    MAX_CONTROL_ID_CHARS,
    MAX_DEPTH,
    MAX_INT,
    MAX_RESUME_FIELD_CHARS,
    MAX_STRING_CHARS,
    MAX_VALUES,
)
from runtime.heap import CollectorPauses
from tests.gateway.strict import EXTENSION_TYPES, validate_server_event

LIMIT = 1 << 20
PCM = b"\x01\x00\xff\x7f\x00\x80"
PCM_B64 = base64.b64encode(PCM).decode()
SESSION = {"type": "realtime", "instructions": "Be brief.", "output_modalities": ["audio"]}


def f(type_: str, **fields: Any) -> str:
    """A client frame of the given type and fields."""
    return json.dumps({"type": type_, **fields})


def parse(data: str | bytes) -> ParsedFrame:
    """Parse with a generous limit."""
    return parse_client_frame(data, max_frame_bytes=LIMIT)


# --------------------------------------------------------------------------- client frames

UPDATE, APPEND, COMMIT = "session.update", "input_audio_buffer.append", "input_audio_buffer.commit"
CREATE, CANCEL, CLOSE = "response.create", "response.cancel", "session.close"
HEARTBEAT, RESUME, ACK = "session.heartbeat", "session.resume", "session.event_ack"
LAST = "last_received_server_event_seq"
TOKEN: dict[str, Any] = {"session_id": "sess_1", "resume_token": "tok"}


def cmd(command: m.Command, client_seq: int | None = None) -> ParsedFrame:
    """The expected parse of a command frame."""
    return ParsedFrame(command=command, client_seq=client_seq)


ACCEPTED: list[tuple[str, str, ParsedFrame]] = [
    (
        "update",
        f(UPDATE, event_id="c1", session=SESSION),
        cmd(m.UpdateSession(session=SESSION, event_id="c1")),
    ),
    ("append", f(APPEND, audio=PCM_B64), cmd(m.AppendAudio(audio=PCM))),
    ("append-empty", f(APPEND, audio=""), cmd(m.AppendAudio(audio=b""))),
    ("commit", f(COMMIT, event_id="c2"), cmd(m.CommitInput(event_id="c2"))),
    ("clear", f("input_audio_buffer.clear"), cmd(m.ClearInput())),
    ("create", f(CREATE), cmd(m.CreateResponse())),
    ("create-null", f(CREATE, response=None), cmd(m.CreateResponse())),
    ("create-options", f(CREATE, response={"k": [1]}), cmd(m.CreateResponse(response={"k": [1]}))),
    ("cancel", f(CANCEL), cmd(m.CancelResponse())),
    ("cancel-id", f(CANCEL, response_id="resp_1"), cmd(m.CancelResponse(response_id="resp_1"))),
    ("heartbeat", f(HEARTBEAT), cmd(m.Heartbeat())),
    ("close", f(CLOSE, event_id="c3"), cmd(m.CloseSession(reason="client_close", event_id="c3"))),
    ("close-null", f(CLOSE, reason=None), cmd(m.CloseSession(reason="client_close"))),
    ("close-reason", f(CLOSE, reason="done"), cmd(m.CloseSession(reason="done"))),
    (
        "resume-full",
        f(RESUME, event_id="c4", **TOKEN, **{LAST: 17}, control_id="ctl", attempt=3),
        ParsedFrame(
            envelope=ResumeRequest(
                **TOKEN, last_received_server_event_seq=17, control_id="ctl", attempt=3,
                event_id="c4"
            )
        ),
    ),
    ("resume-minimal", f(RESUME, **TOKEN), ParsedFrame(envelope=ResumeRequest(**TOKEN))),
    (
        "resume-nulls",
        f(RESUME, **TOKEN, **{LAST: None}, control_id=None),
        ParsedFrame(envelope=ResumeRequest(**TOKEN)),
    ),
    (
        "ack",
        f(ACK, server_event_seq=0, event_id="c5"),
        ParsedFrame(envelope=EventAck(server_event_seq=0, event_id="c5")),
    ),
    (
        "ack-client-seq",
        f(ACK, server_event_seq=9, client_seq=2),
        ParsedFrame(envelope=EventAck(server_event_seq=9), client_seq=2),
    ),
    ("client_seq", f(COMMIT, client_seq=7), cmd(m.CommitInput(), client_seq=7)),
    ("client_seq-max", f(HEARTBEAT, client_seq=MAX_SEQ), cmd(m.Heartbeat(), client_seq=MAX_SEQ)),
    ("nulls-are-absent", f(HEARTBEAT, client_seq=None, event_id=None), cmd(m.Heartbeat())),
    ("unknown-fields-ignored", f(COMMIT, final=True, hints={"x": 1}), cmd(m.CommitInput())),
    (
        "item-create",
        f("conversation.item.create", event_id="c6", item={"type": "message"},
          previous_item_id="root"),
        cmd(m.CreateItem(item={"type": "message"}, previous_item_id="root", event_id="c6")),
    ),
    ("item-create-append", f("conversation.item.create", item={}, previous_item_id=None),
     cmd(m.CreateItem(item={}))),
    ("item-retrieve", f("conversation.item.retrieve", item_id="item_2"),
     cmd(m.RetrieveItem(item_id="item_2"))),
    ("item-delete", f("conversation.item.delete", item_id="item_2"),
     cmd(m.DeleteItem(item_id="item_2"))),
    (
        "item-truncate",
        f("conversation.item.truncate", item_id="item_2", content_index=0, audio_end_ms=640),
        cmd(m.TruncateItem(item_id="item_2", content_index=0, audio_end_ms=640)),
    ),
    ("output-clear", f("output_audio_buffer.clear"), cmd(m.ClearOutputAudio())),
    # The seed's duplex commands and their aliases (more in test_codec_extensions.py).
    ("input-cancel", f("input.cancel", event_id="c7"), cmd(m.CancelInput(event_id="c7"))),
    ("text-append", f("input.text.append", text="hi"), cmd(m.AppendText(text="hi"))),
    ("text-append-beta-spelling", f("input_text.append", text="hi"),
     cmd(m.AppendText(text="hi"))),
    ("push-text", f("push_text", text=""), cmd(m.AppendText(text=""))),
    ("barge-in", f("barge_in"), cmd(m.BargeIn())),
    ("turn-signal", f("turn.signal", event="user.typing", payload={"n": 1}),
     cmd(m.SignalTurn(event="user.typing", payload={"n": 1}))),
    ("signal-turn", f("signal_turn", event="user.typing"),
     cmd(m.SignalTurn(event="user.typing"))),
    ("playback-ack", f("playback.ack", played_ms=640),
     cmd(m.AckPlayback(played_ms=640))),
    ("audio-playback-ack",
     f("audio.playback_ack", played_ms=640, committed_ms=320, response_id="resp_1",
       item_id="item_2"),
     cmd(m.AckPlayback(played_ms=640, committed_ms=320, response_id="resp_1",
                       item_id="item_2"))),
]


@pytest.mark.parametrize(
    ("data", "expected"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED]
)
def test_accepted_frames(data: str, expected: ParsedFrame) -> None:
    """Each valid client frame parses to its typed value, as text and as binary."""
    assert parse(data) == expected
    assert parse(data.encode()) == expected


def test_every_supported_type_has_a_golden_case() -> None:
    """The golden table covers every client event type the codec accepts."""
    assert {json.loads(c[1])["type"] for c in ACCEPTED} == CLIENT_EVENT_TYPES


JSON_, EVENT, UNKNOWN = "invalid_json", "invalid_event", "unknown_event"
MISSING, TYPE, VALUE = "missing_required_parameter", "invalid_type", "invalid_value"
BAD_RESUME = "invalid_session_resume"

# (id, frame, code, param, the client event id echoed)
REJECTED: list[tuple[str, str | bytes, str, str | None, str | None]] = [
    ("bad-utf8", b'{"type":"session.heartbeat","x":"\xff"}', JSON_, None, None),
    ("not-json", "hello", JSON_, None, None),
    ("truncated", '{"type":"session.heartbeat"', JSON_, None, None),
    ("nan", '{"type":"session.heartbeat","x":NaN}', JSON_, None, None),
    ("infinity", "-Infinity", JSON_, None, None),
    ("deep", "[" * 100_000 + "]" * 100_000, JSON_, None, None),
    ("huge-int", '{"type":"session.heartbeat","x":' + "9" * 5000 + "}", JSON_, None, None),
    ("empty", "", JSON_, None, None),
    ("array", "[]", EVENT, None, None),
    ("string", '"session.heartbeat"', EVENT, None, None),
    ("no-type", '{"event_id":"e1"}', EVENT, None, "e1"),
    ("null-type", '{"type":null,"event_id":"e1"}', EVENT, None, "e1"),
    ("int-type", '{"type":1,"event_id":"e1"}', EVENT, None, "e1"),
    ("bad-event-id", f(HEARTBEAT, event_id=5), TYPE, "event_id", None),
    ("unknown", f("nope", event_id="e1"), UNKNOWN, "type", "e1"),
    ("beta-alias", f("response.audio.delta"), UNKNOWN, "type", None),
    ("server-type", f("session.resumed"), UNKNOWN, "type", None),
    *[
        (f"unsupported-{t}", f(t, event_id="e2"), "unsupported_event", "type", "e2")
        for t in sorted(UNSUPPORTED_CLIENT_EVENT_TYPES)
    ],
    ("update-missing", f(UPDATE, event_id="e3"), MISSING, "session", "e3"),
    ("update-array", f(UPDATE, session=[]), TYPE, "session", None),
    ("update-null", f(UPDATE, session=None), TYPE, "session", None),
    ("append-missing", f(APPEND, event_id="e4"), MISSING, "audio", "e4"),
    ("append-int", f(APPEND, audio=5), TYPE, "audio", None),
    ("append-bad-b64", f(APPEND, audio="!!!!", event_id="e5"), VALUE, "audio", "e5"),
    ("append-no-pad", f(APPEND, audio="AAA"), VALUE, "audio", None),
    ("append-newline", f(APPEND, audio="AAAA\nAAAA"), VALUE, "audio", None),
    ("append-non-ascii", f(APPEND, audio="ÄÄÄÄ"), VALUE, "audio", None),
    ("create-str", f(CREATE, response="x"), TYPE, "response", None),
    ("cancel-int", f(CANCEL, response_id=3), TYPE, "response_id", None),
    ("close-int", f(CLOSE, reason=1), TYPE, "reason", None),
    ("seq-zero", f(HEARTBEAT, client_seq=0, event_id="e6"), VALUE, "client_seq", "e6"),
    ("seq-negative", f(HEARTBEAT, client_seq=-1), VALUE, "client_seq", None),
    ("seq-str", f(HEARTBEAT, client_seq="1"), VALUE, "client_seq", None),
    ("seq-float", f(HEARTBEAT, client_seq=1.5), VALUE, "client_seq", None),
    ("seq-bool", f(HEARTBEAT, client_seq=True), VALUE, "client_seq", None),
    ("seq-huge", f(HEARTBEAT, client_seq=MAX_SEQ + 1), VALUE, "client_seq", None),
    ("seq-before-body", f(APPEND, client_seq=0), VALUE, "client_seq", None),
    ("resume-no-token", f(RESUME, session_id="s", event_id="e7"), BAD_RESUME, "resume_token", "e7"),
    ("resume-no-session", f(RESUME, resume_token="t"), BAD_RESUME, "session_id", None),
    (
        "resume-int-session",
        f(RESUME, session_id=1, resume_token="t"),
        BAD_RESUME,
        "session_id",
        None,
    ),
    (
        "resume-empty-session",
        f(RESUME, session_id="", resume_token="t"),
        BAD_RESUME,
        "session_id",
        None,
    ),
    (
        "resume-empty-token",
        f(RESUME, session_id="s", resume_token=""),
        BAD_RESUME,
        "resume_token",
        None,
    ),
    ("resume-negative-seq", f(RESUME, **TOKEN, **{LAST: -1}), BAD_RESUME, LAST, None),
    ("resume-str-seq", f(RESUME, **TOKEN, **{LAST: "3"}), BAD_RESUME, LAST, None),
    ("resume-int-control", f(RESUME, **TOKEN, control_id=5), BAD_RESUME, "control_id", None),
    ("resume-zero-attempt", f(RESUME, **TOKEN, attempt=0), BAD_RESUME, "attempt", None),
    ("resume-str-attempt", f(RESUME, **TOKEN, attempt="2"), BAD_RESUME, "attempt", None),
    ("ack-missing", f(ACK, event_id="e8"), MISSING, "server_event_seq", "e8"),
    ("ack-null", f(ACK, server_event_seq=None), TYPE, "server_event_seq", None),
    ("ack-str", f(ACK, server_event_seq="1"), TYPE, "server_event_seq", None),
    ("ack-bool", f(ACK, server_event_seq=True), TYPE, "server_event_seq", None),
    ("ack-negative", f(ACK, server_event_seq=-1), VALUE, "server_event_seq", None),
]


@pytest.mark.parametrize(
    ("data", "code", "param", "client_event_id"),
    [c[1:] for c in REJECTED],
    ids=[c[0] for c in REJECTED],
)
def test_rejected_frames(
    data: str | bytes, code: str, param: str | None, client_event_id: str | None
) -> None:
    """Each bad frame raises its documented code and param, echoes event_id, keeps the session."""
    for variant in (data, data.encode()) if isinstance(data, str) else (data,):
        with pytest.raises(ClientProtocolError) as info:
            parse(variant)
        error = info.value
        assert (error.code, error.param, error.client_event_id) == (code, param, client_event_id)
        assert error.code in PARSE_ERROR_CODES
        assert error.close_code is None
        assert error.error_type == "invalid_request_error"
        assert error.message


def test_missing_type_message() -> None:
    """A frame without ``type`` gets the Realtime API's own wording."""
    with pytest.raises(ClientProtocolError, match=r"^The 'type' field is missing\.$"):
        parse("{}")


def test_unknown_type_is_quoted_briefly() -> None:
    """A huge unknown ``type`` is not echoed back in full."""
    with pytest.raises(ClientProtocolError) as info:
        parse(f("x" * 10_000))
    assert len(info.value.message) < 1_000


def test_frame_too_large_closes_with_1009() -> None:
    """A frame over the limit is refused with event_too_large and close 1009, text or binary."""
    data = f(APPEND, event_id="big", audio="AAAA" * 100)
    for variant in (data, data.encode()):
        parse_client_frame(variant, max_frame_bytes=len(data))  # exactly at the limit: fine
        with pytest.raises(ClientProtocolError) as info:
            parse_client_frame(variant, max_frame_bytes=len(data) - 1)
        assert info.value.code == "event_too_large"
        assert info.value.close_code == CloseCode.MESSAGE_TOO_BIG
        assert CloseCode.MESSAGE_TOO_BIG.value == 1009
        assert info.value.client_event_id is None  # not parsed: the id is unknown


def test_frame_size_counts_utf8_bytes() -> None:
    """The limit is in UTF-8 bytes, not characters, for text frames too."""
    data = json.dumps({"type": "session.close", "reason": "é" * 10}, ensure_ascii=False)
    size = len(data.encode())
    assert size > len(data)
    assert parse_client_frame(data, max_frame_bytes=size).command == m.CloseSession(reason="é" * 10)
    with pytest.raises(ClientProtocolError, match="bytes"):
        parse_client_frame(data, max_frame_bytes=size - 1)


def test_parsed_frame_holds_exactly_one_message() -> None:
    """A ParsedFrame with neither or both of command and envelope is a bug."""
    with pytest.raises(ValueError, match="exactly one"):
        ParsedFrame()
    with pytest.raises(ValueError, match="exactly one"):
        ParsedFrame(command=m.Heartbeat(), envelope=EventAck(server_event_seq=1))


# --------------------------------------------------------------------------- frame bounds


def refusal(data: str | bytes) -> ClientProtocolError:
    """The error a frame is refused with, text and binary alike (the same either way)."""
    errors = []
    for variant in (data, data.encode()) if isinstance(data, str) else (data,):
        with pytest.raises(ClientProtocolError) as info:
            parse(variant)
        assert info.value.code in PARSE_ERROR_CODES
        assert info.value.close_code is None  # the session stays usable
        errors.append(info.value)
    assert len({(e.code, e.param, e.message, e.client_event_id) for e in errors}) == 1
    return errors[0]


def nested_objects(levels: int) -> dict[str, Any]:
    """``levels`` objects, each the only member of the one around it."""
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def nested_arrays(levels: int) -> str:
    """``levels`` arrays, each the only element of the one around it, as JSON."""
    return "[" * levels + "]" * levels


def test_500_nested_objects_in_tools_are_refused() -> None:
    """The review's 3 KB frame (500 levels of objects in session.tools, which killed the worker
    with a RecursionError) is refused by the gateway: invalid_json, naming where."""
    data = f(UPDATE, event_id="e1", session={"tools": [nested_objects(500)]})
    assert len(data) < 4_000
    error = refusal(data)
    assert (error.code, error.client_event_id) == (JSON_, "e1")
    assert error.param is not None and error.param.startswith("session.tools[0].a.a")
    assert str(MAX_DEPTH) in error.message


def test_600_nested_arrays_are_refused() -> None:
    """The review's 1.2 KB frame of 600 nested ``[`` (json.loads parses it; the worker could
    not) is refused: invalid_json."""
    data = '{"type":"session.update","session":{"tools":' + nested_arrays(600) + "}}"
    assert len(data) < 1_300
    error = refusal(data)
    assert error.code == JSON_
    assert error.param is not None and error.param.startswith("session.tools[0][0]")


def _parse_at_stack_depth(extra_frames: int, data: str) -> None:
    """Parse ``data`` from ``extra_frames`` calls deeper than here (where a gateway's stack
    puts the codec is not where a test's does)."""
    if extra_frames:
        _parse_at_stack_depth(extra_frames - 1, data)
        return
    with pytest.raises(ClientProtocolError):  # a list, or too deep: refused either way
        parse_client_frame(data, max_frame_bytes=1 << 20)


@pytest.mark.timeout(60)
def test_a_frame_nested_to_the_recursion_limit_runs_no_collection_down_there() -> None:
    """Frames nested as deep as the interpreter lets the decoder go (the fuzzer's 100-1,200
    levels), parsed with a collection due at every allocation and the gateway's pause metrics
    observing each one: no collection runs at the limit, so nothing fails where nothing can
    catch it (a live gateway printed a RecursionError from its gc callback)."""
    failures: list[str] = []
    pauses = CollectorPauses(GatewayMetrics().observe_gc_pause)
    thresholds, hook = gc.get_threshold(), sys.unraisablehook
    sys.unraisablehook = lambda failure: failures.append(failure.exc_type.__name__)
    pauses.install()
    gc.set_threshold(1, *thresholds[1:])
    try:
        for opener, closer in (("[", "]"), ('{"a":', "}")):
            for levels in range(960, 1010, 3):
                for extra_frames in (0, 17, 40):
                    _parse_at_stack_depth(extra_frames, opener * levels + "1" + closer * levels)
    finally:
        gc.set_threshold(*thresholds)
        pauses.remove()
        sys.unraisablehook = hook
    assert failures == []


def test_nesting_limit_counts_the_frame_itself() -> None:
    """MAX_DEPTH levels of objects and arrays, the frame's own object being the first, pass;
    one more is refused. Deeper than json.loads can go is refused with the same code."""
    # The frame (1) and session (2) hold MAX_DEPTH - 2 nested arrays: MAX_DEPTH levels.
    at_limit = '{"type":"session.update","session":{"x":' + nested_arrays(MAX_DEPTH - 2) + "}}"
    assert parse(at_limit).command == m.UpdateSession(session=json.loads(at_limit)["session"])
    over = '{"type":"session.update","session":{"x":' + nested_arrays(MAX_DEPTH - 1) + "}}"
    assert refusal(over).code == JSON_
    beyond_the_parser = refusal(nested_arrays(100_000))
    assert (beyond_the_parser.code, beyond_the_parser.message) == (JSON_, refusal(over).message)


LONE = "a\\ud800b"  # JSON text for a string holding a lone surrogate


@pytest.mark.parametrize(("data", "param"), [
    ('{"type":"session.close","reason":"' + LONE + '"}', "reason"),
    ('{"type":"session.update","session":{"tools":[{},{},{},{"name":"' + LONE + '"}]}}',
     "session.tools[3].name"),
    ('{"type":"session.update","session":{"instructions":"\\udfff"}}', "session.instructions"),
    ('{"type":"response.cancel","response_id":"' + LONE + '"}', "response_id"),
    ('{"type":"session.heartbeat","event_id":"' + LONE + '"}', "event_id"),
    ('{"type":"session.heartbeat","unknown":["' + LONE + '"]}', "unknown[0]"),
], ids=["close-reason", "tool-name", "low-surrogate", "response-id", "event-id", "unknown"])
def test_lone_surrogate_is_invalid_value_naming_the_field(data: str, param: str) -> None:
    """A string no UTF-8 encoder can write (json.loads accepts ``"\\ud800"``) is refused at
    the edge, wherever it is, naming its path; before, it failed later, at encoding."""
    error = refusal(data)
    assert (error.code, error.param) == (VALUE, param)
    assert "surrogate" in error.message


def test_lone_surrogate_in_a_key_is_named_printably() -> None:
    """A key with a lone surrogate is refused too; the param quoting it is valid UTF-8."""
    error = refusal('{"type":"session.update","session":{"k\\ud800":1}}')
    assert (error.code, error.param) == (VALUE, "session.k?")


def test_surrogate_pairs_and_non_ascii_text_pass() -> None:
    """An escaped surrogate pair is one valid character (an emoji), and plain non-ASCII text
    is fine: only lone surrogates are refused."""
    parsed = parse('{"type":"session.close","reason":"\\ud83d\\ude00 \\u00e9t\\u00e9 \\u4e2d"}')
    assert parsed.command == m.CloseSession(reason="\U0001f600 été 中")


@pytest.mark.parametrize("number", ["1e400", "-1e400", "1E+999", "1" + "0" * 400 + ".0"])
def test_non_finite_number_is_invalid_value(number: str) -> None:
    """A number too large for a double parses as inf; stored, it made the session's
    session.updated unencodable (dropped for good). Refused, naming the field."""
    error = refusal('{"type":"session.update","session":{"temperature":' + number + "}}")
    assert (error.code, error.param) == (VALUE, "session.temperature")


@pytest.mark.parametrize("number", [MAX_INT + 1, -MAX_INT - 1, 2**64, -(10**200)])
def test_integer_beyond_2_53_is_invalid_value(number: int) -> None:
    """Integers outside +-(2**53 - 1) are not exact in Lua or JavaScript: refused anywhere."""
    error = refusal(f(UPDATE, session={"x": [1, {"y": number}]}))
    assert (error.code, error.param) == (VALUE, "session.x[1].y")
    assert refusal(f(HEARTBEAT, extra=number)).param == "extra"


def test_integers_at_the_bounds_pass() -> None:
    """+-(2**53 - 1) and finite floats are accepted as they are."""
    session = {"x": [MAX_INT, -MAX_INT, 1e308, -0.5]}
    assert parse(f(UPDATE, session=session)).command == m.UpdateSession(session=session)


def test_long_strings_are_refused_except_audio() -> None:
    """Strings are bounded (instructions too); client audio (the top-level audio, an item's
    input_audio part) only by the frame limit."""
    at_limit = {"instructions": "x" * MAX_STRING_CHARS}
    assert parse(f(UPDATE, session=at_limit)).command == m.UpdateSession(session=at_limit)
    error = refusal(f(UPDATE, session={"instructions": "x" * (MAX_STRING_CHARS + 1)}))
    assert (error.code, error.param) == (VALUE, "session.instructions")
    assert refusal(f(UPDATE, session={"k" * (MAX_STRING_CHARS + 1): 1})).code == VALUE
    audio = base64.b64encode(bytes(MAX_STRING_CHARS)).decode()
    assert len(audio) > MAX_STRING_CHARS
    assert parse(f(APPEND, audio=audio)).command == m.AppendAudio(audio=bytes(MAX_STRING_CHARS))
    nested_audio = refusal(f(UPDATE, session={"audio": "x" * (MAX_STRING_CHARS + 1)}))
    assert nested_audio.param == "session.audio"
    # An input_audio part of a created item carries audio too: a second of it is 64,000 base64
    # characters, so it is bounded by the frame size alone; its other strings are not.
    item = {"type": "message", "role": "user",
            "content": [{"type": "input_audio", "audio": audio}]}
    created = parse(f("conversation.item.create", item=item)).command
    assert isinstance(created, m.CreateItem) and created.item == item
    long_text = {"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": "x" * (MAX_STRING_CHARS + 1)}]}
    text_error = refusal(f("conversation.item.create", item=long_text))
    assert (text_error.code, text_error.param) == (VALUE, "item.content[0].text")
    # A session.update's voice prompt is audio too (the worker bounds it); elsewhere a key of
    # that name is not.
    voice = {"ref_audio": "data:audio/wav;base64," + audio}
    assert parse(f(UPDATE, session=voice)).command == m.UpdateSession(session=voice)
    stray = refusal(f(UPDATE, session={"extra_body": {"ref_audio": "x" * (MAX_STRING_CHARS + 1)}}))
    assert stray.param == "session.extra_body.ref_audio"


def test_value_count_is_bounded() -> None:
    """At most MAX_VALUES values (members and elements, every level) per frame."""
    # type, session, x: three values besides the array's elements.
    fits = {"x": [0] * (MAX_VALUES - 3)}
    assert parse(f(UPDATE, session=fits)).command == m.UpdateSession(session=fits)
    error = refusal(f(UPDATE, event_id="e9", session={"x": [0] * (MAX_VALUES - 2)}))
    assert (error.code, error.param, error.client_event_id) == (VALUE, None, "e9")


def test_bounds_errors_echo_the_event_id_unless_it_is_at_fault() -> None:
    """The client's event_id is echoed when readable; never the bad event_id itself."""
    assert refusal(f(UPDATE, event_id="e2", session={"t": 2**60})).client_event_id == "e2"
    bad_id = refusal(f(HEARTBEAT, event_id="x" * (MAX_STRING_CHARS + 1)))
    assert (bad_id.param, bad_id.client_event_id) == ("event_id", None)


def test_long_keys_are_quoted_briefly_in_param() -> None:
    """A param quoting a long key stays short."""
    error = refusal(f(UPDATE, session={"k" * 1000: {"v": "\ud800"}}))  # dumps escapes it
    assert error.param is not None and len(error.param) < 100


@pytest.mark.parametrize(("data", "param"), [
    ('{"type":"session.resume","session_id":"s","resume_token":"' + LONE + '"}',
     "resume_token"),
    ('{"type":"session.resume","session_id":"s","resume_token":"t","control_id":"' + LONE
     + '"}', "control_id"),
    ('{"type":"session.resume","session_id":"' + LONE + '","resume_token":"t"}', "session_id"),
    ('{"type":"session.resume","session_id":"s","resume_token":"t","x":1e400}', "x"),
    ('{"type":"session.resume","session_id":"s","resume_token":"t",'
     '"last_received_server_event_seq":' + str(2**60) + "}", LAST),
    (f(RESUME, session_id="s", resume_token="t" * (MAX_RESUME_FIELD_CHARS + 1)),
     "resume_token"),
    (f(RESUME, session_id="s" * (MAX_RESUME_FIELD_CHARS + 1), resume_token="t"), "session_id"),
    (f(RESUME, **TOKEN, control_id="c" * (MAX_CONTROL_ID_CHARS + 1)), "control_id"),
], ids=["surrogate-token", "surrogate-control", "surrogate-session", "inf-anywhere",
        "huge-seq", "long-token", "long-session", "long-control"])
def test_resume_that_can_never_work_is_invalid_session_resume(data: str, param: str) -> None:
    """Any session.resume field that cannot be valid is invalid_session_resume (the client
    gives up), never internal_error + 1011 (which says: retry)."""
    error = refusal(data)
    assert (error.code, error.param) == (BAD_RESUME, param)


def test_resume_fields_at_their_caps_pass() -> None:
    """A token, session id and control id at their length caps are accepted."""
    token, session_id = "t" * MAX_RESUME_FIELD_CHARS, "s" * MAX_RESUME_FIELD_CHARS
    control_id = "c" * MAX_CONTROL_ID_CHARS
    parsed = parse(f(RESUME, session_id=session_id, resume_token=token, control_id=control_id))
    assert parsed.envelope == ResumeRequest(session_id=session_id, resume_token=token,
                                            control_id=control_id)


def test_close_reason_is_capped() -> None:
    """session.close.reason comes back as the session.closed reason: at most 256 chars."""
    at_cap = "é" * MAX_CLOSE_REASON_CHARS
    assert parse(f(CLOSE, reason=at_cap)).command == m.CloseSession(reason=at_cap)
    error = refusal(f(CLOSE, reason="x" * (MAX_CLOSE_REASON_CHARS + 1), event_id="e3"))
    assert (error.code, error.param, error.client_event_id) == (VALUE, "reason", "e3")


def test_invalid_utf8_in_a_binary_frame_is_invalid_json_and_keeps_the_session() -> None:
    """A binary frame may hold anything (RFC 6455 fails only text frames): bytes that are not
    UTF-8 are invalid_json with no close (the text-frame case closes 1007, in the core)."""
    error = refusal(b'{"type":"session.heartbeat","x":"\xc3\x28"}')
    assert error.code == JSON_


# --------------------------------------------------------------------------- close reasons


@pytest.mark.parametrize(("reason", "expected"), [
    ("client_close", "client_close"),
    ("x" * 200, "x" * MAX_CLOSE_REASON_BYTES),
    ("é" * 62, "é" * 61),  # 124 bytes: the review's reason; a 2-byte char is not split
    ("a" + "€" * 50, "a" + "€" * 40),  # 1 + 120 bytes; the 41st euro would need 124
    ("\U0001f600" * 31, "\U0001f600" * 30),  # 4-byte characters: 120 bytes
    ("bad\ud800end", "bad?end"),
    ("", ""),
])
def test_fit_close_reason_cuts_by_utf8_bytes(reason: str, expected: str) -> None:
    """A close reason is cut to 123 UTF-8 bytes, never inside a character."""
    fitted = fit_close_reason(reason)
    assert fitted == expected
    assert len(fitted.encode("utf-8")) <= MAX_CLOSE_REASON_BYTES == 123


# --------------------------------------------------------------------------- worker events

ITEM_USER = {
    "id": "item_user1",
    "object": "realtime.item",
    "type": "message",
    "status": "completed",
    "role": "user",
    "content": [{"type": "input_audio", "transcript": None}],
}
ITEM_ASSISTANT = {
    "id": "item_asst1",
    "object": "realtime.item",
    "type": "message",
    "status": "in_progress",
    "role": "assistant",
    "content": [],
}
RESPONSE = {
    "object": "realtime.response",
    "id": "resp_1",
    "status": "in_progress",
    "status_details": None,
    "output": [],
    "conversation_id": "conv_1",
    "output_modalities": ["audio"],
    "max_output_tokens": "inf",
    "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin"}},
    "usage": None,
    "metadata": {"client_event_id": "lk_1"},
}
RESPONSE_CANCELLED = {
    **RESPONSE,
    "status": "cancelled",
    "status_details": {"type": "cancelled", "reason": "turn_detected"},
}
PART = {"type": "audio", "transcript": ""}
POS: dict[str, Any] = {
    "response_id": "resp_1",
    "item_id": "item_asst1",
    "output_index": 0,
    "content_index": 0,
}
CALL: dict[str, Any] = {
    "response_id": "resp_1",
    "item_id": "item_call1",
    "output_index": 0,
    "call_id": "call_1",
}

EVENTS: list[tuple[m.Event, dict[str, Any]]] = [
    (
        m.SessionUpdated(session={**SESSION, "id": "sess_1", "object": "realtime.session"}),
        {
            "type": "session.updated",
            "session": {**SESSION, "id": "sess_1", "object": "realtime.session"},
        },
    ),
    (
        m.ErrorEvent(
            code="conversation_already_has_active_response",
            message="busy",
            client_event_id="c9",
        ),
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "code": "conversation_already_has_active_response",
                "message": "busy",
                "param": None,
                "event_id": "c9",
            },
        },
    ),
    (
        m.ErrorEvent(code="engine_error", message="boom", error_type="server_error", param="x"),
        {
            "type": "error",
            "error": {
                "type": "server_error",
                "code": "engine_error",
                "message": "boom",
                "param": "x",
                "event_id": None,
            },
        },
    ),
    (m.HeartbeatAck(), {"type": "session.heartbeat_ack"}),
    (
        m.InputCommitted(item_id="item_user1"),
        {"type": "input_audio_buffer.committed", "previous_item_id": None, "item_id": "item_user1"},
    ),
    (m.InputCleared(), {"type": "input_audio_buffer.cleared"}),
    (
        m.InputSpeechStarted(audio_start_ms=700, item_id="item_user1"),
        {"type": "input_audio_buffer.speech_started", "audio_start_ms": 700,
         "item_id": "item_user1"},
    ),
    (
        m.InputSpeechStopped(audio_end_ms=2500, item_id="item_user1"),
        {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 2500,
         "item_id": "item_user1"},
    ),
    (
        m.ItemAdded(item=ITEM_USER),
        {"type": "conversation.item.added", "previous_item_id": None, "item": ITEM_USER},
    ),
    (
        m.ItemCreated(item=ITEM_USER, previous_item_id="item_0"),
        {"type": "conversation.item.created", "previous_item_id": "item_0", "item": ITEM_USER},
    ),
    (
        m.ItemDone(item=ITEM_ASSISTANT, previous_item_id="item_user1"),
        {
            "type": "conversation.item.done",
            "previous_item_id": "item_user1",
            "item": ITEM_ASSISTANT,
        },
    ),
    (m.ItemRetrieved(item=ITEM_ASSISTANT),
     {"type": "conversation.item.retrieved", "item": ITEM_ASSISTANT}),
    (m.ItemDeleted(item_id="item_2"), {"type": "conversation.item.deleted", "item_id": "item_2"}),
    (
        m.ItemTruncated(item_id="item_2", content_index=0, audio_end_ms=640),
        {"type": "conversation.item.truncated", "item_id": "item_2", "content_index": 0,
         "audio_end_ms": 640},
    ),
    (m.OutputAudioCleared(response_id="resp_1"),
     {"type": "output_audio_buffer.cleared", "response_id": "resp_1"}),
    (m.ResponseCreated(response=RESPONSE), {"type": "response.created", "response": RESPONSE}),
    (
        m.ResponseDone(response=RESPONSE_CANCELLED),
        {"type": "response.done", "response": RESPONSE_CANCELLED},
    ),
    (
        m.OutputItemAdded(response_id="resp_1", output_index=0, item=ITEM_ASSISTANT),
        {
            "type": "response.output_item.added",
            "response_id": "resp_1",
            "output_index": 0,
            "item": ITEM_ASSISTANT,
        },
    ),
    (
        m.OutputItemDone(response_id="resp_1", output_index=1, item=ITEM_ASSISTANT),
        {
            "type": "response.output_item.done",
            "response_id": "resp_1",
            "output_index": 1,
            "item": ITEM_ASSISTANT,
        },
    ),
    (
        m.ContentPartAdded(**POS, part=PART),
        {"type": "response.content_part.added", **POS, "part": PART},
    ),
    (
        m.ContentPartDone(**POS, part={"type": "audio", "transcript": "Hi"}),
        {
            "type": "response.content_part.done",
            **POS,
            "part": {"type": "audio", "transcript": "Hi"},
        },
    ),
    (
        m.AudioDelta(**POS, audio=PCM),
        {"type": "response.output_audio.delta", **POS, "delta": PCM_B64},
    ),
    (m.AudioDone(**POS), {"type": "response.output_audio.done", **POS}),
    (
        m.TranscriptDelta(**POS, delta="Hi "),
        {"type": "response.output_audio_transcript.delta", **POS, "delta": "Hi "},
    ),
    (
        m.TranscriptDone(**POS, transcript="Hi there"),
        {"type": "response.output_audio_transcript.done", **POS, "transcript": "Hi there"},
    ),
    (
        m.TextDelta(**POS, delta="Hi "),
        {"type": "response.output_text.delta", **POS, "delta": "Hi "},
    ),
    (
        m.TextDone(**POS, text="Hi there"),
        {"type": "response.output_text.done", **POS, "text": "Hi there"},
    ),
    (
        m.FunctionCallArgumentsDelta(**CALL, delta='{"city": '),
        {"type": "response.function_call_arguments.delta", **CALL, "delta": '{"city": '},
    ),
    (
        m.FunctionCallArgumentsDone(**CALL, name="weather", arguments='{"city": "Oslo"}'),
        {"type": "response.function_call_arguments.done", **CALL, "name": "weather",
         "arguments": '{"city": "Oslo"}'},
    ),
    (
        m.InputTranscriptionDelta(item_id="item_user1", content_index=0, delta="Hel"),
        {"type": "conversation.item.input_audio_transcription.delta", "item_id": "item_user1",
         "content_index": 0, "delta": "Hel"},
    ),
    (
        m.InputTranscriptionCompleted(item_id="item_user1", content_index=0,
                                      transcript="Hello."),
        {"type": "conversation.item.input_audio_transcription.completed",
         "item_id": "item_user1", "content_index": 0, "transcript": "Hello.",
         "usage": {"type": "tokens", "input_tokens": 0, "output_tokens": 0,
                   "total_tokens": 0}},
    ),
    (
        m.InputTranscriptionFailed(item_id="item_user1", content_index=0, code="model_error",
                                   message="speech recognition failed"),
        {"type": "conversation.item.input_audio_transcription.failed", "item_id": "item_user1",
         "content_index": 0, "error": {"type": "server_error", "code": "model_error",
                                       "message": "speech recognition failed", "param": None}},
    ),
    (
        m.InputTimeoutTriggered(audio_start_ms=1200, audio_end_ms=6200, item_id="item_user2"),
        {"type": "input_audio_buffer.timeout_triggered", "audio_start_ms": 1200,
         "audio_end_ms": 6200, "item_id": "item_user2"},
    ),
    (m.RateLimitsUpdated(rate_limits=[]), {"type": "rate_limits.updated", "rate_limits": []}),
    (
        m.RateLimitsUpdated(rate_limits=[{"name": "requests", "limit": 10, "remaining": 9,
                                          "reset_seconds": 0.5}]),
        {"type": "rate_limits.updated",
         "rate_limits": [{"name": "requests", "limit": 10, "remaining": 9,
                          "reset_seconds": 0.5}]},
    ),
    (
        m.PlaybackAcknowledged(response_id="resp_1", item_id="item_asst1", generated_ms=2000,
                               sent_ms=1800, played_ms=960, committed_ms=640),
        {"type": "playback.acknowledged", "response_id": "resp_1", "item_id": "item_asst1",
         "played_ms": 960, "committed_ms": 640,
         "playback": {"generated_ms": 2000, "sent_ms": 1800, "played_ms": 960,
                      "committed_ms": 640}},
    ),
    (
        m.TurnEvent(event="user.typing", turn_state="idle", payload={"n": 1}, epoch=2),
        {"type": "turn.event", "event": "user.typing", "turn_state": "idle",
         "payload": {"n": 1}, "epoch": 2},
    ),
    (m.SessionClosed(reason="worker_lost"), {"type": "session.closed", "reason": "worker_lost"}),
    (m.SessionExpired(reason="idle"), {"type": "session.expired", "reason": "idle"}),
]


@pytest.mark.parametrize(("event", "expected"), EVENTS, ids=[type(e).__name__ for e, _ in EVENTS])
def test_render_event(event: m.Event, expected: dict[str, Any]) -> None:
    """Each worker event renders to its Realtime GA shape and validates strictly."""
    rendered = render_event(event, server_event_seq=42, event_id="event_42")
    assert rendered == {**expected, "event_id": "event_42", "server_event_seq": 42}
    assert list(rendered)[:2] == ["type", "event_id"]
    validate_server_event(rendered)
    assert json.loads(encode_frame(rendered)) == rendered


def test_every_event_class_has_a_golden_case() -> None:
    """The golden table covers every class of the store's Event union."""
    assert {type(e) for e, _ in EVENTS} == set(typing.get_args(m.Event))


def test_every_message_class_round_trips_through_the_log_codec() -> None:
    """Every command and event class (one or more golden values of each, covering both
    unions) comes back from encode_message/decode_message equal, and as the log's reader of
    its direction expects it (decode_command / decode_event)."""
    commands = [c[2].command for c in ACCEPTED if c[2].command is not None]
    # The commands the gateway itself writes: no client frame parses to them.
    commands.append(m.OutputBackpressure(pending_events=600, pending_bytes=3 << 20))
    events = [e for e, _ in EVENTS]
    assert {type(c) for c in commands} == set(typing.get_args(m.Command))
    for command in commands:
        assert m.decode_command(m.encode_message(command)) == command
    for event in events:
        assert m.decode_event(m.encode_message(event)) == event


def test_every_message_class_has_a_kind_of_its_own() -> None:
    """No two classes share a KIND: a log entry of one would decode as the other."""
    classes = [*typing.get_args(m.Command), *typing.get_args(m.Event)]
    assert len({cls.KIND for cls in classes}) == len(classes)


def test_no_beta_names_are_emitted() -> None:
    """Only GA names go out: beta spellings would be silently dropped by GA clients.
    (``conversation.item.created`` is sent beside ``.added``: it is one of GA's server
    events too.)"""
    beta = {
        "response.audio.delta",
        "response.audio.done",
        "response.audio_transcript.delta",
        "response.audio_transcript.done",
        "response.text.delta",
    }
    assert not beta & {expected["type"] for _, expected in EVENTS}


@pytest.mark.parametrize(
    "event",
    [m.HeartbeatAck(), m.SessionClosed(reason="client_close"), m.SessionExpired(reason="grace"),
     m.TurnEvent(event="user.typing", turn_state="listening")],
    ids=lambda e: type(e).__name__,
)
def test_session_id_on_session_extensions(event: m.Event) -> None:
    """The session-level extension events (and the seed's turn.event) name their session
    when asked to."""
    rendered = render_event(event, server_event_seq=3, event_id="e", session_id="sess_9")
    assert rendered["session_id"] == "sess_9"
    assert rendered["type"] in EXTENSION_TYPES
    validate_server_event(rendered)


def test_session_id_not_added_to_standard_events() -> None:
    """Standard Realtime events keep their SDK shape even when a session id is passed."""
    rendered = render_event(m.InputCleared(), server_event_seq=1, event_id="e", session_id="s")
    assert "session_id" not in rendered


def test_render_unknown_event_class_is_internal() -> None:
    """An event class without a renderer is our bug: InternalError, not a crash elsewhere."""
    with pytest.raises(InternalError):
        render_event(m.Heartbeat(), server_event_seq=1, event_id="e")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- gateway notices


def test_render_session_created() -> None:
    """session.created carries the session resource, resume fields, and no sequence number."""
    notice = SessionCreatedNotice(
        session_id="sess_w1.abc",
        resume_token="tok",
        lease_generation=1,
        session={"model": "moshi", **SESSION, "id": "bogus", "object": "bogus"},
    )
    rendered = render_notice(notice, event_id="event_1")
    assert rendered == {
        "type": "session.created",
        "event_id": "event_1",
        "session": {
            "type": "realtime",
            "object": "realtime.session",
            "id": "sess_w1.abc",
            "model": "moshi",
            "instructions": "Be brief.",
            "output_modalities": ["audio"],
        },
        "session_id": "sess_w1.abc",
        "resume_token": "tok",
        "lease_generation": 1,
    }
    validate_server_event(rendered)


@pytest.mark.parametrize(
    ("session", "kind", "obj"),
    [
        ({}, "realtime", "realtime.session"),
        ({"type": None}, "realtime", "realtime.session"),
        ({"type": "transcription"}, "transcription", "realtime.transcription_session"),
    ],
)
def test_session_created_session_type(session: dict[str, Any], kind: str, obj: str) -> None:
    """The session resource always has a type (realtime by default) and the matching object."""
    notice = SessionCreatedNotice(
        session_id="s", resume_token="t", lease_generation=2, session=session
    )
    rendered = render_notice(notice, event_id="e")
    assert (rendered["session"]["type"], rendered["session"]["object"]) == (kind, obj)
    validate_server_event(rendered)


# A worker's default session (without its id) and capabilities, as its profile holds them.
DEFAULT_SESSION: dict[str, Any] = {
    "type": "realtime", "model": "loopback", "output_modalities": ["audio"], "instructions": "",
    "tools": [], "tool_choice": "auto", "max_output_tokens": "inf", "tracing": None,
    "audio": {
        "input": {"format": {"type": "audio/pcm", "rate": 24000}, "transcription": None,
                  "noise_reduction": None, "turn_detection": None},
        "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "alloy",
                   "speed": 1.0},
    },
    "extra_body": {"loopback_mode": "turn"},
}
CAPABILITIES = {"implementation_level": "turn_based_duplex", "supports_barge_in": True,
                "chunk_period_ms": 40, "input_modes": ["append_audio_chunk"]}


def test_render_session_created_with_the_workers_session_and_capabilities() -> None:
    """With a worker's profile, session.created carries its whole session object (id and
    object first) and the capabilities beside it, and still validates strictly."""
    notice = SessionCreatedNotice(session_id="sess_w1.abc", resume_token="tok",
                                  lease_generation=1, session=DEFAULT_SESSION,
                                  capabilities=CAPABILITIES)
    rendered = render_notice(notice, event_id="e")
    validate_server_event(rendered)
    session = rendered["session"]
    assert list(session)[:3] == ["type", "object", "id"]
    assert session == {**DEFAULT_SESSION, "object": "realtime.session", "id": "sess_w1.abc"}
    assert rendered["capabilities"] == CAPABILITIES


def test_session_resumed_carries_the_current_session_and_capabilities() -> None:
    """session.resumed renders the record's session object as the GA session resource (its
    id filled in) and the capabilities, strictly valid; without them it leaves both out."""
    updated = {**DEFAULT_SESSION, "id": "stale", "instructions": "Be brief."}
    rendered = render_notice(SessionResumedNotice(
        session_id="s", resume_token="t", lease_generation=2, last_client_seq=0, replay_from=1,
        session=updated, capabilities=CAPABILITIES), event_id="e")
    validate_server_event(rendered)
    assert rendered["session"] == {**updated, "object": "realtime.session", "id": "s"}
    assert rendered["capabilities"] == CAPABILITIES
    bare = render_notice(SessionResumedNotice(
        session_id="s", resume_token="t", lease_generation=2, last_client_seq=0,
        replay_from=1), event_id="e")
    assert "session" not in bare and "capabilities" not in bare


def test_a_resumed_session_that_is_not_a_ga_session_fails_strict_validation() -> None:
    """The strict check holds session.resumed's session to the SDK's session type, as it
    holds session.created's (so the tests above can fail)."""
    rendered = render_notice(SessionResumedNotice(
        session_id="s", resume_token="t", lease_generation=2, last_client_seq=0, replay_from=1,
        session={**DEFAULT_SESSION, "audio": {"output": {"speed": "fast"}}}), event_id="e")
    with pytest.raises(ValidationError):
        validate_server_event(rendered)


NOTICES: list[tuple[Any, dict[str, Any]]] = [
    (
        SessionResumedNotice(
            session_id="s", resume_token="t2", lease_generation=3, last_client_seq=9, replay_from=5
        ),
        {
            "type": "session.resumed",
            "session_id": "s",
            "resume_token": "t2",
            "lease_generation": 3,
            "last_client_seq": 9,
            "replay_from": 5,
        },
    ),
    (
        SessionReplacedNotice(session_id="s", lease_generation=3),
        {"type": "session.replaced", "session_id": "s", "lease_generation": 3},
    ),
    (
        ResyncRequiredNotice(session_id="s", reason="log_trimmed", replay_from=7),
        {"type": "session.resync_required", "session_id": "s", "reason": "log_trimmed",
         "replay_from": 7},
    ),
]


@pytest.mark.parametrize(
    ("notice", "expected"), NOTICES, ids=[type(n).__name__ for n, _ in NOTICES]
)
def test_render_notice(notice: Any, expected: dict[str, Any]) -> None:
    """Each extension notice renders to its documented shape, without server_event_seq."""
    rendered = render_notice(notice, event_id="e")
    assert rendered == {**expected, "event_id": "e"}
    validate_server_event(rendered)


def test_render_unknown_notice_class_is_internal() -> None:
    """A notice class without a renderer is our bug."""
    with pytest.raises(InternalError):
        render_notice(EventAck(server_event_seq=1), event_id="e")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- errors


def test_render_client_error() -> None:
    """A client error renders with its code, param and the client's event id."""
    try:
        parse(f(UPDATE, event_id="c7"))
    except ClientProtocolError as exc:
        rendered = render_error(exc, "event_9")
    assert rendered == {
        "type": "error",
        "event_id": "event_9",
        "error": {
            "type": "invalid_request_error",
            "code": "missing_required_parameter",
            "message": "Missing required parameter: 'session'.",
            "param": "session",
            "event_id": "c7",
        },
    }
    validate_server_event(rendered)


def test_render_internal_error_hides_details() -> None:
    """An internal error renders generically: its message may be security-sensitive."""
    rendered = render_error(InternalError("redis password is hunter2"), "e")
    assert "hunter2" not in encode_frame(rendered)
    assert rendered["error"]["type"] == "server_error"
    assert rendered["error"]["code"] == "internal_error"
    validate_server_event(rendered)


def test_error_type_follows_code() -> None:
    """resource_exhausted is a rate_limit_error; other codes are invalid_request_error."""
    exhausted = ClientProtocolError(
        ErrorCode.RESOURCE_EXHAUSTED, "full", close_code=CloseCode.TRY_AGAIN_LATER
    )
    assert exhausted.error_type == "rate_limit_error"
    assert type(exhausted.code) is str
    assert exhausted.close_code == 1013
    assert ClientProtocolError("x", "y").error_type == "invalid_request_error"
    assert ClientProtocolError("x", "y", error_type="server_error").error_type == "server_error"
    assert "resource_exhausted" in repr(exhausted)
    validate_server_event(render_error(exhausted, "e"))


def test_close_codes() -> None:
    """The close codes are the RFC 6455 numbers the design names."""
    assert [int(c) for c in CloseCode] == [1000, 1007, 1008, 1009, 1011, 1012, 1013]
    assert InternalError("x").close_code == 1011


def test_parse_error_codes_are_documented() -> None:
    """Every code the parser raises is an ErrorCode listed in the errors module's table."""
    import gateway.protocol.errors as errors_module

    assert PARSE_ERROR_CODES <= set(ErrorCode)
    for code in ErrorCode:
        assert f"`{code.value}`" in (errors_module.__doc__ or "")


# --------------------------------------------------------------------------- encoding


def test_encode_frame_is_compact() -> None:
    """Frames are compact JSON, one object per text frame."""
    assert (
        encode_frame({"type": "x", "a": [1, 2], "b": "é"}) == '{"type":"x","a":[1,2],"b":"\\u00e9"}'
    )


@pytest.mark.parametrize("bad", [float("nan"), b"raw", {1, 2}])
def test_encode_frame_rejects_non_json(bad: Any) -> None:
    """A message JSON cannot carry is an internal error, never a half-written frame."""
    with pytest.raises(InternalError):
        encode_frame({"type": "x", "bad": bad})


# --------------------------------------------------------------------------- layering


def test_protocol_modules_do_no_io() -> None:
    """The codec modules import no asyncio, redis, starlette or time (sans-I/O core)."""
    forbidden = {"asyncio", "redis", "starlette", "time", "uvicorn", "websockets"}
    root = Path(__file__).resolve().parents[2] / "gateway" / "protocol"
    for name in ("__init__.py", "parse.py", "render.py", "envelope.py", "errors.py"):
        tree = ast.parse((root / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            assert not {mod.split(".")[0] for mod in modules} & forbidden, (name, modules)
        assert "__all__" in (root / name).read_text()


# --------------------------------------------------------------------------- the validator itself

CLOSED = {"type": "session.closed", "event_id": "e", "reason": "x", "server_event_seq": 1}


@pytest.mark.parametrize(
    "event",
    [
        {k: v for k, v in CLOSED.items() if k != "reason"},  # missing key
        {**CLOSED, "extra": 1},  # unknown key
        {**CLOSED, "server_event_seq": True},  # bool is no JSON integer
        {**CLOSED, "server_event_seq": 0},  # sequences start at 1
        {"type": "input_audio_buffer.cleared", "event_id": "e", "server_event_seq": "1"},
        {"type": "response.audio.delta", "event_id": "e"},  # a beta name
        {"type": "input_audio_buffer.cleared"},  # no event_id
        {"type": "session.replaced", "event_id": "e", "session_id": "s", "lease_generation": (1,)},
    ],
)
def test_validator_is_strict(event: dict[str, Any]) -> None:
    """The strict helper refuses what a strict client would, extensions included."""
    with pytest.raises((AssertionError, ValueError)):
        validate_server_event(event)


DECIDED = [
    (m.InputCommitted(item_id="item_1", listen="silence_or_noise", listen_epoch=2),
     m.InputCommitted(item_id="item_1")),
    (m.ResponseDone(response={"id": "resp_1"}, listen="model_turn_completed_without_output",
                    listen_epoch=1),
     m.ResponseDone(response={"id": "resp_1"})),
    (m.AudioDelta(response_id="resp_1", item_id="item_2", output_index=0, content_index=0,
                  audio=b"\x01\x02", speak_epoch=3),
     m.AudioDelta(response_id="resp_1", item_id="item_2", output_index=0, content_index=0,
                  audio=b"\x01\x02")),
]


@pytest.mark.parametrize(("decided", "plain"), DECIDED, ids=[type(e).__name__ for e, _ in DECIDED])
def test_ga_ignores_the_seed_decisions(decided: m.Event, plain: m.Event) -> None:
    """The listen/speak decisions riding an event change nothing in its GA frame."""
    assert (render_event(decided, server_event_seq=7, event_id="event_7")
            == render_event(plain, server_event_seq=7, event_id="event_7"))
