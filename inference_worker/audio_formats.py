"""Session audio formats, converted at the worker's edge: GA ``audio/pcm`` and G.711.

A session may speak ``audio/pcm`` (pcm16 LE mono at 24 kHz) or, as telephony bridges do,
``audio/pcmu`` / ``audio/pcma`` (G.711 mu-law / A-law, one byte a sample at 8 kHz), each
direction on its own. The conversation core works in pcm16 24 kHz only, so a session's
:class:`InputDecoder` turns what the client sends into it and its :class:`OutputEncoder`
turns the core's output deltas back into the client's format. For ``audio/pcm`` both are the
identity and copy nothing.

Companding follows ITU-T G.711 exactly, as the classic reference coder does: mu-law
quantises the top 14 bits of a pcm16 sample, A-law the top 13; decoding gives each code's
reconstruction level as pcm16. Both run through lookup tables built once at import (256
entries to decode, 65,536 to encode), so a chunk costs one numpy indexing pass.

Rates change by exactly 3 in integer arithmetic, so chunks split anywhere give the same
samples as one big chunk, and nothing drifts:

* 8 kHz -> 24 kHz (input) interpolates linearly between neighbouring samples: every input
  sample gives exactly three output samples, the last of which is the sample itself, so the
  stream lags by two 24 kHz samples (83 us). Silence is assumed before the first sample, so
  a stream starts with a two-sample ramp rather than a click.
* 24 kHz -> 8 kHz (output) averages each group of three samples into one. The 3-tap box
  filter is the light anti-alias: it has its nulls at 8 and 16 kHz, where the worst aliases
  would fold onto the low frequencies of speech, and it costs 3.5 dB at 4 kHz, the top of
  the telephone band. Up to two samples (and a half-sample byte) wait for the next delta.

Neither is a hi-fi converter: telephone audio is band-limited to 300-3400 Hz anyway.

Pure: numpy only, no I/O, no clock; importing it loads neither torch nor Redis.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from inference_worker.conversation.refusals import Refusal, RefusalCode
from inference_worker.untrusted import describe

__all__ = [
    "AudioFormat",
    "InputDecoder",
    "OutputEncoder",
    "alaw_decode",
    "alaw_encode",
    "parse_format",
    "ulaw_decode",
    "ulaw_encode",
]

_Samples = npt.NDArray[np.int32]
_Codes = npt.NDArray[np.uint8]

#: The conversation core's rate: GA ``audio/pcm`` supports 24 kHz only.
_PCM_RATE: Final = 24000
#: G.711's rate.
_G711_RATE: Final = 8000
_RATIO: Final = _PCM_RATE // _G711_RATE
_PCM_SAMPLE_BYTES: Final = 2


class AudioFormat(enum.Enum):
    """A session direction's audio format, named by its GA ``type``."""

    PCM24K = "audio/pcm"
    PCMU = "audio/pcmu"
    PCMA = "audio/pcma"

    @property
    def rate(self) -> int:
        """Samples a second."""
        return _PCM_RATE if self is AudioFormat.PCM24K else _G711_RATE

    @property
    def bytes_per_sample(self) -> int:
        """Bytes one sample takes on the wire."""
        return _PCM_SAMPLE_BYTES if self is AudioFormat.PCM24K else 1

    @property
    def bytes_per_ms(self) -> int:
        """Bytes one millisecond takes on the wire (48 for pcm16 24 kHz, 8 for G.711)."""
        return self.rate // 1000 * self.bytes_per_sample

    def as_object(self) -> dict[str, Any]:
        """The effective GA format object (a new dict each call, for the session object)."""
        if self is AudioFormat.PCM24K:
            return {"type": self.value, "rate": _PCM_RATE}
        return {"type": self.value}


# --------------------------------------------------------------------------- parsing

# The keys GA's format objects have, by type (the SDK's `RealtimeAudioFormats`). Every key
# is optional there; `type` is required here, since without it nothing says what the bytes are.
_KEYS: Final[Mapping[str, frozenset[str]]] = {
    AudioFormat.PCM24K.value: frozenset({"type", "rate"}),
    AudioFormat.PCMU.value: frozenset({"type"}),
    AudioFormat.PCMA.value: frozenset({"type"}),
}
_TYPES: Final = ", ".join(sorted(_KEYS))


def parse_format(value: Any, param: str) -> AudioFormat | Refusal:
    """Read a GA audio format object, as ``session.audio.{input,output}.format`` carries it.

    Accepted: ``{"type": "audio/pcm"}`` with an optional ``"rate": 24000``,
    ``{"type": "audio/pcmu"}`` and ``{"type": "audio/pcma"}``. A ``null`` rate counts as
    absent (a pydantic ``model_dump()`` of the SDK's ``AudioPCM`` sends one).

    Args:
        value: the client's value, untrusted.
        param: its path for the refusal, e.g. ``session.audio.input.format``; a refusal of
            one key names that key under it.

    Returns:
        The format, or an ``unsupported_audio_format`` refusal saying what is wrong.
    """
    if not isinstance(value, Mapping):
        return _refusal(param, f"expected a format object, got {describe(value)}")
    kind = value.get("type")
    if not isinstance(kind, str) or kind not in _KEYS:
        return _refusal(f"{param}.type", f"unsupported type {describe(kind)}: use one of {_TYPES}")
    for key in value:
        if key not in _KEYS[kind]:
            return _refusal(f"{param}.{key}", f"{kind} takes no {describe(key)}")
    rate = value.get("rate")
    if rate is not None and not _is_pcm_rate(rate):
        return _refusal(f"{param}.rate",
                        f"unsupported rate {describe(rate)}: {kind} is {_PCM_RATE} Hz only")
    return AudioFormat(kind)


def _is_pcm_rate(rate: Any) -> bool:
    # `type` rather than isinstance: `True` is an int, and never a rate. 24000.0 is what some
    # JSON encoders write for 24000.
    return type(rate) in (int, float) and rate == _PCM_RATE


def _refusal(param: str, message: str) -> Refusal:
    return Refusal(code=RefusalCode.UNSUPPORTED_AUDIO_FORMAT, message=message, param=param)


# --------------------------------------------------------------------------- G.711

#: Every pcm16 value, in the order of its bit pattern read as uint16 (the encode tables' index).
_EVERY_PCM16: Final[_Samples] = np.arange(1 << 16, dtype=np.uint16).view(np.int16).astype(np.int32)
_EVERY_CODE: Final[_Samples] = np.arange(256, dtype=np.int32)

# mu-law: 14-bit magnitudes, biased by 33 so that every segment starts at a power of two.
_ULAW_BIAS: Final = 33
_ULAW_MAX: Final = 0x1FFF
_ULAW_SEGMENT_ENDS: Final = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
# A-law: 13-bit magnitudes; the two lowest segments share one step size.
_ALAW_SEGMENT_ENDS: Final = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])
# A-law inverts the even bits of every code (and mu-law all of them) so that silence, the
# commonest value, is not a run of zero bits on a line.
_ALAW_EVEN_BITS: Final = 0x55


def _ulaw_codes(pcm: _Samples) -> _Codes:
    """The G.711 mu-law code of each pcm16 value."""
    scaled = pcm >> 2
    negative = scaled < 0
    magnitude = np.minimum(np.abs(scaled) + _ULAW_BIAS, _ULAW_MAX)
    segment = np.searchsorted(_ULAW_SEGMENT_ENDS, magnitude)
    mantissa = (magnitude >> (segment + 1)) & 0xF
    sign = np.where(negative, 0x80, 0)  # before the complement: mu-law inverts every bit
    codes: _Codes = (~(sign | (segment << 4) | mantissa) & 0xFF).astype(np.uint8)
    return codes


def _ulaw_levels(codes: _Samples) -> npt.NDArray[np.int16]:
    """The pcm16 reconstruction level of each mu-law code."""
    bits = ~codes & 0xFF
    segment = (bits >> 4) & 0x7
    magnitude = ((((bits & 0xF) << 3) + (_ULAW_BIAS << 2)) << segment) - (_ULAW_BIAS << 2)
    levels: npt.NDArray[np.int16] = np.where(bits & 0x80, -magnitude, magnitude).astype(np.int16)
    return levels


def _alaw_codes(pcm: _Samples) -> _Codes:
    """The G.711 A-law code of each pcm16 value."""
    scaled = pcm >> 3
    negative = scaled < 0
    # Negative values are coded by their ones' complement, so -8..-1 take the lowest negative
    # step as 0..7 take the lowest positive one: A-law has no level at zero.
    magnitude = np.where(negative, -scaled - 1, scaled)
    segment = np.searchsorted(_ALAW_SEGMENT_ENDS, magnitude)
    mantissa = (magnitude >> np.maximum(segment, 1)) & 0xF
    sign = np.where(negative, 0, 0x80)
    codes: _Codes = ((sign | (segment << 4) | mantissa) ^ _ALAW_EVEN_BITS).astype(np.uint8)
    return codes


def _alaw_levels(codes: _Samples) -> npt.NDArray[np.int16]:
    """The pcm16 reconstruction level of each A-law code."""
    bits = codes ^ _ALAW_EVEN_BITS
    segment = (bits >> 4) & 0x7
    # Each level sits in the middle of its step: half a step (8, in pcm16 units) above the
    # step's start; segments 1..7 start at 256 << (segment - 1).
    steps = ((bits & 0xF) << 4) + np.where(segment == 0, 8, 0x108)
    magnitude = steps << np.maximum(segment - 1, 0)
    levels: npt.NDArray[np.int16] = np.where(bits & 0x80, magnitude, -magnitude).astype(np.int16)
    return levels


_ULAW_ENCODE: Final = _ulaw_codes(_EVERY_PCM16)
_ALAW_ENCODE: Final = _alaw_codes(_EVERY_PCM16)
_ULAW_DECODE: Final = _ulaw_levels(_EVERY_CODE).astype("<i2")
_ALAW_DECODE: Final = _alaw_levels(_EVERY_CODE).astype("<i2")


def ulaw_encode(pcm16: bytes) -> bytes:
    """G.711 mu-law codes of pcm16 LE samples (an even number of bytes)."""
    return _compand(pcm16, _ULAW_ENCODE)


def ulaw_decode(codes: bytes) -> bytes:
    """pcm16 LE samples of G.711 mu-law codes."""
    return bytes(_ULAW_DECODE[np.frombuffer(codes, dtype=np.uint8)].tobytes())


def alaw_encode(pcm16: bytes) -> bytes:
    """G.711 A-law codes of pcm16 LE samples (an even number of bytes)."""
    return _compand(pcm16, _ALAW_ENCODE)


def alaw_decode(codes: bytes) -> bytes:
    """pcm16 LE samples of G.711 A-law codes."""
    return bytes(_ALAW_DECODE[np.frombuffer(codes, dtype=np.uint8)].tobytes())


def _compand(pcm16: bytes, table: _Codes) -> bytes:
    return bytes(table[np.frombuffer(pcm16, dtype="<u2")].tobytes())


# --------------------------------------------------------------------------- resampling


def _third(total: _Samples) -> _Samples:
    """``total / 3`` rounded to the nearest integer (a third is never a tie)."""
    return (2 * total + 3) // 6


def _upsample(samples: _Samples, previous: int) -> _Samples:
    """Three 24 kHz samples for each 8 kHz one: a third and two thirds of the way from the
    sample before it, then the sample itself."""
    before = np.concatenate((np.array([previous], dtype=np.int32), samples[:-1]))
    out = np.empty((samples.size, _RATIO), dtype=np.int32)
    out[:, 0] = _third(2 * before + samples)
    out[:, 1] = _third(before + 2 * samples)
    out[:, 2] = samples
    return out.reshape(-1)


def _downsample(samples: _Samples) -> _Samples:
    """One 8 kHz sample for each whole group of three 24 kHz ones: their mean."""
    return _third(samples.reshape(-1, _RATIO).sum(axis=1))


# --------------------------------------------------------------------------- sessions

_DECODE: Final = {AudioFormat.PCMU: _ULAW_DECODE, AudioFormat.PCMA: _ALAW_DECODE}
_ENCODE: Final = {AudioFormat.PCMU: _ULAW_ENCODE, AudioFormat.PCMA: _ALAW_ENCODE}
#: pcm16 24 kHz bytes that make one 8 kHz sample.
_GROUP_BYTES: Final = _RATIO * _PCM_SAMPLE_BYTES


class InputDecoder:
    """One session's client audio, chunk by chunk, as pcm16 LE mono 24 kHz.

    For G.711, every input byte gives exactly three output samples (six bytes), whatever the
    chunking, so the caller's byte accounting stays exact. For ``audio/pcm`` the chunk itself
    is returned, not a copy, and is not looked into: an odd-length chunk comes back odd (the
    caller refuses those before they get here; this module does not guess a half sample).
    """

    __slots__ = ("_format", "_previous")

    def __init__(self, fmt: AudioFormat) -> None:
        """Decode from ``fmt``, the session's ``audio.input.format``."""
        self._format = fmt
        self._previous = 0  # the last 8 kHz sample decoded: the next one interpolates from it

    @property
    def format(self) -> AudioFormat:
        """The client's format."""
        return self._format

    @property
    def bytes_per_ms(self) -> int:
        """Client bytes one millisecond takes (8 for G.711, 48 for pcm16 24 kHz)."""
        return self._format.bytes_per_ms

    def decode(self, data: bytes) -> bytes:
        """The pcm16 24 kHz samples of the client's next chunk."""
        if self._format is AudioFormat.PCM24K or not data:
            return data
        levels = _DECODE[self._format][np.frombuffer(data, dtype=np.uint8)].astype(np.int32)
        out = _upsample(levels, self._previous)
        self._previous = int(levels[-1])
        return bytes(out.astype("<i2").tobytes())

    def reset(self) -> None:
        """Forget the carried sample (the input buffer was cleared or committed)."""
        self._previous = 0


class OutputEncoder:
    """One session's output deltas, pcm16 LE mono 24 kHz in, the client's format out.

    For G.711 each three input samples give one code byte; up to two samples (and an odd
    byte) wait for the next delta, so deltas split anywhere, even inside a sample, give the
    same codes as one delta. For ``audio/pcm`` the delta itself is returned, not a copy.
    """

    __slots__ = ("_format", "_pending")

    def __init__(self, fmt: AudioFormat) -> None:
        """Encode to ``fmt``, the session's ``audio.output.format``."""
        self._format = fmt
        self._pending = b""  # under one group's bytes, carried to the next delta

    @property
    def format(self) -> AudioFormat:
        """The client's format."""
        return self._format

    @property
    def bytes_per_ms(self) -> int:
        """Client bytes one millisecond takes (8 for G.711, 48 for pcm16 24 kHz)."""
        return self._format.bytes_per_ms

    def encode(self, pcm24k: bytes) -> bytes:
        """The client's bytes for the next output delta (``b""`` while under one sample)."""
        if self._format is AudioFormat.PCM24K:
            return pcm24k
        data = self._pending + pcm24k if self._pending else pcm24k
        whole = len(data) - len(data) % _GROUP_BYTES
        self._pending = data[whole:]
        samples = np.frombuffer(data, dtype="<i2", count=whole // _PCM_SAMPLE_BYTES)
        return self._compand(_downsample(samples.astype(np.int32)))

    def flush(self) -> bytes:
        """The code of the last, partial group (the mean of its one or two samples), if any.

        At most one 8 kHz sample: call it at a response's end to send every sample the
        model made, or skip it and lose 125 us at most.
        """
        count = len(self._pending) // _PCM_SAMPLE_BYTES
        if count == 0:
            self._pending = b""
            return b""
        samples = np.frombuffer(self._pending, dtype="<i2", count=count).astype(np.int32)
        self._pending = b""
        mean = (2 * samples.sum(keepdims=True) + count) // (2 * count)  # rounded, ties up
        return self._compand(mean)

    def reset(self) -> None:
        """Drop the carried samples (a new response, or the output was cleared)."""
        self._pending = b""

    def _compand(self, samples: _Samples) -> bytes:
        return bytes(_ENCODE[self._format][samples.astype(np.int16).view(np.uint16)].tobytes())
