"""What each backend's sessions can be (:class:`SessionProfile`: :data:`LOOPBACK`, and
:func:`frame_profile` for the frame backends), the session's audio constants, and the session
object a new session starts from (:func:`default_session`).

A new session starts as OpenAI's GA sessions do where the worker detects turns (the loopback):
``server_vad`` with its defaults, ``audio/pcm`` 24 kHz both ways, voice ``marin``; where the
backend takes turns itself, with what it applies (the cascade's own ``server_vad``; ``null`` on
moshi and the fake, whose model decides when to speak).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from contract.messages import JsonObject
from inference_worker.audio_formats import Encoding
from inference_worker.conversation.refusals import Refusal, RefusalCode
from inference_worker.conversation.seed_settings import APPLIES_ALL, ConfigSupport
from inference_worker.conversation.session_schema import is_bool, is_int

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
    "SessionProfile",
    "default_session",
    "frame_profile",
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
    """One ``session.extra_body`` knob of a backend: its default and the values it takes.

    A knob whose default is None is not in a new session's ``extra_body`` (the seed's knobs:
    a session shows them once its client set them)."""

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
        audio_formats: the encodings its sessions take, in each direction, at any rate (every
            one by default: the conversation core converts at its edge, so the model only ever
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
        sees_video: its model takes the camera frames that ride an append (``video_frames``),
            each with the audio of its append; otherwise the first frame is refused.
        config: what it does with the seed's session settings (instructions, voice, a voice
            prompt), and so which of the seed's refusals its sessions get.
    """

    model: str
    voices: tuple[str, ...]
    output_modalities: tuple[str, ...] = ("audio", "text")
    transcription_model: str | None = None
    extra_body: Mapping[str, ExtraSetting] = field(
        default_factory=lambda: MappingProxyType({}))
    audio_formats: frozenset[Encoding] = frozenset(Encoding)
    turn_detection: Mapping[str, Any] | None = None
    default_turn_detection: Mapping[str, Any] | None = None
    fixed_response_options: frozenset[str] = frozenset()
    coherence: Callable[[JsonObject], Refusal | None] | None = None
    sees_video: bool = False
    config: ConfigSupport = APPLIES_ALL

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
        return {name: copy.deepcopy(knob.default) for name, knob in self.extra_body.items()
                if knob.default is not None}


def _loopback_coherence(merged: JsonObject) -> Refusal | None:
    """Stream mode echoes every chunk at once, inside one open response: the response must be
    audio, and there is no turn for a detector to end."""
    if merged["extra_body"].get("loopback_mode") != "stream":
        return None
    if merged["output_modalities"] != ["audio"]:
        return Refusal(code=RefusalCode.INVALID_VALUE, param="session.extra_body.loopback_mode",
                       message="loopback stream mode needs output_modalities ['audio']")
    if merged["audio"]["input"]["turn_detection"] is not None:
        return Refusal(code=RefusalCode.INVALID_VALUE, param="session.audio.input.turn_detection",
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
        "auto_response": ExtraSetting(default=False, accepts=is_bool, expected="a boolean"),
        # The seed's MiniCPM-o knob: the first N committed turns get no automatic answer.
        "force_listen_count": ExtraSetting(default=None, accepts=lambda v: is_int(v, 0, 1_000_000),
                                           expected="an integer from 0 to 1000000"),
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
        default=800, accepts=lambda v: is_int(v, *_SILENCE_MS),
        expected=f"an integer from {_SILENCE_MS[0]} to {_SILENCE_MS[1]}"),
    # The seed's auto_response: a model-native backend answers when it decides, without a
    # response.create, so true is what it does and false is beyond it.
    "auto_response": ExtraSetting(
        default=None, accepts=lambda v: v is True,
        expected="true: this model answers when it decides, without response.create"),
})


def frame_profile(model: str, *, voices: tuple[str, ...] | None = None,
                  transcription_model: str | None = None,
                  fixed_response_options: frozenset[str] = NATIVE_RESPONSE_OPTIONS,
                  turn_detection: Mapping[str, Any] | None = None,
                  sees_video: bool = False, config: ConfigSupport = APPLIES_ALL,
                  ) -> SessionProfile:
    """The profile of a frame backend named ``model`` (moshi, fake, cascade).

    Its responses are audio only; ``extra_body`` takes ``end_of_turn_silence_ms`` (80..10000,
    default 800: the sustained silence that ends the model's turn) and ``auto_response``
    (``true`` only: the model answers when it decides). Its model takes turns
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
        sees_video: its model takes camera frames (see :attr:`SessionProfile.sees_video`).
        config: what it does with the seed's session settings.
    """
    return SessionProfile(model=model, voices=voices or (model,), output_modalities=("audio",),
                          transcription_model=transcription_model, extra_body=_FRAME_EXTRA,
                          fixed_response_options=fixed_response_options,
                          turn_detection=turn_detection, sees_video=sees_video, config=config)


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
