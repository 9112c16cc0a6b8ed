"""The session object: its defaults, which ``session.update`` values apply, and how.

Every backend's sessions start from :func:`default_session` and change only through a patch
that :func:`check_session_patch` accepted (all or nothing), merged by
:func:`apply_session_patch`. ``response.create`` overrides are read by
:func:`response_options`. Pure: no I/O, no clock.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from inference_worker.untrusted import MAX_SESSION_DEPTH, describe, nests_deeper_than
from inference_worker.vad import VadConfigError, vad_config_from_turn_detection
from store.messages import JsonObject

__all__ = [
    "BYTES_PER_SECOND",
    "MAX_BUFFER_BYTES",
    "MIN_COMMIT_BYTES",
    "PCM_FORMAT",
    "Refusal",
    "apply_session_patch",
    "check_session_patch",
    "default_session",
    "effective_turn_detection",
    "response_options",
    "too_deep",
]

# GA `audio/pcm`: pcm16 LE mono, "only a 24kHz sample rate is supported" (openai_realtime.md §4).
PCM_FORMAT: Final[Mapping[str, Any]] = {"type": "audio/pcm", "rate": 24000}
BYTES_PER_SECOND: Final = 24000 * 2
# `input_audio_buffer_commit_empty`: "Expected at least 100ms of audio" (openai_realtime.md §3).
MIN_COMMIT_BYTES: Final = 4800
# The input buffer keeps the newest 60 s. Stream-mode clients stream for as long as they like
# without committing, and the buffer must not grow with the session's age.
MAX_BUFFER_BYTES: Final = 60 * BYTES_PER_SECOND

_MODES: Final = ("turn", "stream")
_BUILTIN_TOOL_CHOICES: Final = ("auto", "none", "required")
# Read-only fields of the session object. Clients echo them back (LiveKit sends `model` in every
# session.update); the worker serves one model, so they are accepted and ignored, and the
# effective session object reports the truth.
_READ_ONLY: Final = frozenset({"id", "object", "model"})


def default_session(session_id: str) -> JsonObject:
    """The effective GA session object of a new loopback session.

    ``turn_detection`` is null (push-to-talk), unlike OpenAI's default ``server_vad``: a client
    that never asks for turn detection keeps committing and creating responses itself, and no
    detector second-guesses it. The extension knobs live under ``extra_body``; the SDK session
    types allow extra keys, so it is echoed.
    """
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": "loopback",
        "output_modalities": ["audio"],
        "instructions": "",
        "tools": [],
        "tool_choice": "auto",
        "max_output_tokens": "inf",
        "audio": {
            "input": {
                "format": dict(PCM_FORMAT),
                "transcription": None,
                "noise_reduction": None,
                "turn_detection": None,
            },
            "output": {"format": dict(PCM_FORMAT), "voice": "alloy", "speed": 1.0},
        },
        "extra_body": {"loopback_mode": "turn", "auto_response": False},
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """Why a request was refused: the OpenAI error ``code``, a message and the ``param``."""

    code: str
    message: str
    param: str | None = None


# --------------------------------------------------------------------------- session.update

_Check = Callable[[Any], bool]


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_number(value: Any, low: float, high: float) -> bool:
    # bool is an int subclass; `true` is never a valid number here.
    return isinstance(value, int | float) and not isinstance(value, bool) and low <= value <= high


def _is_tool(value: Any) -> bool:
    return (isinstance(value, dict) and value.get("type") == "function"
            and _is_str(value.get("name")))


def _is_tool_choice(value: Any) -> bool:
    return value in _BUILTIN_TOOL_CHOICES or _is_tool(value)


def _is_max_tokens(value: Any) -> bool:
    return value == "inf" or (_is_number(value, 1, 4096) and isinstance(value, int))


def _is_transcription(value: Any) -> bool:
    # Echo only: the loopback produces no transcripts, but clients configure this routinely.
    return value is None or (
        isinstance(value, dict)
        and set(value) <= {"model", "language", "prompt"}
        and all(_is_str(v) for v in value.values())
    )


def _is_voice(value: Any) -> bool:
    return (_is_str(value) and value != "") or (
        isinstance(value, dict) and set(value) == {"id"} and _is_str(value["id"])
    )


# Leaf path -> (check, error code). Every key a patch may carry is here or in _CONTAINERS;
# anything else is `unknown_parameter`.
_LEAVES: Final[Mapping[tuple[str, ...], tuple[_Check, str]]] = {
    ("type",): (lambda v: v == "realtime", "invalid_value"),
    ("id",): (_is_str, "invalid_value"),
    ("object",): (_is_str, "invalid_value"),
    ("model",): (_is_str, "invalid_value"),
    ("output_modalities",): (lambda v: v in (["audio"], ["text"]), "invalid_value"),
    ("instructions",): (_is_str, "invalid_value"),
    ("tools",): (lambda v: isinstance(v, list) and all(map(_is_tool, v)), "invalid_value"),
    ("tool_choice",): (_is_tool_choice, "invalid_value"),
    ("max_output_tokens",): (_is_max_tokens, "invalid_value"),
    ("audio", "input", "format"): (lambda v: v == PCM_FORMAT, "unsupported_audio_format"),
    ("audio", "input", "transcription"): (_is_transcription, "invalid_value"),
    ("audio", "input", "noise_reduction"): (
        lambda v: v is None or v in ({"type": "near_field"}, {"type": "far_field"}),
        "invalid_value",
    ),
    ("audio", "output", "format"): (lambda v: v == PCM_FORMAT, "unsupported_audio_format"),
    ("audio", "output", "voice"): (_is_voice, "invalid_value"),
    ("audio", "output", "speed"): (lambda v: _is_number(v, 0.25, 1.5), "invalid_value"),
    ("extra_body", "loopback_mode"): (lambda v: v in _MODES, "invalid_value"),
    ("extra_body", "auto_response"): (lambda v: isinstance(v, bool), "invalid_value"),
}
_CONTAINERS: Final = frozenset({(), ("audio",), ("audio", "input"), ("audio", "output"),
                                ("extra_body",)})
# Checked by the VAD's own rules, and stored with its defaults filled in (GA's effective shape).
_TURN_DETECTION: Final = ("audio", "input", "turn_detection")


def _param(path: tuple[str, ...]) -> str:
    return ".".join(("session", *path))


def _check_level(patch: Any, path: tuple[str, ...]) -> Refusal | None:
    if not isinstance(patch, dict):
        return Refusal(code="invalid_type", message="expected an object", param=_param(path))
    for key, value in patch.items():
        sub = (*path, key)
        if sub in _CONTAINERS:
            refusal = _check_level(value, sub)
            if refusal is not None:
                return refusal
        elif sub == _TURN_DETECTION:
            refusal = _turn_detection_refusal(value)
            if refusal is not None:
                return refusal
        elif sub in _LEAVES:
            check, code = _LEAVES[sub]
            if not check(value):
                return Refusal(code=code, message=f"unsupported value {describe(value)}",
                               param=_param(sub))
        else:
            return Refusal(code="unknown_parameter", message=f"unknown parameter {describe(key)}",
                           param=_param(sub))
    return None


def _turn_detection_refusal(value: Any) -> Refusal | None:
    """Why ``audio.input.turn_detection`` cannot be ``value`` (None: it can).

    ``idle_timeout_ms`` other than null is refused: no runner implements the idle timeout.
    """
    if value is None:
        return None
    base = _param(_TURN_DETECTION)
    try:
        vad_config_from_turn_detection(value)
    except VadConfigError as error:
        param = f"{base}.{error.param}" if error.param else base
        return Refusal(code=error.code, message=str(error), param=param)
    if value.get("idle_timeout_ms") is not None:
        return Refusal(code="unsupported_turn_detection", param=f"{base}.idle_timeout_ms",
                       message="idle_timeout_ms is not supported: send null or leave it out")
    return None


def effective_turn_detection(value: Any) -> JsonObject | None:
    """The effective ``turn_detection`` object for an accepted one: GA's shape, every key
    present, defaults filled in (``null`` stays ``null``).

    An update replaces the whole object, as OpenAI does: keys it leaves out take their
    defaults again, not the values of the object it replaces.
    """
    if value is None:
        return None
    config = vad_config_from_turn_detection(value)
    conversation = {"create_response": value.get("create_response", True),
                    "interrupt_response": value.get("interrupt_response", True)}
    if value["type"] == "semantic_vad":
        return {"type": "semantic_vad", "eagerness": value.get("eagerness", "auto"),
                **conversation}
    return {"type": "server_vad", "threshold": float(config.threshold),
            "prefix_padding_ms": config.prefix_padding_ms,
            "silence_duration_ms": config.silence_duration_ms, "idle_timeout_ms": None,
            **conversation}


def check_session_patch(patch: JsonObject, current: JsonObject) -> Refusal | None:
    """Decide whether a ``session.update`` patch may apply to the loopback session.

    The whole patch is checked before anything is applied, so a refused update changes nothing.
    A patch nested deeper than :data:`~inference_worker.untrusted.MAX_SESSION_DEPTH` is
    refused first, so the merge and every copy of the session object recurse a bounded depth.

    Args:
        patch: the ``session`` object of the update, as the client sent it.
        current: the effective session object it would be merged into.

    Returns:
        None when the patch is acceptable, else the first reason to refuse it.
    """
    refusal = too_deep(patch, "session") or _check_level(patch, ())
    if refusal is not None:
        return refusal
    merged = apply_session_patch(patch, current)
    # Stream mode echoes audio as it arrives, which a text-only response cannot carry.
    if merged["extra_body"]["loopback_mode"] == "stream" and merged["output_modalities"] != [
        "audio"
    ]:
        return Refusal(code="invalid_value", param="session.extra_body.loopback_mode",
                       message="loopback stream mode needs output_modalities ['audio']")
    # Stream mode answers every chunk at once: there is no turn for a detector to end.
    if (merged["extra_body"]["loopback_mode"] == "stream"
            and merged["audio"]["input"]["turn_detection"] is not None):
        return Refusal(code="invalid_value", param=_param(_TURN_DETECTION),
                       message="loopback stream mode takes no turn detection: use turn mode")
    return None


def too_deep(value: Any, param: str) -> Refusal | None:
    """The ``invalid_value`` refusal of a client value nested deeper than the worker takes."""
    if not nests_deeper_than(value, MAX_SESSION_DEPTH):
        return None
    return Refusal(code="invalid_value", param=param,
                   message=f"nested more than {MAX_SESSION_DEPTH} levels deep")


def apply_session_patch(patch: JsonObject, current: JsonObject) -> JsonObject:
    """Deep-merge an accepted patch into a copy of ``current`` and return the copy.

    Args:
        patch: a patch that :func:`check_session_patch` accepted.
        current: the effective session object; it is not modified.

    Returns:
        The new effective session object.
    """
    merged = copy.deepcopy(current)
    _merge_into(merged, patch, ())
    return merged


def _merge_into(target: JsonObject, patch: JsonObject, path: tuple[str, ...]) -> None:
    for key, value in patch.items():
        sub = (*path, key)
        if sub in _CONTAINERS:
            _merge_into(target[key], value, sub)
        elif sub == _TURN_DETECTION:
            target[key] = effective_turn_detection(value)
        elif key not in _READ_ONLY or path:
            target[key] = copy.deepcopy(value)


def response_options(
    request: JsonObject | None, config: JsonObject,
) -> tuple[bool, dict[str, str] | None] | Refusal:
    """Read the ``response.create`` overrides the loopback honours: modalities and metadata.

    Args:
        request: the ``response`` object of ``response.create``, if any.
        config: the effective session object, which supplies the defaults.

    Returns:
        ``(audio, metadata)``, or the refusal of an invalid value. Other options are
        response-scoped knobs the loopback has no use for, so they are ignored.
    """
    if request is None:
        request = {}
    elif not isinstance(request, dict):
        return Refusal(code="invalid_type", param="response", message="expected an object")
    modalities = request.get("output_modalities", config["output_modalities"])
    if modalities not in (["audio"], ["text"]):
        return Refusal(code="invalid_value", param="response.output_modalities",
                       message="output_modalities must be ['audio'] or ['text']")
    metadata = request.get("metadata")
    # Echoed in response.created/.done (LiveKit waits for it), so it must be a string map.
    if metadata is not None and not (
        isinstance(metadata, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        return Refusal(code="invalid_value", param="response.metadata",
                       message="metadata must map strings to strings")
    return modalities == ["audio"], (dict(metadata) if metadata is not None else None)


