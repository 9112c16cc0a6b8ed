"""Render worker events as Realtime GA JSON and validate them against the openai SDK types.

Test-only: the gateway has its own codec. This one renders the dict the same way the gateway
will, so that the worker's payloads (session, response, item, part) are proven valid.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Annotated, Any

from openai.types.realtime.realtime_server_event import RealtimeServerEvent
from pydantic import BaseModel, Field, TypeAdapter

from store import messages as msg

__all__ = ["ALLOWED_EXTRAS", "WIRE_TYPES", "render", "undeclared_keys", "validate_strict"]

WIRE_TYPES: dict[type[Any], str] = {
    msg.SessionUpdated: "session.updated",
    msg.ErrorEvent: "error",
    msg.HeartbeatAck: "session.heartbeat_ack",
    msg.InputCommitted: "input_audio_buffer.committed",
    msg.InputCleared: "input_audio_buffer.cleared",
    msg.InputSpeechStarted: "input_audio_buffer.speech_started",
    msg.InputSpeechStopped: "input_audio_buffer.speech_stopped",
    msg.ItemAdded: "conversation.item.added",
    msg.ItemDone: "conversation.item.done",
    msg.ItemRetrieved: "conversation.item.retrieved",
    msg.ItemDeleted: "conversation.item.deleted",
    msg.ItemTruncated: "conversation.item.truncated",
    msg.OutputAudioCleared: "output_audio_buffer.cleared",
    msg.ResponseCreated: "response.created",
    msg.ResponseDone: "response.done",
    msg.OutputItemAdded: "response.output_item.added",
    msg.OutputItemDone: "response.output_item.done",
    msg.ContentPartAdded: "response.content_part.added",
    msg.ContentPartDone: "response.content_part.done",
    msg.AudioDelta: "response.output_audio.delta",
    msg.AudioDone: "response.output_audio.done",
    msg.TranscriptDelta: "response.output_audio_transcript.delta",
    msg.TranscriptDone: "response.output_audio_transcript.done",
}

# Extension events (no member of the GA union): checked by exact shape instead.
_EXTENSIONS = {"session.heartbeat_ack"}
# Keys the SDK types do not declare but allow (extra="allow"), which the worker sends on purpose:
# the response form of the session object (openai_realtime.md §1a) and our extension knobs.
ALLOWED_EXTRAS = frozenset({"session.id", "session.object", "session.extra_body"})

_STRICT: TypeAdapter[Any] = TypeAdapter(Annotated[RealtimeServerEvent, Field(discriminator="type")])


def render(event: msg.Event, event_id: str = "e1") -> dict[str, Any]:
    """Render ``event`` as the Realtime JSON object the gateway sends."""
    wire: dict[str, Any] = {"type": WIRE_TYPES[type(event)], "event_id": event_id}
    if isinstance(event, msg.ErrorEvent):
        wire["error"] = {"type": event.error_type, "code": event.code, "message": event.message,
                         "param": event.param, "event_id": event.client_event_id}
        return wire
    for field in dataclasses.fields(event):
        value = getattr(event, field.name)
        if isinstance(value, bytes):
            wire["delta"] = base64.b64encode(value).decode("ascii")
        else:
            wire[field.name] = value
    return wire


def undeclared_keys(model: Any, path: str = "") -> set[str]:
    """Dotted paths of keys that validated as pydantic extras (not declared by the SDK)."""
    found: set[str] = set()
    if isinstance(model, BaseModel):
        found |= {f"{path}{key}" for key in model.model_extra or {}}
        for name in type(model).model_fields:
            found |= undeclared_keys(getattr(model, name), f"{path}{name}.")
    elif isinstance(model, list):
        for value in model:
            found |= undeclared_keys(value, path)
    return found


def validate_strict(event: msg.Event) -> dict[str, Any]:
    """Render ``event`` and validate it strictly; return the rendered dict.

    Raises:
        pydantic.ValidationError: the payload does not fit the SDK's server-event types.
        AssertionError: an extension event has the wrong shape, or a key is undeclared.
    """
    wire = render(event)
    if wire["type"] in _EXTENSIONS:
        assert wire == {"type": wire["type"], "event_id": "e1"}
        return wire
    model = _STRICT.validate_python(wire, strict=True)
    extras = undeclared_keys(model)
    assert extras <= ALLOWED_EXTRAS, f"undeclared keys {extras - ALLOWED_EXTRAS} in {wire}"
    return wire
