"""The gateway's wire codec, outbound: typed values -> Realtime JSON frames, with no I/O.

:func:`render_event` renders worker events, :func:`render_notice` the gateway's own notices
and :func:`render_error` exceptions, all as Realtime GA dicts; :func:`encode_frame` serialises
one. Beta event names are never emitted. Every rendered dict carries ``type`` and ``event_id``
(the SDK types require both); events from the output log also carry our extension
``server_event_seq``, which strict clients accept because the SDK models allow extra keys.

Inbound is :mod:`gateway.protocol.parse`; like it, this module dispatches through a table
(class -> renderer), so adding a message is one entry, not a branch.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import orjson

from contract import messages as m
from gateway.protocol import envelope as env
from gateway.protocol.errors import ClientProtocolError, ErrorCode, GatewayError, InternalError

__all__ = [
    "encode_frame",
    "public_session",
    "render_error",
    "render_event",
    "render_notice",
]

JsonDict: TypeAlias = dict[str, Any]


# --------------------------------------------------------------------------- event renderers


def _copy(*names: str) -> Callable[[Any], JsonDict]:
    """A renderer for the many events whose wire fields are exactly some dataclass fields."""

    def render(message: Any) -> JsonDict:
        return {name: getattr(message, name) for name in names}

    return render


def _error(e: m.ErrorEvent) -> JsonDict:
    error = {"type": e.error_type, "code": e.code, "message": e.message, "param": e.param}
    return {"error": {**error, "event_id": e.client_event_id}}


def _audio_delta(e: m.AudioDelta) -> JsonDict:
    # The log stores raw bytes (DESIGN.md §5); base64 happens once, here, on the way out.
    return {
        "response_id": e.response_id,
        "item_id": e.item_id,
        "output_index": e.output_index,
        "content_index": e.content_index,
        "delta": binascii.b2a_base64(e.audio, newline=False).decode("ascii"),
    }


def _transcription_completed(e: m.InputTranscriptionCompleted) -> JsonDict:
    # GA requires ``usage``; the transcription is billed to nobody, so it counts no tokens.
    usage = {"type": "tokens", "input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    return {"item_id": e.item_id, "content_index": e.content_index, "transcript": e.transcript,
            "usage": usage}


def _transcription_failed(e: m.InputTranscriptionFailed) -> JsonDict:
    error = {"type": e.error_type, "code": e.code, "message": e.message, "param": e.param}
    return {"item_id": e.item_id, "content_index": e.content_index, "error": error}


def _playback_acknowledged(e: m.PlaybackAcknowledged) -> JsonDict:
    # The seed's shape: what the ack moved at the top, the response's whole ledger below.
    ledger = {"generated_ms": e.generated_ms, "sent_ms": e.sent_ms, "played_ms": e.played_ms,
              "committed_ms": e.committed_ms}
    return {"response_id": e.response_id, "item_id": e.item_id, "played_ms": e.played_ms,
            "committed_ms": e.committed_ms, "playback": ledger}


# Every event addressed to one content part of one output item starts with these.
_PART = ("response_id", "item_id", "output_index", "content_index")
# And every event addressed to one function call output item.
_CALL = ("response_id", "item_id", "output_index", "call_id")
# The input transcription events name the user item and its audio part.
_INPUT_PART = ("item_id", "content_index")
_TRANSCRIPTION = "conversation.item.input_audio_transcription"

_EVENT_RENDERERS: dict[type[Any], tuple[str, Callable[[Any], JsonDict]]] = {
    m.SessionUpdated: ("session.updated", _copy("session")),
    m.ErrorEvent: ("error", _error),
    m.HeartbeatAck: ("session.heartbeat_ack", _copy()),
    m.InputCommitted: ("input_audio_buffer.committed", _copy("previous_item_id", "item_id")),
    m.InputCleared: ("input_audio_buffer.cleared", _copy()),
    m.InputSpeechStarted: ("input_audio_buffer.speech_started",
                           _copy("audio_start_ms", "item_id")),
    m.InputSpeechStopped: ("input_audio_buffer.speech_stopped", _copy("audio_end_ms", "item_id")),
    m.ItemAdded: ("conversation.item.added", _copy("previous_item_id", "item")),
    m.ItemCreated: ("conversation.item.created", _copy("previous_item_id", "item")),
    m.ItemDone: ("conversation.item.done", _copy("previous_item_id", "item")),
    m.ItemRetrieved: ("conversation.item.retrieved", _copy("item")),
    m.ItemDeleted: ("conversation.item.deleted", _copy("item_id")),
    m.ItemTruncated: ("conversation.item.truncated",
                      _copy("item_id", "content_index", "audio_end_ms")),
    m.OutputAudioCleared: ("output_audio_buffer.cleared", _copy("response_id")),
    m.ResponseCreated: ("response.created", _copy("response")),
    m.ResponseDone: ("response.done", _copy("response")),
    m.OutputItemAdded: ("response.output_item.added", _copy("response_id", "output_index", "item")),
    m.OutputItemDone: ("response.output_item.done", _copy("response_id", "output_index", "item")),
    m.ContentPartAdded: ("response.content_part.added", _copy(*_PART, "part")),
    m.ContentPartDone: ("response.content_part.done", _copy(*_PART, "part")),
    m.AudioDelta: ("response.output_audio.delta", _audio_delta),
    m.AudioDone: ("response.output_audio.done", _copy(*_PART)),
    m.TranscriptDelta: ("response.output_audio_transcript.delta", _copy(*_PART, "delta")),
    m.TranscriptDone: ("response.output_audio_transcript.done", _copy(*_PART, "transcript")),
    m.TextDelta: ("response.output_text.delta", _copy(*_PART, "delta")),
    m.TextDone: ("response.output_text.done", _copy(*_PART, "text")),
    m.FunctionCallArgumentsDelta: ("response.function_call_arguments.delta",
                                   _copy(*_CALL, "delta")),
    m.FunctionCallArgumentsDone: ("response.function_call_arguments.done",
                                  _copy(*_CALL, "name", "arguments")),
    m.InputTranscriptionDelta: (f"{_TRANSCRIPTION}.delta", _copy(*_INPUT_PART, "delta")),
    m.InputTranscriptionCompleted: (f"{_TRANSCRIPTION}.completed", _transcription_completed),
    m.InputTranscriptionFailed: (f"{_TRANSCRIPTION}.failed", _transcription_failed),
    m.InputTimeoutTriggered: ("input_audio_buffer.timeout_triggered",
                              _copy("audio_start_ms", "audio_end_ms", "item_id")),
    m.RateLimitsUpdated: ("rate_limits.updated", _copy("rate_limits")),
    m.PlaybackAcknowledged: ("playback.acknowledged", _playback_acknowledged),
    m.TurnEvent: ("turn.event", _copy("event", "turn_state", "payload", "epoch")),
    m.SessionClosed: ("session.closed", _copy("reason")),
    m.SessionExpired: ("session.expired", _copy("reason")),
}

# Our session-level extensions name their session, as the seed's do (seed_behaviour.md §3.1).
_CARRIES_SESSION_ID = frozenset(
    {"session.heartbeat_ack", "session.closed", "session.expired", "turn.event"}
)

def render_event(
    event: m.Event, *, server_event_seq: int, event_id: str, session_id: str | None = None
) -> JsonDict:
    """Render a worker event from the output log as a Realtime GA server event.

    Nested objects (``session``, ``item``, ``response``, ``part``) are shared with ``event``,
    not copied: encode the result, do not mutate it.

    Args:
        event: the typed event.
        server_event_seq: its position in the session's output log (1, 2, 3, ...).
        event_id: the server ``event_id`` to stamp (unique per rendered event).
        session_id: added to ``session.heartbeat_ack``/``.closed``/``.expired`` and
            ``turn.event`` when given.

    Returns:
        The event's JSON object, with ``type``, ``event_id`` and ``server_event_seq``.

    Raises:
        InternalError: ``event`` is of a class without a renderer (a gateway bug).
    """
    entry = _EVENT_RENDERERS.get(type(event))
    if entry is None:
        raise InternalError(f"no renderer for {type(event).__name__}")
    wire_type, render = entry
    rendered: JsonDict = {"type": wire_type, "event_id": event_id, **render(event)}
    if session_id is not None and wire_type in _CARRIES_SESSION_ID:
        rendered["session_id"] = session_id
    rendered["server_event_seq"] = server_event_seq
    return rendered


# --------------------------------------------------------------------------- gateway notices

# ``object`` of the session resource by session ``type`` (the GA create-response shapes).
_SESSION_OBJECTS = {
    "realtime": "realtime.session",
    "transcription": "realtime.transcription_session",
}


# The resume fields ride on session.created as extra top-level keys (strict clients allow extras).
_RESUME_FIELDS = _copy("session_id", "resume_token", "lease_generation")
_RESUMED_FIELDS = _copy("session_id", "resume_token", "lease_generation", "last_client_seq",
                        "replay_from")


def public_session(session: Mapping[str, Any], *, session_id: str) -> JsonDict:
    """``session`` as the GA session resource: ``type`` (``realtime`` unless it names
    another), its ``object`` and the session's ``id`` first, winning over the object's own.

    Nested values are shared with ``session``, not copied: encode the result, do not mutate it.
    """
    kind = session.get("type")
    if not isinstance(kind, str):
        kind = "realtime"  # the GA session object requires ``type``
    obj = _SESSION_OBJECTS.get(kind, "realtime.session")
    head = {"type": kind, "object": obj, "id": session_id}
    return {**head, **{k: v for k, v in session.items() if k not in head}}


def _session_created(n: env.SessionCreatedNotice) -> JsonDict:
    rendered = {"session": public_session(n.session, session_id=n.session_id),
                **_RESUME_FIELDS(n)}
    if n.capabilities is not None:  # our extension: a worker that published its profile
        rendered["capabilities"] = n.capabilities
    return rendered


def _session_resumed(n: env.SessionResumedNotice) -> JsonDict:
    rendered = _RESUMED_FIELDS(n)
    if n.session is not None:
        rendered["session"] = public_session(n.session, session_id=n.session_id)
    if n.capabilities is not None:
        rendered["capabilities"] = n.capabilities
    return rendered


_NOTICE_RENDERERS: dict[type[Any], tuple[str, Callable[[Any], JsonDict]]] = {
    env.SessionCreatedNotice: ("session.created", _session_created),
    env.SessionResumedNotice: ("session.resumed", _session_resumed),
    env.SessionReplacedNotice: ("session.replaced", _copy("session_id", "lease_generation")),
    env.ResyncRequiredNotice: ("session.resync_required",
                               _copy("session_id", "reason", "replay_from")),
}


def render_notice(notice: env.Notice, *, event_id: str) -> JsonDict:
    """Render a gateway notice; notices are not in the output log, so carry no sequence number.

    Args:
        notice: the typed notice.
        event_id: the server ``event_id`` to stamp.

    Returns:
        The notice's JSON object. ``session.created`` validates against the SDK's
        ``SessionCreatedEvent``, with our resume fields as extra top-level keys.

    Raises:
        InternalError: ``notice`` is of a class without a renderer (a gateway bug).
    """
    entry = _NOTICE_RENDERERS.get(type(notice))
    if entry is None:
        raise InternalError(f"no renderer for {type(notice).__name__}")
    wire_type, render = entry
    return {"type": wire_type, "event_id": event_id, **render(notice)}


_INTERNAL_MESSAGE = "The server had an error while processing your request."


def render_error(error: GatewayError, event_id: str) -> JsonDict:
    """Render an exception as a Realtime ``error`` event.

    Args:
        error: a :class:`ClientProtocolError` is rendered with its type, code, message, param
            and client event id; any other :class:`GatewayError` (an :class:`InternalError`)
            as a generic ``server_error``/``internal_error``, because its details may be
            security-sensitive.
        event_id: the server ``event_id`` to stamp.

    Returns:
        The ``error`` event's JSON object (no ``server_event_seq``: it is not in the log).
    """
    body: dict[str, str | None]
    if isinstance(error, ClientProtocolError):
        body = {"type": error.error_type, "code": error.code, "message": error.message}
        body |= {"param": error.param, "event_id": error.client_event_id}
    else:
        body = {"type": "server_error", "code": ErrorCode.INTERNAL_ERROR.value}
        body |= {"message": _INTERNAL_MESSAGE, "param": None, "event_id": None}
    return {"type": "error", "event_id": event_id, "error": body}


# contract.messages.ORJSON_REFUSE: the reference encoder decides (and refuses) a dataclass or a
# datetime. (orjson also writes a UUID or an Enum; neither reaches here: events come out of
# JSON in the log.)


def encode_frame(message: JsonDict) -> str:
    """Serialise a rendered message as one compact JSON text frame, in ASCII (every other
    character escaped).

    orjson writes the frame; its bytes are used as they are when they are plain ASCII
    without a ``null``, which is every audio delta (the hot path). Otherwise the standard
    library, the reference, writes it: it escapes what is not ASCII, and it refuses NaN and
    infinities, which orjson would have written as ``null``. The two differ at most in how a
    float is spelled (``1e16`` for ``1e+16``), which JSON reads as the same number.

    Raises:
        InternalError: the message holds something JSON cannot carry (NaN, bytes, ...).
    """
    try:
        raw = orjson.dumps(message, option=m.ORJSON_REFUSE)
    except orjson.JSONEncodeError:
        return _encode_strictly(message)
    if raw.isascii() and b"null" not in raw:
        return raw.decode("ascii")
    return _encode_strictly(message)


def _encode_strictly(message: JsonDict) -> str:
    """The frame as the standard library writes it, or the reason it cannot be one."""
    try:
        return json.dumps(message, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InternalError(f"unencodable message: {exc}") from exc
