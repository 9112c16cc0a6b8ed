"""Audio at the frame backends' boundary: pcm16 <-> float32, streaming resampling, levels.

Sessions speak pcm16 little-endian mono at 24 kHz (the Realtime ``audio/pcm`` format); a
backend consumes and produces float32 frames at its own rates (``FrameSpec``). The engine
converts between the two with these helpers, and hands each session's conversation core a
:class:`FrameOutput`: the tick's audio already as pcm16 24 kHz bytes, its level, text and the
model's reports.

Two streaming resamplers, one home: :class:`LinearResampler` (cheap, for audio going into a
model's own front end) and :class:`SincResampler` (polyphase windowed-sinc, for audio a person
or a speech recogniser hears: the cascade, ``talk``'s WAV input), with :func:`resample` for
whole buffers.

Pure: numpy only, no clock, no threads (the engine calls it from its model thread).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from inference_worker.conversation.reports import ModelReport, Output, Report, TurnEnded

__all__ = [
    "PCM_RATE",
    "FrameOutput",
    "LinearResampler",
    "SincResampler",
    "checked_input",
    "float_to_pcm16",
    "level",
    "pcm16_to_float",
    "repaired_output",
    "resample",
]

Audio = npt.NDArray[np.float32]

#: The sessions' audio rate: GA ``audio/pcm`` is 24 kHz only.
PCM_RATE: Final = 24000
_SCALE: Final = 32768.0


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameOutput:
    """One slot's output for one tick, as the session's conversation core consumes it."""

    #: pcm16 LE mono at 24 kHz; empty while the model is in its delay warm-up.
    audio: bytes
    #: RMS of the tick's audio in [0, 1] (0.0 for no audio): what "silent" is measured on.
    level: float
    #: Decoded text produced this tick ("" for none).
    text: str = ""
    #: What the backend's model reported this tick besides its output (``SlotResult.reports``).
    reports: tuple[ModelReport, ...] = ()
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
    #: What the step added to the slot's context (``SlotResult.context``): what another
    #: worker continues the slot from.
    context: bytes = b""

    def all_reports(self) -> list[Report]:
        """The tick's reports in the order they happened: the model's, with the tick's output
        before the end of its turn (the output is the turn's last)."""
        output = Output(audio=self.audio, level=self.level, text=self.text)
        if not any(isinstance(report, TurnEnded) for report in self.reports):
            return [*self.reports, output]
        return [*(r for r in self.reports if not isinstance(r, TurnEnded)), output, TurnEnded()]


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


def checked_input(frame: Any, samples: int) -> Audio | None:
    """``frame`` as float32 in [-1, 1] if it is a finite 1-D frame of ``samples``, else None:
    an input frame a caller queued as is, checked before a model steps on it."""
    if not isinstance(frame, np.ndarray) or frame.shape != (samples,):
        return None
    if frame.dtype.kind not in "fiu":  # real numbers only (no complex, bool or object)
        return None
    audio = frame.astype(np.float32, copy=False)
    if not np.isfinite(audio).all():
        return None
    return np.clip(audio, -1.0, 1.0)


def repaired_output(pcm: Any, samples: int) -> tuple[Audio, bool]:
    """A model's output frame as flat float32 of at most ``samples``, non-finite values
    silenced, and whether it needed either repair."""
    audio = np.asarray(pcm, dtype=np.float32).reshape(-1)
    repaired = False
    if audio.size > samples:
        audio, repaired = audio[:samples], True
    if not np.isfinite(audio).all():
        audio, repaired = np.nan_to_num(audio, nan=0.0, posinf=0.0, neginf=0.0), True
    return audio, repaired


class LinearResampler:
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


class SincResampler:
    """A polyphase windowed-sinc resampler that carries its state across chunks.

    ``process`` may be fed chunks of any length; the concatenated outputs equal one pass over
    the concatenated inputs. The output lags the input by ``taps_per_phase / 2`` input samples
    (the filter's group delay); :func:`resample` removes it for whole buffers.
    """

    def __init__(self, src_rate: int, dst_rate: int, *, taps_per_phase: int = 24) -> None:
        """Build the filter bank for ``src_rate -> dst_rate`` (any two positive rates)."""
        if src_rate <= 0 or dst_rate <= 0:
            raise ValueError(f"rates must be positive, got {src_rate} -> {dst_rate}")
        gcd = math.gcd(src_rate, dst_rate)
        self.up = dst_rate // gcd
        self.down = src_rate // gcd
        self.taps = taps_per_phase
        #: The group delay in output samples, for whole-buffer use.
        self.delay, self._bank = _filter_bank(self.up, self.down, taps_per_phase)
        self._history = np.zeros(taps_per_phase - 1, dtype=np.float32)
        self._consumed = 0
        self._produced = 0

    def process(self, chunk: Audio) -> Audio:
        """Resample the next ``chunk``; returns every output sample it makes available."""
        if self.up == self.down:
            return chunk.astype(np.float32, copy=True)
        if not len(chunk):  # nothing new: and the history alone is shorter than a window
            return np.zeros(0, dtype=np.float32)
        buffer = np.concatenate([self._history, chunk.astype(np.float32, copy=False)])
        consumed = self._consumed + len(chunk)
        # Output m needs input n0 = m * down // up; produce every m whose n0 has arrived.
        end = (consumed * self.up - 1) // self.down + 1 if consumed else 0
        outputs = np.arange(self._produced, end)
        n0 = outputs * self.down // self.up
        starts = n0 - self._consumed  # window start in ``buffer``, given taps - 1 of history
        windows = np.lib.stride_tricks.sliding_window_view(buffer, self.taps)[starts]
        out: Audio = np.einsum("mk,mk->m", windows, self._bank[outputs * self.down % self.up])
        self._history = buffer[len(buffer) - (self.taps - 1):].copy()
        self._consumed, self._produced = consumed, end
        return out.astype(np.float32, copy=False)


@functools.lru_cache(maxsize=32)
def _filter_bank(up: int, down: int, taps: int) -> tuple[int, Audio]:
    """The group delay and the read-only polyphase bank of ``up / down`` resampling.

    Cached: every session converting between the same two rates shares one bank, and a rate
    pair with a large reduced ratio (44100 -> 24000 has 80 phases) is built once.
    """
    length = taps * up
    # Low-pass at 92% of the lower Nyquist, in cycles per sample of the upsampled signal.
    cutoff = 0.46 / max(up, down)
    # The sinc is centred on a multiple of ``down`` so that the delay is a whole number of
    # output samples.
    delay = round((length - 1) / 2 / down)
    n = np.arange(length) - delay * down
    h = np.sinc(2 * cutoff * n) * np.kaiser(length, 8.0)
    h *= up / h.sum()
    # bank[p, j] multiplies the window x[n0 - taps + 1 + j], for output phase p.
    bank = np.ascontiguousarray(h.reshape(taps, up).T[:, ::-1], dtype=np.float32)
    bank.setflags(write=False)
    return delay, bank


def resample(pcm: Audio, src_rate: int, dst_rate: int) -> Audio:
    """Resample a whole buffer, delay-compensated, to ``len * dst / src`` samples."""
    pcm = np.asarray(pcm, dtype=np.float32)
    if src_rate == dst_rate:
        return pcm.copy()
    resampler = SincResampler(src_rate, dst_rate)
    out = np.concatenate([
        resampler.process(pcm), resampler.process(np.zeros(resampler.taps, dtype=np.float32))
    ])
    length = len(pcm) * dst_rate // src_rate
    return out[resampler.delay:resampler.delay + length]
