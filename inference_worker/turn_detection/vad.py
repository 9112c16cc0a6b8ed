"""Voice activity detection for ``server_vad`` and ``semantic_vad`` turn detection, model-free.

:class:`EnergyVad` turns a session's input audio (pcm16 little-endian mono at 24 kHz, the GA
``audio/pcm`` format) into :class:`SpeechStarted` / :class:`SpeechStopped` events, the two
``input_audio_buffer.speech_*`` events of the Realtime API. It is the torch- and onnx-free
detector the conversation core drives; a Silero adapter can stand in for it behind the
:class:`Vad` protocol. Pure: numpy only, no clock, no I/O, deterministic.

**Framing.** Audio is cut into 20 ms frames (480 samples) counted from the first byte fed.
Chunks of any length are accepted: a partial frame, even an odd byte, waits for the next
chunk, so any chunking of the same audio gives the same events.

**Levels.** Each frame's level is its RMS in dBFS (0 dBFS: a full-scale square wave; a
full-scale sine is -3 dBFS). The Realtime ``threshold`` (0..1, "higher needs louder audio")
maps linearly onto a start level, ``-70 + 60 * threshold`` dBFS:

* 0.0 -> -70 dBFS: anything but digital silence or the faintest dither is speech;
* 0.5 -> -40 dBFS (the default): a quiet room through a typical microphone sits around -60
  to -50 dBFS, conversational speech at -30 to -20 dBFS on its voiced frames (the Piper voice
  the tests use: median -27 dBFS), so the default is 10 dB or more clear of both;
* 1.0 -> -10 dBFS: only very loud, nearly clipping audio.

**Turns.** Speech starts after ``min_speech_ms`` of consecutive frames at or above the start
level: a click or a knock lasts a frame or two and starts nothing, while a syllable lasts
longer. Once speaking, a frame counts as speech down to 6 dB (half the amplitude) below the
start level, so the decaying tail of a word does not count as silence (hysteresis, as
Silero's ``VADIterator`` does with probabilities). Speech stops after ``silence_duration_ms``
of frames below that lower level (the hangover). Durations round up to whole frames, at
least one.

**Timeline.** Event times are milliseconds of audio fed (never the wall clock), counted from
the detector's creation, as the Realtime API counts from the start of the session's audio:

* ``SpeechStarted.audio_start_ms``: the first frame of the speech run, less
  ``prefix_padding_ms`` (the audio kept before the detected start, which the API includes in
  ``audio_start_ms``), never before 0, the last :meth:`EnergyVad.reset` or the previous
  stop (the audio up to a stop belongs to the turn it ended);
* ``SpeechStopped.audio_end_ms``: the end of the frame that completed the hangover, so it
  includes ``silence_duration_ms``, as the API's ``audio_end_ms`` does.

Each event is returned by the :meth:`EnergyVad.feed` call that completes the frame deciding it.

**semantic_vad.** OpenAI's ``semantic_vad`` waits until a model judges the user finished,
at most 8 s / 4 s / 2 s for eagerness ``low`` / ``medium`` / ``high`` (``auto`` is
``medium``). An energy detector cannot judge meaning, so eagerness picks the end-of-turn
silence instead, in the same low:medium:high order and well inside those maxima:

* ``high`` 300 ms: ends the turn at the first clear pause, the pauses between phrases
  included (responds fastest, interrupts most);
* ``medium`` / ``auto`` 700 ms: longer than ``server_vad``'s 500 ms default, since semantic
  turn detection is meant to cut the user off less often, and beyond most pauses inside a
  sentence;
* ``low`` 1500 ms: lets the user stop to think mid-turn.

Threshold and prefix padding keep the ``server_vad`` defaults (0.5, 300 ms).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

from inference_worker.audio_frames import PCM_RATE
from inference_worker.conversation.refusals import RefusalCode
from inference_worker.untrusted import describe

__all__ = [
    "EAGERNESS_SILENCE_MS",
    "FRAME_BYTES",
    "FRAME_MS",
    "FRAME_SAMPLES",
    "HYSTERESIS_DB",
    "MAX_DURATION_MS",
    "DetectorPlace",
    "EnergyVad",
    "Pcm16",
    "SpeechStarted",
    "SpeechStopped",
    "TurnRules",
    "Vad",
    "VadConfig",
    "VadConfigError",
    "VadEvent",
    "level_dbfs",
    "threshold_dbfs",
    "vad_config_from_turn_detection",
]

#: Length of one analysis frame.
FRAME_MS: Final = 20
#: Samples in one frame at the session rate (480 at 24 kHz).
FRAME_SAMPLES: Final = PCM_RATE * FRAME_MS // 1000
#: Bytes of pcm16 in one frame.
FRAME_BYTES: Final = 2 * FRAME_SAMPLES
#: How far below the start level a frame still counts as speech once speaking.
HYSTERESIS_DB: Final = 6.0
#: Longest accepted duration setting. A minute of prefix padding or end-of-turn silence is far
#: beyond any turn taking; the cap bounds the audio a core keeps for the padding.
MAX_DURATION_MS: Final = 60_000
#: End-of-turn silence per ``semantic_vad`` eagerness (see the module docstring for why).
EAGERNESS_SILENCE_MS: Final[Mapping[str, int]] = MappingProxyType({
    "low": 1500, "medium": 700, "auto": 700, "high": 300,
})

_SAMPLES_PER_MS: Final = PCM_RATE // 1000
_FULL_SCALE: Final = 32768
_LOWEST_START_DBFS: Final = -70.0
_START_DBFS_SPAN: Final = 60.0

# The keys each turn detection type takes. Those outside VadConfig (create_response,
# interrupt_response, idle_timeout_ms) steer the conversation, not detection: they are
# type-checked here and read by the conversation core.
_SERVER_VAD_KEYS: Final = frozenset({
    "type", "threshold", "prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms",
    "create_response", "interrupt_response",
})
_SEMANTIC_VAD_KEYS: Final = frozenset({
    "type", "eagerness", "create_response", "interrupt_response",
})
_KEYS_BY_TYPE: Final[Mapping[str, frozenset[str]]] = {
    "server_vad": _SERVER_VAD_KEYS, "semantic_vad": _SEMANTIC_VAD_KEYS,
}

#: What :meth:`Vad.feed` takes: pcm16 LE mono 24 kHz bytes, in any buffer.
Pcm16: TypeAlias = bytes | bytearray | memoryview


# ------------------------------------------------------------------------------ configuration


class VadConfigError(ValueError):
    """A VAD setting that cannot be used.

    ``code`` is the Realtime error code a refusal carries (``invalid_type``,
    ``invalid_value``, ``unknown_parameter``, ``missing_required_parameter``) and ``param``
    the offending key inside the ``turn_detection`` object (``""`` for the object itself).
    """

    def __init__(self, code: RefusalCode, param: str, message: str) -> None:
        """Carry the refusal's ``code`` and ``param`` next to its message."""
        super().__init__(message)
        self.code = code
        self.param = param


@dataclass(frozen=True, slots=True, kw_only=True)
class VadConfig:
    """How speech is detected; the defaults are OpenAI ``server_vad``'s.

    Attributes:
        threshold: 0..1, mapped onto a start level by :func:`threshold_dbfs`.
        prefix_padding_ms: audio before the detected start included in ``audio_start_ms``.
        silence_duration_ms: silence that ends a turn.
        min_speech_ms: consecutive speech needed to start one (not a Realtime setting).

    Raises:
        VadConfigError: a value of the wrong type or out of range (a ``ValueError``).
    """

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    min_speech_ms: int = 100

    def __post_init__(self) -> None:
        """Refuse values the detector cannot use, naming the field."""
        _check_threshold("threshold", self.threshold)
        _check_duration("prefix_padding_ms", self.prefix_padding_ms)
        _check_duration("silence_duration_ms", self.silence_duration_ms)
        _check_duration("min_speech_ms", self.min_speech_ms)

    @property
    def start_dbfs(self) -> float:
        """The level at or above which a frame starts speech."""
        return threshold_dbfs(self.threshold)

    @property
    def release_dbfs(self) -> float:
        """The level below which a frame counts as silence while speaking."""
        return self.start_dbfs - HYSTERESIS_DB

    @property
    def min_speech_frames(self) -> int:
        """``min_speech_ms`` in whole frames (at least one)."""
        return _whole_frames(self.min_speech_ms)

    @property
    def silence_frames(self) -> int:
        """``silence_duration_ms`` in whole frames (at least one)."""
        return _whole_frames(self.silence_duration_ms)


def threshold_dbfs(threshold: float) -> float:
    """The start level in dBFS for a Realtime ``threshold``: ``-70 + 60 * threshold``."""
    return _LOWEST_START_DBFS + _START_DBFS_SPAN * threshold


def level_dbfs(pcm16: Pcm16) -> float:
    """RMS level of pcm16 LE audio in dBFS; ``-inf`` for digital silence or no audio."""
    samples = np.frombuffer(pcm16, dtype="<i2", count=len(pcm16) // 2).astype(np.int64)
    if not samples.size or not samples.any():
        return -math.inf
    mean_square = float(np.dot(samples, samples)) / samples.size
    return 10.0 * math.log10(mean_square / _FULL_SCALE**2)


def vad_config_from_turn_detection(turn_detection: object) -> VadConfig:
    """The detector settings for a GA ``turn_detection`` object (``server_vad`` or
    ``semantic_vad``).

    Missing keys take OpenAI's defaults. ``null`` (turn detection off) is the caller's case:
    it means no detector at all.

    Raises:
        VadConfigError: not an object, no or an unknown ``type``, a key the type does not
            take, or a value of the wrong type or out of range.
    """
    if not isinstance(turn_detection, Mapping):
        raise VadConfigError(RefusalCode.INVALID_TYPE, "",
                             "turn_detection must be an object or null")
    kind = turn_detection.get("type")
    if kind is None:
        raise VadConfigError(RefusalCode.MISSING_REQUIRED_PARAMETER, "type",
                             "turn_detection needs a type: 'server_vad' or 'semantic_vad'")
    if not isinstance(kind, str):
        raise VadConfigError(RefusalCode.INVALID_TYPE, "type",
                             f"turn_detection type must be a string, got {type(kind).__name__}")
    keys = _KEYS_BY_TYPE.get(kind)
    if keys is None:
        # The seed's update-time refusal: a detector this server does not have.
        raise VadConfigError(RefusalCode.UNSUPPORTED_TURN_DETECTION, "type",
                             f"unsupported turn_detection type {describe(kind)}: expected "
                             f"'server_vad' or 'semantic_vad'")
    for key in turn_detection:
        if key not in keys:
            raise VadConfigError(RefusalCode.UNKNOWN_PARAMETER, str(key),
                                 f"{kind} does not take {describe(key)}")
    _check_conversation_keys(turn_detection)
    if kind == "semantic_vad":
        return VadConfig(silence_duration_ms=_eagerness_silence(turn_detection))
    defaults = VadConfig()
    return VadConfig(
        threshold=turn_detection.get("threshold", defaults.threshold),
        prefix_padding_ms=turn_detection.get("prefix_padding_ms", defaults.prefix_padding_ms),
        silence_duration_ms=turn_detection.get("silence_duration_ms",
                                               defaults.silence_duration_ms),
    )


def _eagerness_silence(turn_detection: Mapping[str, object]) -> int:
    eagerness = turn_detection.get("eagerness", "auto")
    if not isinstance(eagerness, str):
        raise VadConfigError(RefusalCode.INVALID_TYPE, "eagerness",
                             f"eagerness must be a string, got {type(eagerness).__name__}")
    if eagerness not in EAGERNESS_SILENCE_MS:
        raise VadConfigError(RefusalCode.INVALID_VALUE, "eagerness",
                             f"eagerness must be one of 'low', 'medium', 'high', 'auto', got "
                             f"{describe(eagerness)}")
    return EAGERNESS_SILENCE_MS[eagerness]


def _check_conversation_keys(turn_detection: Mapping[str, object]) -> None:
    for key in ("create_response", "interrupt_response"):
        value = turn_detection.get(key, True)
        if not isinstance(value, bool):
            raise VadConfigError(RefusalCode.INVALID_TYPE, key,
                                 f"{key} must be a boolean, got {type(value).__name__}")
    idle = turn_detection.get("idle_timeout_ms")
    if idle is not None:
        _check_duration("idle_timeout_ms", idle, limit=None)


def _check_threshold(name: str, value: object) -> None:
    # bool is an int to Python but never a threshold in JSON.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise VadConfigError(RefusalCode.INVALID_TYPE, name,
                             f"{name} must be a number, got {type(value).__name__}")
    if not 0.0 <= value <= 1.0:  # also refuses NaN
        raise VadConfigError(RefusalCode.INVALID_VALUE, name,
                             f"{name} must be in [0, 1], got {describe(value)}")


def _check_duration(name: str, value: object, *, limit: int | None = MAX_DURATION_MS) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise VadConfigError(RefusalCode.INVALID_TYPE, name,
                             f"{name} must be an integer (ms), got {type(value).__name__}")
    if value < 0 or (limit is not None and value > limit):
        bound = f"in [0, {limit}]" if limit is not None else "at least 0"
        raise VadConfigError(RefusalCode.INVALID_VALUE, name,
                             f"{name} must be {bound} ms, got {value}")


def _whole_frames(ms: int) -> int:
    return max(1, -(-ms // FRAME_MS))


# -------------------------------------------------------------------------------- detection


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    """Speech began: ``input_audio_buffer.speech_started``."""

    #: Start of the turn's audio on the timeline, prefix padding included.
    audio_start_ms: int


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    """Speech ended: ``input_audio_buffer.speech_stopped``."""

    #: Where the stop was decided on the timeline, the end-of-turn silence included.
    audio_end_ms: int


VadEvent: TypeAlias = SpeechStarted | SpeechStopped


class Vad(Protocol):
    """A streaming voice activity detector over one session's pcm16 24 kHz input.

    Events alternate, starting with :class:`SpeechStarted`, and their times are on the
    audio timeline (milliseconds of audio fed), whatever the detector inside.
    """

    @property
    def config(self) -> VadConfig:
        """The settings in force."""
        ...

    @property
    def fed_ms(self) -> int:
        """Whole milliseconds of audio fed since creation, partial frames included."""
        ...

    @property
    def speaking(self) -> bool:
        """Whether speech has started and not stopped."""
        ...

    @property
    def place(self) -> DetectorPlace | None:
        """Where it is, when nothing is in progress (no speech, no run of loud frames, no
        partial frame): what a checkpoint keeps. None otherwise."""
        ...

    def resume(self, place: DetectorPlace) -> None:
        """Continue at ``place`` (another detector's), out of speech, its own state anew."""

    def feed(self, pcm16: Pcm16) -> list[VadEvent]:
        """Take the next chunk (any length); returns the events it completes, in order."""
        ...

    def reset(self, config: VadConfig | None = None) -> None:
        """Forget detection state and buffered audio (optionally switching ``config``);
        the timeline keeps counting."""
        ...


@dataclass(frozen=True, slots=True)
class DetectorPlace:
    """A detector's place between turns, in samples since it was made: the next frame's
    first sample, and how far back prefix padding may reach."""

    position: int
    origin: int


class TurnRules:
    """The turn rules every detector shares, over whole frames of ``frame_samples`` 24 kHz
    samples (see the module docstring): a run of ``min_speech_ms`` of loud frames starts
    speech (its start less the prefix padding, never before :attr:`origin`), then
    ``silence_duration_ms`` of frames that are not even audible stop it. A detector says per
    frame whether it was loud (at the start level) and audible (above the release level);
    the rules place the events on the timeline.
    """

    __slots__ = ("_frame", "_run", "_run_start", "_silence", "origin", "position", "speaking")

    def __init__(self, frame_samples: int) -> None:
        self._frame = frame_samples
        #: Timeline position, in samples, of the next frame's first sample.
        self.position = 0
        #: Where prefix padding may reach back to: the last reset or stop.
        self.origin = 0
        self.speaking = False
        self._run = 0
        self._run_start = 0
        self._silence = 0

    def frame(self, config: VadConfig, *, loud: bool, audible: bool) -> VadEvent | None:
        """The next frame; the event it completes, if any."""
        event = (self._while_speaking(config, audible) if self.speaking
                 else self._while_quiet(config, loud))
        self.position += self._frame
        return event

    def reset(self, skipped_samples: int = 0) -> None:
        """Forget the turn in progress; the timeline goes on (``skipped_samples``: a partial
        frame dropped with it), and padding never reaches back past here."""
        self.position += skipped_samples
        self.origin = self.position
        self.speaking, self._run, self._silence = False, 0, 0

    @property
    def at_rest(self) -> bool:
        """Whether no turn and no run of loud frames is in progress."""
        return not self.speaking and self._run == 0

    def resume(self, place: DetectorPlace) -> None:
        """Continue at ``place``, out of speech."""
        self.position, self.origin = place.position, place.origin
        self.speaking, self._run, self._silence = False, 0, 0

    def _frames(self, ms: int) -> int:
        return max(1, -(-ms * _SAMPLES_PER_MS // self._frame))

    def _while_quiet(self, config: VadConfig, loud: bool) -> SpeechStarted | None:
        if not loud:
            self._run = 0
            return None
        if self._run == 0:
            self._run_start = self.position
        self._run += 1
        if self._run < self._frames(config.min_speech_ms):
            return None
        self.speaking, self._silence = True, 0
        start = max(self.origin, self._run_start - config.prefix_padding_ms * _SAMPLES_PER_MS)
        return SpeechStarted(audio_start_ms=start // _SAMPLES_PER_MS)

    def _while_speaking(self, config: VadConfig, audible: bool) -> SpeechStopped | None:
        if audible:
            self._silence = 0
            return None
        self._silence += 1
        if self._silence < self._frames(config.silence_duration_ms):
            return None
        self.speaking, self._run = False, 0
        end = self.position + self._frame
        self.origin = end
        return SpeechStopped(audio_end_ms=end // _SAMPLES_PER_MS)


class FramedDetector:
    """What every detector shares: its settings, the turn rules over its frames of
    ``frame_samples`` (24 kHz samples), and the bytes of a frame still to come. A subclass
    judges whole frames (:meth:`_judge`: loud, audible) and forgets its own state on
    :meth:`_restart`; the rules place the events on the timeline.
    """

    def __init__(self, config: VadConfig | None, frame_samples: int) -> None:
        self._config = config if config is not None else VadConfig()
        self._frame_bytes = 2 * frame_samples
        #: Bytes waiting for the rest of their frame (fewer than a frame's).
        self._pending = b""
        self._turns = TurnRules(frame_samples)

    @property
    def config(self) -> VadConfig:
        """The settings in force."""
        return self._config

    @property
    def fed_ms(self) -> int:
        """Whole milliseconds of audio fed since creation, partial frames included."""
        return (self._turns.position + len(self._pending) // 2) // _SAMPLES_PER_MS

    @property
    def speaking(self) -> bool:
        """Whether speech has started and not stopped."""
        return self._turns.speaking

    @property
    def place(self) -> DetectorPlace | None:
        """Where it is, when nothing is in progress; None otherwise (see :class:`Vad`)."""
        turns = self._turns
        if self._pending or not turns.at_rest:
            return None
        return DetectorPlace(turns.position, turns.origin)

    def resume(self, place: DetectorPlace) -> None:
        """Continue at ``place``, out of speech, the detector's own state anew."""
        self._pending = b""
        self._turns.resume(place)
        self._restart()

    def feed(self, pcm16: Pcm16) -> list[VadEvent]:
        """Take the next chunk of pcm16 LE mono 24 kHz audio, of any length.

        Returns the events of the frames this chunk completes, in timeline order.
        """
        data = self._pending + bytes(pcm16)
        count = len(data) // self._frame_bytes
        self._pending = data[count * self._frame_bytes:]
        if not count:
            return []
        events: list[VadEvent] = []
        for loud, audible in self._judge(data, count):
            event = self._turns.frame(self._config, loud=loud, audible=audible)
            if event is not None:
                events.append(event)
        return events

    def reset(self, config: VadConfig | None = None) -> None:
        """Forget detection state and the pending partial frame, as after
        ``input_audio_buffer.clear`` (optionally switching to ``config``, for a
        ``session.update``).

        The timeline keeps counting from the audio fed so far, so later events stay on the
        session's timeline; prefix padding never reaches back past this point, since the
        audio before it is gone.
        """
        if config is not None:
            self._config = config
        self._turns.reset(len(self._pending) // 2)
        self._pending = b""
        self._restart()

    def _judge(self, data: bytes, count: int) -> Iterable[tuple[bool, bool]]:
        """Whether each of the first ``count`` frames of ``data`` is loud (starts speech)
        and audible (keeps it going)."""
        raise NotImplementedError

    def _restart(self) -> None:
        """Forget the detector's own state (after a reset; ``config`` may have changed)."""


class EnergyVad(FramedDetector):
    """Frame-energy voice activity detection (see the module docstring for the rules)."""

    def __init__(self, config: VadConfig | None = None) -> None:
        """Start at 0 ms on the timeline, not speaking."""
        super().__init__(config, FRAME_SAMPLES)
        self._thresholds = _energy_thresholds(self._config)

    def _judge(self, data: bytes, count: int) -> Iterable[tuple[bool, bool]]:
        start_energy, release_energy = self._thresholds
        energies = _frame_energies(data, count)
        return zip((energies >= start_energy).tolist(), (energies >= release_energy).tolist(),
                   strict=True)

    def _restart(self) -> None:
        self._thresholds = _energy_thresholds(self._config)


def _energy_thresholds(config: VadConfig) -> tuple[float, float]:
    """The start and release levels as sums of squared samples over one frame.

    Comparing integer energies to these avoids a logarithm per frame; the sums are exact in
    int64 and in float64 (below 2**40), so the decisions are deterministic.
    """
    full = FRAME_SAMPLES * float(_FULL_SCALE) ** 2
    return (full * 10.0 ** (config.start_dbfs / 10.0),
            full * 10.0 ** (config.release_dbfs / 10.0))


def _frame_energies(data: bytes, count: int) -> npt.NDArray[np.int64]:
    """The sum of squared samples of each of the first ``count`` frames of ``data``."""
    samples = np.frombuffer(data, dtype="<i2", count=count * FRAME_SAMPLES).astype(np.int64)
    frames = samples.reshape(count, FRAME_SAMPLES)
    energies: npt.NDArray[np.int64] = np.einsum("ij,ij->i", frames, frames)
    return energies
