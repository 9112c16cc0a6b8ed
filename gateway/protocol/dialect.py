"""The two wire dialects a connection may speak, and how the URL picks one (no I/O).

A connection speaks the OpenAI Realtime GA dialect unless its URL asks for the seed's duplex
dialect (vLLM-Omni's ``/v1/realtime?duplex=1``, or its ``/v1/duplex`` path): the same commands
and events underneath, with the seed's client-event aliases accepted and the seed's names,
fields and codes rendered where they differ from GA. Which differences there are is
docs/reference/protocol.md's dialect table; the rendering is
:mod:`gateway.protocol.render_duplex`, the aliases :mod:`gateway.protocol.parse`.

The URL's other handshake parameters are read here too, with the seed's spellings: ``model``,
``resume=1`` and ``autostart=0`` (both: open nothing until the first client event).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from gateway.protocol.errors import ClientProtocolError, ErrorCode

__all__ = [
    "DUPLEX_PATH",
    "SEED_ERROR_CODES",
    "SEED_RESYNC_REASONS",
    "Dialect",
    "Handshake",
    "parse_handshake",
    "seed_error_code",
]


class Dialect(StrEnum):
    """What a connection speaks on the wire."""

    #: OpenAI Realtime GA (strictly valid against the openai SDK's types), plus our extensions.
    GA = "ga"
    #: The seed's ``?duplex=1`` contract (vLLM-Omni's released server and clients).
    DUPLEX = "duplex"


#: The seed's other endpoint: an alias of ``/v1/realtime?duplex=1``, always the duplex dialect.
DUPLEX_PATH = "/v1/duplex"

# The seed's spellings of a boolean query parameter.
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Handshake:
    """What a connection's URL asks for.

    Attributes:
        dialect: the dialect the connection speaks.
        model: the URL's ``model`` (None: none named).
        autostart: whether the URL's model may be opened before the first client event
            (False after ``resume=1`` or ``autostart=0``: the first event decides).
    """

    dialect: Dialect = Dialect.GA
    model: str | None = None
    autostart: bool = True


def _flag(query: Mapping[str, str], name: str, *, strict: bool) -> bool | None:
    """The boolean ``name`` (None: absent). ``strict``: a value that is neither true nor
    false is refused; otherwise it counts as false, as GA connections always read ``resume``."""
    raw = query.get(name)
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE or not strict:
        return False
    raise ClientProtocolError(
        ErrorCode.INVALID_VALUE,
        f"Invalid value for query parameter '{name}': expected one of"
        f" {', '.join(sorted(_TRUE | _FALSE))}.",
        param=name,
    )


def parse_handshake(path: str, query: Mapping[str, str]) -> Handshake:
    """Read the websocket URL's path and query parameters.

    Raises:
        ClientProtocolError: ``invalid_value`` for a ``duplex`` or ``autostart`` that is
            neither true nor false (refused before the handshake completes).
    """
    duplex = _flag(query, "duplex", strict=True)
    autostart = _flag(query, "autostart", strict=True)
    resume = _flag(query, "resume", strict=False)
    model = query.get("model") or None
    dialect = Dialect.DUPLEX if duplex or path == DUPLEX_PATH else Dialect.GA
    return Handshake(dialect=dialect, model=model,
                     autostart=not resume and autostart is not False)


# --------------------------------------------------------------------------- codes and reasons

#: The seed's error code for ours, where they differ: ``(code, param)`` first (an indexed
#: param, ``video_frames[2]``, by its name), then ``(code, None)`` for every other param.
#: Applied to every error a duplex connection gets, the gateway's and the worker's.
SEED_ERROR_CODES: Mapping[tuple[str, str | None], str] = MappingProxyType({
    ("invalid_event", None): "bad_event",
    ("invalid_type", None): "bad_event",
    ("missing_required_parameter", None): "bad_event",
    ("missing_required_parameter", "item_id"): "missing_item_id",
    ("invalid_value", "audio"): "bad_audio",
    ("invalid_value", "delta"): "bad_audio",
    ("invalid_value", "item.call_id"): "invalid_function_call_output",
    ("invalid_value", "video_frames"): "invalid_video_frames",
    ("invalid_value", "sample_rate_hz"): "bad_event",
    ("input_audio_buffer_commit_empty", None): "input_audio_buffer_empty",
    ("conversation_already_has_active_response", None): "response_already_active",
    ("response_cancel_not_active", None): "response_not_active",
})


def seed_error_code(code: str, param: str | None) -> str:
    """The code a duplex connection gets for the error ``code`` about ``param``."""
    seed = None if param is None else SEED_ERROR_CODES.get((code, param.partition("[")[0]))
    if seed is None:
        seed = SEED_ERROR_CODES.get((code, None), code)
    return seed


#: The seed's ``session.resync_required`` reason for ours, where one means the same: events
#: the client lacks are no longer retained. (``log_rewound``, a failover that lost events the
#: client holds, has no seed counterpart and keeps its name.)
SEED_RESYNC_REASONS: Mapping[str, str] = MappingProxyType({"log_trimmed": "journal_gap"})
