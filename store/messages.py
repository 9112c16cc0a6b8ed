"""Typed commands (gateway -> worker) and events (worker -> gateway), and their log codec.

These are the values the two logs carry. They are deliberately *not* Realtime JSON: the gateway
alone knows the wire shapes (``gateway/protocol/parse.py``, ``render.py``); the worker produces
and consumes these typed values and never sees a websocket frame.

Every class is a frozen, slotted, keyword-only dataclass. At most one field is ``bytes`` (audio):
the codec stores it raw after the JSON header instead of as base64 (DESIGN.md §5: audio is
stored as bytes), which saves a third of the log's memory and all the base64 work in the store.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

import orjson

from store.reasons import CloseReason

__all__ = [
    "ORJSON_REFUSE",
    "TERMINAL_KINDS",
    "AckPlayback",
    "AppendAudio",
    "AppendText",
    "AudioDelta",
    "AudioDone",
    "BargeIn",
    "CancelInput",
    "CancelResponse",
    "ClearInput",
    "ClearOutputAudio",
    "CloseSession",
    "Command",
    "CommitInput",
    "ContentPartAdded",
    "ContentPartDone",
    "CreateItem",
    "CreateResponse",
    "DeleteItem",
    "ErrorEvent",
    "Event",
    "FunctionCallArgumentsDelta",
    "FunctionCallArgumentsDone",
    "Heartbeat",
    "HeartbeatAck",
    "InputCleared",
    "InputCommitted",
    "InputSpeechStarted",
    "InputSpeechStopped",
    "InputTimeoutTriggered",
    "InputTranscriptionCompleted",
    "InputTranscriptionDelta",
    "InputTranscriptionFailed",
    "ItemAdded",
    "ItemCreated",
    "ItemDeleted",
    "ItemDone",
    "ItemRetrieved",
    "ItemTruncated",
    "JsonObject",
    "MessageDecodeError",
    "OutputAudioCleared",
    "OutputBackpressure",
    "OutputItemAdded",
    "OutputItemDone",
    "PlaybackAcknowledged",
    "RateLimitsUpdated",
    "ResponseCreated",
    "ResponseDone",
    "RetrieveItem",
    "SessionClosed",
    "SessionExpired",
    "SessionUpdated",
    "SignalTurn",
    "TextDelta",
    "TextDone",
    "TranscriptDelta",
    "TranscriptDone",
    "TruncateItem",
    "TurnEvent",
    "UpdateSession",
    "decode_command",
    "decode_event",
    "decode_message",
    "encode_message",
    "is_terminal",
    "load_header",
]

JsonObject: TypeAlias = dict[str, Any]



# --------------------------------------------------------------------------- commands


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateSession:
    """``session.update``: a Realtime session patch; the worker decides what may apply."""

    KIND: ClassVar[str] = "update"
    session: JsonObject
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendAudio:
    """``input_audio_buffer.append``: pcm16 little-endian mono at the session's input rate."""

    KIND: ClassVar[str] = "append"
    audio: bytes
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitInput:
    """``input_audio_buffer.commit``."""

    KIND: ClassVar[str] = "commit"
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClearInput:
    """``input_audio_buffer.clear``."""

    KIND: ClassVar[str] = "clear"
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateResponse:
    """``response.create``: optional per-response overrides, as sent."""

    KIND: ClassVar[str] = "respond"
    response: JsonObject | None = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelResponse:
    """``response.cancel``."""

    KIND: ClassVar[str] = "cancel"
    response_id: str | None = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """``session.heartbeat``: keeps the lease alive; answered in order by the worker."""

    KIND: ClassVar[str] = "heartbeat"
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CloseSession:
    """``session.close``: an ordered, graceful end decided by the client."""

    KIND: ClassVar[str] = "close"
    reason: str = CloseReason.CLIENT_CLOSE
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateItem:
    """``conversation.item.create``: the item as sent (the worker validates its shape) and
    where it goes (None: at the end; ``root``: first; an item id: after that item)."""

    KIND: ClassVar[str] = "item.create"
    item: JsonObject
    previous_item_id: str | None = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RetrieveItem:
    """``conversation.item.retrieve``."""

    KIND: ClassVar[str] = "item.retrieve"
    item_id: str
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteItem:
    """``conversation.item.delete``."""

    KIND: ClassVar[str] = "item.delete"
    item_id: str
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TruncateItem:
    """``conversation.item.truncate``: the client heard ``audio_end_ms`` of an assistant
    audio item's content part ``content_index``, and no more."""

    KIND: ClassVar[str] = "item.truncate"
    item_id: str
    content_index: int
    audio_end_ms: int
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClearOutputAudio:
    """``output_audio_buffer.clear``: drop the active response's audio not yet sent."""

    KIND: ClassVar[str] = "output.clear"
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputBackpressure:
    """Written by the gateway, never sent by a client: the client has not read this much of
    the session's output (events and bytes behind the log's end). The worker ends the
    active response ``failed`` (``output_backpressure``) and stops the model, so a client that
    does not read is not flooded, and nothing already written is dropped."""

    KIND: ClassVar[str] = "output.backpressure"
    pending_events: int
    pending_bytes: int
    event_id: str | None = None


# The seed's duplex extensions (seed_behaviour.md §2). What each one does is the worker's to
# decide; here they are only the typed values the input log carries.


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelInput:
    """``input.cancel``: drop the pending input and stop whatever work is in flight."""

    KIND: ClassVar[str] = "input.cancel"
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendText:
    """``input.text.append``: text for the user's turn (bounded at the gateway's edge)."""

    KIND: ClassVar[str] = "input.text"
    text: str
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BargeIn:
    """``barge_in``: the client's hard interrupt of the active response."""

    KIND: ClassVar[str] = "barge_in"
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SignalTurn:
    """``turn.signal``: a turn transition the gateway does not route to a typed command
    (``event`` is never one of those), with its payload as sent."""

    KIND: ClassVar[str] = "turn.signal"
    event: str
    payload: JsonObject = dataclasses.field(default_factory=dict)
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AckPlayback:
    """``playback.ack``: the client played ``played_ms`` of a response's audio and commits
    ``committed_ms`` of it to the conversation (None: all it played). With neither id the
    worker picks the response still playing."""

    KIND: ClassVar[str] = "playback.ack"
    played_ms: int
    committed_ms: int | None = None
    response_id: str | None = None
    item_id: str | None = None
    event_id: str | None = None


Command: TypeAlias = (
    UpdateSession
    | AppendAudio
    | CommitInput
    | ClearInput
    | CreateResponse
    | CancelResponse
    | Heartbeat
    | CloseSession
    | CreateItem
    | RetrieveItem
    | DeleteItem
    | TruncateItem
    | ClearOutputAudio
    | OutputBackpressure
    | CancelInput
    | AppendText
    | BargeIn
    | SignalTurn
    | AckPlayback
)

# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionUpdated:
    """The effective session configuration after an open or an update."""

    KIND: ClassVar[str] = "session.updated"
    session: JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorEvent:
    """A refusal or failure, attributed to a client event when there is one."""

    KIND: ClassVar[str] = "error"
    code: str
    message: str
    error_type: str = "invalid_request_error"
    param: str | None = None
    client_event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatAck:
    """Answer to ``session.heartbeat``."""

    KIND: ClassVar[str] = "heartbeat_ack"


@dataclass(frozen=True, slots=True, kw_only=True)
class InputCommitted:
    """The input buffer became a user item."""

    KIND: ClassVar[str] = "input.committed"
    item_id: str
    previous_item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InputCleared:
    """The input buffer was emptied."""

    KIND: ClassVar[str] = "input.cleared"


@dataclass(frozen=True, slots=True, kw_only=True)
class InputSpeechStarted:
    """Turn detection heard speech start in the input buffer."""

    KIND: ClassVar[str] = "input.speech_started"
    #: Milliseconds of the session's input audio before the turn, prefix padding included.
    audio_start_ms: int
    #: The id the user item of this turn will get once it is committed.
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InputSpeechStopped:
    """Turn detection heard speech end in the input buffer (a commit follows)."""

    KIND: ClassVar[str] = "input.speech_stopped"
    #: Milliseconds of the session's input audio up to the turn's end, its silence included.
    audio_end_ms: int
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemAdded:
    """A conversation item was added (user item on commit, assistant item on response)."""

    KIND: ClassVar[str] = "item.added"
    item: JsonObject
    previous_item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemCreated:
    """The same item as the :class:`ItemAdded` just before it, under the name the beta API
    and the seed use (``conversation.item.created``, still in GA's server events): clients
    written for either name see every item."""

    KIND: ClassVar[str] = "item.created"
    item: JsonObject
    previous_item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemDone:
    """A conversation item is final."""

    KIND: ClassVar[str] = "item.done"
    item: JsonObject
    previous_item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemRetrieved:
    """Answer to ``conversation.item.retrieve``: the item as the conversation holds it."""

    KIND: ClassVar[str] = "item.retrieved"
    item: JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemDeleted:
    """An item left the conversation (``conversation.item.delete``)."""

    KIND: ClassVar[str] = "item.deleted"
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemTruncated:
    """An assistant audio item was cut to what the client heard; its transcript is gone."""

    KIND: ClassVar[str] = "item.truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputAudioCleared:
    """Answer to ``output_audio_buffer.clear``: the response whose audio was dropped (or the
    last one, when none was playing)."""

    KIND: ClassVar[str] = "output_audio.cleared"
    response_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseCreated:
    """A response started; ``response`` is the Realtime response object."""

    KIND: ClassVar[str] = "response.created"
    response: JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseDone:
    """A response ended (completed, cancelled, failed or incomplete)."""

    KIND: ClassVar[str] = "response.done"
    response: JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputItemAdded:
    """An output item of a response started."""

    KIND: ClassVar[str] = "output_item.added"
    response_id: str
    output_index: int
    item: JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputItemDone:
    """An output item of a response is final."""

    KIND: ClassVar[str] = "output_item.done"
    response_id: str
    output_index: int
    item: JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class ContentPartAdded:
    """A content part of an output item started."""

    KIND: ClassVar[str] = "content_part.added"
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part: JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class ContentPartDone:
    """A content part of an output item is final."""

    KIND: ClassVar[str] = "content_part.done"
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part: JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioDelta:
    """A chunk of output audio (pcm16 LE mono, the session's output rate)."""

    KIND: ClassVar[str] = "audio.delta"
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    audio: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioDone:
    """The audio of a content part is complete."""

    KIND: ClassVar[str] = "audio.done"
    response_id: str
    item_id: str
    output_index: int
    content_index: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TranscriptDelta:
    """A piece of the transcript of the output audio."""

    KIND: ClassVar[str] = "transcript.delta"
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TranscriptDone:
    """The full transcript of the output audio."""

    KIND: ClassVar[str] = "transcript.done"
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    transcript: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TextDelta:
    """A piece of a text content part of an output item."""

    KIND: ClassVar[str] = "text.delta"
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TextDone:
    """The whole text of a text content part (completed, or cut short by a cancel)."""

    KIND: ClassVar[str] = "text.done"
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionCallArgumentsDelta:
    """A piece of the JSON arguments of a function call output item."""

    KIND: ClassVar[str] = "function_call_arguments.delta"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionCallArgumentsDone:
    """The whole JSON arguments of a function call output item, and the function's name."""

    KIND: ClassVar[str] = "function_call_arguments.done"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTranscriptionDelta:
    """A piece of the transcript of a user item's input audio."""

    KIND: ClassVar[str] = "input_transcription.delta"
    item_id: str
    content_index: int
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTranscriptionCompleted:
    """The whole transcript of a user item's input audio."""

    KIND: ClassVar[str] = "input_transcription.completed"
    item_id: str
    content_index: int
    transcript: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTranscriptionFailed:
    """Transcribing a user item's input audio failed; the item stays, without transcript."""

    KIND: ClassVar[str] = "input_transcription.failed"
    item_id: str
    content_index: int
    code: str
    message: str
    error_type: str = "server_error"
    param: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTimeoutTriggered:
    """Turn detection's ``idle_timeout_ms`` ran out with no speech after the last response:
    ``audio_start_ms`` to ``audio_end_ms`` of the input timeline was silent."""

    KIND: ClassVar[str] = "input.timeout_triggered"
    audio_start_ms: int
    audio_end_ms: int
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimitsUpdated:
    """The rate limits that apply to the session, after each ``response.done``."""

    KIND: ClassVar[str] = "rate_limits.updated"
    #: GA ``RateLimit`` objects (``name``, ``limit``, ``remaining``, ``reset_seconds``).
    rate_limits: list[JsonObject]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlaybackAcknowledged:
    """Answer to ``playback.ack``: the response's playback ledger after it, in milliseconds
    of audio (each only moves forward)."""

    KIND: ClassVar[str] = "playback.acknowledged"
    response_id: str
    item_id: str
    generated_ms: int
    sent_ms: int
    played_ms: int
    committed_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnEvent:
    """A turn transition (``turn.signal``) the worker applied, and the turn state after it."""

    KIND: ClassVar[str] = "turn.event"
    event: str
    turn_state: str
    payload: JsonObject = dataclasses.field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionClosed:
    """Terminal: a deliberate end (client close, runtime failure, worker loss)."""

    KIND: ClassVar[str] = "session.closed"
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionExpired:
    """Terminal: the reaper ended the session (grace or idle expiry)."""

    KIND: ClassVar[str] = "session.expired"
    reason: str


Event: TypeAlias = (
    SessionUpdated
    | ErrorEvent
    | HeartbeatAck
    | InputCommitted
    | InputCleared
    | InputSpeechStarted
    | InputSpeechStopped
    | ItemAdded
    | ItemCreated
    | ItemDone
    | ItemRetrieved
    | ItemDeleted
    | ItemTruncated
    | OutputAudioCleared
    | ResponseCreated
    | ResponseDone
    | OutputItemAdded
    | OutputItemDone
    | ContentPartAdded
    | ContentPartDone
    | AudioDelta
    | AudioDone
    | TranscriptDelta
    | TranscriptDone
    | TextDelta
    | TextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
    | InputTranscriptionDelta
    | InputTranscriptionCompleted
    | InputTranscriptionFailed
    | InputTimeoutTriggered
    | RateLimitsUpdated
    | PlaybackAcknowledged
    | TurnEvent
    | SessionClosed
    | SessionExpired
)

_COMMAND_CLASSES: tuple[type[Any], ...] = typing.get_args(Command)
_EVENT_CLASSES: tuple[type[Any], ...] = typing.get_args(Event)
# Derived from the unions, so that a class added to one cannot be left out of the codec.
_CLASSES: tuple[type[Any], ...] = (*_COMMAND_CLASSES, *_EVENT_CLASSES)
_BY_KIND: dict[str, type[Any]] = {cls.KIND: cls for cls in _CLASSES}
if len(_BY_KIND) != len(_CLASSES):  # two classes of one KIND would decode as each other
    raise RuntimeError("every command and event class needs a KIND of its own")
# The (at most one) bytes field of each class; found once, not per message.
_BYTES_FIELD: dict[type[Any], str | None] = {
    cls: next((f.name for f in dataclasses.fields(cls) if f.type in ("bytes", bytes)), None)
    for cls in _CLASSES
}
TERMINAL_KINDS = frozenset({SessionClosed.KIND, SessionExpired.KIND})

# Each class's fields with their defaults, found once, not per message (dataclasses.fields
# builds its tuple on every call).
_FIELD_DEFAULTS: dict[type[Any], tuple[tuple[str, Any], ...]] = {
    cls: tuple((f.name, f.default) for f in dataclasses.fields(cls)) for cls in _CLASSES
}

# orjson writes a dataclass or a datetime where the standard library refuses one: handing them
# back makes it refuse them too, so the standard library decides (and refuses) them. The one
# home of that rule: the gateway's frame encoder passes it too.
ORJSON_REFUSE = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME

# JSON never contains a raw NUL (it would be escaped as \u0000), so NUL safely ends the header.
_SEPARATOR = b"\0"


class MessageDecodeError(ValueError):
    """A log entry that this version cannot decode (corrupt, or from a newer writer)."""


def encode_message(message: Command | Event) -> bytes:
    """Encode a command or event as ``<json header>\\0<raw bytes field>``."""
    cls = type(message)
    blob_field = _BYTES_FIELD[cls]
    header: dict[str, Any] = {"k": cls.KIND}
    blob = b""
    for name, default in _FIELD_DEFAULTS[cls]:
        value = getattr(message, name)
        if name == blob_field:
            blob = value
        elif value is not None and value != default:
            header[name] = value
    return _encode_header(header) + _SEPARATOR + blob


def _encode_header(header: dict[str, Any]) -> bytes:
    """The header as JSON: orjson's bytes (a fifth of the standard library's cost) when they
    are what the standard library would have read back the same; else the standard library's.

    orjson refuses an integer beyond 64 bits and a lone surrogate, and writes NaN and the
    infinities as ``null``: a header holding a ``null`` (values of None are left out of the
    header, so only a nested one) is written by the standard library too, which keeps NaN as
    NaN. Either writer's output is read by :func:`decode_message`.
    """
    try:
        raw = orjson.dumps(header, option=ORJSON_REFUSE)
    except orjson.JSONEncodeError:
        return json.dumps(header, separators=(",", ":")).encode()
    if b"null" in raw:
        return json.dumps(header, separators=(",", ":")).encode()
    return raw


# orjson reads JSON text as the standard library does (a value for a value, an error for an
# error: tests/store/test_messages.py holds it to that) but for an integer beyond 64 bits,
# which it reads as a float. Every such integer is a run of 19 digits or more; so is nothing
# else a header is likely to hold. Finding one costs a translate and a search, both in C.
_DIGITS_ONLY = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x2E for byte in range(256))
_LONG_DIGIT_RUN = b"0" * 19


def load_header(head: bytes) -> Any:
    """``json.loads(head)``, through orjson where it reads the same: about eight times
    faster, and no Python frames (a header is decoded once per relayed chunk in the gateway
    and in the worker). A header with a run of 19 digits goes to the standard library, as
    does one orjson refuses (NaN and the infinities, which the standard library writes and
    reads back; a lone surrogate; nesting past orjson's limit), whose error stands."""
    if _LONG_DIGIT_RUN not in head.translate(_DIGITS_ONLY):
        try:
            return orjson.loads(head)
        except orjson.JSONDecodeError:
            pass
    return json.loads(head)


def decode_message(data: bytes) -> Command | Event:
    """Decode what :func:`encode_message` wrote.

    Raises:
        MessageDecodeError: unknown kind, bad JSON, or fields that do not fit the class.
    """
    head, sep, blob = data.partition(_SEPARATOR)
    if not sep:
        raise MessageDecodeError("missing header separator")
    try:
        header = load_header(head)
        cls = _BY_KIND[header.pop("k")]
        blob_field = _BYTES_FIELD[cls]
        if blob_field is not None:
            header[blob_field] = blob
        message: Command | Event = cls(**header)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        # AttributeError: a JSON header that is not an object; RecursionError: absurd nesting.
        raise MessageDecodeError(f"undecodable log entry: {exc!r}") from exc
    return message


def is_terminal(event: Event) -> bool:
    """Whether ``event`` ends its session (exactly one per session, always last)."""
    return isinstance(event, SessionClosed | SessionExpired)




def decode_event(data: bytes) -> Event:
    """Decode an output-log entry.

    Raises:
        MessageDecodeError: not an event.
    """
    message = decode_message(data)
    if not isinstance(message, _EVENT_CLASSES):
        raise MessageDecodeError(f"expected an event, got {type(message).__name__}")
    return message  # type: ignore[no-any-return]


def decode_command(data: bytes) -> Command:
    """Decode an input-log entry.

    Raises:
        MessageDecodeError: not a command.
    """
    message = decode_message(data)
    if not isinstance(message, _COMMAND_CLASSES):
        raise MessageDecodeError(f"expected a command, got {type(message).__name__}")
    return message  # type: ignore[no-any-return]
