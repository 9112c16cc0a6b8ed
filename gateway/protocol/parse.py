"""The gateway's wire codec, inbound: Realtime JSON frames -> typed values, with no I/O.

:func:`parse_client_frame` turns one websocket frame into a :class:`ParsedFrame` (a
typed :data:`~contract.messages.Command` for the worker, or a gateway envelope) or raises a
:class:`ClientProtocolError` whose code is in :data:`PARSE_ERROR_CODES`; it never raises
anything else. Checks are syntactic only (JSON, field types, base64, sizes); semantic questions
(is a response active? may this update apply?) belong to the worker (DESIGN.md §1).

Before any field is read, one iterative walk bounds the whole frame
(:func:`gateway.protocol.bounds.check_bounds`): nesting depth, value count, string length,
integer range, finite numbers and strings that UTF-8 can carry, so that nothing accepted here
can fail later in the store, the worker or on the way back to the client.

Outbound is :mod:`gateway.protocol.render`. Both directions dispatch through a table (wire type
-> parser, class -> renderer), so adding a message is one entry, not a branch.
"""

from __future__ import annotations

import binascii
import dataclasses
import json
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NoReturn, TypeAlias, TypeVar

from contract import messages as m
from gateway.protocol import envelope as env
from gateway.protocol.bounds import (
    MAX_APPEND_TEXT_CHARS,
    MAX_DEPTH,
    MAX_INT,
    MAX_PLAYBACK_MS,
    MAX_SIGNAL_EVENT_CHARS,
    MAX_STRING_CHARS,
    MAX_VALUES,
    check_bounds,
    load_json,
)
from gateway.protocol.dialect import Dialect
from gateway.protocol.errors import (
    ClientProtocolError,
    CloseCode,
    ErrorCode,
)

__all__ = [
    "CLIENT_EVENT_ALIASES",
    "CLIENT_EVENT_TYPES",
    "DUPLEX_CLIENT_EVENT_ALIASES",
    "DUPLEX_CLIENT_EVENT_TYPES",
    "MAX_CLOSE_REASON_CHARS",
    "MAX_CONTROL_ID_CHARS",
    "MAX_DEPTH",
    "MAX_INT",
    "MAX_RESUME_FIELD_CHARS",
    "MAX_SEQ",
    "MAX_STRING_CHARS",
    "MAX_VALUES",
    "ROUTED_SIGNAL_EVENTS",
    "UNSUPPORTED_CLIENT_EVENT_TYPES",
    "parse_client_frame",
]

JsonDict: TypeAlias = dict[str, Any]

#: Largest sequence number accepted from a client: Redis Lua numbers are doubles, so anything
#: above 2**53 - 1 could not be compared exactly by the store's scripts.
MAX_SEQ = MAX_INT

#: Longest ``session.close`` ``reason``: it comes back as the ``session.closed`` reason.
MAX_CLOSE_REASON_CHARS = 256

#: Longest ``session_id`` and ``resume_token`` of a ``session.resume`` (ours are under 64).
MAX_RESUME_FIELD_CHARS = 256

#: Longest ``control_id`` of a ``session.resume``: it is kept in the store for idempotence.
MAX_CONTROL_ID_CHARS = 128

# Longest slice of a client-supplied ``type`` quoted back in a message: it may be megabytes.
_QUOTE_LIMIT = 64

# --------------------------------------------------------------------------- field access


_T = TypeVar("_T")

# What JSON calls each Python type that json.loads produces, for error messages.
_JSON_TYPES: dict[type[Any], str] = {
    type(None): "null",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
}


class _Fields:
    """Typed access to the fields of one client frame; failures name the field and echo the id."""

    __slots__ = ("event_id", "obj")

    def __init__(self, obj: JsonDict, event_id: str | None) -> None:
        self.obj = obj
        self.event_id = event_id

    def fail(self, code: str, message: str, param: str | None = None) -> NoReturn:
        raise ClientProtocolError(code, message, param=param, client_event_id=self.event_id)

    def _get(self, key: str, kind: type[Any], *, required: bool) -> Any:
        if key not in self.obj:
            if required:
                msg = f"Missing required parameter: '{key}'."
                self.fail(ErrorCode.MISSING_REQUIRED_PARAMETER, msg, key)
            return None
        value = self.obj[key]
        # An explicit null means "absent" for optional fields (the SDK keeps None-valued keys).
        if value is None and not required:
            return None
        # Exact types: bool is an int subclass in Python but not a JSON integer.
        if type(value) is not kind:
            got = _JSON_TYPES.get(type(value), "a value")
            msg = f"Invalid type for '{key}': expected {_JSON_TYPES[kind]}, but got {got}."
            self.fail(ErrorCode.INVALID_TYPE, msg, key)
        return value

    def keys(self) -> Any:
        """The frame's keys (a set-like view)."""
        return self.obj.keys()

    def value(self, key: str) -> Any:
        """The raw value of ``key``, which the caller knows is present (bounded, any type)."""
        return self.obj[key]

    def require(self, key: str, kind: type[_T]) -> _T:
        value: _T = self._get(key, kind, required=True)
        return value

    def optional(self, key: str, kind: type[_T]) -> _T | None:
        value: _T | None = self._get(key, kind, required=False)
        return value

    def require_seq(self, key: str, *, minimum: int, maximum: int = MAX_SEQ) -> int:
        return self._in_range(key, self.require(key, int), minimum, maximum)

    def optional_seq(self, key: str, *, minimum: int, maximum: int = MAX_SEQ) -> int | None:
        value = self.optional(key, int)
        return None if value is None else self._in_range(key, value, minimum, maximum)

    def _in_range(self, key: str, value: int, minimum: int, maximum: int) -> int:
        # Sequence numbers end up in Lua scripts, whose numbers are doubles: see MAX_SEQ.
        if not minimum <= value <= maximum:
            msg = f"Invalid value for '{key}': expected an integer in [{minimum}, {maximum}]."
            self.fail(ErrorCode.INVALID_VALUE, msg, key)
        return value

    def bounded(self, key: str, text: str, *, cap: int) -> str:
        """``text``, the value of ``key``, if it is at most ``cap`` characters long."""
        if len(text) > cap:
            msg = f"Invalid value for '{key}': longer than {cap} characters."
            self.fail(ErrorCode.INVALID_VALUE, msg, key)
        return text

    def audio(self, key: str) -> bytes:
        """Strict base64 of audio: no stray characters. Whether the bytes are whole samples
        depends on the session's input format (pcm16: 2 bytes, G.711: 1), which the worker
        knows: it refuses a broken pcm16 sample."""
        try:
            # base64.b64decode(text, validate=True) is this call behind two Python frames,
            # once per audio chunk.
            return binascii.a2b_base64(self.require(key, str), strict_mode=True)
        except (binascii.Error, ValueError):  # ValueError: non-ASCII characters
            self.fail(ErrorCode.INVALID_VALUE, f"Invalid value for '{key}': not base64.", key)


def _quote(text: str) -> str:
    return repr(text if len(text) <= _QUOTE_LIMIT else text[:_QUOTE_LIMIT] + "...")


# --------------------------------------------------------------------------- client parsers


def _session_update(f: _Fields) -> m.Command:
    return m.UpdateSession(session=f.require("session", dict), event_id=f.event_id)


# The keys of GA's append (and our ``client_seq``): an append holding no other key takes the
# short path, one call, as every append of a GA client does.
_GA_APPEND_KEYS: frozenset[str] = frozenset({"type", "event_id", "audio", "client_seq"})
# A camera frame may arrive as a data URL; the log carries bare base64.
_DATA_URL_MARK = ";base64,"
# Sorted, so that the hints of one append are always in one order.
_HINT_KEYS: tuple[str, ...] = tuple(sorted(m.APPEND_HINT_KEYS))


def _audio_append(f: _Fields) -> m.Command:
    if f.obj.keys() <= _GA_APPEND_KEYS:
        return m.AppendAudio(audio=f.audio("audio"), event_id=f.event_id)
    # The seed's fields: its encoding and rate, camera frames and hints; and its other names
    # for the same fields (``delta``, ``input_audio_format``, ``sample_rate``).
    frames = _video_frames(f, f.optional("video_frames", list))
    if "audio" in f.keys() or not ("delta" in f.keys() or frames):
        audio = f.audio("audio")
    else:
        audio = f.audio("delta") if "delta" in f.keys() else b""
    encoding = f.optional("format", str)
    if encoding is None:
        encoding = f.optional("input_audio_format", str)
    rate = f.optional("sample_rate_hz", int)
    if rate is None:
        rate = f.optional("sample_rate", int)
    if rate is not None and rate <= 0:
        f.fail(ErrorCode.INVALID_VALUE,
               "Invalid value for 'sample_rate_hz': expected a positive integer.", "sample_rate_hz")
    hints = {name: f.value(name) for name in _HINT_KEYS if name in f.keys()}
    return m.AppendAudio(
        audio=audio, format=None if encoding is None else f.bounded("format", encoding, cap=64),
        sample_rate_hz=rate, is_speech=f.optional("is_speech", bool), hints=hints or None,
        video_frames=frames, event_id=f.event_id)


def _video_frames(f: _Fields, raw: list[Any] | None) -> tuple[str, ...]:
    """``video_frames``: each a string of strict base64, a data URL's prefix stripped. What a
    frame may be (an image, how large, how many) is checked past the parse."""
    if not raw:
        return ()
    frames = []
    for index, frame in enumerate(raw):
        param = f"video_frames[{index}]"
        if type(frame) is not str or not frame:
            f.fail(ErrorCode.INVALID_VALUE,
                   f"Invalid value for '{param}': expected a non-empty base64 string.", param)
        bare = frame.partition(_DATA_URL_MARK)[2] if frame.startswith("data:") else frame
        try:
            binascii.a2b_base64(bare, strict_mode=True)
        except (binascii.Error, ValueError):
            f.fail(ErrorCode.INVALID_VALUE, f"Invalid value for '{param}': not base64.", param)
        frames.append(bare)
    return tuple(frames)


def _audio_commit(f: _Fields) -> m.Command:
    # ``response_create`` is the seed's wire name, ``create_response`` its Python API's.
    create = f.optional("response_create", bool)
    if create is None:
        create = f.optional("create_response", bool)
    final = f.optional("final", bool)
    return m.CommitInput(final=True if final is None else final, create_response=create,
                         is_speech=f.optional("is_speech", bool), event_id=f.event_id)


def _audio_clear(f: _Fields) -> m.Command:
    return m.ClearInput(event_id=f.event_id)


def _response_create(f: _Fields) -> m.Command:
    return m.CreateResponse(response=f.optional("response", dict), event_id=f.event_id)


def _response_cancel(f: _Fields) -> m.Command:
    return m.CancelResponse(response_id=f.optional("response_id", str), event_id=f.event_id)


def _item_create(f: _Fields) -> m.Command:
    # The item's shape is the worker's to judge: its refusals come in order with the rest.
    return m.CreateItem(item=f.require("item", dict),
                        previous_item_id=f.optional("previous_item_id", str),
                        event_id=f.event_id)


def _item_retrieve(f: _Fields) -> m.Command:
    return m.RetrieveItem(item_id=f.require("item_id", str), event_id=f.event_id)


def _item_delete(f: _Fields) -> m.Command:
    return m.DeleteItem(item_id=f.require("item_id", str), event_id=f.event_id)


def _item_truncate(f: _Fields) -> m.Command:
    return m.TruncateItem(item_id=f.require("item_id", str),
                          content_index=f.require_seq("content_index", minimum=0),
                          audio_end_ms=f.require_seq("audio_end_ms", minimum=0),
                          event_id=f.event_id)


def _output_audio_clear(f: _Fields) -> m.Command:
    return m.ClearOutputAudio(response_id=f.optional("response_id", str), event_id=f.event_id)


def _heartbeat(f: _Fields) -> m.Command:
    return m.Heartbeat(event_id=f.event_id)


def _session_close(f: _Fields) -> m.Command:
    reason = f.optional("reason", str)
    if reason is None:
        return m.CloseSession(event_id=f.event_id)
    reason = f.bounded("reason", reason, cap=MAX_CLOSE_REASON_CHARS)
    return m.CloseSession(reason=reason, event_id=f.event_id)


def _session_resume(f: _Fields) -> env.ClientEnvelope:
    # Any shape problem is one code, as in the seed: clients treat it as "resume impossible".
    try:
        session_id = f.require("session_id", str)
        resume_token = f.require("resume_token", str)
        last_seq = f.optional_seq("last_received_server_event_seq", minimum=0)
        control_id = f.optional("control_id", str)
        attempt = f.optional_seq("attempt", minimum=1)
    except ClientProtocolError as exc:
        f.fail(ErrorCode.INVALID_SESSION_RESUME, exc.message, exc.param)
    for key, value in (("session_id", session_id), ("resume_token", resume_token)):
        if not value:
            f.fail(ErrorCode.INVALID_SESSION_RESUME, f"'{key}' must not be empty.", key)
    caps = (
        ("session_id", session_id, MAX_RESUME_FIELD_CHARS),
        ("resume_token", resume_token, MAX_RESUME_FIELD_CHARS),
        ("control_id", control_id or "", MAX_CONTROL_ID_CHARS),
    )
    for key, value, cap in caps:
        if len(value) > cap:  # no such id or token was ever issued
            msg = f"'{key}' is longer than {cap} characters."
            f.fail(ErrorCode.INVALID_SESSION_RESUME, msg, key)
    return env.ResumeRequest(
        session_id=session_id,
        resume_token=resume_token,
        last_received_server_event_seq=last_seq or 0,
        control_id=control_id,
        attempt=attempt or 0,
        event_id=f.event_id,
    )


def _event_ack(f: _Fields) -> env.ClientEnvelope:
    seq = f.require_seq("server_event_seq", minimum=0)
    return env.EventAck(server_event_seq=seq, event_id=f.event_id)


# --------------------------------------------------------------------------- seed extensions


def _input_cancel(f: _Fields) -> m.Command:
    return m.CancelInput(event_id=f.event_id)


def _text_append(f: _Fields) -> m.Command:
    text = f.bounded("text", f.require("text", str), cap=MAX_APPEND_TEXT_CHARS)
    return m.AppendText(text=text, event_id=f.event_id)


def _barge_in(f: _Fields) -> m.Command:
    return m.BargeIn(event_id=f.event_id)


def _playback_ack(f: _Fields) -> m.Command:
    return m.AckPlayback(
        played_ms=f.require_seq("played_ms", minimum=0, maximum=MAX_PLAYBACK_MS),
        committed_ms=f.optional_seq("committed_ms", minimum=0, maximum=MAX_PLAYBACK_MS),
        response_id=f.optional("response_id", str),
        item_id=f.optional("item_id", str),
        event_id=f.event_id,
    )


# ``turn.signal`` events decoded as the client event of that name, as the seed does: the
# signal's payload holds that event's fields and goes through that event's own parser, so both
# spellings are validated alike. Every other signal stays a ``SignalTurn``.
_ROUTED_SIGNALS: dict[str, Callable[[_Fields], m.Command]] = {
    "input.cancel": _input_cancel,
    "barge_in": _barge_in,
    "response.cancel": _response_cancel,
    "session.update": _session_update,
    "conversation.item.create": _item_create,
    "conversation.item.delete": _item_delete,
    "conversation.item.truncate": _item_truncate,
    "conversation.item.retrieve": _item_retrieve,
}

#: The ``turn.signal`` events that the codec decodes as the typed command of that name.
ROUTED_SIGNAL_EVENTS: frozenset[str] = frozenset(_ROUTED_SIGNALS)


def _turn_signal(f: _Fields) -> m.Command:
    event = f.require("event", str)
    if not event:
        f.fail(ErrorCode.INVALID_VALUE, "Invalid value for 'event': must not be empty.", "event")
    event = f.bounded("event", event, cap=MAX_SIGNAL_EVENT_CHARS)
    # ``payload`` is the Python API's name and wins; ``signal_payload`` the seed's wire name.
    payload, seed_payload = f.optional("payload", dict), f.optional("signal_payload", dict)
    key = "signal_payload" if payload is None and seed_payload is not None else "payload"
    fields: JsonDict = (payload if payload is not None else seed_payload) or {}
    routed = _ROUTED_SIGNALS.get(event)
    if routed is None:
        return m.SignalTurn(event=event, payload=fields, event_id=f.event_id)
    try:
        return routed(_Fields(fields, f.event_id))
    except ClientProtocolError as exc:  # name the field where the client put it
        f.fail(exc.code, exc.message, f"{key}.{exc.param}" if exc.param else key)


_PARSERS: dict[str, Callable[[_Fields], m.Command | env.ClientEnvelope]] = {
    "session.update": _session_update,
    "input_audio_buffer.append": _audio_append,
    "input_audio_buffer.commit": _audio_commit,
    "input_audio_buffer.clear": _audio_clear,
    "response.create": _response_create,
    "response.cancel": _response_cancel,
    "conversation.item.create": _item_create,
    "conversation.item.retrieve": _item_retrieve,
    "conversation.item.delete": _item_delete,
    "conversation.item.truncate": _item_truncate,
    "output_audio_buffer.clear": _output_audio_clear,
    # Extensions (seed_behaviour.md §4.7): lease keepalive, graceful close, resume, log trim.
    "session.heartbeat": _heartbeat,
    "session.close": _session_close,
    "session.resume": _session_resume,
    "session.event_ack": _event_ack,
    # The seed's duplex commands (seed_behaviour.md §2), with its aliases.
    "input.cancel": _input_cancel,
    "input.text.append": _text_append,
    "input_text.append": _text_append,
    "push_text": _text_append,
    "barge_in": _barge_in,
    "turn.signal": _turn_signal,
    "signal_turn": _turn_signal,
    "playback.ack": _playback_ack,
    "audio.playback_ack": _playback_ack,
}

#: Every client event type the codec accepts, aliases included.
CLIENT_EVENT_TYPES: frozenset[str] = frozenset(_PARSERS)

#: The seed's other spellings of a client event: alias -> the event type it stands for.
CLIENT_EVENT_ALIASES: Mapping[str, str] = MappingProxyType({
    "input_text.append": "input.text.append",
    "push_text": "input.text.append",
    "signal_turn": "turn.signal",
    "audio.playback_ack": "playback.ack",
})

# The seed's ``input.commit``: a commit that asks for a response unless it says otherwise.
def _input_commit(f: _Fields) -> m.Command:
    commit = _audio_commit(f)
    assert isinstance(commit, m.CommitInput)
    if commit.create_response is None:
        return dataclasses.replace(commit, create_response=True)
    return commit


# The seed's aliases that only duplex connections take (GA clients get unknown_event).
_DUPLEX_ONLY_PARSERS: dict[str, Callable[[_Fields], m.Command | env.ClientEnvelope]] = {
    "input.commit": _input_commit,
    "close": _session_close,
    "close_session": _session_close,
}

_DUPLEX_PARSERS = {**_PARSERS, **_DUPLEX_ONLY_PARSERS}
_DUPLEX = Dialect.DUPLEX  # a module global: read once per frame

#: Every client event type a duplex connection takes besides :data:`CLIENT_EVENT_TYPES`.
DUPLEX_CLIENT_EVENT_TYPES: frozenset[str] = frozenset(_DUPLEX_ONLY_PARSERS)

#: The seed's spellings only duplex connections take: alias -> the event type it stands for.
DUPLEX_CLIENT_EVENT_ALIASES: Mapping[str, str] = MappingProxyType({
    "input.commit": "input_audio_buffer.commit",
    "close": "session.close",
    "close_session": "session.close",
})

#: Realtime client events (GA, plus beta's ``transcription_session.update``) that exist upstream
#: but are not implemented yet: refused with ``unsupported_event`` so the session survives.
UNSUPPORTED_CLIENT_EVENT_TYPES: frozenset[str] = frozenset(
    {"transcription_session.update"}
)


def _reject_constant(name: str) -> NoReturn:
    # Python's json accepts NaN/Infinity; JSON does not.
    raise ValueError(f"{name} is not valid JSON")


# One decoder for every frame: json.loads with any keyword builds a new decoder (and its C
# scanner) per call, a tenth of what decoding an audio append costs.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _frame_bytes(data: str | bytes) -> int:
    """The frame's size in UTF-8 bytes, without encoding the common (ASCII) case."""
    if isinstance(data, bytes) or data.isascii():
        return len(data)
    return len(data.encode("utf-8", "surrogatepass"))


def _load_object(data: str | bytes, max_frame_bytes: int) -> JsonDict:
    size = _frame_bytes(data)
    if size > max_frame_bytes:
        raise ClientProtocolError(
            ErrorCode.EVENT_TOO_LARGE,
            f"The frame is {size} bytes; the limit is {max_frame_bytes} bytes.",
            close_code=CloseCode.MESSAGE_TOO_BIG,
        )
    # The standard library, not orjson: orjson reads an integer beyond 64 bits as a float
    # (a huge integer refused today would pass as a number), and it would save only a small
    # part of what an append costs here (docs/performance/notes/2026-12-05-relay-cpu.md).
    try:
        # Decode explicitly: json.loads(bytes) would also guess UTF-16/32, which is not JSON text.
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        obj = load_json(text, _DECODER)  # far deeper than MAX_DEPTH: refused as too deep
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        reason = str(exc)[:200]
        raise ClientProtocolError(
            ErrorCode.INVALID_JSON, f"The frame is not valid UTF-8 JSON: {reason}"
        ) from None
    if not isinstance(obj, dict):
        got = _JSON_TYPES.get(type(obj), "a value")
        msg = f"A client event must be a JSON object, not {got}."
        raise ClientProtocolError(ErrorCode.INVALID_EVENT, msg)
    return obj


# --------------------------------------------------------------------------- dispatch


def _event_type(f: _Fields, obj: JsonDict) -> str:
    type_ = obj.get("type")
    if type_ is None:
        f.fail(ErrorCode.INVALID_EVENT, "The 'type' field is missing.")
    if not isinstance(type_, str):
        f.fail(ErrorCode.INVALID_EVENT, "The 'type' field must be a string.")
    return type_


def _parser_for(f: _Fields, type_: str, parsers: Mapping[str, Callable[[_Fields], m.Command |
                env.ClientEnvelope]]) -> Callable[[_Fields], m.Command | env.ClientEnvelope]:
    parser = parsers.get(type_)
    if parser is not None:
        return parser
    if type_ in UNSUPPORTED_CLIENT_EVENT_TYPES:
        f.fail(
            ErrorCode.UNSUPPORTED_EVENT,
            f"The event type {_quote(type_)} is not supported by this server yet.",
            "type",
        )
    f.fail(
        ErrorCode.UNKNOWN_EVENT,
        f"Invalid value: {_quote(type_)}. Supported values are: {', '.join(sorted(parsers))}.",
        "type",
    )


def _client_seq(f: _Fields) -> int | None:
    # Our extension has one code for every way to get it wrong, wrong JSON type included.
    try:
        return f.optional_seq("client_seq", minimum=1)
    except ClientProtocolError as exc:
        f.fail(ErrorCode.INVALID_VALUE, exc.message, "client_seq")


def parse_client_frame(data: str | bytes, *, max_frame_bytes: int,
                       dialect: Dialect = Dialect.GA) -> env.ParsedFrame:
    """Parse one client websocket frame (text or binary) into a typed value.

    Unknown fields are ignored, as the Realtime API's clients expect of additive extensions.

    Args:
        data: the frame's payload: ``str`` for a text frame, ``bytes`` for a binary one.
        max_frame_bytes: the largest frame accepted, in UTF-8 bytes.
        dialect: the connection's; a duplex one also takes the seed's aliases
            (:data:`DUPLEX_CLIENT_EVENT_ALIASES`).

    Returns:
        The command or gateway envelope the frame holds, with its optional ``client_seq``.

    Raises:
        ClientProtocolError: with a code from :data:`PARSE_ERROR_CODES`, echoing the frame's
            ``event_id`` whenever it could be read. Only ``event_too_large`` carries a close
            code (1009); after every other error the session stays usable.
    """
    obj = _load_object(data, max_frame_bytes)
    check_bounds(obj)
    f = _Fields(obj, None)
    f.event_id = f.optional("event_id", str)
    parsers = _DUPLEX_PARSERS if dialect is _DUPLEX else _PARSERS
    parser = _parser_for(f, _event_type(f, obj), parsers)
    client_seq = _client_seq(f)
    message = parser(f)
    if isinstance(message, env.ResumeRequest | env.EventAck):
        return env.ParsedFrame(envelope=message, client_seq=client_seq)
    return env.ParsedFrame(command=message, client_seq=client_seq)
