"""Fuzz a live stack with bad frames while bystander sessions stream on the same worker.

One real Redis, one real gateway and one real loopback worker (``tests/e2e/stack.py``) serve
the whole module. Three bystander sessions stream real-time audio in loopback ``stream`` mode,
from a process of their own (``tests/e2e/bystanders.py``: what they time is the stack, not
this process), from the first test to the last. Meanwhile fuzz connections send every kind
of bad frame: bad JSON, invalid UTF-8 in text frames, lone surrogates, deep nesting, huge and
non-finite numbers, wrong types for every field of every client event, binary and oversize
frames. The named regression frames go first, one
connection each, then the hypothesis examples over a few long-lived connections.

Every frame is followed by a probe, a ``response.cancel`` whose ``event_id`` is a fresh marker
and which names no response: the worker refuses it in log order, so by the time the refusal
naming the marker is read, everything the gateway and the worker answered to the frame has
been read too, and the session is known to be usable. A frame that closes the connection is
followed by a resume instead (the docs: a session whose connection is lost is detached and
resumable), or, when the frame ended the session, by a new session.

What must hold (docs/reference/protocol.md):

* every ``error`` a fuzz connection gets has a documented code, and every close code is a
  documented one that the frame may cause (never 1006, and never 1011: that one means a
  gateway or store failure, and nothing here is one);
* the gateway and the worker still run, and ``/healthz`` answers;
* a fresh session then completes a turn;
* every bystander got every chunk back, in order, with no gap over a second between echoes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

import pytest
import websockets
from hypothesis import HealthCheck, given, settings, strategies as st
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, WebSocketException

from duplex_client import DuplexClient, RealtimeEvent
from gateway.protocol.errors import PARSE_ERROR_CODES
from gateway.protocol.parse import CLIENT_EVENT_TYPES, UNSUPPORTED_CLIENT_EVENT_TYPES
from runtime.embedded import start_server
from tests.e2e.bystanders import TERMINAL_TYPES, Bystanders, StreamReport, close_code_of
from tests.e2e.conftest import FAST_ENV
from tests.e2e.helpers import PUSH_TO_TALK_SESSION, STREAM_SESSION, collect_until, marked_chunk
from tests.e2e.stack import Proc, Stack, http_ok, new_log_path
from tests.gateway.strict import validate_server_event
from tests.test_protocol_doc import column, doc_table

pytestmark = [pytest.mark.e2e]

JsonDict: TypeAlias = dict[str, Any]
_T = TypeVar("_T")

MAX_FRAME = 64 * 1024
# The gateway's websocket server refuses frames over this on its own (close 1009 before the
# gateway sees them): ``duplex-gateway serve`` sets uvicorn's ws_max_size to the limit + 1 KiB.
PROTOCOL_MAX_FRAME = MAX_FRAME + 1024
BYSTANDERS = 3
FUZZ_CONNECTIONS = 3
WORKER_SLOTS = 16
# Sized for a 2-core machine: a few connections, a few frames per example.
FUZZ_EXAMPLES = 300
FRAMES_PER_EXAMPLE = 6
# Once spent, the remaining examples send nothing: a product bug that makes every probe time out
# must still leave the report of what was found, not a test killed by its timeout.
FUZZ_BUDGET_S = 35.0
# Every answer comes from a local process within milliseconds; this is only a deadline.
ANSWER_TIMEOUT_S = 5.0
# Acceptance criterion: the longest gap between two consecutive echoes of a bystander.
STALL_LIMIT_S = 1.0

# Docs, Errors: the codes of the gateway's own table that a client's frames may cause, the
# codes its resume and rate-limit rules add, and the refusals decided by the worker.
GATEWAY_CODES = frozenset({
    "unsupported_session_resume", "session_resume_expired", "invalid_resume_token",
    "invalid_event_ack", "resource_exhausted", "rate_limit_exceeded",
})
# Every refusal the protocol page's error table gives the worker (its "from" column), but
# model_error (a model that failed: no client frame may cause one). A playback.ack with a null
# (absent) item_id and an unknown response_id is refused playback_item_not_found, say.
_FROM = column("error code", "from")
WORKER_REFUSAL_CODES = frozenset(
    code for code, row in doc_table("error code").items()
    if "worker" in row.cells[_FROM] and code != "model_error")
DOCUMENTED_ERROR_CODES = frozenset(PARSE_ERROR_CODES) | GATEWAY_CODES | WORKER_REFUSAL_CODES
DOCUMENTED_CLOSE_CODES = frozenset({1000, 1007, 1008, 1009, 1011, 1012, 1013})
# 1011 is documented for a gateway or store failure only (internal_error, session_lost).
FUZZ_CLOSE_CODES = DOCUMENTED_CLOSE_CODES - {1011}
# session.closed reasons that say the session broke, not that a client asked it to end.
BROKEN_REASONS = frozenset({
    "worker_lost", "worker_shutdown", "open_abandoned", "no_free_slot", "model_error",
    "log_rewound", "internal_error",
})
BOUNDS_CODES = frozenset({"invalid_value", "invalid_json"})
# Docs, Errors: the close that comes with an error code.
CLOSE_BY_CODE = {
    "event_too_large": 1009, "session_resume_expired": 1008, "invalid_resume_token": 1008,
    "resource_exhausted": 1013, "rate_limit_exceeded": 1013,
}


# --------------------------------------------------------------------------- frames


@dataclass(frozen=True, slots=True)
class Frame:
    """One websocket frame to send.

    ``data`` goes out as a text frame when ``text`` is true, bytes included (which then need
    not be UTF-8), else as a binary frame. ``kind`` groups frames in the report; ``detail``
    says where the bad part sits. ``expect_error``: the documented answer is an ``error``
    (a bound broken where a field is read: a non-finite number, hundreds of levels of nesting).
    """

    kind: str
    data: str | bytes
    text: bool = True
    detail: str = ""
    expect_error: bool = False

    @property
    def size(self) -> int:
        if isinstance(self.data, bytes):
            return len(self.data)
        return len(self.data.encode())

    @property
    def expected_close(self) -> int | None:
        """The close code the docs give for this frame, or None: the session stays usable."""
        if self.size > MAX_FRAME:
            return 1009
        if self.text and isinstance(self.data, bytes) and not _is_utf8(self.data):
            return 1007
        return None

    @property
    def expected_code(self) -> str | None:
        """The error the docs give before that close, where the gateway reads the frame
        (one over the websocket server's own limit is closed before the gateway sees it)."""
        if MAX_FRAME < self.size <= PROTOCOL_MAX_FRAME:
            return "event_too_large"
        return "invalid_json" if self.expected_close == 1007 else None

    @property
    def label(self) -> str:
        shown = self.data if len(self.data) <= 120 else self.data[:120]
        more = f" ... ({self.size} bytes)" if len(self.data) > 120 else ""
        where = f" [{self.detail}]" if self.detail else ""
        frame_type = "text" if self.text else "binary"
        return f"{self.kind}{where} {frame_type} {shown!r}{more}"


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# The smallest valid event of each client event type: a fuzz frame spoils one field of one.
VALID_EVENTS: dict[str, JsonDict] = {
    "session.update": {"session": {"type": "realtime"}},
    "input_audio_buffer.append": {"audio": "AAAAAA=="},
    "input_audio_buffer.commit": {},
    "input_audio_buffer.clear": {},
    "response.create": {"response": {}},
    "response.cancel": {"response_id": "resp_fuzz"},
    "session.heartbeat": {},
    "session.close": {"reason": "fuzz"},
    "session.resume": {"session_id": "sess_fuzz", "resume_token": "token",
                       "last_received_server_event_seq": 0, "control_id": "control",
                       "attempt": 1},
    "session.event_ack": {"server_event_seq": 0},
    "conversation.item.create": {
        "previous_item_id": "item_fuzz",
        "item": {"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": "fuzz"}]}},
    "conversation.item.retrieve": {"item_id": "item_fuzz"},
    "conversation.item.delete": {"item_id": "item_fuzz"},
    "conversation.item.truncate": {"item_id": "item_fuzz", "content_index": 0,
                                   "audio_end_ms": 0},
    "output_audio_buffer.clear": {},
    "input.cancel": {},
    "input.text.append": {"text": "fuzz"},
    "input_text.append": {"text": "fuzz"},
    "push_text": {"text": "fuzz"},
    "barge_in": {},
    "turn.signal": {"event": "user.typing", "payload": {}},
    "signal_turn": {"event": "barge_in", "signal_payload": {}},
    "playback.ack": {"played_ms": 0, "committed_ms": 0, "response_id": "resp_fuzz",
                     "item_id": "item_fuzz"},
    "audio.playback_ack": {"played_ms": 0},
}
# The JSON type of every field the parsers in gateway/protocol/parse.py read.
FIELD_KINDS: dict[str, type] = {
    "type": str, "event_id": str, "client_seq": int, "session": dict, "audio": str,
    "response": dict, "response_id": str, "reason": str, "session_id": str,
    "resume_token": str, "last_received_server_event_seq": int, "control_id": str,
    "server_event_seq": int, "attempt": int, "item": dict, "previous_item_id": str,
    "item_id": str, "content_index": int, "audio_end_ms": int, "text": str, "event": str,
    "payload": dict, "signal_payload": dict, "played_ms": int, "committed_ms": int,
}
COMMON_FIELDS = ("type", "event_id", "client_seq")
# An absent optional field may be sent as null: null is a wrong type only where required.
REQUIRED_FIELDS = frozenset({"type", "session", "audio", "session_id", "resume_token",
                             "server_event_seq", "item", "item_id", "content_index",
                             "audio_end_ms"})
# Values inside ``session`` that the worker reads; the last one is echoed back unchecked.
SESSION_SLOTS: dict[str, Callable[[Any], JsonDict]] = {
    "session.instructions": lambda v: {"type": "realtime", "instructions": v},
    "session.tools": lambda v: {"type": "realtime", "tools": v},
    "session.audio.output.speed": lambda v: {"audio": {"output": {"speed": v}}},
    "session.audio.output.voice": lambda v: {"audio": {"output": {"voice": v}}},
    "session.max_output_tokens": lambda v: {"max_output_tokens": v},
    "session.extra_body.loopback_mode": lambda v: {"extra_body": {"loopback_mode": v}},
    "session.tools[0].parameters": lambda v: {
        "type": "realtime", "tools": [{"type": "function", "name": "fuzz", "parameters": v}]},
}
IGNORED_FIELD = "x_fuzz"  # unknown top-level fields are ignored (docs: additive extensions)

Slot: TypeAlias = tuple[str, str]  # (event type, field or SESSION_SLOTS path)
FIELD_SLOTS: list[Slot] = [(type_, name) for type_ in sorted(VALID_EVENTS)
                           for name in (*COMMON_FIELDS, *VALID_EVENTS[type_])]
IGNORED_SLOTS: list[Slot] = [(type_, IGNORED_FIELD)
                             for type_ in ("session.heartbeat", "session.update")]
SESSION_VALUE_SLOTS: list[Slot] = [("session.update", path) for path in SESSION_SLOTS]
STRING_SESSION_SLOTS = ("session.instructions", "session.audio.output.voice",
                        "session.extra_body.loopback_mode")
# Half the draws go inside ``session``: the worker reads, copies and echoes what is there.
ANY_SLOT = st.sampled_from(FIELD_SLOTS + IGNORED_SLOTS) | st.sampled_from(SESSION_VALUE_SLOTS)
STRING_SLOT = (st.sampled_from([slot for slot in FIELD_SLOTS if FIELD_KINDS[slot[1]] is str])
               | st.sampled_from([slot for slot in SESSION_VALUE_SLOTS
                                  if slot[1] in STRING_SESSION_SLOTS]))


def event_with(slot: Slot, value: Any) -> JsonDict:
    """The valid event of ``slot``'s type with ``value`` put where ``slot`` says."""
    type_, name = slot
    event: JsonDict = {"type": type_, **VALID_EVENTS[type_]}
    if name in SESSION_SLOTS:
        event["session"] = SESSION_SLOTS[name](value)
    else:
        event[name] = value
    return event


_RAW = "\x00raw\x00"


def embed(event: JsonDict, literal: str) -> str:
    """The JSON text of ``event`` with its one ``_RAW`` placeholder replaced by ``literal``:
    what json.dumps cannot write (1e400, NaN, lone surrogate escapes, very deep nesting)."""
    text, placeholder = json.dumps(event), json.dumps(_RAW)
    assert text.count(placeholder) == 1, text
    return text.replace(placeholder, literal)


def slot_frame(kind: str, slot: Slot, literal: str, *, expect_error: bool = False) -> Frame:
    """A frame whose ``slot`` holds the raw JSON ``literal``."""
    detail = f"{slot[0]} {slot[1]}"
    return Frame(kind, embed(event_with(slot, _RAW), literal), detail=detail,
                 expect_error=expect_error and slot[1] != IGNORED_FIELD)


def nested(depth: int, container: str) -> str:
    """``depth`` levels of arrays or objects as JSON text."""
    if container == "array":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "{}" + "}" * depth


def json_string(prefix: str, escape: str, suffix: str) -> str:
    """A JSON string literal with a raw escape (a lone surrogate, say) between two texts."""
    return json.dumps(prefix)[:-1] + escape + json.dumps(suffix)[1:]


NON_FINITE = ("1e400", "-1e400", "NaN", "Infinity", "-Infinity", "1" * 5000)
FINITE = (str(2**70), str(-(2**70)), "1e308", "-0.0", "1e-400", str(2**53 + 1))
LONE_SURROGATES = ("\\ud800", "\\udbff", "\\udc00", "\\udfff", "\\udc00\\ud800", "\\ud83d")
INVALID_UTF8 = (b"\xff", b"\xfe\xff", b"\x80", b"\xc0\xaf", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80",
                b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80")
GARBAGE = (
    "", " ", "{", "}", "[", "{not json", '{"type":', '{"type":"session.heartbeat",}',
    "{'type': 'session.heartbeat'}", '{"type":"session.heartbeat"} {}',
    '{"type":"session.heartbeat"}x', "\x00", "nul", "tru", '{"a":"\\u12"}', '"\\x41"',
    '{"type":"session.heartbeat","event_id":"e" "f"}', "\ufeff" + '{"type":"session.heartbeat"}',
)
ALL_TYPES = (*sorted(CLIENT_EVENT_TYPES | UNSUPPORTED_CLIENT_EVENT_TYPES), "no.such.event", "")

JSON_LEAVES = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
               | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
_KIND_STRATEGIES: dict[type, st.SearchStrategy[Any]] = {
    type(None): st.none(),
    bool: st.booleans(),
    int: st.integers(-(2**70), 2**70),
    float: st.floats(allow_nan=False, allow_infinity=False),
    str: st.text(max_size=12),
    list: st.lists(JSON_LEAVES, max_size=3),
    dict: st.dictionaries(st.text(max_size=6), JSON_LEAVES, max_size=3),
}


def wrong_values(name: str) -> st.SearchStrategy[Any]:
    """JSON values of any type but the one field ``name`` needs."""
    right = FIELD_KINDS[name]
    wrong = [kind for kind in _KIND_STRATEGIES
             if kind is not right and (kind is not type(None) or name in REQUIRED_FIELDS)]
    return st.one_of([_KIND_STRATEGIES[kind] for kind in wrong])


@st.composite
def wrong_type_frames(draw: st.DrawFn) -> Frame:
    """A valid event with one field of the wrong JSON type."""
    slot = draw(st.sampled_from(FIELD_SLOTS))
    value = draw(wrong_values(slot[1]))
    return Frame("wrong type", json.dumps(event_with(slot, value)), detail=f"{slot[0]} {slot[1]}")


@st.composite
def number_frames(draw: st.DrawFn) -> Frame:
    """Huge, tiny and non-finite number literals in any field."""
    literal = draw(st.sampled_from(NON_FINITE) | st.sampled_from(FINITE))
    return slot_frame("number", draw(ANY_SLOT), literal, expect_error=literal in NON_FINITE)


@st.composite
def surrogate_frames(draw: st.DrawFn) -> Frame:
    """Lone surrogate escapes in any string field, or as a key inside ``session``."""
    literal = json_string(draw(st.text(max_size=4)), draw(st.sampled_from(LONE_SURROGATES)),
                          draw(st.text(max_size=4)))
    if draw(st.booleans()):
        session = {"type": "realtime", _RAW: "x"}
        return Frame("lone surrogate", embed({"type": "session.update", "session": session},
                                              literal), detail="session key")
    return slot_frame("lone surrogate", draw(STRING_SLOT), literal)


@st.composite
def deep_frames(draw: st.DrawFn) -> Frame:
    """Hundreds of levels of arrays or objects, as the whole frame or in any field."""
    depth = draw(st.integers(min_value=100, max_value=1200))
    container = draw(st.sampled_from(["array", "object"]))
    literal = nested(depth, container)
    if draw(st.integers(0, 5)) == 0:
        return Frame("deep nesting", literal, detail=f"{depth} {container}s, whole frame",
                     expect_error=True)
    frame = slot_frame("deep nesting", draw(ANY_SLOT), literal, expect_error=True)
    return Frame(frame.kind, frame.data, detail=f"{depth} {container}s, {frame.detail}",
                 expect_error=frame.expect_error)


@st.composite
def bad_json_frames(draw: st.DrawFn) -> Frame:
    """Text that is not JSON: garbage, random text, valid events cut short."""
    choice = draw(st.integers(0, 2))
    if choice == 0:
        return Frame("bad json", draw(st.sampled_from(GARBAGE)))
    if choice == 1:
        return Frame("bad json", draw(st.text(max_size=40)))
    type_ = draw(st.sampled_from(sorted(VALID_EVENTS)))
    text = json.dumps({"type": type_, **VALID_EVENTS[type_]})
    return Frame("bad json", text[: draw(st.integers(1, len(text) - 1))], detail="cut short")


@st.composite
def invalid_utf8_frames(draw: st.DrawFn) -> Frame:
    """A text frame whose bytes are not UTF-8 (the websocket protocol requires it)."""
    prefix = draw(st.sampled_from([b"", b'{"type":"session.heartbeat","event_id":"',
                                   b'{"type":"session.close","reason":"']))
    suffix = draw(st.sampled_from([b"", b'"}']))
    bad = draw(st.sampled_from(INVALID_UTF8))
    return Frame("invalid utf-8 text", prefix + bad + suffix)


@st.composite
def binary_frames(draw: st.DrawFn) -> Frame:
    """Binary frames: random bytes, valid events, events with invalid UTF-8 inside."""
    choice = draw(st.integers(0, 2))
    if choice == 0:
        return Frame("binary", draw(st.binary(max_size=200)), text=False)
    type_ = draw(st.sampled_from(["session.heartbeat", "input_audio_buffer.append",
                                  "session.update", "response.cancel"]))
    data = json.dumps({"type": type_, **VALID_EVENTS[type_]}).encode()
    if choice == 1:
        return Frame("binary", data, text=False, detail="a valid event")
    return Frame("binary", data[:-2] + draw(st.sampled_from(INVALID_UTF8)) + b'"}', text=False,
                 detail="invalid utf-8 inside")


@st.composite
def oversize_frames(draw: st.DrawFn) -> Frame:
    """Frames around the size limit, text or binary, under and over the protocol's limit."""
    size = draw(st.integers(min_value=MAX_FRAME - 8, max_value=PROTOCOL_MAX_FRAME + 1024))
    head, tail = '{"type":"input_audio_buffer.append","audio":"', '"}'
    text = head + "A" * (size - len(head) - len(tail)) + tail
    as_text = draw(st.booleans())
    return Frame("oversize" if size > MAX_FRAME else "at the size limit",
                 text if as_text else text.encode(), text=as_text, detail=f"{size} bytes")


@st.composite
def close_reason_frames(draw: st.DrawFn) -> Frame:
    """``session.close`` with reasons that are long in UTF-8 bytes (a close frame's reason
    holds 123), multi-byte, or lone surrogates: the reason comes back in session.closed."""
    if draw(st.integers(0, 3)) == 0:
        literal = json_string(draw(st.text(max_size=4)), draw(st.sampled_from(LONE_SURROGATES)),
                              draw(st.text(max_size=4)))
        return slot_frame("close reason", ("session.close", "reason"), literal)
    character = draw(st.sampled_from(["a", "\u00e9", "\u20ac", "\U0001f600"]))  # 1-4 bytes
    reason = draw(st.just(character * draw(st.integers(20, 140))) | st.text(max_size=80))
    event = {"type": "session.close", "reason": reason}
    return Frame("close reason", json.dumps(event, ensure_ascii=draw(st.booleans())),
                 detail=f"{len(reason.encode())} bytes")


@st.composite
def near_valid_frames(draw: st.DrawFn) -> Frame:
    """Any event type with random fields of random values; session patches of random values."""
    fields = {name: JSON_VALUES for name in FIELD_KINDS if name != "type"}
    if draw(st.booleans()):
        keys = st.sampled_from(["type", "instructions", "tools", "tool_choice", "audio",
                                "extra_body", "output_modalities", "max_output_tokens", "model"])
        fields["session"] = st.dictionaries(keys, JSON_VALUES, max_size=3)
    event = draw(st.fixed_dictionaries({"type": st.sampled_from(ALL_TYPES)}, optional=fields))
    return Frame("near valid", json.dumps(event))


FRAMES: st.SearchStrategy[Frame] = st.one_of(
    bad_json_frames(), invalid_utf8_frames(), surrogate_frames(), deep_frames(),
    number_frames(), wrong_type_frames(), binary_frames(), oversize_frames(),
    close_reason_frames(), near_valid_frames(),
)


def resume_first_frames(target_id: str) -> st.SearchStrategy[Frame]:
    """``session.resume`` as a connection's first frame, its fields spoilt: the session named
    is ``target_id`` (a live session whose token is never sent), an unknown one, or junk."""
    ids = st.one_of(st.just(target_id), st.sampled_from(["sess_nope", ""]), st.text(max_size=12))
    valid = {"session_id": ids, "resume_token": st.text(max_size=12),
             "control_id": st.text(max_size=12),
             "last_received_server_event_seq": st.integers(0, 10)}
    deep = (nested(600, "array"), nested(600, "object"))
    raw = st.sampled_from([*NON_FINITE, *FINITE, *deep]) | st.builds(
        json_string, st.text(max_size=4), st.sampled_from(LONE_SURROGATES), st.text(max_size=4))

    @st.composite
    def build(draw: st.DrawFn) -> Frame:
        event: JsonDict = {"type": "session.resume", **draw(st.fixed_dictionaries(valid))}
        if draw(st.booleans()):  # well-formed: the token and control id reach the store
            return Frame("resume first", json.dumps(event, ensure_ascii=draw(st.booleans())))
        spoilt = draw(st.sampled_from(sorted(valid)))
        event[spoilt] = _RAW
        return Frame("resume first", embed(event, draw(raw)), detail=spoilt)

    return build()


# --------------------------------------------------------------------------- outcomes


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one frame got back on a fuzz connection."""

    frame: Frame
    events: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    close_code: int | None = None
    ended: str | None = None
    problems: tuple[str, ...] = ()

    def violations(self) -> list[str]:
        """Each way this answer departs from the docs."""
        found = [f"undocumented error code {code!r}" for code in self.errors
                 if code not in DOCUMENTED_ERROR_CODES]
        if self.close_code is not None and self.close_code not in FUZZ_CLOSE_CODES:
            found.append(f"close {self.close_code}")
        if self.ended in BROKEN_REASONS:
            found.append(f"the session broke: {self.ended}")
        return [*found, *self.problems]


@dataclass
class Answer:
    """What a connection received since the frame went out; becomes an :class:`Outcome`."""

    events: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    close_code: int | None = None
    ended: str | None = None

    def note(self, data: JsonDict) -> None:
        type_ = str(data.get("type"))
        self.events.append(type_)
        try:
            validate_server_event(data)
        except (AssertionError, ValueError, RecursionError) as exc:  # pydantic's is a ValueError
            self.problems.append(f"invalid {type_} event: {str(exc)[:200]}")
        error = data.get("error")
        if type_ == "error" and isinstance(error, dict):
            self.errors.append(str(error.get("code")))
        elif type_ in TERMINAL_TYPES:
            self.ended = str(data.get("reason"))

    def check(self, frame: Frame) -> None:
        """Add what the docs' per-frame rules say about the close (or its absence)."""
        expected, got = frame.expected_close, self.close_code
        if expected is not None and got != expected:
            self.problems.append(f"expected close {expected}, got {got}")
        if frame.expected_code is not None and frame.expected_code not in self.errors:
            self.problems.append(f"expected error {frame.expected_code} before the close")
        called_for = {CLOSE_BY_CODE[code] for code in self.errors if code in CLOSE_BY_CODE}
        for code in self.errors:
            if code in CLOSE_BY_CODE and got != CLOSE_BY_CODE[code]:
                self.problems.append(f"{code} without close {CLOSE_BY_CODE[code]} (got {got})")
        session_end = got == 1000 and self.ended is not None
        if (expected is None and got in FUZZ_CLOSE_CODES and got not in called_for
                and not session_end):
            self.problems.append(f"closed {got} although the frame calls for no close")
        if frame.expect_error and not self.errors and got is None:
            self.problems.append("no error for a value out of bounds")

    def outcome(self, frame: Frame) -> Outcome:
        return Outcome(frame, tuple(self.events), tuple(self.errors), self.close_code,
                       self.ended, tuple(self.problems))


def decode_server_frame(raw: str | bytes, answer: Answer) -> JsonDict:
    """A server frame as JSON; anything else is a problem (and an empty event)."""
    try:
        data = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        answer.problems.append(f"a server frame that is not a JSON object: {raw[:80]!r}")
        return {}
    return data


def report(outcomes: Sequence[Outcome]) -> list[str]:
    """One line per kind of violation, in the order they first happened (the first is most
    often the cause of the rest): how often, and the first frame that caused it."""
    seen: Counter[tuple[str, str]] = Counter()
    first: dict[tuple[str, str], str] = {}
    for outcome in outcomes:
        for violation in outcome.violations():
            key = (outcome.frame.kind, violation[:160])
            seen[key] += 1
            first.setdefault(key, outcome.frame.label)
    return [f"{seen[key]} x {key[0]}: {key[1]}\n    first: {label}"
            for key, label in first.items()]


def assert_documented(outcomes: Sequence[Outcome], procs: Sequence[Proc] = ()) -> None:
    """No outcome departs from the docs; the message says how, and which process exited."""
    lines = report(outcomes)
    exited = [f"the {proc.name} exited with {proc.process.returncode}" for proc in procs
              if proc.process.poll() is not None]
    assert not lines, "\n".join([
        *exited, f"{len(lines)} kinds of undocumented answers to {len(outcomes)} frames:",
        *lines[:40]])


# --------------------------------------------------------------------------- fuzz connections


class SessionRefused(Exception):
    """The gateway would not open a session for a fuzz connection."""


def probe_frame(marker: str) -> str:
    """A command the worker refuses in log order (it names no response), echoing ``marker``."""
    return json.dumps({"type": "response.cancel", "event_id": marker, "response_id": marker})


class FuzzSession:
    """One fuzz client: frames go out one at a time, each followed by a probe. A frame that
    closes the connection is followed by a resume; one that ends the session, by a new one."""

    def __init__(self, url: str, config: JsonDict, name: str) -> None:
        self._url = url
        self._config = config
        self._name = name
        self._ws: ClientConnection | None = None
        self._session_id: str | None = None
        self._resume_token = ""
        self._last_seq = 0
        self._probes = 0

    @property
    def session_id(self) -> str | None:
        return self._session_id

    async def exchange(self, frame: Frame) -> Outcome:
        """Send ``frame``, read every answer to it, and leave a usable session behind."""
        answer = Answer()
        try:
            ws = self._ws or await self.open(answer)
        except SessionRefused as refused:  # the frame was not sent: nothing else to check
            answer.problems.append(f"no session for the fuzz connection: {refused}")
            return answer.outcome(frame)
        except (OSError, WebSocketException) as exc:  # the gateway is gone
            answer.problems.append(f"could not connect: {exc!r}")
            return answer.outcome(frame)
        await self._send_and_probe(ws, frame, answer)
        answer.check(frame)
        return answer.outcome(frame)

    async def finish(self) -> Outcome:
        """End the session with ``session.close``: the connection must close 1000 after it."""
        frame = Frame("session.close at the end", json.dumps({"type": "session.close"}))
        answer = Answer()
        ws, self._ws = self._ws, None
        if ws is None:
            return answer.outcome(frame)
        try:
            await ws.send(frame.data)
            while True:
                await self._next(ws, answer)
        except ConnectionClosed as closed:
            answer.close_code = close_code_of(closed)
        except TimeoutError:
            answer.problems.append("session.close got no session.closed")
            ws.transport.abort()
        if answer.ended is None or answer.close_code != 1000:
            answer.problems.append(f"session.close ended with {answer.ended}, "
                                   f"close {answer.close_code}")
        return answer.outcome(frame)

    async def _send_and_probe(self, ws: ClientConnection, frame: Frame, answer: Answer) -> None:
        marker = self._marker()
        try:
            # The frame may close the connection: then the probe cannot go, but what the
            # gateway sent before its close frame is still read below.
            with contextlib.suppress(ConnectionClosed):
                await ws.send(frame.data, text=frame.text)
                await ws.send(probe_frame(marker))
            await self._read_until_probe(ws, marker, answer)
        except ConnectionClosed as closed:
            answer.close_code = close_code_of(closed)
            self._ws = None
            await self._recover(answer)
        except TimeoutError:
            answer.problems.append(f"no answer to the probe within {ANSWER_TIMEOUT_S} s")
            await self._abandon(ws)

    async def _read_until_probe(self, ws: ClientConnection, marker: str,
                                answer: Answer) -> None:
        while True:
            data = await self._next(ws, answer, quiet_marker=marker)
            error = data.get("error")
            if isinstance(error, dict) and error.get("event_id") == marker:
                return

    async def _next(self, ws: ClientConnection, answer: Answer, *,
                    quiet_marker: str | None = None) -> JsonDict:
        """The next server event, checked: strict shape, server_event_seq 1, 2, 3, ..."""
        raw = await asyncio.wait_for(ws.recv(), ANSWER_TIMEOUT_S)
        data = decode_server_frame(raw, answer)
        seq = data.get("server_event_seq")
        if isinstance(seq, int):
            if seq != self._last_seq + 1:
                answer.problems.append(f"server_event_seq {seq} after {self._last_seq}")
            self._last_seq = seq
        if data.get("type") == "session.resync_required":
            self._last_seq = int(data["replay_from"]) - 1
        error = data.get("error")
        if quiet_marker is not None and isinstance(error, dict) \
                and error.get("event_id") == quiet_marker:
            if error.get("code") != "response_cancel_not_active":
                answer.problems.append(f"the probe got {error.get('code')!r}")
            return data  # the probe's own answer is not an answer to the frame
        answer.note(data)
        return data

    def _marker(self) -> str:
        self._probes += 1
        return f"probe_{self._name}_{self._probes}"

    async def open(self, answer: Answer) -> ClientConnection:
        """Open a new session on a new connection; what the opening got back is not an
        answer to a frame, so only its problems (a malformed event, say) join ``answer``."""
        opening = Answer()
        ws = await websockets.connect(self._url, max_size=None)
        try:
            await ws.send(json.dumps({"type": "session.update", "session": self._config}))
            created = await self._next(ws, opening)
            if created.get("type") != "session.created":
                raise SessionRefused(str(created.get("error", created)))
            self._session_id = str(created["session_id"])
            self._resume_token = str(created["resume_token"])
            self._last_seq = 0
            while (await self._next(ws, opening)).get("type") != "session.updated":
                pass
        except (SessionRefused, ConnectionClosed, TimeoutError) as exc:
            await ws.close()
            raise SessionRefused(repr(exc)) from None
        finally:
            answer.problems.extend(opening.problems)
        self._ws = ws
        return ws

    async def _recover(self, answer: Answer) -> None:
        """After a close: an ended session is replaced on the next frame; a detached one must
        resume (docs: detached, resumable), and is then probed to read what it replays."""
        if answer.ended is not None or self._session_id is None:
            self._session_id = None
            return
        try:
            refusal = await self._resume(answer)
        except (OSError, WebSocketException) as exc:  # the connect itself failed
            refusal = repr(exc)
        if refusal is not None:
            answer.problems.append(f"not resumable after close {answer.close_code}: {refusal}")
            self._session_id = None

    async def _resume(self, answer: Answer) -> str | None:
        """Resume on a new connection; None once the resumed session answered a probe, else
        why not (the connection is then closed)."""
        ws = await websockets.connect(self._url, max_size=None)
        try:
            refusal = await self._resume_on(ws, answer)
        except (OSError, WebSocketException) as exc:  # TimeoutError is an OSError
            refusal = repr(exc)
        if refusal is None:
            self._ws = ws
        else:
            await ws.close()
        return refusal

    async def _resume_on(self, ws: ClientConnection, answer: Answer) -> str | None:
        await ws.send(json.dumps({
            "type": "session.resume", "session_id": self._session_id,
            "resume_token": self._resume_token,
            "last_received_server_event_seq": self._last_seq,
        }))
        resumed = await self._next(ws, answer)
        if resumed.get("type") != "session.resumed":
            return str(resumed.get("error", resumed))
        self._resume_token = str(resumed["resume_token"])
        self._last_seq = int(resumed["replay_from"]) - 1
        marker = self._marker()
        await ws.send(probe_frame(marker))
        await self._read_until_probe(ws, marker, answer)
        return None

    async def _abandon(self, ws: ClientConnection) -> None:
        """A session that stopped answering: drop it (it stays detached) and use a new one."""
        ws.transport.abort()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ws.wait_closed(), ANSWER_TIMEOUT_S)
        self._ws = None
        self._session_id = None


FIRST_PROBE_ID = "probe_first"
# Answered by the gateway itself in any state (it acknowledges an event never sent): proof that
# the connection is still read, without opening a session.
FIRST_PROBE = json.dumps({"type": "session.event_ack", "server_event_seq": 1,
                          "event_id": FIRST_PROBE_ID})


async def exchange_first(url: str, frame: Frame) -> Outcome:
    """Send ``frame`` as a new connection's first frame (a resume), then the probe; read until
    both are answered or the gateway closes the connection."""
    answer = Answer()
    try:
        ws = await websockets.connect(url, max_size=None)
    except (OSError, WebSocketException) as exc:
        answer.problems.append(f"could not connect: {exc!r}")
        return answer.outcome(frame)
    try:
        await ws.send(frame.data, text=frame.text)
        await ws.send(FIRST_PROBE)
        answered = probed = False
        while not (answered and probed):
            raw = await asyncio.wait_for(ws.recv(), ANSWER_TIMEOUT_S)
            data = decode_server_frame(raw, answer)
            error = data.get("error")
            if isinstance(error, dict) and error.get("event_id") == FIRST_PROBE_ID:
                probed = True
            else:
                answered = True
                answer.note(data)
    except ConnectionClosed as closed:
        answer.close_code = close_code_of(closed)
    except TimeoutError:
        answer.problems.append(f"no answer within {ANSWER_TIMEOUT_S} s")
    finally:
        await ws.close()
    if "session.resumed" in answer.events:
        answer.problems.append("a resume with a forged token was accepted")
    answer.check(frame)
    return answer.outcome(frame)


class FuzzPool:
    """The long-lived fuzz connections of the hypothesis examples (one stream, the rest turn
    mode), each sending its share of an example's frames while the others send theirs."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._sessions = [FuzzSession(url, STREAM_SESSION if n == 0 else PUSH_TO_TALK_SESSION,
                                      f"fuzz{n}") for n in range(FUZZ_CONNECTIONS)]

    async def send(self, steps: Sequence[tuple[int, Frame]],
                   first_frames: Sequence[Frame]) -> list[Outcome]:
        shares = [[frame for n, frame in steps if n == index]
                  for index in range(len(self._sessions))]
        results = await asyncio.gather(
            *(self._send_all(session, frames) for session, frames in zip(self._sessions, shares,
                                                                         strict=True)),
            *(self._first(frame) for frame in first_frames))
        return [outcome for outcomes in results for outcome in outcomes]

    async def finish(self) -> list[Outcome]:
        return list(await asyncio.gather(*(session.finish() for session in self._sessions)))

    @staticmethod
    async def _send_all(session: FuzzSession, frames: Sequence[Frame]) -> list[Outcome]:
        return [await session.exchange(frame) for frame in frames]

    async def _first(self, frame: Frame) -> list[Outcome]:
        return [await exchange_first(self.url, frame)]


# --------------------------------------------------------------------------- the live stack


@dataclass
class LiveStack:
    """The module's processes, its bystanders, its fuzz connections, and the event loop (run
    from the test's thread) that every fuzz connection lives on between examples."""

    stack: Stack
    gateway: Proc
    worker: Proc
    runner: asyncio.Runner
    bystanders: Bystanders
    fuzz: FuzzPool
    target_id: str

    def run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        return self.runner.run(coroutine)


@pytest.fixture(scope="module")
def live() -> Iterator[LiveStack]:
    """Redis, a gateway (64 KiB frame limit), a worker, the bystanders streaming, and a
    target session that resume frames name (its token is never sent)."""
    with contextlib.ExitStack() as cleanup:
        server = start_server("auto")
        cleanup.callback(server.stop)
        stack = Stack(redis=server,
                      env={**FAST_ENV, "DUPLEX_GATEWAY_MAX_FRAME_BYTES": str(MAX_FRAME)})
        cleanup.callback(stack.stop)
        gateway = stack.gateway()
        worker = stack.worker(slots=WORKER_SLOTS)
        runner = cleanup.enter_context(asyncio.Runner(loop_factory=asyncio.new_event_loop))
        target = FuzzSession(gateway.ws_url, {"type": "realtime"}, "target")
        runner.run(target.open(Answer()))
        cleanup.callback(lambda: runner.run(target.finish()))
        assert target.session_id is not None
        bystanders = Bystanders(gateway.ws_url, BYSTANDERS,
                                log=cleanup.enter_context(new_log_path("bystanders").open("wb")))
        bystanders.start()
        cleanup.callback(_stop_quietly, bystanders)
        fuzz = FuzzPool(gateway.ws_url)
        cleanup.callback(lambda: runner.run(fuzz.finish()))
        yield LiveStack(stack, gateway, worker, runner, bystanders, fuzz, target.session_id)


def _stop_quietly(bystanders: Bystanders) -> None:
    # At teardown the streams only need to end; the test that checks them has reported.
    try:
        bystanders.stop()
    except AssertionError:
        bystanders.kill()


# --------------------------------------------------------------------------- regression frames


def refused_as_out_of_bounds(outcome: Outcome) -> bool:
    """Docs (bounds on depth, surrogates, numbers): an ``error``, the session usable."""
    return (bool(outcome.errors) and set(outcome.errors) <= BOUNDS_CODES
            and outcome.close_code is None and outcome.ended is None)


def accepted_or_refused(allowed: frozenset[str]) -> Callable[[Outcome], bool]:
    """Within the bounds: applied (``session.updated``); beyond: refused with an ``allowed``
    code. Either way the session stays usable."""
    def check(outcome: Outcome) -> bool:
        answered = bool(outcome.errors) or "session.updated" in outcome.events
        return (answered and set(outcome.errors) <= allowed
                and outcome.close_code is None and outcome.ended is None)
    return check


def ended_cleanly(outcome: Outcome) -> bool:
    """``session.closed`` and then a valid close frame, 1000."""
    return outcome.ended is not None and outcome.close_code == 1000


def refused_or_ended_cleanly(outcome: Outcome) -> bool:
    return refused_as_out_of_bounds(outcome) or ended_cleanly(outcome)


def invalid_utf8_closed_1007(outcome: Outcome) -> bool:
    """Docs: ``invalid_json``, then close 1007 (RFC 6455); the session resumes (a failed
    resume is a problem of the outcome, checked before this)."""
    return outcome.errors == ("invalid_json",) and outcome.close_code == 1007


def resume_refused_open(outcome: Outcome) -> bool:
    """Docs: malformed resume fields get ``invalid_session_resume``, and no close."""
    return outcome.errors == ("invalid_session_resume",) and outcome.close_code is None


def too_large_closed_1009(outcome: Outcome) -> bool:
    return "event_too_large" in outcome.errors and outcome.close_code == 1009


def heartbeat_answered(outcome: Outcome) -> bool:
    return not outcome.errors and "session.heartbeat_ack" in outcome.events


@dataclass(frozen=True, slots=True)
class Regression:
    """A frame that once broke something, sent on a connection of its own: ``build`` makes
    it from the target session's id; ``first``: as the connection's first frame."""

    name: str
    build: Callable[[str], Frame]
    expect: Callable[[Outcome], bool]
    first: bool = False


def _update(slot: str, literal: str) -> Callable[[str], Frame]:
    return lambda _: slot_frame("regression", ("session.update", slot), literal)


def _resume_with(spoilt: str) -> Callable[[str], Frame]:
    def build(target_id: str) -> Frame:
        event = {"type": "session.resume", "session_id": target_id, "resume_token": "token",
                 "control_id": "control", spoilt: _RAW}
        return Frame("regression", embed(event, json_string("a", "\\ud800", "b")))
    return build


def _text(data: str | bytes, *, text: bool = True) -> Callable[[str], Frame]:
    return lambda _: Frame("regression", data, text=text)


REGRESSIONS = [
    Regression("tools_500_nested_objects", _update("session.tools", nested(500, "object")),
               accepted_or_refused(BOUNDS_CODES)),
    Regression("tool_parameters_500_nested_objects",
               _update("session.tools[0].parameters", nested(500, "object")),
               accepted_or_refused(BOUNDS_CODES)),
    Regression("session_600_nested_arrays",
               _text('{"type":"session.update","session":' + nested(600, "array") + "}"),
               accepted_or_refused(BOUNDS_CODES | {"invalid_type"})),
    Regression("tools_600_nested_arrays", _update("session.tools", nested(600, "array")),
               accepted_or_refused(BOUNDS_CODES)),
    Regression("tool_parameters_600_nested_arrays",
               _update("session.tools[0].parameters", nested(600, "array")),
               accepted_or_refused(BOUNDS_CODES)),
    Regression("close_reason_lone_surrogate",
               _text('{"type":"session.close","reason":"a\\ud800b"}'), refused_or_ended_cleanly),
    Regression("speed_1e400", _update("session.audio.output.speed", "1e400"),
               refused_as_out_of_bounds),
    Regression("tool_parameter_1e400", _update("session.tools[0].parameters", '{"x":1e400}'),
               refused_as_out_of_bounds),
    Regression("speed_nan", _update("session.audio.output.speed", "NaN"),
               refused_as_out_of_bounds),
    Regression("instructions_lone_surrogate",
               _update("session.instructions", json_string("a", "\\ud800", "b")),
               refused_as_out_of_bounds),
    Regression("text_frame_invalid_utf8",
               _text(b'{"type":"session.heartbeat","event_id":"\xff"}'),
               invalid_utf8_closed_1007),
    Regression("close_reason_62_e_acute",
               _text(json.dumps({"type": "session.close", "reason": "\u00e9" * 62},
                                ensure_ascii=False)), ended_cleanly),
    Regression("resume_token_lone_surrogate", _resume_with("resume_token"), resume_refused_open,
               first=True),
    Regression("resume_control_id_lone_surrogate", _resume_with("control_id"),
               resume_refused_open, first=True),
    Regression("oversize_append",
               _text('{"type":"input_audio_buffer.append","audio":"' + "A" * MAX_FRAME + '"}'),
               too_large_closed_1009),
    Regression("binary_heartbeat", _text(b'{"type":"session.heartbeat"}', text=False),
               heartbeat_answered),
]


async def send_regression(url: str, target_id: str, case: Regression) -> list[Outcome]:
    """The case's frame on a new connection, then (unless first) the session's close."""
    frame = case.build(target_id)
    if case.first:
        return [await exchange_first(url, frame)]
    session = FuzzSession(url, STREAM_SESSION, case.name)
    answer = Answer()
    await session.open(answer)
    assert not answer.problems, answer.problems
    outcome = await session.exchange(frame)
    return [outcome, await session.finish()]


# --------------------------------------------------------------------------- tests


def test_every_client_event_type_is_fuzzed() -> None:
    """The fuzz spoils fields of every client event type the codec accepts, so a new type
    cannot slip past it (add it to VALID_EVENTS, and its fields to FIELD_KINDS)."""
    assert set(VALID_EVENTS) == set(CLIENT_EVENT_TYPES)
    assert {name for event in VALID_EVENTS.values() for name in event} <= set(FIELD_KINDS)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", REGRESSIONS, ids=lambda case: case.name)
def test_regression_frame_gets_its_documented_answer(live: LiveStack, case: Regression) -> None:
    """Each named frame that once broke the gateway or the worker gets the docs' answer
    for it, and nothing the docs do not list, while the bystanders stream."""
    outcomes = live.run(send_regression(live.gateway.ws_url, live.target_id, case))
    assert_documented(outcomes, (live.gateway, live.worker))
    outcome = outcomes[0]
    assert case.expect(outcome), (
        f"{case.name}: not {case.expect.__doc__ or case.expect.__name__}\n"
        f"got errors {outcome.errors}, events {outcome.events}, close {outcome.close_code}, "
        f"ended {outcome.ended!r}")


@pytest.mark.timeout(120)
def test_fuzzed_frames_get_only_documented_answers(live: LiveStack) -> None:
    """Hypothesis examples of every kind of bad frame, over a few connections at once (and
    resumes as first frames on new ones), while the bystanders stream: every error code and
    close code is a documented one the frame may cause, and every session stays usable."""
    outcomes: list[Outcome] = []
    budget_ends = time.monotonic() + FUZZ_BUDGET_S
    steps = st.lists(st.tuples(st.integers(0, FUZZ_CONNECTIONS - 1), FRAMES), min_size=1,
                     max_size=FRAMES_PER_EXAMPLE)

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(steps=steps, first_frames=st.lists(resume_first_frames(live.target_id), max_size=1))
    def one_example(steps: list[tuple[int, Frame]], first_frames: list[Frame]) -> None:
        if time.monotonic() < budget_ends:
            outcomes.extend(live.run(live.fuzz.send(steps, first_frames)))

    one_example()
    outcomes.extend(live.run(live.fuzz.finish()))
    assert_documented(outcomes, (live.gateway, live.worker))
    kinds = {outcome.frame.kind for outcome in outcomes}
    every_kind = {"bad json", "invalid utf-8 text", "lone surrogate", "deep nesting", "number",
                  "wrong type", "binary", "oversize", "close reason", "near valid",
                  "resume first"}
    assert kinds >= every_kind, f"some kinds of frame were never sent: {sorted(kinds)}"


@pytest.mark.timeout(30)
def test_gateway_and_worker_survive(live: LiveStack) -> None:
    """After the fuzz, the gateway and the worker processes still run; /healthz answers."""
    for proc in (live.gateway, live.worker):
        assert proc.process.poll() is None, f"the {proc.name} exited: {proc.process.returncode}"
    assert http_ok(live.gateway.http_url + "/healthz")


async def complete_a_turn(url: str) -> tuple[RealtimeEvent, bytes, bytes]:
    """A new turn-mode session: append 200 ms, commit, response.create, read response.done;
    returns it, the audio played back and the audio sent."""
    sent = b"".join(marked_chunk(99, index) for index in range(10))
    events: list[RealtimeEvent] = []
    async with await DuplexClient.connect(url, session=PUSH_TO_TALK_SESSION) as client:
        await collect_until(client, "session.updated", events)
        await client.append_audio(sent)
        await client.commit()
        await client.create_response()
        done = await collect_until(client, "response.done", events)
        await client.close()
        await collect_until(client, "session.closed", events)
    played = b"".join(event.audio for event in events
                      if event.type == "response.output_audio.delta")
    return done, played, sent


@pytest.mark.timeout(30)
def test_a_fresh_session_completes_a_turn(live: LiveStack) -> None:
    """After the fuzz, a new session completes a loopback turn: its audio played back."""
    done, played, sent = live.run(complete_a_turn(live.gateway.ws_url))
    assert done.data["response"]["status"] == "completed"
    assert played == sent


def stream_failures(report: StreamReport) -> list[str]:
    """Everything wrong with what one bystander got back: problems on its connection, lost,
    duplicated or reordered chunks, a stall."""
    failures = list(report.problems)
    if report.sent == 0:
        failures.append("sent nothing")
    if list(report.echoed) != list(range(report.sent)):
        counts = Counter(report.echoed)
        lost = [index for index in range(report.sent) if index not in counts]
        duplicated = sorted(index for index, count in counts.items() if count > 1)
        reordered = [later for earlier, later in itertools.pairwise(report.echoed)
                     if later < earlier]
        failures.append(f"{report.sent} sent, {len(report.echoed)} echoed; lost {lost[:10]}, "
                        f"duplicated {duplicated[:10]}, out of order {reordered[:10]}")
    if report.longest_gap_s > STALL_LIMIT_S:
        failures.append(f"stalled {report.longest_gap_s:.2f} s between two echoes")
    return failures


@pytest.mark.timeout(60)
def test_bystanders_got_every_chunk_back_in_order(live: LiveStack) -> None:
    """The bystanders, streaming on the same worker throughout the module, got every chunk
    back exactly once, in order, with no gap over a second between two echoes."""
    reports = live.bystanders.stop()
    assert len(reports) == BYSTANDERS
    failures = {report.bystander: stream_failures(report) for report in reports}
    assert not any(failures.values()), "\n".join(
        f"bystander {number}: {'; '.join(found)}" for number, found in failures.items() if found)
