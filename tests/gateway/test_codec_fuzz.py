"""Property tests for the codec: every input is accepted or refused with a documented code.

In the spirit of websockets' fuzzing: whatever bytes a client sends, ``parse_client_frame``
returns a :class:`ParsedFrame` or raises :class:`ClientProtocolError` with a code from
:data:`PARSE_ERROR_CODES`, never anything else. And every event the worker can produce renders
to JSON that the strictest real client accepts.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from typing import Any

from hypothesis import given, settings, strategies as st

from contract import messages as m
from gateway.protocol import (
    CLIENT_EVENT_TYPES,
    MAX_SEQ,
    PARSE_ERROR_CODES,
    UNSUPPORTED_CLIENT_EVENT_TYPES,
    ClientProtocolError,
    CloseCode,
    ParsedFrame,
    ResyncRequiredNotice,
    SessionCreatedNotice,
    SessionReplacedNotice,
    SessionResumedNotice,
    encode_frame,
    parse_client_frame,
    render_event,
    render_notice,
)
from gateway.protocol.parse import MAX_DEPTH, MAX_INT
from tests.gateway.strict import validate_server_event

# No example database: this tree is shared, and the seeds are cheap to rediscover.
FUZZ = settings(max_examples=300, deadline=None, database=None)
LIMIT = 1 << 16


def check_parse(
    data: str | bytes, *, max_frame_bytes: int = LIMIT
) -> ParsedFrame | ClientProtocolError:
    """Parse, asserting that the outcome is one of the documented ones, and return it."""
    try:
        parsed = parse_client_frame(data, max_frame_bytes=max_frame_bytes)
    except ClientProtocolError as exc:
        assert exc.code in PARSE_ERROR_CODES, exc
        assert exc.error_type == "invalid_request_error"
        # Only an oversized frame ends the session; every other refusal keeps it.
        expected_close = CloseCode.MESSAGE_TOO_BIG if exc.code == "event_too_large" else None
        assert exc.close_code == expected_close
        assert isinstance(exc.message, str) and exc.message
        return exc
    assert isinstance(parsed, ParsedFrame)
    assert (parsed.command is None) != (parsed.envelope is None)
    assert parsed.client_seq is None or 1 <= parsed.client_seq <= MAX_SEQ
    return parsed


# --------------------------------------------------------------------------- raw frames


@FUZZ
@given(st.text(alphabet="ABCDEFab019+/=-_ \n\u00e9\u4f60", max_size=16) | st.text(max_size=8))
def test_audio_is_exactly_what_strict_base64_reads(audio: str) -> None:
    """An append's audio decodes to the bytes ``base64.b64decode(validate=True)`` gives, and
    what it refuses (stray characters, bad padding, non-ASCII) is ``invalid_value``."""
    try:
        expected: bytes | None = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        expected = None
    outcome = check_parse(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
    if expected is None:
        assert isinstance(outcome, ClientProtocolError)
        assert (outcome.code, outcome.param) == ("invalid_value", "audio")
    else:
        assert isinstance(outcome, ParsedFrame)
        assert outcome.command == m.AppendAudio(audio=expected)


@FUZZ
@given(st.binary(max_size=512))
def test_arbitrary_bytes(data: bytes) -> None:
    """Arbitrary binary frames are parsed or refused with a documented code."""
    check_parse(data)


@FUZZ
@given(st.text(max_size=512))
def test_arbitrary_text(data: str) -> None:
    """Arbitrary text frames are parsed or refused with a documented code."""
    check_parse(data)


def json_values(integers: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    """Any JSON value, kept small, with its integers drawn from ``integers``."""
    leaves = (
        st.none()
        | st.booleans()
        | integers
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=20)
    )
    return st.recursive(
        leaves,
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=10), children, max_size=4)
        ),
        max_leaves=20,
    )


JSON = json_values(st.integers())
# Within every bound the codec checks: a frame of these is refused for its shape only.
IN_BOUNDS_JSON = json_values(st.integers(min_value=-MAX_INT, max_value=MAX_INT))


@FUZZ
@given(JSON)
def test_arbitrary_json(value: Any) -> None:
    """Any JSON document is parsed or refused with a documented code, text or binary."""
    data = json.dumps(value)
    check_parse(data)
    check_parse(data.encode())


# --------------------------------------------------------------------------- near-valid frames

ALL_TYPES = [*sorted(CLIENT_EVENT_TYPES | UNSUPPORTED_CLIENT_EVENT_TYPES), "nope", ""]
B64_AUDIO = st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode())
SEQ = st.integers(min_value=-2, max_value=MAX_SEQ + 2) | st.sampled_from([0, 1, MAX_SEQ])



def client_fields(
    values: st.SearchStrategy[Any], seqs: st.SearchStrategy[int]
) -> dict[str, st.SearchStrategy[Any]]:
    """Each field a client event may carry: a plausible value or any of ``values``."""
    return {
        "event_id": st.text(max_size=10) | values,
        "client_seq": seqs | values,
        "session": st.dictionaries(st.text(max_size=5), values, max_size=3) | values,
        "audio": B64_AUDIO | st.text(max_size=16) | values,
        "response": st.dictionaries(st.text(max_size=5), values, max_size=3) | values,
        "response_id": st.text(max_size=10) | values,
        "reason": st.text(max_size=10) | values,
        "session_id": st.text(max_size=10) | values,
        "resume_token": st.text(max_size=10) | values,
        "last_received_server_event_seq": seqs | values,
        "control_id": st.text(max_size=10) | values,
        "attempt": seqs | values,
        "server_event_seq": seqs | values,
        "text": st.text(max_size=10) | values,
        "event": st.sampled_from(["user.typing", "barge_in", "response.cancel", ""])
        | st.text(max_size=10) | values,
        "payload": st.dictionaries(st.text(max_size=5), values, max_size=3) | values,
        "signal_payload": st.dictionaries(st.text(max_size=5), values, max_size=3) | values,
        "played_ms": seqs | values,
        "committed_ms": seqs | values,
        "item_id": st.text(max_size=10) | values,
    }


FIELDS = client_fields(JSON, SEQ)
NEAR_VALID = st.fixed_dictionaries({"type": st.sampled_from(ALL_TYPES)}, optional=FIELDS)
IN_BOUNDS = st.fixed_dictionaries(
    {"type": st.sampled_from(ALL_TYPES)},
    optional=client_fields(IN_BOUNDS_JSON, st.integers(min_value=-2, max_value=MAX_SEQ)),
)


@FUZZ
@given(NEAR_VALID, st.integers(min_value=1, max_value=LIMIT))
def test_near_valid_frames(obj: dict[str, Any], max_frame_bytes: int) -> None:
    """Frames with a real type and random fields parse or fail with the client's event_id."""
    data = json.dumps(obj)
    outcome = check_parse(data, max_frame_bytes=max_frame_bytes)
    event_id = obj.get("event_id")
    if not isinstance(event_id, str):
        return
    if isinstance(outcome, ParsedFrame):
        assert getattr(outcome.command or outcome.envelope, "event_id", None) == event_id
    elif outcome.code != "event_too_large":  # refused unread: the id is unknown
        assert outcome.client_event_id == event_id


VALID_FRAMES = [
    '{"type":"session.update","event_id":"c1","session":{"type":"realtime"}}',
    '{"type":"input_audio_buffer.append","audio":"AQD/fw==","client_seq":3}',
    '{"type":"session.resume","session_id":"s","resume_token":"t"}',
    '{"type":"session.event_ack","server_event_seq":5}',
]


@FUZZ
@given(st.sampled_from(VALID_FRAMES), st.data())
def test_cut_frames(data: str, draw: st.DataObject) -> None:
    """Every prefix of a valid frame is parsed or refused with a documented code."""
    cut = draw.draw(st.integers(min_value=0, max_value=len(data)))
    check_parse(data[:cut])
    check_parse(data.encode()[:cut])


# --------------------------------------------------------------------------- out of bounds

# Raw JSON text for values json.loads accepts but nothing downstream can carry. Built as text:
# json.dumps cannot write 1e400, and writes inf as Infinity (refused earlier, as not JSON).
LONE_SURROGATE = st.integers(min_value=0xD800, max_value=0xDFFF).map(chr)
SURROGATE_TEXT = st.tuples(st.text(max_size=5), LONE_SURROGATE, st.text(max_size=5)).map(
    lambda parts: json.dumps("".join(parts))  # ensure_ascii writes the surrogate as \\udXXX
)
SURROGATE_KEY = SURROGATE_TEXT.map(lambda key: "{" + key + ":1}")
HUGE_INT = (
    st.integers(min_value=MAX_INT + 1, max_value=10**300)
    | st.integers(min_value=-(10**300), max_value=-MAX_INT - 1)
).map(str)
NON_FINITE = st.sampled_from(["1e400", "-1e400", "1E+999", "-9.9e9999", "1" + "0" * 400])
# Deeper than MAX_DEPTH but shallow enough for json.loads: the codec's own walk refuses these.
DEEP = st.tuples(st.integers(min_value=MAX_DEPTH, max_value=600), st.booleans()).map(
    lambda spec: ('{"a":' * spec[0] + "1" + "}" * spec[0]) if spec[1]
    else "[" * spec[0] + "]" * spec[0]
)
POISON = {"surrogate": SURROGATE_TEXT | SURROGATE_KEY, "huge_int": HUGE_INT,
          "non_finite": NON_FINITE, "deep": DEEP}
PLACEHOLDER = "__poison__"


@st.composite
def poisoned_frames(draw: st.DrawFn) -> tuple[str, str, str, str]:
    """A near-valid frame with one poisoned value somewhere: as a field of the event, inside
    its session or response object, or in an array. Returns the frame, its type, the top-level
    field holding the poison, and the kind of poison."""
    frame = draw(IN_BOUNDS)  # so that the poison is the frame's only fault of its kind
    kind = draw(st.sampled_from(sorted(POISON)))
    field = draw(st.sampled_from(sorted(FIELDS)) | st.just("x_unknown"))
    where = draw(st.sampled_from(["field", "object", "array"]))
    slot: Any = {"k": PLACEHOLDER} if where == "object" else [0, PLACEHOLDER]
    frame[field] = PLACEHOLDER if where == "field" else slot
    text = json.dumps(frame).replace(json.dumps(PLACEHOLDER), draw(POISON[kind]))
    return text, frame["type"], field, kind


@FUZZ
@given(poisoned_frames())
def test_out_of_bounds_values_are_refused_wherever_they_are(
    case: tuple[str, str, str, str]
) -> None:
    """Deep nesting, lone surrogates, huge integers and non-finite numbers are refused in any
    field of any event (json.loads accepts them all): invalid_json for depth, else
    invalid_session_resume in a resume, else invalid_value, naming the field."""
    text, type_, field, kind = case
    for data in (text, text.encode()):
        outcome = check_parse(data)
        assert isinstance(outcome, ClientProtocolError), (text, outcome)
        if kind == "deep":
            assert outcome.code == "invalid_json"
        elif type_ == "session.resume":
            assert outcome.code == "invalid_session_resume"
        else:
            assert outcome.code == "invalid_value"
        assert outcome.param is not None and outcome.param.startswith(field), outcome


# Each field of each client event, with its JSON type; every event also takes these two.
COMMON_FIELDS: dict[str, type] = {"event_id": str, "client_seq": int}
EVENT_FIELDS: dict[str, dict[str, type]] = {
    "session.update": {"session": dict},
    "input_audio_buffer.append": {"audio": str},
    "input_audio_buffer.commit": {},
    "input_audio_buffer.clear": {},
    "response.create": {"response": dict},
    "response.cancel": {"response_id": str},
    "conversation.item.create": {"item": dict, "previous_item_id": str},
    "conversation.item.retrieve": {"item_id": str},
    "conversation.item.delete": {"item_id": str},
    "conversation.item.truncate": {"item_id": str, "content_index": int, "audio_end_ms": int},
    "output_audio_buffer.clear": {},
    "session.heartbeat": {},
    "session.close": {"reason": str},
    "session.resume": {"session_id": str, "resume_token": str,
                       "last_received_server_event_seq": int, "control_id": str,
                       "attempt": int},
    "session.event_ack": {"server_event_seq": int},
    "input.cancel": {},
    "input.text.append": {"text": str},
    "input_text.append": {"text": str},
    "push_text": {"text": str},
    "barge_in": {},
    "turn.signal": {"event": str, "payload": dict, "signal_payload": dict},
    "signal_turn": {"event": str, "payload": dict, "signal_payload": dict},
    "playback.ack": {"played_ms": int, "committed_ms": int, "response_id": str,
                     "item_id": str},
    "audio.playback_ack": {"played_ms": int, "committed_ms": int, "response_id": str,
                           "item_id": str},
}
# A valid frame of each type, which the wrong-type test spoils one field of.
VALID_BODIES: dict[str, dict[str, Any]] = {
    "session.update": {"session": {"type": "realtime"}},
    "input_audio_buffer.append": {"audio": "AQD/fw=="},
    "session.resume": {"session_id": "s", "resume_token": "t"},
    "session.event_ack": {"server_event_seq": 0},
    "conversation.item.create": {"item": {}},
    "conversation.item.retrieve": {"item_id": "item_1"},
    "conversation.item.delete": {"item_id": "item_1"},
    "conversation.item.truncate": {"item_id": "item_1", "content_index": 0, "audio_end_ms": 0},
    **{type_: {"text": "hi"} for type_ in ("input.text.append", "input_text.append", "push_text")},
    **{type_: {"event": "user.typing"} for type_ in ("turn.signal", "signal_turn")},
    **{type_: {"played_ms": 0} for type_ in ("playback.ack", "audio.playback_ack")},
}
REQUIRED = {"session", "audio", "session_id", "resume_token", "server_event_seq", "item",
            "content_index", "audio_end_ms", "text", "event", "played_ms"}
# Required by some events only: a null there is refused, elsewhere it means absent.
REQUIRED_BY_TYPE = {"item_id": {"conversation.item.retrieve", "conversation.item.delete",
                                "conversation.item.truncate"}}
FIELD_OF_EVENT = st.sampled_from(sorted(EVENT_FIELDS)).flatmap(
    lambda type_: st.tuples(
        st.just(type_), st.sampled_from(sorted({**COMMON_FIELDS, **EVENT_FIELDS[type_]}.items(),
                                               key=lambda item: item[0])))
)


def test_every_client_event_has_its_fields_listed() -> None:
    """The wrong-type fuzz covers every event type the codec accepts."""
    assert set(EVENT_FIELDS) == CLIENT_EVENT_TYPES


@FUZZ
@given(FIELD_OF_EVENT, IN_BOUNDS_JSON)
def test_wrong_types_for_every_field_of_every_event(
    target: tuple[str, tuple[str, type]], value: Any
) -> None:
    """A value of the wrong JSON type in any field of any client event is refused, naming the
    field (null means absent, which only a required field refuses)."""
    type_, (field, kind) = target
    required = field in REQUIRED or type_ in REQUIRED_BY_TYPE.get(field, set())
    if type(value) is kind or (value is None and not required):
        return
    frame = {"type": type_, **VALID_BODIES.get(type_, {}), field: value}
    outcome = check_parse(json.dumps(frame))
    assert isinstance(outcome, ClientProtocolError), frame
    assert outcome.param == field
    if type_ == "session.resume" and field in EVENT_FIELDS[type_]:
        assert outcome.code == "invalid_session_resume"


def assert_deliverable(value: Any, depth: int = 1) -> None:
    """``value`` can be written as strict JSON in strict UTF-8 and read back exactly, by Lua
    and JavaScript too: no surrogate, no non-finite number, no inexact integer, shallow."""
    assert depth <= MAX_DEPTH
    if isinstance(value, bytes):  # audio: stored raw, beside the JSON header
        return
    json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    if type(value) is int:
        assert -MAX_INT <= value <= MAX_INT
    elif isinstance(value, dict):
        for key, member in value.items():
            assert_deliverable(key, depth)
            assert_deliverable(member, depth + 1)
    elif isinstance(value, list):
        for element in value:
            assert_deliverable(element, depth + 1)


# Fields whose value the parsed message carries on (to the store, the worker, the client),
# by event type, apart from event_id, which every event carries.
CARRIED_OBJECTS = {"session.update": "session", "response.create": "response"}
CARRIED_STRINGS = {"session.close": "reason", "response.cancel": "response_id",
                   "session.resume": "resume_token"}


@st.composite
def carried_poison(draw: st.DrawFn) -> dict[str, Any]:
    """A valid frame whose carried payload holds poison: anything inside a session or
    response object, a lone surrogate in a carried string."""
    if draw(st.booleans()):
        type_ = draw(st.sampled_from(sorted(CARRIED_OBJECTS)))
        poison = draw(POISON[draw(st.sampled_from(sorted(POISON)))])
        frame = {"type": type_, CARRIED_OBJECTS[type_]: {"k": [PLACEHOLDER]}}
    else:
        type_ = draw(st.sampled_from(sorted(CARRIED_STRINGS)))
        poison = draw(SURROGATE_TEXT)
        field = draw(st.sampled_from([CARRIED_STRINGS[type_], "event_id"]))
        frame = {"type": type_, "session_id": "s", "resume_token": "t", field: PLACEHOLDER}
    loaded: dict[str, Any] = json.loads(json.dumps(frame).replace(json.dumps(PLACEHOLDER),
                                                                  poison))
    return loaded


@FUZZ
@given(NEAR_VALID | carried_poison())
def test_whatever_is_accepted_can_be_stored_and_rendered(frame: dict[str, Any]) -> None:
    """Every frame the codec accepts holds only values the store, the worker and the client
    can carry: what used to fail later (a 1011, a dropped session.updated) fails here or not
    at all."""
    outcome = check_parse(json.dumps(frame))
    if isinstance(outcome, ClientProtocolError):
        return
    message = outcome.command or outcome.envelope
    assert message is not None
    for message_field in dataclasses.fields(message):
        assert_deliverable(getattr(message, message_field.name))
    if isinstance(outcome.command, m.UpdateSession):
        rendered = render_event(m.SessionUpdated(session=outcome.command.session),
                                server_event_seq=1, event_id="e")
        encode_frame(rendered).encode("utf-8")


# --------------------------------------------------------------------------- rendering

TEXT = st.text(max_size=20)
INDEX = st.integers(min_value=0, max_value=2**31)
SESSIONS = st.fixed_dictionaries(
    {"type": st.just("realtime")},
    optional={
        "id": TEXT,
        "object": st.just("realtime.session"),
        "model": TEXT,
        "instructions": TEXT,
        "output_modalities": st.sampled_from([["audio"], ["text"]]),
        "audio": st.just({"output": {"format": {"type": "audio/pcm", "rate": 24000}}}),
    },
)
CONTENT = {
    "user": st.fixed_dictionaries(
        {"type": st.sampled_from(["input_audio", "input_text"])},
        optional={"transcript": st.none() | TEXT, "text": TEXT},
    ),
    "assistant": st.fixed_dictionaries(
        {"type": st.sampled_from(["output_audio", "output_text"])},
        optional={"transcript": TEXT, "text": TEXT},
    ),
}
ITEMS = st.sampled_from(sorted(CONTENT)).flatmap(
    lambda role: st.fixed_dictionaries(
        {
            "type": st.just("message"),
            "role": st.just(role),
            "content": st.lists(CONTENT[role], max_size=2),
        },
        optional={
            "id": TEXT,
            "object": st.just("realtime.item"),
            "status": st.sampled_from(["completed", "incomplete", "in_progress"]),
        },
    )
)
RESPONSES = st.fixed_dictionaries(
    {"object": st.just("realtime.response"), "id": TEXT},
    optional={
        "status": st.sampled_from(
            ["completed", "cancelled", "failed", "incomplete", "in_progress"]
        ),
        "output": st.lists(ITEMS, max_size=2),
        "conversation_id": TEXT,
        "output_modalities": st.sampled_from([["audio"], ["text"]]),
        "max_output_tokens": st.just("inf") | INDEX,
        "metadata": st.none() | st.dictionaries(TEXT, TEXT, max_size=3),
    },
)
PARTS = st.fixed_dictionaries(
    {"type": st.sampled_from(["audio", "text"])}, optional={"transcript": TEXT, "text": TEXT}
)
OPTIONAL_TEXT = st.none() | TEXT

# Every Event class, with valid Realtime objects where a field holds one; other fields are
# inferred from their types (str, int, bytes).
EVENTS: st.SearchStrategy[m.Event] = st.one_of(
    st.builds(m.SessionUpdated, session=SESSIONS),
    st.builds(
        m.ErrorEvent,
        code=TEXT,
        message=TEXT,
        error_type=TEXT,
        param=OPTIONAL_TEXT,
        client_event_id=OPTIONAL_TEXT,
    ),
    st.builds(m.HeartbeatAck),
    st.builds(m.InputCommitted, item_id=TEXT, previous_item_id=OPTIONAL_TEXT),
    st.builds(m.InputCleared),
    st.builds(m.InputSpeechStarted, audio_start_ms=INDEX, item_id=TEXT),
    st.builds(m.InputSpeechStopped, audio_end_ms=INDEX, item_id=TEXT),
    st.builds(m.ItemAdded, item=ITEMS, previous_item_id=OPTIONAL_TEXT),
    st.builds(m.ItemDone, item=ITEMS, previous_item_id=OPTIONAL_TEXT),
    st.builds(m.ItemRetrieved, item=ITEMS),
    st.builds(m.ItemDeleted, item_id=TEXT),
    st.builds(m.ItemTruncated, item_id=TEXT, content_index=INDEX, audio_end_ms=INDEX),
    st.builds(m.OutputAudioCleared, response_id=TEXT),
    st.builds(m.ResponseCreated, response=RESPONSES),
    st.builds(m.ResponseDone, response=RESPONSES),
    st.builds(m.OutputItemAdded, output_index=INDEX, item=ITEMS),
    st.builds(m.OutputItemDone, output_index=INDEX, item=ITEMS),
    st.builds(m.ContentPartAdded, output_index=INDEX, content_index=INDEX, part=PARTS),
    st.builds(m.ContentPartDone, output_index=INDEX, content_index=INDEX, part=PARTS),
    st.builds(m.AudioDelta, output_index=INDEX, content_index=INDEX),
    st.builds(m.AudioDone, output_index=INDEX, content_index=INDEX),
    st.builds(m.TranscriptDelta, output_index=INDEX, content_index=INDEX),
    st.builds(m.TranscriptDone, output_index=INDEX, content_index=INDEX),
    st.builds(m.SessionClosed),
    st.builds(m.SessionExpired),
)


@FUZZ
@given(EVENTS, st.integers(min_value=1, max_value=MAX_SEQ), TEXT, OPTIONAL_TEXT)
def test_every_event_renders_valid(
    event: m.Event, seq: int, event_id: str, session_id: str | None
) -> None:
    """Every event the worker can produce renders to JSON that validates strictly."""
    rendered = render_event(event, server_event_seq=seq, event_id=event_id, session_id=session_id)
    validate_server_event(rendered)
    assert json.loads(encode_frame(rendered)) == rendered


NOTICES = st.one_of(
    st.builds(SessionCreatedNotice, session=SESSIONS, lease_generation=INDEX),
    st.builds(SessionResumedNotice),
    st.builds(SessionReplacedNotice),
    st.builds(ResyncRequiredNotice),
)


@FUZZ
@given(NOTICES, TEXT)
def test_every_notice_renders_valid(notice: Any, event_id: str) -> None:
    """Every gateway notice renders to JSON that validates strictly."""
    rendered = render_notice(notice, event_id=event_id)
    validate_server_event(rendered)
    assert json.loads(encode_frame(rendered)) == rendered
