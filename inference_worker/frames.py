"""Audio at the frame backends' boundary: pcm16 <-> float32, streaming resampling, levels.

Sessions speak pcm16 little-endian mono at 24 kHz (the Realtime ``audio/pcm`` format); a
backend consumes and produces float32 frames at its own rates (``FrameSpec``). The engine
converts between the two with these helpers, and hands each session's runner a
:class:`FrameOutput`: the tick's audio already as pcm16 24 kHz bytes, its level, text and events.

Pure: numpy only, no clock, no threads (the engine calls it from its model thread).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "PCM_RATE",
    "FrameOutput",
    "StreamResampler",
    "float_to_pcm16",
    "level",
    "pcm16_to_float",
]

Audio = npt.NDArray[np.float32]

#: The sessions' audio rate: GA ``audio/pcm`` is 24 kHz only.
PCM_RATE: Final = 24000
_SCALE: Final = 32768.0


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameOutput:
    """One slot's output for one tick, as the session runner consumes it."""

    #: pcm16 LE mono at 24 kHz; empty while the model is in its delay warm-up.
    audio: bytes
    #: RMS of the tick's audio in [0, 1] (0.0 for no audio): what "silent" is measured on.
    level: float
    #: Decoded text produced this tick ("" for none).
    text: str = ""
    #: The backend's model-specific signals (``end_of_turn``, ``speech_started``, ...).
    events: dict[str, Any] = field(default_factory=dict)
    #: How many stops (``Engine.stop_response``) the engine had applied to the session's slot
    #: before the step that produced this frame began. A frame whose epoch is below the stops
    #: the session asked for comes from a step that was already running, or already queued,
    #: when it asked: what the model said in it belongs to the cancelled response.
    epoch: int = 0
    #: Where the model is on the session's input timeline after this tick: ms of the
    #: session's audio it consumed (or that was dropped or cleared before it could), counted
    #: in whole frames. What the model reports of the user's speech happened there, however
    #: far ahead the client's appends are. None: not known (a frame not from an engine).
    input_ms: int | None = None


def pcm16_to_float(data: bytes) -> Audio:
    """Decode pcm16 LE bytes (an even number of them) to float32 in [-1, 1)."""
    return (np.frombuffer(data, dtype="<i2").astype(np.float32) / _SCALE).astype(np.float32)


def float_to_pcm16(audio: Audio) -> bytes:
    """Encode float audio as pcm16 LE; values are clipped to [-1, 1] and non-finite become 0."""
    clean = np.nan_to_num(np.asarray(audio, dtype=np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    scaled = np.clip(clean * _SCALE, -_SCALE, _SCALE - 1)
    return bytes(np.round(scaled).astype("<i2").tobytes())


def level(audio: Audio) -> float:
    """RMS of ``audio`` (0.0 when empty)."""
    if audio.size == 0:
        return 0.0
    return float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))


class StreamResampler:
    """Linear-interpolation resampler that keeps its phase across chunks.

    Feeding a signal in arbitrary chunks gives the same samples as feeding it at once, so
    frame boundaries leave no clicks. Linear interpolation is enough for speech going into
    a model's own codec (Mimi, Whisper front ends resample again internally); it is not a
    hi-fi converter. With equal rates it is the identity and copies nothing.
    """

    __slots__ = ("_pos", "_step", "_tail")

    def __init__(self, src_rate: int, dst_rate: int) -> None:
        """Resample from ``src_rate`` to ``dst_rate`` (Hz, both positive)."""
        if src_rate <= 0 or dst_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {src_rate} -> {dst_rate}")
        self._step = src_rate / dst_rate  # source samples per output sample
        self._pos = 0.0  # position of the next output sample, in the buffered source
        self._tail: Audio = np.zeros(0, dtype=np.float32)  # the last source sample seen

    @property
    def identity(self) -> bool:
        """Whether the rates are equal (chunks pass through unchanged)."""
        return self._step == 1.0

    def process(self, chunk: Audio) -> Audio:
        """Resample the next ``chunk``; returns every output sample it completes."""
        if self.identity:
            return chunk
        buffer = np.concatenate([self._tail, chunk.astype(np.float32, copy=False)])
        last = buffer.size - 1
        if last < 0:
            return np.zeros(0, dtype=np.float32)
        count = int(np.floor((last - self._pos) / self._step)) + 1 if self._pos <= last else 0
        times = self._pos + self._step * np.arange(count, dtype=np.float64)
        out: Audio = np.interp(times, np.arange(buffer.size, dtype=np.float64),
                               buffer).astype(np.float32)
        self._pos = self._pos + self._step * count - last
        self._tail = buffer[-1:]
        return out

    def reset(self) -> None:
        """Forget the carried phase (a new session in the same slot)."""
        self._pos = 0.0
        self._tail = np.zeros(0, dtype=np.float32)
