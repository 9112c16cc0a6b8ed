"""``session.update``: which values apply and how.

A :class:`~inference_worker.conversation.profiles.SessionProfile` says what one backend's
sessions can be. Every session starts from
:func:`~inference_worker.conversation.profiles.default_session` and changes only through a
patch that :func:`check_session_patch` accepted (all or nothing), merged by
:func:`apply_session_patch`. ``response.create`` is read by
:mod:`~inference_worker.conversation.response_options`. The rules, liberal in what real
clients send by default (openai-agents, pipecat and LiveKit):

* **Both shapes.** GA's session object and beta's flat one (``modalities``, ``voice``,
  ``input_audio_format: "pcm16"``, ``turn_detection``, ``input_audio_transcription``, ...) are
  accepted; beta keys are mapped onto their GA places (a GA key given too wins) and refusals
  name the key the client sent. Read-only keys that clients echo back (``id``, ``object``,
  ``expires_at``) are accepted and ignored.
* **A new session starts as OpenAI's GA sessions do** where the worker detects turns (the
  loopback): ``server_vad`` with its defaults, ``audio/pcm`` 24 kHz both ways, voice
  ``marin``; where the backend takes turns itself, with what it applies (the cascade's own
  ``server_vad``; ``null`` on moshi and the fake, whose model decides when to speak). An
  explicit ``turn_detection: null`` is push-to-talk.
* **What a client can observe is reported truthfully** in the effective session: the voice
  the backend really speaks with (an unknown one, ``ash`` say, maps to the backend's default),
  what really transcribes the user (``null`` where nothing does), the formats, the modalities
  and the turn detection with every default filled in.
* **Hints are kept and echoed**: ``instructions``, ``tools``, ``tool_choice``, ``tracing``,
  ``prompt``, ``include``, ``truncation``, ``noise_reduction``, ``speed``,
  ``max_output_tokens``, ``parallel_tool_calls``, ``reasoning``. They are the session's record
  of what the client configured; no backend writes traces, filters noise or calls tools.
* **Refused** is only what would change the session's meaning: another ``model`` once the
  session has taken one (``model_update_unsupported``; its first name is whatever the client
  calls the deployment's model), a format the backend cannot take
  (``unsupported_audio_format``), a modality it cannot answer in, and malformed values.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import copy
from typing import Any

from contract.messages import JsonObject
from inference_worker.audio_formats import AudioFormat, parse_format
from inference_worker.conversation.beta import BETA_PATHS, param_name, renamed_refusal, to_ga
from inference_worker.conversation.profiles import IDLE_TIMEOUT_MS_RANGE, LOOPBACK, SessionProfile
from inference_worker.conversation.refusals import Refusal, RefusalCode
from inference_worker.conversation.seed_audio import fold_rates
from inference_worker.conversation.session_schema import (
    CONTAINERS,
    EXTRA,
    FORMATS,
    LEAVES,
    READ_ONLY,
    TRANSCRIPTION,
    TURN_DETECTION,
    VOICE,
    WRITE_ONLY,
)
from inference_worker.turn_detection.vad import VadConfigError, vad_config_from_turn_detection
from inference_worker.untrusted import MAX_SESSION_DEPTH, describe, nests_deeper_than

__all__ = [
    "apply_session_patch",
    "check_session_patch",
    "effective_turn_detection",
    "effective_value",
    "format_refusal",
    "modality_refusal",
    "too_deep",
]

def _check_level(patch: Any, path: tuple[str, ...], profile: SessionProfile) -> Refusal | None:
    if not isinstance(patch, dict):
        return Refusal(code=RefusalCode.INVALID_TYPE, message="expected an object",
                       param=param_name(path))
    for key, value in patch.items():
        refusal = _check_entry((*path, key), value, profile)
        if refusal is not None:
            return refusal
    return None


def _check_entry(sub: tuple[str, ...], value: Any, profile: SessionProfile) -> Refusal | None:
    if sub in CONTAINERS:
        return _check_level(value, sub, profile)
    if sub == EXTRA:
        return _extra_refusal(value, profile)
    if sub == TURN_DETECTION:
        return _turn_detection_refusal(value)
    if sub in FORMATS:
        return format_refusal(value, param_name(sub), profile)
    if sub in LEAVES:
        check, code = LEAVES[sub]
        if check(value):
            return None
        return Refusal(code=code, message=f"unsupported value {describe(value)}",
                       param=param_name(sub))
    return Refusal(code=RefusalCode.UNKNOWN_PARAMETER,
                   message=f"unknown parameter {describe(sub[-1])}",
                   param=param_name(sub))


def _extra_refusal(extra: Any, profile: SessionProfile) -> Refusal | None:
    """Why ``extra_body`` cannot be ``extra`` on ``profile``'s backend (None: it can)."""
    if not isinstance(extra, dict):
        return Refusal(code=RefusalCode.INVALID_TYPE, message="expected an object",
                       param=param_name(EXTRA))
    for key, value in extra.items():
        param = param_name((*EXTRA, key))
        knob = profile.extra_body.get(key)
        if knob is None:  # the seed's code: a model knob this backend does not declare
            return Refusal(code=RefusalCode.INVALID_DUPLEX_RUNTIME_CONFIG, param=param,
                           message=f"model {describe(profile.model)} takes no extra_body "
                                   f"key {describe(key)}")
        if not knob.accepts(value):
            return Refusal(code=RefusalCode.INVALID_VALUE, param=param,
                           message=f"unsupported value {describe(value)}: must be "
                                   f"{knob.expected}")
    return None


def format_refusal(value: Any, param: str, profile: SessionProfile) -> Refusal | None:
    """Why an audio format cannot be ``value`` on ``profile``'s backend (None: it can)."""
    parsed = parse_format(value, param)
    if isinstance(parsed, Refusal):
        return parsed
    if parsed.encoding in profile.audio_formats:
        return None
    takes = ", ".join(sorted(encoding.value for encoding in profile.audio_formats))
    return Refusal(code=RefusalCode.UNSUPPORTED_AUDIO_FORMAT, param=param,
                   message=f"this model takes {takes} only, not {parsed.value}")


def _turn_detection_refusal(value: Any) -> Refusal | None:
    """Why ``audio.input.turn_detection`` cannot be ``value`` (None: it can).

    ``idle_timeout_ms`` is taken from :data:`IDLE_TIMEOUT_MS_RANGE` (``server_vad`` only: the
    detector refuses it on ``semantic_vad``, as OpenAI does).
    """
    if value is None:
        return None
    base = param_name(TURN_DETECTION)
    try:
        vad_config_from_turn_detection(value)
    except VadConfigError as error:
        param = f"{base}.{error.param}" if error.param else base
        return Refusal(code=error.code, message=str(error), param=param)
    idle = value.get("idle_timeout_ms")
    if idle is None:
        return None
    low, high = IDLE_TIMEOUT_MS_RANGE
    if not low <= idle <= high:
        return Refusal(code=RefusalCode.INVALID_VALUE, param=f"{base}.idle_timeout_ms",
                       message=f"idle_timeout_ms must be from {low} to {high} ms, got {idle}")
    return None


def _model_refusal(patch: JsonObject, current: JsonObject,
                   profile: SessionProfile) -> Refusal | None:
    """A ``model`` other than the session's.

    A session is placed on a worker of the model its client named (the URL's ``?model=`` or
    its first ``session.update``), or of the deployment's default, and is named after it
    then; its model never changes after that (OpenAI's rule, the seed's code), not even to
    another name its worker serves."""
    model = patch.get("model")
    serving = current.get("model", profile.model)
    if model is None or model == serving:
        return None
    return Refusal(code=RefusalCode.MODEL_UPDATE_UNSUPPORTED, param="session.model",
                   message=f"this session is served by model {describe(serving)} and cannot "
                           f"change to {describe(model)}: send {describe(serving)} or leave "
                           "model out")


def modality_refusal(patch: JsonObject, profile: SessionProfile, root: str) -> Refusal | None:
    modalities = patch.get("output_modalities")
    if modalities is None or modalities[0] in profile.output_modalities:
        return None
    allowed = [[kind] for kind in profile.output_modalities]
    return Refusal(code=RefusalCode.INVALID_VALUE, param=f"{root}.output_modalities",
                   message=f"this model answers in {' or '.join(profile.output_modalities)}: "
                           f"output_modalities must be {' or '.join(map(str, allowed))}")


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
            "silence_duration_ms": config.silence_duration_ms,
            "idle_timeout_ms": value.get("idle_timeout_ms"),
            **conversation}


def check_session_patch(patch: JsonObject, current: JsonObject,
                        profile: SessionProfile = LOOPBACK) -> Refusal | None:
    """Decide whether a ``session.update`` patch may apply to a session on ``profile``'s
    backend.

    The whole patch is checked before anything is applied, so a refused update changes nothing.
    A patch nested deeper than :data:`~inference_worker.untrusted.MAX_SESSION_DEPTH` is
    refused first, so the merge and every copy of the session object recurse a bounded depth.

    Args:
        patch: the ``session`` object of the update, as the client sent it (GA or beta shape).
        current: the effective session object it would be merged into.
        profile: what the session's backend can do.

    Returns:
        None when the patch is acceptable, else the first reason to refuse it.
    """
    refusal = too_deep(patch, "session")
    if refusal is not None:
        return refusal
    if not isinstance(patch, dict):
        return Refusal(code=RefusalCode.INVALID_TYPE, message="expected an object", param="session")
    mapped = to_ga(patch, BETA_PATHS, "session")
    if isinstance(mapped, Refusal):
        return mapped
    folded = fold_rates(mapped[0], current)
    if isinstance(folded, Refusal):
        return folded
    ga, renamed = folded, mapped[1]
    refusal = (_check_level(ga, (), profile) or _model_refusal(ga, current, profile)
               or modality_refusal(ga, profile, "session"))
    if refusal is None and profile.coherence is not None:
        refusal = profile.coherence(_merged(ga, current, profile))
    return renamed_refusal(refusal, renamed)


def too_deep(value: Any, param: str) -> Refusal | None:
    """The ``invalid_value`` refusal of a client value nested deeper than the worker takes."""
    if not nests_deeper_than(value, MAX_SESSION_DEPTH):
        return None
    return Refusal(code=RefusalCode.INVALID_VALUE, param=param,
                   message=f"nested more than {MAX_SESSION_DEPTH} levels deep")


def apply_session_patch(patch: JsonObject, current: JsonObject,
                        profile: SessionProfile = LOOPBACK) -> JsonObject:
    """Deep-merge an accepted patch into a copy of ``current`` and return the copy, with
    every value as the backend really serves it (beta keys at their GA places, the voice
    the backend speaks with, what really transcribes, formats and turn detection in full).

    Args:
        patch: a patch that :func:`check_session_patch` accepted for ``profile``.
        current: the effective session object; it is not modified.
        profile: what the session's backend can do.

    Returns:
        The new effective session object.

    Raises:
        ValueError: ``patch`` has a beta value that maps to nothing (it was not accepted).
    """
    mapped = to_ga(patch, BETA_PATHS, "session")
    ga = mapped if isinstance(mapped, Refusal) else fold_rates(mapped[0], current)
    if isinstance(ga, Refusal):
        raise ValueError(f"a refused patch cannot apply: {ga.message}")
    return _merged(ga, current, profile)


def _merged(ga: JsonObject, current: JsonObject, profile: SessionProfile) -> JsonObject:
    merged = copy.deepcopy(current)
    _merge_into(merged, ga, (), profile)
    return merged


def _merge_into(target: JsonObject, patch: JsonObject, path: tuple[str, ...],
                profile: SessionProfile) -> None:
    for key, value in patch.items():
        sub = (*path, key)
        if sub in CONTAINERS or sub == EXTRA:
            inner = target.setdefault(key, {})
            _merge_into(inner, value, sub, profile)
        elif path or key not in READ_ONLY | WRITE_ONLY:
            target[key] = effective_value(sub, value, profile)
        elif key == "model" and isinstance(value, str):
            target[key] = value  # the session's name (see _model_refusal)


def effective_value(sub: tuple[str, ...], value: Any, profile: SessionProfile) -> Any:
    """The effective value of an accepted leaf ``value`` at ``sub``."""
    if sub == TURN_DETECTION:
        if profile.turn_detection is not None:  # the backend's own, whatever was asked
            return copy.deepcopy(dict(profile.turn_detection))
        return effective_turn_detection(value)
    if sub == VOICE:
        return profile.voice_for(value)
    if sub == TRANSCRIPTION:
        return profile.transcription_for(value)
    if sub in FORMATS:
        parsed = parse_format(value, param_name(sub))
        assert isinstance(parsed, AudioFormat), "only an accepted format is applied"
        return parsed.as_object()
    if sub == ("instructions",) and value is None:
        return ""  # GA's "no instructions"
    return copy.deepcopy(value)
