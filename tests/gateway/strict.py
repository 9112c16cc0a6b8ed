"""Strict validation of server events, as openai-agents and pipecat apply it.

The ``openai`` SDK itself parses server events leniently (``construct``, no validation), which
hides protocol bugs: a beta name or a missing field goes unnoticed. Stricter real clients
validate each event with pydantic against the SDK's ``RealtimeServerEvent`` union, so every
event the gateway emits is held to that here (openai_realtime.md §9), after a JSON round trip
so that what is checked is what a client would parse.

Our extension events have no SDK model; they are listed in :data:`EXTENSION_TYPES` and get a
strict check of their own: every required key present with the right JSON type, no unknown
key, and the members of the objects they carry checked the same way where those are fixed.
Our extension keys on standard events (``server_event_seq`` on logged events; the resume
fields and ``capabilities`` on ``session.created``) are type-checked wherever they appear. The
``session`` that ``session.resumed`` carries is held to the SDK's type of the ``session`` of
``session.created``, as strictly as that event.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from openai.types.realtime.realtime_server_event import RealtimeServerEvent
from openai.types.realtime.session_created_event import Session
from pydantic import Field, TypeAdapter

__all__ = ["EXTENSION_TYPES", "STRICT", "validate_server_event"]

#: The strict validator of openai_realtime.md §9 (discriminated on ``type``).
STRICT: TypeAdapter[Any] = TypeAdapter(Annotated[RealtimeServerEvent, Field(discriminator="type")])
# The session resource of session.created, for the extension events that carry one too.
_SESSION: TypeAdapter[Any] = TypeAdapter(Session)

_SEQ = {"server_event_seq": int}

# type -> (required keys, optional keys), each key -> its JSON type. ``type`` is implied.
_EXTENSIONS: dict[str, tuple[dict[str, type], dict[str, type]]] = {
    "session.resumed": (
        {
            "event_id": str,
            "session_id": str,
            "resume_token": str,
            "lease_generation": int,
            "last_client_seq": int,
            "replay_from": int,
        },
        {"session": dict, "capabilities": dict},
    ),
    "session.replaced": ({"event_id": str, "session_id": str, "lease_generation": int}, {}),
    "session.resync_required": (
        {"event_id": str, "session_id": str, "reason": str, "replay_from": int}, {}),
    "session.closed": ({"event_id": str, "reason": str}, {**_SEQ, "session_id": str}),
    "session.expired": ({"event_id": str, "reason": str}, {**_SEQ, "session_id": str}),
    "session.heartbeat_ack": ({"event_id": str}, {**_SEQ, "session_id": str}),
    "playback.acknowledged": (
        {"event_id": str, "response_id": str, "item_id": str, "played_ms": int,
         "committed_ms": int, "playback": dict},
        {**_SEQ},
    ),
    "turn.event": (
        {"event_id": str, "event": str, "turn_state": str, "payload": dict, "epoch": int},
        {**_SEQ, "session_id": str},
    ),
    "response.listen": (
        {"event_id": str, "epoch": int, "response": dict},
        {**_SEQ, "session_id": str, "response_id": str},
    ),
    "response.speak": (
        {"event_id": str, "response_id": str, "item_id": str, "output_index": int,
         "content_index": int, "metadata": dict},
        {**_SEQ},
    ),
}

# (type, key) -> the exact members of an object an extension event carries, with their types.
_NESTED: dict[tuple[str, str], dict[str, type]] = {
    ("playback.acknowledged", "playback"): {
        "generated_ms": int, "sent_ms": int, "played_ms": int, "committed_ms": int},
    ("response.speak", "metadata"): {"epoch": int, "model_speak": bool},
}

#: Server event types that are our extensions (seed_behaviour.md §4.7), not in the SDK union.
EXTENSION_TYPES: frozenset[str] = frozenset(_EXTENSIONS)

# Extension keys allowed on standard events, checked wherever they appear.
_EXTRA_KEYS: dict[str, type] = {
    "server_event_seq": int,
    "session_id": str,
    "resume_token": str,
    "lease_generation": int,
    "capabilities": dict,
}


def _check_type(event_type: str, key: str, value: Any, expected: type) -> None:
    # JSON has no bool/int confusion; Python does (bool is an int subclass).
    if type(value) is not expected:
        raise AssertionError(
            f"{event_type}: {key!r} must be {expected.__name__}, got {type(value).__name__}"
        )
    if key == "server_event_seq" and isinstance(value, int) and value < 1:
        raise AssertionError(f"{event_type}: server_event_seq must be >= 1, got {value}")


def _validate_extension(event: dict[str, Any]) -> None:
    event_type = event["type"]
    required, optional = _EXTENSIONS[event_type]
    missing = required.keys() - event.keys()
    if missing:
        raise AssertionError(f"{event_type}: missing {sorted(missing)}")
    unknown = event.keys() - required.keys() - optional.keys() - {"type"}
    if unknown:
        raise AssertionError(f"{event_type}: unknown keys {sorted(unknown)}")
    for key, value in event.items():
        if key != "type":
            _check_type(event_type, key, value, {**required, **optional}[key])
        members = _NESTED.get((event_type, key))
        if members is not None:
            if value.keys() != members.keys():
                raise AssertionError(f"{event_type}.{key}: keys {sorted(value)}")
            for member, expected in members.items():
                _check_type(f"{event_type}.{key}", member, value[member], expected)


def validate_server_event(event: dict[str, Any]) -> None:
    """Validate one server event as the strictest real client would.

    Args:
        event: the rendered event (a dict, as produced by the codec).

    Raises:
        AssertionError: an extension event or extension key is malformed, or the event does
            not survive a JSON round trip.
        pydantic.ValidationError: a standard event fails the SDK's strict schema (unknown
            type, missing field, wrong literal).
    """
    wire = json.loads(json.dumps(event, allow_nan=False))
    if wire != event:
        raise AssertionError(f"not JSON-faithful: {event!r}")
    event_type = wire.get("type")
    if event_type in EXTENSION_TYPES:
        _validate_extension(wire)
        if event_type == "session.resumed" and "session" in wire:
            _SESSION.validate_python(wire["session"], strict=True)
        return
    STRICT.validate_python(wire, strict=True)
    for key, expected in _EXTRA_KEYS.items():
        if key in wire:
            _check_type(str(event_type), key, wire[key], expected)
