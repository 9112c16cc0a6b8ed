"""Golden tables for the gateway codec: client frames in, Realtime GA JSON out."""

from __future__ import annotations

import ast
import base64
import json
import typing
from pathlib import Path
from typing import Any

import pytest

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
from store import messages as m
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
        f(RESUME, event_id="c4", **TOKEN, **{LAST: 17}, control_id="ctl"),
        ParsedFrame(
            envelope=ResumeRequest(
                **TOKEN, last_received_server_event_seq=17, control_id="ctl", event_id="c4"
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
    ("append-odd", f(APPEND, audio="AA=="), VALUE, "audio", None),
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
        m.ItemAdded(item=ITEM_USER),
        {"type": "conversation.item.added", "previous_item_id": None, "item": ITEM_USER},
    ),
    (
        m.ItemDone(item=ITEM_ASSISTANT, previous_item_id="item_user1"),
        {
            "type": "conversation.item.done",
            "previous_item_id": "item_user1",
            "item": ITEM_ASSISTANT,
        },
    ),
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


def test_no_beta_names_are_emitted() -> None:
    """Only GA names go out: beta spellings would be silently dropped by GA clients."""
    beta = {
        "response.audio.delta",
        "response.audio.done",
        "response.audio_transcript.delta",
        "response.audio_transcript.done",
        "response.text.delta",
        "conversation.item.created",
    }
    assert not beta & {expected["type"] for _, expected in EVENTS}


@pytest.mark.parametrize(
    "event",
    [m.HeartbeatAck(), m.SessionClosed(reason="client_close"), m.SessionExpired(reason="grace")],
    ids=lambda e: type(e).__name__,
)
def test_session_id_on_session_extensions(event: m.Event) -> None:
    """The session-level extension events name their session when asked to."""
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
    assert [int(c) for c in CloseCode] == [1000, 1008, 1009, 1011, 1012, 1013]
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
    for name in ("__init__.py", "codec.py", "envelope.py", "errors.py"):
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
