"""The seed's session settings: what a ``session.update`` may set beyond GA's session object
(vLLM-Omni's ``DuplexSessionConfig``), what each backend declares it can apply
(:class:`ConfigSupport`), the refusals of the seed where it cannot, and the configuration a
frame backend's slot receives (:class:`SlotConfig`).

The keys, each honoured (none is ignored):

* ``ref_audio``: a voice prompt, as a ``data:audio/...;base64,`` URL or bare base64 of at
  most :data:`MAX_REF_AUDIO_CHARS` characters (the worker fetches nothing, so other URLs are
  refused). Decoded once and carried to the backend at open and on update; never echoed in
  the session object (its size would ride every ``session.updated``), as the seed drops it
  once it took it.
* ``temperature`` (:data:`TEMPERATURE_RANGE`): carried to a backend that samples at it
  (:attr:`ConfigSupport.temperature`), refused ``invalid_duplex_runtime_config`` by one that
  does not; shown in the session object.
* ``overlap_policy``: ``listen_only`` (the user's speech never cuts the model's answer) or
  ``barge_in_on_speech`` (it does). It is what the session's turn detection does, so a value
  that contradicts it is refused ``unsupported_turn_detection`` (the seed's rule) and the
  session object shows the value derived from the turn detection once a client set it.
* ``playback_commit_policy``: ``commit_all_on_done`` (a completed answer joins the history
  whole) or ``ack_only`` (only what the client acknowledged playing does, once it
  acknowledged any).
* ``idle_timeout_s`` (:data:`IDLE_TIMEOUT_S_RANGE`): the session's idle TTL; the store reads
  it from the session object the worker stores with ``session.updated``.
* ``session_id``: a session object the seed's client echoes may carry it; ignored, as the
  seed does.
* ``metadata``: kept and echoed (the seed echoes it too), at most 16 string pairs.
* Refused, since no backend here can do what they ask (:data:`UNSUPPORTED_KEYS`):
  ``initial_user_text`` (``text_only_turn_unsupported``: every backend here answers speech),
  ``overlap_short_ack_ms``, ``overlap_barge_in_ms``, ``overlap_silence_rms`` and
  ``use_tts_template`` (``invalid_duplex_runtime_config``: no overlap tuning, no TTS template).

The per-backend refusals, from the backend's :class:`ConfigSupport`:
``instructions_update_unsupported``, ``voice_update_after_audio_unsupported``,
``ref_audio_required``, ``ref_audio_update_unsupported``, and
``invalid_duplex_runtime_config`` for a voice prompt or a temperature a backend cannot use.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import base64
import binascii
import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from contract.messages import JsonObject
from inference_worker.conversation.refusals import Refusal, RefusalCode

__all__ = [
    "APPLIES_ALL",
    "IDLE_TIMEOUT_S_RANGE",
    "MAX_REF_AUDIO_CHARS",
    "NO_SLOT_CONFIG",
    "OVERLAP_POLICIES",
    "PLAYBACK_COMMIT_POLICIES",
    "TEMPERATURE_RANGE",
    "UNSUPPORTED_KEYS",
    "Applies",
    "ConfigSupport",
    "SeedSettings",
    "SlotConfig",
    "VoicePrompt",
    "is_idle_timeout",
    "is_metadata",
    "is_overlap_policy",
    "is_playback_commit_policy",
    "is_ref_audio",
    "is_temperature",
    "parse_ref_audio",
    "response_refusal",
    "slot_config_of",
]

#: The longest ``ref_audio`` taken, in characters of its data URL or base64 text: about
#: 1.5 MB of audio (47 s of pcm16 at 16 kHz), far more than a voice prompt needs, and well
#: inside a client frame.
MAX_REF_AUDIO_CHARS: Final = 2_000_000
#: The idle TTL a session may ask for, in seconds.
IDLE_TIMEOUT_S_RANGE: Final = (10.0, 3600.0)
#: The sampling temperature a session may ask for.
TEMPERATURE_RANGE: Final = (0.0, 2.0)
OVERLAP_POLICIES: Final = ("listen_only", "barge_in_on_speech")
PLAYBACK_COMMIT_POLICIES: Final = ("commit_all_on_done", "ack_only")
_NO_OVERLAP_TUNING: Final = ("this server has no overlap tuning: overlap_policy and the turn "
                              "detection decide")
#: The seed's session keys no backend here applies: each with its refusal.
UNSUPPORTED_KEYS: Final[Mapping[str, Refusal]] = MappingProxyType({
    "initial_user_text": Refusal(
        code=RefusalCode.TEXT_ONLY_TURN_UNSUPPORTED, param="session.initial_user_text",
        message="this model answers speech input only: speak, or send a user message with "
                "conversation.item.create"),
    **{key: Refusal(code=RefusalCode.INVALID_DUPLEX_RUNTIME_CONFIG, param=f"session.{key}",
                    message=_NO_OVERLAP_TUNING)
       for key in ("overlap_short_ack_ms", "overlap_barge_in_ms", "overlap_silence_rms")},
    "use_tts_template": Refusal(
        code=RefusalCode.INVALID_DUPLEX_RUNTIME_CONFIG, param="session.use_tts_template",
        message="no backend here has a TTS template"),
})
_METADATA_PAIRS: Final = 16
_METADATA_CHARS: Final = 512
_DATA_URL: Final = re.compile(r"data:(audio/[A-Za-z0-9.+-]+)(?:;[^,;]*)*;base64,", re.ASCII)
_TURN_DETECTION: Final = ("audio", "input", "turn_detection")


def _is_number(value: Any, low: float, high: float) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and low <= value <= high)


def is_temperature(value: Any) -> bool:
    return value is None or _is_number(value, *TEMPERATURE_RANGE)


def is_idle_timeout(value: Any) -> bool:
    return _is_number(value, *IDLE_TIMEOUT_S_RANGE)


def is_overlap_policy(value: Any) -> bool:
    return value in OVERLAP_POLICIES


def is_playback_commit_policy(value: Any) -> bool:
    return value in PLAYBACK_COMMIT_POLICIES


def is_metadata(value: Any) -> bool:
    return value is None or (
        isinstance(value, dict) and len(value) <= _METADATA_PAIRS
        and all(isinstance(k, str) and len(k) <= _METADATA_CHARS and isinstance(v, str)
                and len(v) <= _METADATA_CHARS for k, v in value.items()))


@dataclass(frozen=True, slots=True)
class VoicePrompt:
    """A decoded ``ref_audio``: its media type (``audio/wav``; ``""`` when sent as bare
    base64) and its bytes."""

    mime: str
    data: bytes


def parse_ref_audio(value: Any) -> VoicePrompt | None:
    """The voice prompt ``value`` sends, or None when it is not one the worker takes."""
    if not isinstance(value, str) or not value or len(value) > MAX_REF_AUDIO_CHARS:
        return None
    mime, text = "", value
    if value.startswith("data:"):
        match = _DATA_URL.match(value)
        if match is None:
            return None
        mime, text = match.group(1).lower(), value[match.end():]
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return VoicePrompt(mime, data) if data else None


def is_ref_audio(value: Any) -> bool:
    return value is None or parse_ref_audio(value) is not None


class Applies(StrEnum):
    """When a backend applies a setting."""

    #: Never: the backend cannot use it (a voice prompt to a model with a voice of its own).
    NEVER = "never"
    #: Only with the session's first ``session.update``, before its first audio.
    AT_OPEN = "at_open"
    #: At open and on every update.
    ALWAYS = "always"


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigSupport:
    """What a backend does with the seed's session settings.

    Attributes:
        instructions: when it applies ``instructions`` (``AT_OPEN``: a later change is
            ``instructions_update_unsupported``).
        voice_after_audio: whether it changes voice once it has spoken (False: a voice
            change after the first audio answer is ``voice_update_after_audio_unsupported``).
        ref_audio: when it takes a voice prompt (``NEVER``: ``invalid_duplex_runtime_config``;
            ``AT_OPEN``: a later one is ``ref_audio_update_unsupported``).
        ref_audio_required: it cannot speak without one: a session whose first
            ``session.update`` answers in audio without ``ref_audio`` is ``ref_audio_required``.
        temperature: it samples at the session's ``temperature`` (False: it does not sample,
            or only at its own temperature, and a ``temperature`` is
            ``invalid_duplex_runtime_config``).
    """

    instructions: Applies = Applies.ALWAYS
    voice_after_audio: bool = True
    ref_audio: Applies = Applies.ALWAYS
    ref_audio_required: bool = False
    temperature: bool = False


#: What a backend that declares nothing does: it applies every setting, always.
APPLIES_ALL: Final = ConfigSupport()


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotConfig:
    """The session configuration a frame backend's slot gets at open and on each update:
    what a backend may use of the session object, typed.

    Attributes:
        instructions: the session's instructions ("" for none).
        voice: the voice the session speaks with (as its session object reports it).
        ref_audio: the voice prompt (None: none was sent).
        temperature: the sampling temperature asked for (None: the backend's own).
        extra_body: the backend's own ``extra_body`` knobs (only keys it declares).
    """

    instructions: str = ""
    voice: str = ""
    ref_audio: VoicePrompt | None = None
    temperature: float | None = None
    extra_body: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


#: The configuration of a slot opened with no session settings (tests, tools).
NO_SLOT_CONFIG: Final = SlotConfig()


def slot_config_of(config: JsonObject, ref_audio: VoicePrompt | None = None) -> SlotConfig:
    """The slot configuration of the effective session object ``config``."""
    voice = config["audio"]["output"]["voice"]
    temperature = config.get("temperature")
    return SlotConfig(
        instructions=config.get("instructions") or "",
        voice=voice if isinstance(voice, str) else str(voice.get("id", "")),
        ref_audio=ref_audio,
        temperature=float(temperature) if temperature is not None else None,
        extra_body=MappingProxyType(copy.deepcopy(config.get("extra_body", {}))),
    )


def _overlap_of(turn_detection: Any) -> str:
    """The overlap policy a turn detection implies (the seed's rule)."""
    if turn_detection is None or not turn_detection.get("interrupt_response", True):
        return "listen_only"
    return "barge_in_on_speech"


def _nested(config: Mapping[str, Any], path: Sequence[str]) -> Any:
    value: Any = config
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


class SeedSettings:
    """One session's seed settings: the per-backend refusals of a ``session.update``, and
    what an accepted one gives the backend."""

    __slots__ = ("_opened", "_ref_audio", "_spoke", "_support")

    def __init__(self, support: ConfigSupport) -> None:
        self._support = support
        self._opened = False  # a session.update was applied: the session has its opening config
        self._spoke = False  # the model answered in audio
        self._ref_audio: VoicePrompt | None = None

    @property
    def ref_audio(self) -> VoicePrompt | None:
        """The voice prompt in effect (None: none was sent)."""
        return self._ref_audio

    @property
    def opened(self) -> bool:
        """Whether a ``session.update`` was applied (the session has its opening config)."""
        return self._opened

    @property
    def spoke(self) -> bool:
        """Whether the model was seen to answer in audio (checked on each update)."""
        return self._spoke

    def restore(self, *, opened: bool, spoke: bool, ref_audio: VoicePrompt | None,
                config: JsonObject) -> SlotConfig:
        """Continue a checkpointed session; the slot configuration of its session object
        ``config`` (what the backend's new slot must be given)."""
        self._opened, self._spoke, self._ref_audio = opened, spoke, ref_audio
        return slot_config_of(config, ref_audio)

    def refusal(self, patch: JsonObject, current: JsonObject, merged: JsonObject, *,
                heard: bool, history: Sequence[Any]) -> Refusal | None:
        """Why the backend cannot apply ``patch`` (already accepted by the session's rules,
        ``merged`` the session object it makes), or None.

        Args:
            patch: the ``session`` object of the update, as sent.
            current: the effective session object before it.
            merged: the effective session object after it.
            heard: whether the session heard input audio already.
            history: the conversation's items (an assistant audio item: the model spoke).
        """
        self._spoke = self._spoke or any(
            getattr(item, "role", None) == "assistant" and getattr(item, "audio_bytes", 0)
            for item in history)
        opening = not self._opened and not heard
        return (_unsupported_refusal(patch)
                or self._temperature_refusal(patch, merged)
                or self._ref_audio_refusal(patch, merged, opening)
                or self._instructions_refusal(current, merged, opening)
                or self._voice_refusal(current, merged)
                or _overlap_refusal(patch.get("overlap_policy"), merged))

    def applied(self, patch: JsonObject, config: JsonObject) -> SlotConfig:
        """An accepted ``patch`` was applied, making ``config`` (updated in place with the
        derived ``overlap_policy``); the backend's new slot configuration."""
        self._opened = True
        if patch.get("ref_audio") is not None:
            self._ref_audio = parse_ref_audio(patch["ref_audio"])
        if "overlap_policy" in config:
            config["overlap_policy"] = _overlap_of(_nested(config, _TURN_DETECTION))
        return slot_config_of(config, self._ref_audio)

    def _temperature_refusal(self, patch: JsonObject, merged: JsonObject) -> Refusal | None:
        if patch.get("temperature") is None or self._support.temperature:
            return None
        return Refusal(code=RefusalCode.INVALID_DUPLEX_RUNTIME_CONFIG, param="session.temperature",
                       message=f"model {merged.get('model')!r} does not sample at a session's "
                               "temperature: leave temperature out")

    def _ref_audio_refusal(self, patch: JsonObject, merged: JsonObject,
                           opening: bool) -> Refusal | None:
        support, sent = self._support, patch.get("ref_audio")
        if sent is not None and support.ref_audio is Applies.NEVER:
            return Refusal(code=RefusalCode.INVALID_DUPLEX_RUNTIME_CONFIG,
                           param="session.ref_audio",
                           message=f"model {merged.get('model')!r} speaks with its own voice "
                                   "and takes no voice prompt: leave ref_audio out")
        if sent is not None and not opening and support.ref_audio is Applies.AT_OPEN:
            return Refusal(code=RefusalCode.REF_AUDIO_UPDATE_UNSUPPORTED,
                           param="session.ref_audio",
                           message="session.update cannot change ref_audio after the session "
                                   "is open")
        if (opening and support.ref_audio_required and sent is None
                and self._ref_audio is None and "audio" in merged["output_modalities"]):
            return Refusal(code=RefusalCode.REF_AUDIO_REQUIRED, param="session.ref_audio",
                           message=f"model {merged.get('model')!r} needs a voice prompt to "
                                   "answer in audio: send ref_audio")
        return None

    def _instructions_refusal(self, current: JsonObject, merged: JsonObject,
                              opening: bool) -> Refusal | None:
        if (opening or self._support.instructions is not Applies.AT_OPEN
                or merged.get("instructions") == current.get("instructions")):
            return None
        return Refusal(code=RefusalCode.INSTRUCTIONS_UPDATE_UNSUPPORTED,
                       param="session.instructions",
                       message="instructions cannot be changed after the session is created")

    def _voice_refusal(self, current: JsonObject, merged: JsonObject) -> Refusal | None:
        voice = ("audio", "output", "voice")
        if (self._support.voice_after_audio or not self._spoke
                or _nested(merged, voice) == _nested(current, voice)):
            return None
        return Refusal(code=RefusalCode.VOICE_UPDATE_AFTER_AUDIO_UNSUPPORTED,
                       param="session.audio.output.voice",
                       message="session.update cannot change voice after audio output has "
                               "started")


def _unsupported_refusal(patch: JsonObject) -> Refusal | None:
    for key in sorted(UNSUPPORTED_KEYS.keys() & patch.keys()):
        if patch[key] is not None:
            return UNSUPPORTED_KEYS[key]
    return None


def _overlap_refusal(asked: Any, merged: JsonObject) -> Refusal | None:
    """An ``overlap_policy`` the update asks for that its turn detection contradicts (one
    it leaves out follows the turn detection)."""
    if asked is None:
        return None
    implied = _overlap_of(_nested(merged, _TURN_DETECTION))
    if asked == implied:
        return None
    how = ("send turn_detection null, or interrupt_response false"
           if asked == "listen_only" else "it needs turn detection that interrupts "
           "(server_vad with interrupt_response true)")
    return Refusal(code=RefusalCode.UNSUPPORTED_TURN_DETECTION, param="session.overlap_policy",
                   message=f"overlap_policy {asked!r} conflicts with the session's turn "
                           f"detection, which implies {implied!r}: {how}")


def response_refusal(given: JsonObject, config: JsonObject, support: ConfigSupport,
                     knobs: Sequence[str], *, native: bool) -> Refusal | None:
    """Why a ``response.create`` cannot have the seed's per-response options it asks for:
    ``temperature``, ``audio.output.speed`` (beta ``speed``) and ``extra_body``, or None.

    A value equal to the session's changes nothing and is taken. Otherwise: a temperature is
    ``unsupported_native_response_options`` on a model-native backend (``native``, the
    seed's rule) and ``invalid_duplex_runtime_config`` on one that does not sample at it; a
    speaking rate (a hint of the session's, which no backend changes per response) and an
    ``extra_body`` knob (the backend's knobs are the session's) are
    ``invalid_duplex_runtime_config``.

    Args:
        given: the request, GA spelling.
        config: the effective session object.
        support: what the backend does with the seed's settings.
        knobs: the ``extra_body`` keys the backend declares.
        native: the backend answers from what it hears (the seed's model-native duplex).
    """
    temperature = given.get("temperature")
    if temperature is not None and temperature != config.get("temperature"):
        if not is_temperature(temperature):
            return Refusal(code=RefusalCode.INVALID_VALUE, param="response.temperature",
                           message=f"temperature must be from {TEMPERATURE_RANGE[0]} to "
                                   f"{TEMPERATURE_RANGE[1]}")
        if native:
            return Refusal(code=RefusalCode.UNSUPPORTED_NATIVE_RESPONSE_OPTIONS,
                           param="response.temperature",
                           message="this model answers from what it hears and cannot set "
                                   "temperature per response: leave it out")
        if not support.temperature:
            return Refusal(code=RefusalCode.INVALID_DUPLEX_RUNTIME_CONFIG,
                           param="response.temperature",
                           message="this model does not sample at a temperature: leave it out")
    speed = _nested(given, ("audio", "output", "speed"))
    if speed is not None and speed != _nested(config, ("audio", "output", "speed")):
        return Refusal(code=RefusalCode.INVALID_DUPLEX_RUNTIME_CONFIG,
                       param="response.audio.output.speed",
                       message="the speaking rate is the session's (audio.output.speed): "
                               "leave it out of response.create")
    return _response_extra_refusal(given.get("extra_body"), config, knobs)


def _response_extra_refusal(extra: Any, config: JsonObject,
                            knobs: Sequence[str]) -> Refusal | None:
    if extra is None:
        return None
    if not isinstance(extra, dict):
        return Refusal(code=RefusalCode.INVALID_TYPE, param="response.extra_body",
                       message="expected an object")
    session = config.get("extra_body", {})
    for key, value in extra.items():
        param = f"response.extra_body.{key}"
        if key not in knobs:
            return Refusal(code=RefusalCode.INVALID_DUPLEX_RUNTIME_CONFIG, param=param,
                           message=f"this model takes no extra_body key {key!r}")
        if value != session.get(key):
            return Refusal(code=RefusalCode.INVALID_DUPLEX_RUNTIME_CONFIG, param=param,
                           message=f"extra_body {key!r} is set per session "
                                   "(session.update), not per response")
    return None
