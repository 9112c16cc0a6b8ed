"""Property tests for the codec: every input is accepted or refused with a documented code.

In the spirit of websockets' fuzzing: whatever bytes a client sends, ``parse_client_frame``
returns a :class:`ParsedFrame` or raises :class:`ClientProtocolError` with a code from
:data:`PARSE_ERROR_CODES`, never anything else. And every event the worker can produce renders
to JSON that the strictest real client accepts.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import given, settings, strategies as st

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
from store import messages as m
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
@given(st.binary(max_size=512))
def test_arbitrary_bytes(data: bytes) -> None:
    """Arbitrary binary frames are parsed or refused with a documented code."""
    check_parse(data)


@FUZZ
@given(st.text(max_size=512))
def test_arbitrary_text(data: str) -> None:
    """Arbitrary text frames are parsed or refused with a documented code."""
    check_parse(data)


JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON = st.recursive(
    JSON_LEAVES,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


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

# Each field a client event may carry: a plausible value or any JSON value.
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "event_id": st.text(max_size=10) | JSON,
    "client_seq": SEQ | JSON,
    "session": st.dictionaries(st.text(max_size=5), JSON, max_size=3) | JSON,
    "audio": B64_AUDIO | st.text(max_size=16) | JSON,
    "response": st.dictionaries(st.text(max_size=5), JSON, max_size=3) | JSON,
    "response_id": st.text(max_size=10) | JSON,
    "reason": st.text(max_size=10) | JSON,
    "session_id": st.text(max_size=10) | JSON,
    "resume_token": st.text(max_size=10) | JSON,
    "last_received_server_event_seq": SEQ | JSON,
    "control_id": st.text(max_size=10) | JSON,
    "server_event_seq": SEQ | JSON,
}
NEAR_VALID = st.fixed_dictionaries({"type": st.sampled_from(ALL_TYPES)}, optional=FIELDS)


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
    st.builds(m.ItemAdded, item=ITEMS, previous_item_id=OPTIONAL_TEXT),
    st.builds(m.ItemDone, item=ITEMS, previous_item_id=OPTIONAL_TEXT),
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
