"""The session object: what each backend's sessions can be, their defaults, which
``session.update`` values apply and how, and what ``response.create`` may ask for.

A :class:`SessionProfile` says what one backend's sessions can be (:data:`LOOPBACK`, and
:func:`frame_profile` for the frame backends). Every session starts from
:func:`default_session` and changes only through a patch that :func:`check_session_patch`
accepted (all or nothing), merged by :func:`apply_session_patch`. ``response.create`` is read
by :func:`parse_response_options`. The rules, liberal in what real clients send by default
(openai-agents, pipecat and LiveKit):

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from inference_worker.audio_formats import AudioFormat, parse_format
from inference_worker.conversation.refusals import Refusal
from inference_worker.turn_detection.vad import VadConfigError, vad_config_from_turn_detection
from inference_worker.untrusted import MAX_SESSION_DEPTH, describe, nests_deeper_than
from store.messages import JsonObject

__all__ = [
    "BYTES_PER_SECOND",
    "GA_TURN_DETECTION",
    "IDLE_TIMEOUT_MS_RANGE",
    "LOOPBACK",
    "MAX_BUFFER_BYTES",
    "MIN_COMMIT_BYTES",
    "NATIVE_RESPONSE_OPTIONS",
    "PCM_FORMAT",
    "ExtraSetting",
    "ResponseOptions",
    "SessionProfile",
    "apply_session_patch",
    "check_session_patch",
    "default_session",
    "effective_turn_detection",
    "frame_profile",
    "parse_response_options",
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
#: The ``idle_timeout_ms`` a ``server_vad`` takes (OpenAI's bounds).
IDLE_TIMEOUT_MS_RANGE: Final = (5000, 30000)
#: The turn detection a GA session starts with (openai_realtime.md §5 and its GA
#: ``session.created``), in the effective shape, every default filled in.
GA_TURN_DETECTION: Final[Mapping[str, Any]] = MappingProxyType({
    "type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
    "silence_duration_ms": 500, "idle_timeout_ms": None, "create_response": True,
    "interrupt_response": True,
})


# --------------------------------------------------------------------------- profiles


@dataclass(frozen=True, slots=True, kw_only=True)
class ExtraSetting:
    """One ``session.extra_body`` knob of a backend: its default and the values it takes."""

    default: Any
    accepts: Callable[[Any], bool]
    #: What ``accepts`` wants, for the refusal's message ("an integer from 80 to 10000").
    expected: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionProfile:
    """What one backend's sessions can be.

    Attributes:
        model: the model name its sessions report; an update naming another is refused.
        voices: the voices it really speaks with, the first its default; any other voice a
            client asks for (a name it lacks, a custom ``{"id": ...}``) is reported as that one.
        output_modalities: what its responses can be made of: ``("audio", "text")`` or
            ``("audio",)``.
        transcription_model: what transcribes the user's audio, reported as
            ``audio.input.transcription.model`` once a client turns transcription on; None:
            nothing does, and ``transcription`` stays ``null`` whatever the client asks.
        extra_body: its extension knobs (``session.extra_body``), by name.
        audio_formats: the formats its sessions take, in each direction (every one by
            default: the conversation core converts G.711 at its edge, so the model only ever
            sees pcm16 24 kHz).
        fixed_response_options: the ``response.create`` options it cannot set per response
            (a model-native backend answers from what it heard); asking one for a value other
            than the session's is refused.
        coherence: its rules across the fields of a merged session (None: no such rule).
        turn_detection: a backend that detects turns itself (the cascade's own VAD): the
            ``audio.input.turn_detection`` its sessions always show, whatever a client asks
            (the request is still checked); None: the session's own, as asked.
        default_turn_detection: where ``turn_detection`` is None, the turn detection a new
            session starts with (None: push-to-talk, until a client asks for one).
    """

    model: str
    voices: tuple[str, ...]
    output_modalities: tuple[str, ...] = ("audio", "text")
    transcription_model: str | None = None
    extra_body: Mapping[str, ExtraSetting] = field(
        default_factory=lambda: MappingProxyType({}))
    audio_formats: frozenset[AudioFormat] = frozenset(AudioFormat)
    turn_detection: Mapping[str, Any] | None = None
    default_turn_detection: Mapping[str, Any] | None = None
    fixed_response_options: frozenset[str] = frozenset()
    coherence: Callable[[JsonObject], Refusal | None] | None = None

    def __post_init__(self) -> None:
        if not self.voices:
            raise ValueError("a profile needs at least one voice")
        if not set(self.output_modalities) <= {"audio", "text"} or not self.output_modalities:
            raise ValueError(f"bad output modalities {self.output_modalities!r}")

    def voice_for(self, requested: Any) -> str:
        """The voice a session asking for ``requested`` really gets."""
        return requested if requested in self.voices else self.voices[0]

    def initial_turn_detection(self) -> JsonObject | None:
        """The ``audio.input.turn_detection`` of a new session."""
        shown = (self.turn_detection if self.turn_detection is not None
                 else self.default_turn_detection)
        return None if shown is None else copy.deepcopy(dict(shown))

    def transcription_for(self, requested: Any) -> JsonObject | None:
        """The effective ``audio.input.transcription`` for an accepted ``requested`` one."""
        if requested is None or self.transcription_model is None:
            return None
        return {"model": self.transcription_model}

    def extra_defaults(self) -> JsonObject:
        """The ``extra_body`` of a new session."""
        return {name: copy.deepcopy(knob.default) for name, knob in self.extra_body.items()}


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_number(value: Any, low: float, high: float) -> bool:
    # bool is an int subclass; `true` is never a valid number here.
    return isinstance(value, int | float) and not isinstance(value, bool) and low <= value <= high


def _is_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and _is_number(value, low, high)


def _loopback_coherence(merged: JsonObject) -> Refusal | None:
    """Stream mode echoes every chunk at once, inside one open response: the response must be
    audio, and there is no turn for a detector to end."""
    if merged["extra_body"].get("loopback_mode") != "stream":
        return None
    if merged["output_modalities"] != ["audio"]:
        return Refusal(code="invalid_value", param="session.extra_body.loopback_mode",
                       message="loopback stream mode needs output_modalities ['audio']")
    if merged["audio"]["input"]["turn_detection"] is not None:
        return Refusal(code="invalid_value", param="session.audio.input.turn_detection",
                       message="loopback stream mode takes no turn detection: send "
                               "audio.input.turn_detection null with it, or use turn mode")
    return None


#: The loopback: plays the caller's audio back, so it has no voice of its own; its one voice
#: is named after OpenAI's GA default, so a session that never names one shows what an OpenAI
#: session would. The worker detects its turns, so a new session starts with OpenAI's
#: ``server_vad``. It answers in audio or text and transcribes nothing.
LOOPBACK: Final = SessionProfile(
    model="loopback",
    voices=("marin",),
    default_turn_detection=GA_TURN_DETECTION,
    extra_body=MappingProxyType({
        "loopback_mode": ExtraSetting(default="turn", accepts=lambda v: v in ("turn", "stream"),
                                      expected="'turn' or 'stream'"),
        "auto_response": ExtraSetting(default=False, accepts=_is_bool, expected="a boolean"),
    }),
    coherence=_loopback_coherence,
)

#: What a model-native backend cannot set per response: it answers from what it heard, so
#: text instructions, tools, token limits, prompts and out-of-band responses mean nothing to it
#: (the seed's ``unsupported_native_response_options``).
NATIVE_RESPONSE_OPTIONS: Final = frozenset({
    "instructions", "tools", "tool_choice", "max_output_tokens", "prompt", "reasoning",
    "parallel_tool_calls", "conversation", "input",
})

_SILENCE_MS: Final = (80, 10_000)
_FRAME_EXTRA: Final[Mapping[str, ExtraSetting]] = MappingProxyType({
    "end_of_turn_silence_ms": ExtraSetting(
        default=800, accepts=lambda v: _is_int(v, *_SILENCE_MS),
        expected=f"an integer from {_SILENCE_MS[0]} to {_SILENCE_MS[1]}"),
})


def frame_profile(model: str, *, voices: tuple[str, ...] | None = None,
                  transcription_model: str | None = None,
                  fixed_response_options: frozenset[str] = NATIVE_RESPONSE_OPTIONS,
                  turn_detection: Mapping[str, Any] | None = None,
                  ) -> SessionProfile:
    """The profile of a frame backend named ``model`` (moshi, fake, cascade).

    Its responses are audio only; ``extra_body`` takes ``end_of_turn_silence_ms`` (80..10000,
    default 800: the sustained silence that ends the model's turn). Its model takes turns
    itself, so a new session has no turn detection of the worker's (``turn_detection`` null,
    unless the backend applies its own).

    Args:
        model: the backend's name, reported as the session's ``model``.
        voices: the voices it speaks with, the first its default (None: one voice named
            after the model, its own).
        transcription_model: what transcribes the user (None: nothing does).
        fixed_response_options: what a response cannot set on it (see
            :attr:`SessionProfile.fixed_response_options`).
        turn_detection: the turn detection it applies itself, whatever is asked (see
            :attr:`SessionProfile.turn_detection`).
    """
    return SessionProfile(model=model, voices=voices or (model,), output_modalities=("audio",),
                          transcription_model=transcription_model, extra_body=_FRAME_EXTRA,
                          fixed_response_options=fixed_response_options,
                          turn_detection=turn_detection)


def default_session(session_id: str, profile: SessionProfile = LOOPBACK) -> JsonObject:
    """The effective GA session object of a new session on ``profile``'s backend.

    Both formats are GA's ``audio/pcm`` 24 kHz. ``turn_detection`` is the backend's own where
    it detects turns itself, else :attr:`SessionProfile.default_turn_detection` (GA's
    ``server_vad`` where the worker detects turns), so a client that streams audio without a
    ``session.update`` is answered as OpenAI would answer it. The extension knobs live under
    ``extra_body``; the SDK session types allow extra keys, so it is echoed.
    """
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": profile.model,
        "output_modalities": ["audio"],
        "instructions": "",
        "tools": [],
        "tool_choice": "auto",
        "max_output_tokens": "inf",
        "tracing": None,
        "truncation": "auto",
        "prompt": None,
        "include": None,
        "audio": {
            "input": {
                "format": dict(PCM_FORMAT),
                "transcription": None,
                "noise_reduction": None,
                "turn_detection": profile.initial_turn_detection(),
            },
            "output": {"format": dict(PCM_FORMAT), "voice": profile.voices[0], "speed": 1.0},
        },
        "extra_body": profile.extra_defaults(),
    }


# --------------------------------------------------------------------------- value checks

_Check = Callable[[Any], bool]
_BUILTIN_TOOL_CHOICES: Final = ("auto", "none", "required")
_EFFORTS: Final = ("minimal", "low", "medium", "high", "xhigh")
_DELAYS: Final = ("minimal", "low", "medium", "high", "xhigh")


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_optional_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(map(_is_str, value))


def _has_only(value: Any, checks: Mapping[str, _Check]) -> bool:
    """An object whose every key is in ``checks`` and passes its check."""
    return isinstance(value, dict) and all(
        key in checks and checks[key](item) for key, item in value.items())


def _is_tool(value: Any) -> bool:
    return (isinstance(value, dict) and value.get("type") == "function"
            and _is_str(value.get("name")))


def _is_tools(value: Any) -> bool:
    return isinstance(value, list) and all(map(_is_tool, value))


def _is_tool_choice(value: Any) -> bool:
    return value in _BUILTIN_TOOL_CHOICES or _is_tool(value)


def _is_max_tokens(value: Any) -> bool:
    return value == "inf" or _is_int(value, 1, 4096)


def _is_modalities(value: Any) -> bool:
    # GA: audio (with its transcript) or text, never both at once.
    return value in (["audio"], ["text"])


_TRANSCRIPTION_KEYS: Final[Mapping[str, _Check]] = {
    "model": _is_optional_str, "language": _is_optional_str, "prompt": _is_optional_str,
    "delay": lambda v: v is None or v in _DELAYS,
    "keywords": lambda v: v is None or _is_str_list(v),
    "languages": lambda v: v is None or _is_str_list(v),
}
_NOISE_REDUCTION_KEYS: Final[Mapping[str, _Check]] = {
    "type": lambda v: v in (None, "near_field", "far_field"),
    "strength": lambda v: v is None or _is_number(v, 0, float("inf")),
}
_TRACING_KEYS: Final[Mapping[str, _Check]] = {
    "workflow_name": _is_optional_str, "group_id": _is_optional_str,
    "metadata": lambda v: True,  # arbitrary metadata, echoed
}
_PROMPT_KEYS: Final[Mapping[str, _Check]] = {
    "id": _is_str, "version": _is_optional_str,
    "variables": lambda v: v is None or isinstance(v, dict),
}
_RETENTION_KEYS: Final[Mapping[str, _Check]] = {
    "type": lambda v: v == "retention_ratio",
    "retention_ratio": lambda v: _is_number(v, 0, 1),
    "token_limits": lambda v: v is None or _has_only(
        v, {"post_instructions": lambda n: n is None or _is_int(n, 0, 2**31)}),
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


def _is_prompt(value: Any) -> bool:
    return value is None or (_has_only(value, _PROMPT_KEYS) and "id" in value)


def _is_include(value: Any) -> bool:
    return value is None or (isinstance(value, list) and all(
        item == "item.input_audio_transcription.logprobs" for item in value))


def _is_reasoning(value: Any) -> bool:
    return value is None or _has_only(value, {"effort": lambda v: v is None or v in _EFFORTS})


def _is_voice(value: Any) -> bool:
    return (_is_str(value) and value != "") or (
        isinstance(value, dict) and set(value) == {"id"} and _is_str(value["id"])
    )


# --------------------------------------------------------------------------- session.update

# Leaf path -> (check, error code). Every key a patch may carry is here, in _CONTAINERS or
# one of the special paths below; anything else is `unknown_parameter`.
_LEAVES: Final[Mapping[tuple[str, ...], tuple[_Check, str]]] = {
    ("type",): (lambda v: v == "realtime", "invalid_value"),
    ("id",): (_is_str, "invalid_value"),
    ("object",): (_is_str, "invalid_value"),
    ("expires_at",): (lambda v: v is None or _is_int(v, 0, 2**53), "invalid_value"),
    ("model",): (_is_optional_str, "invalid_value"),
    ("output_modalities",): (_is_modalities, "invalid_value"),
    ("instructions",): (_is_optional_str, "invalid_value"),
    ("tools",): (_is_tools, "invalid_value"),
    ("tool_choice",): (_is_tool_choice, "invalid_value"),
    ("max_output_tokens",): (_is_max_tokens, "invalid_value"),
    ("tracing",): (_is_tracing, "invalid_value"),
    ("truncation",): (_is_truncation, "invalid_value"),
    ("prompt",): (_is_prompt, "invalid_value"),
    ("include",): (_is_include, "invalid_value"),
    ("parallel_tool_calls",): (lambda v: v is None or _is_bool(v), "invalid_value"),
    ("reasoning",): (_is_reasoning, "invalid_value"),
    ("audio", "input", "transcription"): (_is_transcription, "invalid_value"),
    ("audio", "input", "noise_reduction"): (_is_noise_reduction, "invalid_value"),
    ("audio", "output", "voice"): (_is_voice, "invalid_value"),
    ("audio", "output", "speed"): (lambda v: _is_number(v, 0.25, 1.5), "invalid_value"),
}
_CONTAINERS: Final = frozenset({(), ("audio",), ("audio", "input"), ("audio", "output")})
_EXTRA: Final = ("extra_body",)
# Checked by the VAD's own rules, and stored with its defaults filled in (GA's effective shape).
_TURN_DETECTION: Final = ("audio", "input", "turn_detection")
_FORMATS: Final = frozenset({("audio", "input", "format"), ("audio", "output", "format")})
_VOICE: Final = ("audio", "output", "voice")
_TRANSCRIPTION: Final = ("audio", "input", "transcription")
# Fields of the session object that clients echo back (LiveKit sends `model` in every update,
# pipecat may send what session.updated said): accepted, never applied. `model` is refused
# when it names another model (see _model_refusal).
_READ_ONLY: Final = frozenset({"id", "object", "model", "expires_at"})

# Beta's flat session keys, each with the GA path it is mapped onto.
_BETA_PATHS: Final[Mapping[str, tuple[str, ...]]] = {
    "modalities": ("output_modalities",),
    "voice": _VOICE,
    "input_audio_format": ("audio", "input", "format"),
    "output_audio_format": ("audio", "output", "format"),
    "turn_detection": _TURN_DETECTION,
    "input_audio_transcription": _TRANSCRIPTION,
    "input_audio_noise_reduction": ("audio", "input", "noise_reduction"),
    "speed": ("audio", "output", "speed"),
    "max_response_output_tokens": ("max_output_tokens",),
}
# Beta's format names and their GA objects.
_BETA_FORMATS: Final[Mapping[str, Mapping[str, Any]]] = {
    "pcm16": PCM_FORMAT, "g711_ulaw": {"type": "audio/pcmu"}, "g711_alaw": {"type": "audio/pcma"},
}


def _param(path: tuple[str, ...], root: str = "session") -> str:
    return ".".join((root, *path))


def _ga_modalities(value: Any) -> list[str] | None:
    """GA's ``output_modalities`` for beta's ``modalities`` (None: not a modality list).

    Beta's default ``["text", "audio"]`` is an audio answer with its transcript, which is
    GA's ``["audio"]``.
    """
    if not (isinstance(value, list) and value and set(value) <= {"text", "audio"}
            and all(map(_is_str, value))):
        return None
    return ["audio"] if "audio" in value else ["text"]


def _beta_value(key: str, value: Any, root: str) -> Any:
    """The GA value of beta ``key`` (a refusal naming the beta key when it has none)."""
    param = f"{root}.{key}"
    if key == "modalities":
        modalities = _ga_modalities(value)
        if modalities is None:
            return Refusal(code="invalid_value", param=param,
                           message=f"unsupported value {describe(value)}: a list of 'audio' "
                                   "and 'text'")
        return modalities
    if key.endswith("_audio_format"):
        if not (isinstance(value, str) and value in _BETA_FORMATS):
            return Refusal(code="unsupported_audio_format", param=param,
                           message=f"unsupported format {describe(value)}: use one of "
                                   f"{', '.join(_BETA_FORMATS)}")
        return dict(_BETA_FORMATS[value])
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


def _to_ga(patch: JsonObject, beta_paths: Mapping[str, tuple[str, ...]],
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
            renamed[_param(path, root)] = f"{root}.{key}"
    return ga, renamed


def _renamed(refusal: Refusal | None, renamed: Mapping[str, str]) -> Refusal | None:
    """``refusal`` with its param named as the client sent it (a beta key, say)."""
    if refusal is None or refusal.param is None:
        return refusal
    for ga, sent in renamed.items():
        if refusal.param == ga or refusal.param.startswith((f"{ga}.", f"{ga}[")):
            return Refusal(code=refusal.code, message=refusal.message,
                           param=sent + refusal.param[len(ga):])
    return refusal


def _check_level(patch: Any, path: tuple[str, ...], profile: SessionProfile) -> Refusal | None:
    if not isinstance(patch, dict):
        return Refusal(code="invalid_type", message="expected an object", param=_param(path))
    for key, value in patch.items():
        refusal = _check_entry((*path, key), value, profile)
        if refusal is not None:
            return refusal
    return None


def _check_entry(sub: tuple[str, ...], value: Any, profile: SessionProfile) -> Refusal | None:
    if sub in _CONTAINERS:
        return _check_level(value, sub, profile)
    if sub == _EXTRA:
        return _extra_refusal(value, profile)
    if sub == _TURN_DETECTION:
        return _turn_detection_refusal(value)
    if sub in _FORMATS:
        return _format_refusal(value, _param(sub), profile)
    if sub in _LEAVES:
        check, code = _LEAVES[sub]
        if check(value):
            return None
        return Refusal(code=code, message=f"unsupported value {describe(value)}",
                       param=_param(sub))
    return Refusal(code="unknown_parameter", message=f"unknown parameter {describe(sub[-1])}",
                   param=_param(sub))


def _extra_refusal(extra: Any, profile: SessionProfile) -> Refusal | None:
    """Why ``extra_body`` cannot be ``extra`` on ``profile``'s backend (None: it can)."""
    if not isinstance(extra, dict):
        return Refusal(code="invalid_type", message="expected an object",
                       param=_param(_EXTRA))
    for key, value in extra.items():
        param = _param((*_EXTRA, key))
        knob = profile.extra_body.get(key)
        if knob is None:
            return Refusal(code="unknown_parameter", param=param,
                           message=f"unknown parameter {describe(key)}")
        if not knob.accepts(value):
            return Refusal(code="invalid_value", param=param,
                           message=f"unsupported value {describe(value)}: must be "
                                   f"{knob.expected}")
    return None


def _format_refusal(value: Any, param: str, profile: SessionProfile) -> Refusal | None:
    """Why an audio format cannot be ``value`` on ``profile``'s backend (None: it can)."""
    parsed = parse_format(value, param)
    if isinstance(parsed, Refusal):
        return parsed
    if parsed in profile.audio_formats:
        return None
    takes = ", ".join(sorted(fmt.value for fmt in profile.audio_formats))
    return Refusal(code="unsupported_audio_format", param=param,
                   message=f"this model takes {takes} only, not {parsed.value}")


def _turn_detection_refusal(value: Any) -> Refusal | None:
    """Why ``audio.input.turn_detection`` cannot be ``value`` (None: it can).

    ``idle_timeout_ms`` is taken from :data:`IDLE_TIMEOUT_MS_RANGE` (``server_vad`` only: the
    detector refuses it on ``semantic_vad``, as OpenAI does).
    """
    if value is None:
        return None
    base = _param(_TURN_DETECTION)
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
        return Refusal(code="invalid_value", param=f"{base}.idle_timeout_ms",
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
    return Refusal(code="model_update_unsupported", param="session.model",
                   message=f"this session is served by model {describe(serving)} and cannot "
                           f"change to {describe(model)}: send {describe(serving)} or leave "
                           "model out")


def _modality_refusal(patch: JsonObject, profile: SessionProfile, root: str) -> Refusal | None:
    modalities = patch.get("output_modalities")
    if modalities is None or modalities[0] in profile.output_modalities:
        return None
    allowed = [[kind] for kind in profile.output_modalities]
    return Refusal(code="invalid_value", param=f"{root}.output_modalities",
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
        return Refusal(code="invalid_type", message="expected an object", param="session")
    mapped = _to_ga(patch, _BETA_PATHS, "session")
    if isinstance(mapped, Refusal):
        return mapped
    ga, renamed = mapped
    refusal = (_check_level(ga, (), profile) or _model_refusal(ga, current, profile)
               or _modality_refusal(ga, profile, "session"))
    if refusal is None and profile.coherence is not None:
        refusal = profile.coherence(_merged(ga, current, profile))
    return _renamed(refusal, renamed)


def too_deep(value: Any, param: str) -> Refusal | None:
    """The ``invalid_value`` refusal of a client value nested deeper than the worker takes."""
    if not nests_deeper_than(value, MAX_SESSION_DEPTH):
        return None
    return Refusal(code="invalid_value", param=param,
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
    mapped = _to_ga(patch, _BETA_PATHS, "session")
    if isinstance(mapped, Refusal):
        raise ValueError(f"a refused patch cannot apply: {mapped.message}")
    return _merged(mapped[0], current, profile)


def _merged(ga: JsonObject, current: JsonObject, profile: SessionProfile) -> JsonObject:
    merged = copy.deepcopy(current)
    _merge_into(merged, ga, (), profile)
    return merged


def _merge_into(target: JsonObject, patch: JsonObject, path: tuple[str, ...],
                profile: SessionProfile) -> None:
    for key, value in patch.items():
        sub = (*path, key)
        if sub in _CONTAINERS or sub == _EXTRA:
            inner = target.setdefault(key, {})
            _merge_into(inner, value, sub, profile)
        elif path or key not in _READ_ONLY:
            target[key] = _effective(sub, value, profile)
        elif key == "model" and isinstance(value, str):
            target[key] = value  # the session's name (see _model_refusal)


def _effective(sub: tuple[str, ...], value: Any, profile: SessionProfile) -> Any:
    """The effective value of an accepted leaf ``value`` at ``sub``."""
    if sub == _TURN_DETECTION:
        if profile.turn_detection is not None:  # the backend's own, whatever was asked
            return copy.deepcopy(dict(profile.turn_detection))
        return effective_turn_detection(value)
    if sub == _VOICE:
        return profile.voice_for(value)
    if sub == _TRANSCRIPTION:
        return profile.transcription_for(value)
    if sub in _FORMATS:
        parsed = parse_format(value, _param(sub))
        assert isinstance(parsed, AudioFormat), "only an accepted format is applied"
        return parsed.as_object()
    if sub == ("instructions",) and value is None:
        return ""  # GA's "no instructions"
    return copy.deepcopy(value)


# --------------------------------------------------------------------------- response.create

# OpenAI's metadata bounds: at most 16 pairs, keys up to 64 characters, values up to 512.
_METADATA_PAIRS: Final = 16
_METADATA_KEY_CHARS: Final = 64
_METADATA_VALUE_CHARS: Final = 512
# Beta's flat response keys, each with the GA path it is mapped onto.
_RESPONSE_BETA_PATHS: Final[Mapping[str, tuple[str, ...]]] = {
    "modalities": ("output_modalities",),
    "voice": ("audio", "output", "voice"),
    "output_audio_format": ("audio", "output", "format"),
    "max_response_output_tokens": ("max_output_tokens",),
}
# GA response option -> its check (the refusal is `invalid_value`). `audio`, `input` and
# `metadata` have checks of their own.
_RESPONSE_LEAVES: Final[Mapping[str, _Check]] = {
    "output_modalities": lambda v: v is None or _is_modalities(v),
    "instructions": _is_optional_str,
    "conversation": lambda v: v in (None, "auto", "none"),
    "max_output_tokens": lambda v: v is None or _is_max_tokens(v),
    "tools": lambda v: v is None or _is_tools(v),
    "tool_choice": lambda v: v is None or _is_tool_choice(v),
    "prompt": _is_prompt,
    "reasoning": _is_reasoning,
    "parallel_tool_calls": lambda v: v is None or _is_bool(v),
}
_RESPONSE_AUDIO_KEYS: Final = frozenset({"format", "voice"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseOptions:
    """What one ``response.create`` asked for, every option honoured: the request's value,
    else the session's.

    Attributes:
        output_modalities: ``("audio",)`` (audio and its transcript) or ``("text",)``.
        voice: the voice the response really speaks with.
        output_format: the response's audio format (a GA format object).
        instructions: the instructions of this response.
        conversation: ``"auto"`` (the response joins the default conversation) or ``"none"``
            (out of band: it adds nothing to the conversation).
        input: the items the response answers instead of the conversation (None: the
            conversation), checked only for shape (objects with a ``type``): the conversation
            core parses them as it parses ``conversation.item.create``.
        metadata: echoed in ``response.created`` / ``.done`` (LiveKit waits for it).
        max_output_tokens, tools, tool_choice, prompt, reasoning, parallel_tool_calls: as the
            session's fields of those names, for this response.
    """

    output_modalities: tuple[str, ...]
    voice: Any
    output_format: JsonObject
    instructions: str
    conversation: str
    input: tuple[JsonObject, ...] | None
    metadata: Mapping[str, str] | None
    max_output_tokens: int | str
    tools: tuple[JsonObject, ...]
    tool_choice: Any
    prompt: JsonObject | None
    reasoning: JsonObject | None
    parallel_tool_calls: bool | None

    @property
    def audio(self) -> bool:
        """Whether the response is audio (with its transcript) rather than text."""
        return self.output_modalities == ("audio",)

    @property
    def out_of_band(self) -> bool:
        """Whether the response stays out of the conversation (``conversation: "none"``)."""
        return self.conversation == "none"


def parse_response_options(request: JsonObject | None, config: JsonObject,
                           profile: SessionProfile = LOOPBACK) -> ResponseOptions | Refusal:
    """Read a ``response.create``'s ``response`` object: every option is honoured or refused.

    Both GA and beta spellings are read (``modalities``, ``voice``, ``output_audio_format``,
    ``max_response_output_tokens``); a ``null`` option is one left out (LiveKit sends
    ``"instructions": null``). An option ``profile`` cannot set per response
    (:attr:`SessionProfile.fixed_response_options`) may still be sent with the session's own
    value.

    Args:
        request: the ``response`` object of ``response.create``, if any.
        config: the effective session object, which supplies the defaults.
        profile: what the session's backend can do.

    Returns:
        The options, or the refusal of the first option that is malformed (``invalid_type``,
        ``invalid_value``), unknown (``unknown_parameter``), in a format the backend cannot
        take (``unsupported_audio_format``), or one the backend cannot set per response
        (``unsupported_native_response_options``).
    """
    if request is None:
        request = {}
    elif not isinstance(request, dict):
        return Refusal(code="invalid_type", param="response", message="expected an object")
    refusal = too_deep(request, "response")
    if refusal is not None:
        return refusal
    mapped = _to_ga(request, _RESPONSE_BETA_PATHS, "response")
    if isinstance(mapped, Refusal):
        return mapped
    given, renamed = mapped
    refusal = _renamed(_response_refusal(given, config, profile), renamed)
    if refusal is not None:
        return refusal
    return _response_options(given, config, profile)


def _response_refusal(given: JsonObject, config: JsonObject,
                      profile: SessionProfile) -> Refusal | None:
    for key, value in given.items():
        refusal = _response_option_refusal(key, value, profile)
        if refusal is not None:
            return refusal
    return (_modality_refusal(given, profile, "response")
            or _fixed_option_refusal(given, config, profile))


def _response_option_refusal(key: str, value: Any, profile: SessionProfile) -> Refusal | None:
    param = f"response.{key}"
    if key == "audio":
        return _response_audio_refusal(value, profile)
    if key == "metadata":
        return _metadata_refusal(value)
    if key == "input":
        return _input_refusal(value)
    check = _RESPONSE_LEAVES.get(key)
    if check is None:
        return Refusal(code="unknown_parameter", param=param,
                       message=f"unknown parameter {describe(key)}")
    if check(value):
        return None
    return Refusal(code="invalid_value", param=param,
                   message=f"unsupported value {describe(value)}")


def _response_audio_refusal(value: Any, profile: SessionProfile) -> Refusal | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        return Refusal(code="invalid_type", param="response.audio", message="expected an object")
    for key in value:
        if key != "output":
            return Refusal(code="unknown_parameter", param=f"response.audio.{key}",
                           message=f"unknown parameter {describe(key)}")
    output = value.get("output")
    if output is None:
        return None
    if not isinstance(output, dict):
        return Refusal(code="invalid_type", param="response.audio.output",
                       message="expected an object")
    return _response_output_refusal(output, profile)


def _response_output_refusal(output: JsonObject, profile: SessionProfile) -> Refusal | None:
    for key, value in output.items():
        param = f"response.audio.output.{key}"
        if key not in _RESPONSE_AUDIO_KEYS:
            return Refusal(code="unknown_parameter", param=param,
                           message=f"unknown parameter {describe(key)}")
        if value is None:
            continue
        if key == "format":
            refusal = _format_refusal(value, param, profile)
            if refusal is not None:
                return refusal
        elif not _is_voice(value):
            return Refusal(code="invalid_value", param=param,
                           message=f"unsupported value {describe(value)}")
    return None


def _metadata_refusal(metadata: Any) -> Refusal | None:
    # Echoed in response.created/.done (LiveKit waits for it), so it must be a string map.
    if metadata is None or (
        isinstance(metadata, dict) and len(metadata) <= _METADATA_PAIRS
        and all(isinstance(k, str) and len(k) <= _METADATA_KEY_CHARS
                and isinstance(v, str) and len(v) <= _METADATA_VALUE_CHARS
                for k, v in metadata.items())
    ):
        return None
    return Refusal(code="invalid_value", param="response.metadata",
                   message=f"metadata must map strings to strings: at most {_METADATA_PAIRS} "
                           f"pairs, keys of at most {_METADATA_KEY_CHARS} characters, values "
                           f"of at most {_METADATA_VALUE_CHARS}")


def _input_refusal(items: Any) -> Refusal | None:
    if items is None:
        return None
    if not isinstance(items, list):
        return Refusal(code="invalid_type", param="response.input", message="expected an array")
    for index, item in enumerate(items):
        if not (isinstance(item, dict) and _is_str(item.get("type"))):
            return Refusal(code="invalid_value", param=f"response.input[{index}]",
                           message="each input item is an object with a string type")
    return None


def _session_value(name: str, config: JsonObject) -> Any:
    """What a response gets for option ``name`` when it leaves it out: the session's value."""
    if name == "conversation":
        return "auto"
    return config.get(name)


def _fixed_option_refusal(given: JsonObject, config: JsonObject,
                          profile: SessionProfile) -> Refusal | None:
    for name in sorted(profile.fixed_response_options & given.keys()):
        value = given[name]
        if value is None or (name != "input" and value == _session_value(name, config)):
            continue
        return Refusal(code="unsupported_native_response_options", param=f"response.{name}",
                       message=f"model {describe(profile.model)} answers from what it hears "
                               f"and cannot set {name} per response: leave it out")
    return None


def _response_options(given: JsonObject, config: JsonObject,
                      profile: SessionProfile) -> ResponseOptions:
    """The options of an accepted request ``given`` (GA spelling): the request's, else the
    session's."""
    def option(name: str) -> Any:
        value = given.get(name)
        return copy.deepcopy(value if value is not None else _session_value(name, config))

    output = (given.get("audio") or {}).get("output") or {}
    session_output = config["audio"]["output"]
    voice = output.get("voice")
    fmt = output.get("format")
    items = given.get("input")
    return ResponseOptions(
        output_modalities=tuple(option("output_modalities")),
        voice=profile.voice_for(voice) if voice is not None
        else copy.deepcopy(session_output["voice"]),
        output_format=(_effective(("audio", "output", "format"), fmt, profile) if fmt is not None
                       else dict(session_output["format"])),
        instructions=option("instructions") or "",
        conversation=option("conversation"),
        input=tuple(copy.deepcopy(items)) if items is not None else None,
        metadata=dict(given["metadata"]) if given.get("metadata") is not None else None,
        max_output_tokens=option("max_output_tokens"),
        tools=tuple(option("tools") or ()),
        tool_choice=option("tool_choice"),
        prompt=option("prompt"),
        reasoning=option("reasoning"),
        parallel_tool_calls=option("parallel_tool_calls"),
    )
