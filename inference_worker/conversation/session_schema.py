"""The session object's schema, by hand: the value checks and the table of ``session.update``
leaves (each path with its check and error code), the containers and the paths with rules of
their own.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from inference_worker.conversation.refusals import RefusalCode
from inference_worker.conversation.seed_settings import (
    UNSUPPORTED_KEYS,
    is_idle_timeout,
    is_metadata,
    is_overlap_policy,
    is_playback_commit_policy,
    is_ref_audio,
    is_temperature,
)

__all__ = [
    "CONTAINERS",
    "EXTRA",
    "FORMATS",
    "LEAVES",
    "READ_ONLY",
    "TRANSCRIPTION",
    "TURN_DETECTION",
    "VOICE",
    "WRITE_ONLY",
    "Check",
    "is_bool",
    "is_int",
    "is_max_tokens",
    "is_modalities",
    "is_number",
    "is_optional_str",
    "is_prompt",
    "is_reasoning",
    "is_str",
    "is_tool_choice",
    "is_tools",
    "is_voice",
]

Check = Callable[[Any], bool]
_BUILTIN_TOOL_CHOICES: Final = ("auto", "none", "required")
_EFFORTS: Final = ("minimal", "low", "medium", "high", "xhigh")
_DELAYS: Final = ("minimal", "low", "medium", "high", "xhigh")


def is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def is_number(value: Any, low: float, high: float) -> bool:
    # bool is an int subclass; `true` is never a valid number here.
    return isinstance(value, int | float) and not isinstance(value, bool) and low <= value <= high


def is_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and is_number(value, low, high)


def is_str(value: Any) -> bool:
    return isinstance(value, str)


def is_optional_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(map(is_str, value))


def _has_only(value: Any, checks: Mapping[str, Check]) -> bool:
    """An object whose every key is in ``checks`` and passes its check."""
    return isinstance(value, dict) and all(
        key in checks and checks[key](item) for key, item in value.items())


def _is_tool(value: Any) -> bool:
    return (isinstance(value, dict) and value.get("type") == "function"
            and is_str(value.get("name")))


def is_tools(value: Any) -> bool:
    return isinstance(value, list) and all(map(_is_tool, value))


def is_tool_choice(value: Any) -> bool:
    return value in _BUILTIN_TOOL_CHOICES or _is_tool(value)


def is_max_tokens(value: Any) -> bool:
    return value == "inf" or is_int(value, 1, 4096)


def is_modalities(value: Any) -> bool:
    # GA: audio (with its transcript) or text, never both at once.
    return value in (["audio"], ["text"])


_TRANSCRIPTION_KEYS: Final[Mapping[str, Check]] = {
    "model": is_optional_str, "language": is_optional_str, "prompt": is_optional_str,
    "delay": lambda v: v is None or v in _DELAYS,
    "keywords": lambda v: v is None or _is_str_list(v),
    "languages": lambda v: v is None or _is_str_list(v),
}
_NOISE_REDUCTION_KEYS: Final[Mapping[str, Check]] = {
    "type": lambda v: v in (None, "near_field", "far_field"),
    "strength": lambda v: v is None or is_number(v, 0, float("inf")),
}
_TRACING_KEYS: Final[Mapping[str, Check]] = {
    "workflow_name": is_optional_str, "group_id": is_optional_str,
    "metadata": lambda v: True,  # arbitrary metadata, echoed
}
_PROMPT_KEYS: Final[Mapping[str, Check]] = {
    "id": is_str, "version": is_optional_str,
    "variables": lambda v: v is None or isinstance(v, dict),
}
_RETENTION_KEYS: Final[Mapping[str, Check]] = {
    "type": lambda v: v == "retention_ratio",
    "retention_ratio": lambda v: is_number(v, 0, 1),
    "token_limits": lambda v: v is None or _has_only(
        v, {"post_instructions": lambda n: n is None or is_int(n, 0, 2**31)}),
}


def _is_transcription(value: Any) -> bool:
    return value is None or _has_only(value, _TRANSCRIPTION_KEYS)


def _is_noise_reduction(value: Any) -> bool:
    return value is None or _has_only(value, _NOISE_REDUCTION_KEYS)


def _is_tracing(value: Any) -> bool:
    return value in (None, "auto") or _has_only(value, _TRACING_KEYS)


def _is_truncation(value: Any) -> bool:
    return value in ("auto", "disabled") or (
        _has_only(value, _RETENTION_KEYS) and "retention_ratio" in value)


def is_prompt(value: Any) -> bool:
    return value is None or (_has_only(value, _PROMPT_KEYS) and "id" in value)


def _is_include(value: Any) -> bool:
    return value is None or (isinstance(value, list) and all(
        item == "item.input_audio_transcription.logprobs" for item in value))


def is_reasoning(value: Any) -> bool:
    return value is None or _has_only(value, {"effort": lambda v: v is None or v in _EFFORTS})


def is_voice(value: Any) -> bool:
    return (is_str(value) and value != "") or (
        isinstance(value, dict) and set(value) == {"id"} and is_str(value["id"])
    )


# --------------------------------------------------------------------------- session.update

# Leaf path -> (check, error code). Every key a patch may carry is here, in CONTAINERS or
# one of the special paths below; anything else is `unknown_parameter`.
LEAVES: Final[Mapping[tuple[str, ...], tuple[Check, RefusalCode]]] = {
    ("type",): (lambda v: v == "realtime", RefusalCode.INVALID_VALUE),
    ("id",): (is_str, RefusalCode.INVALID_VALUE),
    ("object",): (is_str, RefusalCode.INVALID_VALUE),
    ("expires_at",): (lambda v: v is None or is_int(v, 0, 2**53), RefusalCode.INVALID_VALUE),
    ("model",): (is_optional_str, RefusalCode.INVALID_VALUE),
    ("output_modalities",): (is_modalities, RefusalCode.INVALID_VALUE),
    ("instructions",): (is_optional_str, RefusalCode.INVALID_VALUE),
    ("tools",): (is_tools, RefusalCode.INVALID_VALUE),
    ("tool_choice",): (is_tool_choice, RefusalCode.INVALID_VALUE),
    ("max_output_tokens",): (is_max_tokens, RefusalCode.INVALID_VALUE),
    ("tracing",): (_is_tracing, RefusalCode.INVALID_VALUE),
    ("truncation",): (_is_truncation, RefusalCode.INVALID_VALUE),
    ("prompt",): (is_prompt, RefusalCode.INVALID_VALUE),
    ("include",): (_is_include, RefusalCode.INVALID_VALUE),
    ("parallel_tool_calls",): (lambda v: v is None or is_bool(v), RefusalCode.INVALID_VALUE),
    ("reasoning",): (is_reasoning, RefusalCode.INVALID_VALUE),
    ("audio", "input", "transcription"): (_is_transcription, RefusalCode.INVALID_VALUE),
    ("audio", "input", "noise_reduction"): (_is_noise_reduction, RefusalCode.INVALID_VALUE),
    ("audio", "output", "voice"): (is_voice, RefusalCode.INVALID_VALUE),
    ("audio", "output", "speed"): (lambda v: is_number(v, 0.25, 1.5), RefusalCode.INVALID_VALUE),
    # The seed's session settings (conversation/seed_settings.py).
    ("session_id",): (is_str, RefusalCode.INVALID_VALUE),
    ("ref_audio",): (is_ref_audio, RefusalCode.INVALID_VALUE),
    ("temperature",): (is_temperature, RefusalCode.INVALID_VALUE),
    ("overlap_policy",): (is_overlap_policy, RefusalCode.INVALID_VALUE),
    ("playback_commit_policy",): (is_playback_commit_policy, RefusalCode.INVALID_VALUE),
    ("idle_timeout_s",): (is_idle_timeout, RefusalCode.INVALID_VALUE),
    ("metadata",): (is_metadata, RefusalCode.INVALID_VALUE),
    # Refused by seed_settings with the seed's code; any value is read.
    **{(key,): ((lambda v: True), RefusalCode.INVALID_VALUE) for key in UNSUPPORTED_KEYS},
}
CONTAINERS: Final = frozenset({(), ("audio",), ("audio", "input"), ("audio", "output")})
EXTRA: Final = ("extra_body",)
# Checked by the VAD's own rules, and stored with its defaults filled in (GA's effective shape).
TURN_DETECTION: Final = ("audio", "input", "turn_detection")
FORMATS: Final = frozenset({("audio", "input", "format"), ("audio", "output", "format")})
VOICE: Final = ("audio", "output", "voice")
TRANSCRIPTION: Final = ("audio", "input", "transcription")
# Fields of the session object that clients echo back (LiveKit sends `model` in every update,
# pipecat may send what session.updated said; the seed's client may send `session_id`):
# accepted, never applied. `model` is refused
# when it names another model (see _model_refusal).
READ_ONLY: Final = frozenset({"id", "object", "model", "expires_at", "session_id"})
# Never stored in the session object: a voice prompt is carried to the backend
# (seed_settings.py), and its size would ride every session.updated; the keys no backend
# applies are refused unless null (left out).
WRITE_ONLY: Final = frozenset({"ref_audio", *UNSUPPORTED_KEYS})
