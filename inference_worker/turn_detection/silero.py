"""Silero voice activity detection for ``server_vad`` and ``semantic_vad`` turn detection.

:class:`SileroTurnDetector` is the :class:`~inference_worker.turn_detection.vad.Vad` the worker
uses where onnxruntime and the Silero weights faster-whisper ships are installed (the ``cascade``
extra, no torch); it hears the same pcm16 24 kHz input as
:class:`~inference_worker.turn_detection.vad.EnergyVad` and keeps its timeline rules exactly (see
:mod:`inference_worker.turn_detection.vad`): event times are milliseconds of audio fed,
``min_speech_ms`` of speech starts a turn, ``silence_duration_ms`` of silence (the hangover) stops
it, ``audio_start_ms`` reaches back ``prefix_padding_ms`` but never past 0, the last reset or the
previous stop, ``audio_end_ms`` includes the hangover, a reset keeps the timeline counting, and any
chunking of the same audio gives the same events. What differs is what a frame is and how it is
judged:

**Windows.** Silero judges 32 ms windows of 512 samples at 16 kHz: 768 samples (1536 bytes) of
the session's 24 kHz audio, counted from the first byte fed, resampled by
:class:`~inference_worker.audio_frames.LinearResampler`. A partial window waits for the next chunk.
Durations round up to whole windows, at least one (``min_speech_ms`` 100 -> 4 windows,
``silence_duration_ms`` 500 -> 16).

**Probabilities.** Each window gets Silero's speech probability, and ``threshold`` keeps
OpenAI's own meaning: a probability in 0..1, "higher needs more certain speech". A window at
or above it is speech; once speaking, a window counts as speech down to ``threshold - 0.15``
(:data:`HYSTERESIS`, as Silero's ``VADIterator`` does), so the weak windows inside a word do not
count as silence. Unlike the energy VAD, loud non-speech (a fan, a tone, music) is not speech.

**One model, many sessions.** The ONNX session is loaded once per process and shared by every
detector; each detector keeps its own recurrent state (:class:`VadState`), so sessions never
hear each other. :class:`SileroVad` runs the model for many streams at once (the cascade backend
judges its slots with it too). Importing this module loads neither onnxruntime nor the model:
the worker loads it at start, off its event loop (:func:`load_weights`), else the first
detector made would.

:func:`detector_factory` turns the worker's ``vad`` setting (:data:`VAD_CHOICES`) into the
detector factory the conversation core takes.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt

from inference_worker.audio_frames import PCM_RATE, LinearResampler, pcm16_to_float
from inference_worker.turn_detection.vad import (
    EnergyVad,
    FramedDetector,
    Vad,
    VadConfig,
)
from inference_worker.weights import PackagedWeights, default_path, existing, onnx_session
from runtime.config import ENV_PREFIX, SettingsError

__all__ = [
    "AUTO",
    "ENERGY",
    "HYSTERESIS",
    "SILERO",
    "SILERO_MODULES",
    "VAD_CHOICES",
    "WINDOW_BYTES",
    "WINDOW_MS",
    "WINDOW_SAMPLES",
    "OnnxSession",
    "SileroTurnDetector",
    "SileroUnavailable",
    "SileroVad",
    "SpeechProbabilities",
    "VadState",
    "detector_factory",
    "load_vad",
    "load_weights",
    "missing_silero_module",
    "shared_model",
]

Audio = npt.NDArray[np.float32]

#: The worker's ``vad`` setting: Silero where installed, else energy.
AUTO: Final = "auto"
#: Silero, or the worker refuses to start.
SILERO: Final = "silero"
#: The model-free energy detector.
ENERGY: Final = "energy"
#: Every accepted ``vad`` setting.
VAD_CHOICES: Final = (AUTO, SILERO, ENERGY)
#: What Silero needs importable: the runtime, and the package that ships the default weights
#: (faster-whisper's copy of the v6 export; found without importing the package).
SILERO_MODULES: Final = ("onnxruntime", "faster_whisper")

#: Length of one Silero window.
WINDOW_MS: Final = 32
#: Samples of one window at the session rate (768 at 24 kHz; 512 at Silero's 16 kHz).
WINDOW_SAMPLES: Final = PCM_RATE * WINDOW_MS // 1000
#: Bytes of pcm16 in one window.
WINDOW_BYTES: Final = 2 * WINDOW_SAMPLES
#: How far below ``threshold`` a window's probability still counts as speech once speaking.
HYSTERESIS: Final = 0.15

_SILERO_RATE: Final = 16000
_SILERO_WINDOW: Final = _SILERO_RATE * WINDOW_MS // 1000
_SAMPLES_PER_MS: Final = PCM_RATE // 1000
_VARIABLE: Final = f"{ENV_PREFIX}VAD"


class OnnxSession(Protocol):
    """A loaded ONNX model (an ``onnxruntime.InferenceSession``), as :class:`SileroVad` runs it."""

    def get_inputs(self) -> Sequence[Any]:
        """The model's inputs (each with its ``name``)."""
        ...

    def run(self, output_names: list[str] | None, input_feed: dict[str, Any]) -> list[Any]:
        """Run the model on ``input_feed``; the outputs named (all when None)."""
        ...


#: Silero's v6 export, as faster-whisper ships it for its own VAD filter.
_DEFAULT_VAD: Final = PackagedWeights("faster-whisper", "faster_whisper",
                                      "assets/silero_vad_v6.onnx")


@dataclass(slots=True)
class VadState:
    """One stream's Silero state: the LSTM's ``h`` and ``c`` (rows 0 and 1) and the last 64
    samples of the previous window (the context the next window is judged with)."""

    lstm: npt.NDArray[np.float32] = field(
        default_factory=lambda: np.zeros((2, 128), dtype=np.float32)
    )
    context: Audio = field(default_factory=lambda: np.zeros(64, dtype=np.float32))


#: The two interfaces Silero's ONNX exports come with, told apart by their input names.
#: ``silero-vad``'s exports: ``input`` [B, 576], ``state`` [2, B, 128], ``sr``; the first axis
#: is the batch, so one call judges a window of every stream.
_BATCHED_INPUTS: Final = frozenset({"input", "state", "sr"})
#: faster-whisper's export: ``input`` [T, 576], ``h`` and ``c`` [1, 1, 128]; the first axis is
#: time (the LSTM runs along it), so each stream needs a call of its own.
_SPLIT_INPUTS: Final = frozenset({"input", "h", "c"})


class SileroVad:
    """Silero VAD (ONNX): speech probability per 32 ms window at 16 kHz, for many streams.

    Either export interface (:data:`_BATCHED_INPUTS`, :data:`_SPLIT_INPUTS`) is recognised
    from the model's inputs; both see the same thing per stream: 64 samples of the stream's
    previous window, then the new 512, with the stream's own LSTM state.
    """

    #: Input rate.
    rate: Final = 16000
    #: Samples per window (32 ms).
    window: Final = 512
    #: Samples of the previous window each window is judged with.
    context: Final = 64

    def __init__(self, session: OnnxSession) -> None:
        """Wrap a loaded ONNX session (see :func:`load_vad`).

        Raises:
            ValueError: the model has neither Silero interface.
        """
        inputs = frozenset(node.name for node in session.get_inputs())
        if inputs not in (_BATCHED_INPUTS, _SPLIT_INPUTS):
            raise ValueError(
                f"not a Silero VAD model: its inputs are {sorted(inputs)}, expected"
                f" {sorted(_BATCHED_INPUTS)} or {sorted(_SPLIT_INPUTS)}")
        self._session = session
        self._batched = inputs == _BATCHED_INPUTS
        self._sr = np.array(self.rate, dtype=np.int64)

    def probabilities(self, windows: npt.NDArray[np.float32], states: Sequence[VadState]
                      ) -> npt.NDArray[np.float32]:
        """Speech probability of each row of ``windows`` ``[B, 512]``; updates ``states``.

        Rows are independent streams: each is judged with its own state only.
        """
        if windows.ndim != 2 or windows.shape[1] != self.window or len(states) != len(windows):
            raise ValueError(f"expected [{len(states)}, {self.window}], got {windows.shape}")
        contexts = np.stack([state.context for state in states])
        batch = np.concatenate([contexts, windows.astype(np.float32, copy=False)], axis=1)
        if self._batched:
            probabilities = self._run_batched(batch, states)
        else:
            probabilities = np.concatenate([self._run_one(batch[row:row + 1], state)
                                            for row, state in enumerate(states)])
        for row, state in enumerate(states):
            state.context = batch[row, -self.context:].copy()
        return probabilities

    def _run_batched(self, batch: Audio, states: Sequence[VadState]) -> Audio:
        lstm = np.stack([state.lstm for state in states], axis=1)
        out, new_lstm = self._session.run(None, {"input": batch, "state": lstm, "sr": self._sr})
        for row, state in enumerate(states):
            state.lstm = np.asarray(new_lstm[:, row], dtype=np.float32)
        return np.asarray(out, dtype=np.float32).reshape(len(states))

    def _run_one(self, window: Audio, state: VadState) -> Audio:
        h, c = (state.lstm[row].reshape(1, 1, -1) for row in (0, 1))
        out, hn, cn = self._session.run(["speech_probs", "hn", "cn"],
                                        {"input": window, "h": h, "c": c})
        state.lstm = np.concatenate([hn.reshape(1, -1), cn.reshape(1, -1)]).astype(np.float32)
        return np.asarray(out, dtype=np.float32).reshape(1)


def load_vad(path: str | Path | None = None) -> SileroVad:
    """Load a Silero VAD ONNX model (either interface) from ``path``, by default the v6
    export faster-whisper ships.

    Raises:
        WeightsNotFound: ``path`` does not exist, or (``path=None``) faster-whisper is not
            installed.
        ValueError: the model at ``path`` is not a Silero VAD.
        ImportError: onnxruntime is not installed.
    """
    model = default_path(_DEFAULT_VAD) if path is None else existing(path, "Silero VAD model")
    return SileroVad(onnx_session(model, threads=1))


class SpeechProbabilities(Protocol):
    """What judges windows: :class:`SileroVad`."""

    def probabilities(self, windows: npt.NDArray[np.float32], states: Sequence[VadState]
                      ) -> npt.NDArray[np.float32]:
        """Speech probability of each row of ``windows`` ``[B, 512]`` (16 kHz); updates
        ``states``, one per row."""
        ...


@cache
def shared_model() -> SpeechProbabilities:
    """The process's one Silero ONNX session, loaded on the first call.

    Raises:
        WeightsNotFound: faster-whisper, which ships the weights, is not installed (a
            ``FileNotFoundError``).
        ImportError: onnxruntime is not installed.
    """
    return load_vad()


def load_weights(factory: Callable[[VadConfig], Vad]) -> None:
    """Load what the detectors ``factory`` makes need (Silero's ONNX session; nothing for the
    energy VAD). Blocking: the worker runs it on a thread before it registers, because the
    first detector would otherwise load it on the event loop, where a cold onnxruntime
    import and model load stall every session's relay and can outlast the heartbeat's slack.

    Raises:
        SileroUnavailable: the model cannot be loaded (a broken install, say); it names the
            setting that avoids it.
    """
    if factory is not SileroTurnDetector:
        return
    try:
        shared_model()
    except (ImportError, OSError) as exc:  # WeightsNotFound is a FileNotFoundError
        raise SileroUnavailable(
            f"cannot load the Silero VAD: {exc} (set {_VARIABLE} to {ENERGY} to run without"
            " it)") from exc


class SileroTurnDetector(FramedDetector):
    """Silero voice activity detection on the turn timeline (see the module docstring).

    Args:
        config: the settings (OpenAI ``server_vad``'s defaults when None).
        model: what judges the windows; the process's shared Silero session when None.
    """

    def __init__(self, config: VadConfig | None = None, *,
                 model: SpeechProbabilities | None = None) -> None:
        """Start at 0 ms on the timeline, not speaking (loads the shared model if needed)."""
        super().__init__(config, WINDOW_SAMPLES)
        self._model = model if model is not None else shared_model()
        self._state = VadState()
        self._resampler = LinearResampler(PCM_RATE, _SILERO_RATE)

    def _judge(self, data: bytes, count: int) -> Iterable[tuple[bool, bool]]:
        threshold = self._config.threshold
        for index in range(count):
            probability = self._probability(data[index * WINDOW_BYTES:(index + 1) * WINDOW_BYTES])
            yield probability >= threshold, probability >= threshold - HYSTERESIS

    def _restart(self) -> None:
        """Silero's recurrent state and the resampler's phase go with the turn."""
        self._state = VadState()
        self._resampler.reset()

    def _probability(self, window: bytes) -> float:
        samples = self._resampler.process(pcm16_to_float(window))
        # 768 samples at 24 kHz resample to exactly 512 at 16 kHz (the step is 1.5, exact in
        # binary), so every window reaches Silero whole and the next starts afresh.
        assert samples.size == _SILERO_WINDOW, samples.size
        return float(self._model.probabilities(samples.reshape(1, -1), [self._state])[0])


# -------------------------------------------------------------------------------- selection


class SileroUnavailable(SettingsError):
    """``vad=silero`` on a machine without onnxruntime or the Silero weights: the worker
    refuses to start (a :class:`~runtime.config.SettingsError`, reported as one)."""


def missing_silero_module(modules: Sequence[str] = SILERO_MODULES) -> str | None:
    """The first of ``modules`` that cannot be found (None: Silero can run); nothing is
    imported."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            return module
    return None


def detector_factory(choice: str, *, requires: Sequence[str] = SILERO_MODULES
                     ) -> Callable[[VadConfig], Vad]:
    """The turn detector factory of the worker's ``vad`` setting.

    ``auto`` is Silero when every module of ``requires`` is installed (by default onnxruntime
    and faster-whisper, which ships the weights), else the energy VAD; ``silero`` is Silero or an
    error; ``energy`` is the energy VAD. Nothing is loaded until a detector is made.

    Raises:
        SileroUnavailable: ``silero`` where a module of ``requires`` is missing.
        ValueError: ``choice`` is not one of :data:`VAD_CHOICES`.
    """
    if choice not in VAD_CHOICES:
        raise ValueError(f"unknown vad {choice!r}: expected one of {', '.join(VAD_CHOICES)}")
    if choice == ENERGY:
        return EnergyVad
    missing = missing_silero_module(requires)
    if missing is None:
        return SileroTurnDetector
    if choice == AUTO:
        return EnergyVad
    raise SileroUnavailable(
        f"{_VARIABLE}={SILERO} needs onnxruntime and the Silero weights of faster-whisper, and"
        f" {missing!r} is not installed: pip install 'duplex-gateway[cascade]' (or set"
        f" {_VARIABLE} to {AUTO} or {ENERGY})")
