"""Beta's flat session and response shapes, mapped onto GA's.

Beta's keys (``modalities``, ``voice``, ``input_audio_format: "pcm16"``, ``turn_detection``,
``input_audio_transcription``, ...) are moved to their GA places (a GA key given too wins), and
a refusal names the key the client sent (:func:`renamed_refusal`).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from contract.messages import JsonObject
from inference_worker.audio_formats import AudioFormat, encoding_named
from inference_worker.conversation.refusals import Refusal, RefusalCode
from inference_worker.conversation.session_schema import (
    TRANSCRIPTION,
    TURN_DETECTION,
    VOICE,
    is_str,
)
from inference_worker.untrusted import describe

__all__ = [
    "BETA_PATHS",
    "param_name",
    "renamed_refusal",
    "to_ga",
]

# Beta's flat session keys, each with the GA path it is mapped onto.
BETA_PATHS: Final[Mapping[str, tuple[str, ...]]] = {
    "modalities": ("output_modalities",),
    "voice": VOICE,
    "input_audio_format": ("audio", "input", "format"),
    "output_audio_format": ("audio", "output", "format"),
    "response_format": ("audio", "output", "format"),  # the seed's name for the same
    "turn_detection": TURN_DETECTION,
    "input_audio_transcription": TRANSCRIPTION,
    "input_audio_noise_reduction": ("audio", "input", "noise_reduction"),
    "speed": ("audio", "output", "speed"),
    "max_response_output_tokens": ("max_output_tokens",),
    "max_tokens": ("max_output_tokens",),  # the seed's DuplexSessionConfig spelling
}
# Beta's format names (the seed's too), for the refusal of another.
_BETA_FORMATS: Final = "pcm16, g711_ulaw, g711_alaw, pcm_f32le"


def param_name(path: tuple[str, ...], root: str = "session") -> str:
    return ".".join((root, *path))


def _ga_modalities(value: Any) -> list[str] | None:
    """GA's ``output_modalities`` for beta's ``modalities`` (None: not a modality list).

    Beta's default ``["text", "audio"]`` is an audio answer with its transcript, which is
    GA's ``["audio"]``.
    """
    if not (isinstance(value, list) and value and set(value) <= {"text", "audio"}
            and all(map(is_str, value))):
        return None
    return ["audio"] if "audio" in value else ["text"]


def _beta_value(key: str, value: Any, root: str) -> Any:
    """The GA value of beta ``key`` (a refusal naming the beta key when it has none)."""
    param = f"{root}.{key}"
    if key == "modalities":
        modalities = _ga_modalities(value)
        if modalities is None:
            return Refusal(code=RefusalCode.INVALID_VALUE, param=param,
                           message=f"unsupported value {describe(value)}: a list of 'audio' "
                                   "and 'text'")
        return modalities
    if key.endswith("_format"):
        if isinstance(value, dict):  # the seed also takes a format object here
            return value
        encoding = encoding_named(value)
        if encoding is None:
            return Refusal(code=RefusalCode.UNSUPPORTED_AUDIO_FORMAT, param=param,
                           message=f"unsupported format {describe(value)}: use one of "
                                   f"{_BETA_FORMATS}")
        # At the encoding's GA rate: the seed's rate keys, folded in next, may change it.
        return AudioFormat(encoding, encoding.default_rate).as_object()
    return value


def _place(target: JsonObject, path: tuple[str, ...], value: Any) -> bool:
    """Put ``value`` at ``path`` in ``target``, copying (never changing) the client's objects
    on the way. False when the path is taken (GA's own key wins) or crosses a non-object
    (which the GA check refuses)."""
    *containers, leaf = path
    for key in containers:
        inner = target.get(key, {})
        if not isinstance(inner, dict):
            return False
        target[key] = dict(inner)
        target = target[key]
    if leaf in target:
        return False
    target[leaf] = value
    return True


def to_ga(patch: JsonObject, beta_paths: Mapping[str, tuple[str, ...]],
           root: str) -> tuple[JsonObject, dict[str, str]] | Refusal:
    """``patch`` with its beta keys moved to their GA places, and the params renamed (GA
    param -> the beta param the client sent), or the refusal of a beta value."""
    ga = {key: value for key, value in patch.items() if key not in beta_paths}
    renamed: dict[str, str] = {}
    for key, path in beta_paths.items():
        if key not in patch:
            continue
        value = _beta_value(key, patch[key], root)
        if isinstance(value, Refusal):
            return value
        if _place(ga, path, value):
            renamed[param_name(path, root)] = f"{root}.{key}"
    return ga, renamed


def renamed_refusal(refusal: Refusal | None, renamed: Mapping[str, str]) -> Refusal | None:
    """``refusal`` with its param named as the client sent it (a beta key, say)."""
    if refusal is None or refusal.param is None:
        return refusal
    for ga, sent in renamed.items():
        if refusal.param == ga or refusal.param.startswith((f"{ga}.", f"{ga}[")):
            return Refusal(code=refusal.code, message=refusal.message,
                           param=sent + refusal.param[len(ga):])
    return refusal
