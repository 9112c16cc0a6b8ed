"""Render worker events as the gateway does and validate them as strict clients do.

The worker's tests check every event they drain this way: rendered by the gateway's own codec
(``gateway.protocol.render.render_event``), then held to the SDK's GA types (or, for our
extension events, to their documented shapes) by :func:`tests.gateway.strict.validate_server_event`,
and finally checked for keys the SDK does not declare beyond the ones we send on purpose.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from contract import messages as msg
from gateway.protocol.render import render_event
from tests.gateway.strict import EXTENSION_TYPES, STRICT, validate_server_event

__all__ = ["ALLOWED_EXTRAS", "render", "undeclared_keys", "validate_strict"]

# Keys the SDK types do not declare but allow (extra="allow"), which the worker sends on purpose:
# the response form of the session object (openai_realtime.md §1a), our extension knobs, the
# seed's session settings (shown only once a client set them) and the log position the gateway
# stamps on every logged event.
ALLOWED_EXTRAS = frozenset({"session.id", "session.object", "session.extra_body",
                            "session.idle_timeout_s", "session.overlap_policy",
                            "session.playback_commit_policy", "session.temperature",
                            "session.metadata",
                            "server_event_seq"})


def render(event: msg.Event, event_id: str = "e1") -> dict[str, Any]:
    """Render ``event`` as the Realtime JSON object the gateway sends (after a JSON round
    trip, so what is checked is what a client parses); a duplex-only event as a duplex
    connection's renderer starts it."""
    wire = render_event(event, server_event_seq=1, event_id=event_id,
                                    session_id="sess_test")
    loaded: dict[str, Any] = json.loads(json.dumps(wire))
    return loaded


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
    validate_server_event(wire)
    if wire["type"] not in EXTENSION_TYPES:
        extras = undeclared_keys(STRICT.validate_python(wire, strict=True))
        assert extras <= ALLOWED_EXTRAS, f"undeclared keys {extras - ALLOWED_EXTRAS} in {wire}"
    return wire
