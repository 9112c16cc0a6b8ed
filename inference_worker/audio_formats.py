"""Session audio formats, converted once at the worker's edge: an encoding at a rate.

A session's input and output each have a format: pcm16 LE mono (GA ``audio/pcm``), float32
LE mono (``audio/pcm_f32le``, the seed's), or G.711 mu-law / A-law (``audio/pcmu`` /
``audio/pcma``, one byte a sample, as telephony bridges send), at any whole rate from
:data:`MIN_RATE` to :data:`MAX_RATE` Hz. GA's own are ``audio/pcm`` at 24 kHz and G.711 at
8 kHz; the seed names its encodings (``pcm16``, ``pcm_f32le``, ``g711_ulaw``, ...) and gives
the rate apart (``sample_rate_hz``), on the session or on one append. The conversation core
works in pcm16 24 kHz only, so a session's :class:`InputDecoder` turns what the client sends
into it and its :class:`OutputEncoder` turns the core's output deltas into the client's
format. For ``audio/pcm`` at 24 kHz both are the identity and copy nothing.

Both stream: chunks split anywhere (on whole samples, for input, which the caller checks;
anywhere at all, for output) give the same samples as one big chunk, and nothing drifts,
since every rate change counts its phase in integers.

* G.711 at 8 kHz keeps its exact integer 3:1 converters. Input interpolates linearly between
  neighbouring samples: every code gives exactly three output samples, the last of which is
  the sample itself, so the stream lags by two 24 kHz samples (83 us); silence is assumed
  before the first sample, so a stream starts with a two-sample ramp rather than a click.
  Output averages each group of three samples into one: the 3-tap box filter has its nulls at
  8 and 16 kHz, where the worst aliases would fold onto the low frequencies of speech, and
  costs 3.5 dB at 4 kHz, the top of the telephone band. Up to two samples (and a half-sample
  byte) wait for the next delta.
* Every other rate goes through the project's polyphase windowed-sinc resampler
  (:class:`~inference_worker.audio_frames.SincResampler`), which lags by half its filter
  (twelve samples of the lower rate) and gives ``ceil(n * to / from)`` samples for ``n``.

Pure: numpy only, no I/O, no clock; importing it loads neither torch nor Redis.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import numpy as np
import numpy.typing as npt

from inference_worker.audio_frames import PCM_RATE, SincResampler, float_to_pcm16
from inference_worker.conversation.refusals import BROKEN_SAMPLE, Refusal, RefusalCode
from inference_worker.g711 import (
    ALAW_DECODE,
    ALAW_ENCODE,
    ULAW_DECODE,
    ULAW_ENCODE,
    alaw_decode,
    alaw_encode,
    ulaw_decode,
    ulaw_encode,
)
from inference_worker.untrusted import describe

__all__ = [
    "MAX_RATE",
    "MIN_RATE",
    "AppendDecoder",
    "AudioFormat",
    "Encoding",
    "InputDecoder",
    "OutputEncoder",
    "alaw_decode",
    "alaw_encode",
    "append_format",
    "encoding_named",
    "is_rate",
    "parse_format",
    "ulaw_decode",
    "ulaw_encode",
]

_Samples = npt.NDArray[np.int32]
_Audio = npt.NDArray[np.float32]

#: The rates a format may have (the seed's bounds).
MIN_RATE: Final = 8000
MAX_RATE: Final = 192000
#: G.711's own rate, and the rate of a G.711 format that names none.
_G711_RATE: Final = 8000
_RATIO: Final = PCM_RATE // _G711_RATE
_PCM_SAMPLE_BYTES: Final = 2
_SCALE: Final = 32768.0


class Encoding(enum.Enum):
    """How a format's samples are written, named by its GA-shaped ``type``."""

    PCM16 = "audio/pcm"
    PCMU = "audio/pcmu"
    PCMA = "audio/pcma"
    PCM_F32LE = "audio/pcm_f32le"

    @property
    def bytes_per_sample(self) -> int:
        """Bytes one sample takes on the wire."""
        return _SAMPLE_BYTES[self]

    @property
    def default_rate(self) -> int:
        """The rate of a format of this encoding that names none (GA's: 24 kHz, G.711 8 kHz)."""
        return _G711_RATE if self in _G711 else PCM_RATE


_SAMPLE_BYTES: Final = {Encoding.PCM16: 2, Encoding.PCMU: 1, Encoding.PCMA: 1,
                        Encoding.PCM_F32LE: 4}
_G711: Final = frozenset({Encoding.PCMU, Encoding.PCMA})

# Every name a client may give an encoding (lower-cased first): GA's types, the seed's names
# and the spellings its codec reads. `wav` (whole files per delta) is none of them.
_NAMES: Final[Mapping[str, Encoding]] = {
    **dict.fromkeys(("audio/pcm", "pcm", "audio/pcm16", "pcm16", "pcm_s16le", "s16le"),
                    Encoding.PCM16),
    **dict.fromkeys(("audio/pcm_f32le", "pcm_f32le", "f32le"), Encoding.PCM_F32LE),
    **dict.fromkeys(("audio/pcmu", "audio/g711_ulaw", "g711_ulaw", "g711-ulaw", "ulaw",
                     "mulaw"), Encoding.PCMU),
    **dict.fromkeys(("audio/pcma", "audio/g711_alaw", "g711_alaw", "g711-alaw", "alaw"),
                    Encoding.PCMA),
}
_ACCEPTED: Final = "pcm16, pcm_f32le, g711_ulaw, g711_alaw (or audio/pcm, audio/pcm_f32le, " \
                   "audio/pcmu, audio/pcma)"


@dataclass(frozen=True, slots=True)
class AudioFormat:
    """One direction's format: an encoding at a rate (mono, little-endian)."""

    encoding: Encoding
    rate: int

    #: GA's ``audio/pcm`` (24 kHz), ``audio/pcmu`` and ``audio/pcma`` (8 kHz).
    PCM24K: ClassVar[AudioFormat]
    PCMU: ClassVar[AudioFormat]
    PCMA: ClassVar[AudioFormat]

    @property
    def value(self) -> str:
        """The GA-shaped ``type`` of its encoding."""
        return self.encoding.value

    @property
    def bytes_per_sample(self) -> int:
        """Bytes one sample takes on the wire."""
        return self.encoding.bytes_per_sample

    @property
    def bytes_per_ms(self) -> float:
        """Bytes one millisecond takes on the wire (48 for pcm16 24 kHz, 8 for G.711)."""
        return self.rate * self.bytes_per_sample / 1000

    def as_object(self) -> dict[str, Any]:
        """The effective format object (a new dict each call, for the session object): GA's
        own for GA's formats, which give G.711 no rate."""
        if self.encoding in _G711 and self.rate == _G711_RATE:
            return {"type": self.value}
        return {"type": self.value, "rate": self.rate}


AudioFormat.PCM24K = AudioFormat(Encoding.PCM16, PCM_RATE)
AudioFormat.PCMU = AudioFormat(Encoding.PCMU, _G711_RATE)
AudioFormat.PCMA = AudioFormat(Encoding.PCMA, _G711_RATE)


# --------------------------------------------------------------------------- parsing


def encoding_named(name: Any) -> Encoding | None:
    """The encoding a client's name means (any case), or None for none the worker takes."""
    return _NAMES.get(name.lower()) if isinstance(name, str) else None


def is_rate(value: Any) -> bool:
    """Whether ``value`` is a rate a format may have: a whole number of Hz in range."""
    # `type` rather than isinstance: `True` is an int, and never a rate. 24000.0 is what some
    # JSON encoders write for 24000.
    # The range comes first: it rules out inf and nan, which int() cannot take.
    return (type(value) in (int, float) and MIN_RATE <= value <= MAX_RATE
            and value == int(value))


# The keys a format object may have: GA's `type` and `rate`, and the seed's spellings of the
# rate.
_RATE_KEYS: Final = ("rate", "sample_rate_hz", "sample_rate")


def parse_format(value: Any, param: str) -> AudioFormat | Refusal:
    """Read a format object, as ``session.audio.{input,output}.format`` carries it.

    Accepted: ``{"type": T}`` with an optional ``"rate": R`` (the seed also writes
    ``sample_rate_hz``), where ``T`` names an encoding (``audio/pcm``, ``audio/pcm_f32le``,
    ``audio/pcmu``, ``audio/pcma`` or a seed name) and ``R`` is a whole number of Hz from
    :data:`MIN_RATE` to :data:`MAX_RATE`. A ``null`` rate counts as absent (a pydantic
    ``model_dump()`` of the SDK's ``AudioPCM`` sends one): the encoding's default rate.

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
    encoding = encoding_named(kind)
    if encoding is None:
        return _refusal(f"{param}.type", f"unsupported type {describe(kind)}: use one of "
                                         f"{_ACCEPTED}")
    rate: Any = None
    for key, given in value.items():
        if key != "type" and key not in _RATE_KEYS:
            return _refusal(f"{param}.{key}", f"{kind} takes no {describe(key)}")
        if key in _RATE_KEYS and given is not None:
            if not is_rate(given):
                return _refusal(f"{param}.{key}",
                                f"unsupported rate {describe(given)}: a whole number of Hz "
                                f"from {MIN_RATE} to {MAX_RATE}")
            rate = rate or int(given)
    return AudioFormat(encoding, rate or encoding.default_rate)


def append_format(name: str | None, rate: int | None,
                  session: AudioFormat) -> AudioFormat | Refusal:
    """The format of one append: its own ``format`` and ``sample_rate_hz``, each falling back
    to the session's input format.

    A named encoding other than the session's, with no rate, takes G.711's 8 kHz for G.711
    and the session's rate otherwise (the seed's rule for linear encodings).

    Returns:
        The format, or the seed's refusal: ``unsupported_audio_format`` for a name it does
        not take, ``bad_event`` for a rate out of range.
    """
    encoding = session.encoding
    if name is not None:
        named = encoding_named(name)
        if named is None:
            return Refusal(code=RefusalCode.UNSUPPORTED_AUDIO_FORMAT, param="format",
                           message=f"unsupported input audio format {describe(name)}: use "
                                   f"one of {_ACCEPTED}")
        encoding = named
    if rate is not None:
        if not is_rate(rate):
            return Refusal(code=RefusalCode.BAD_EVENT, param="sample_rate_hz",
                           message=f"sample_rate_hz must be a whole number of Hz from "
                                   f"{MIN_RATE} to {MAX_RATE}, got {describe(rate)}")
        return AudioFormat(encoding, int(rate))
    if encoding is session.encoding or encoding not in _G711:
        return AudioFormat(encoding, session.rate)
    return AudioFormat(encoding, _G711_RATE)


def _refusal(param: str, message: str) -> Refusal:
    return Refusal(code=RefusalCode.UNSUPPORTED_AUDIO_FORMAT, message=message, param=param)


# --------------------------------------------------------------------------- G.711 at 8 kHz


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

_DECODE: Final = {Encoding.PCMU: ULAW_DECODE, Encoding.PCMA: ALAW_DECODE}
_ENCODE: Final = {Encoding.PCMU: ULAW_ENCODE, Encoding.PCMA: ALAW_ENCODE}
#: pcm16 24 kHz bytes that make one 8 kHz sample.
_GROUP_BYTES: Final = _RATIO * _PCM_SAMPLE_BYTES


def _g711_8k(fmt: AudioFormat) -> bool:
    return fmt.encoding in _G711 and fmt.rate == _G711_RATE


def _floats(data: bytes, encoding: Encoding) -> _Audio:
    """Whole samples of ``encoding`` as float32 in [-1, 1) (pcm16's scale)."""
    if encoding is Encoding.PCM_F32LE:
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    if encoding in _G711:
        levels = _DECODE[encoding][np.frombuffer(data, dtype=np.uint8)]
        return (levels.astype(np.float32) / _SCALE).astype(np.float32)
    return (np.frombuffer(data, dtype="<i2").astype(np.float32) / _SCALE).astype(np.float32)


class InputDecoder:
    """One session's client audio, chunk by chunk, as pcm16 LE mono 24 kHz.

    Chunks must be whole samples of the format (the caller refuses others: this module does
    not guess a part of a sample). For ``audio/pcm`` at 24 kHz the chunk itself is returned,
    not a copy. For G.711 at 8 kHz every input byte gives exactly three output samples.
    """

    __slots__ = ("_g711_8k", "_previous", "_resampler", "format", "identity", "sample_bytes")

    def __init__(self, fmt: AudioFormat) -> None:
        """Decode from ``fmt``, the session's (or an append's) input format."""
        #: The client's format (an attribute, not a property: read on every append).
        self.format = fmt
        #: Whether chunks come back as they are (``audio/pcm`` at 24 kHz).
        self.identity = fmt == AudioFormat.PCM24K
        #: Bytes one sample of the format takes: a chunk is whole samples.
        self.sample_bytes = fmt.bytes_per_sample
        self._g711_8k = _g711_8k(fmt)
        self._previous = 0  # G.711 8 kHz: the last sample decoded, the next interpolates from
        self._resampler = (None if fmt.rate == PCM_RATE or self._g711_8k
                           else SincResampler(fmt.rate, PCM_RATE))

    @property
    def bytes_per_ms(self) -> float:
        """Client bytes one millisecond takes (8 for G.711, 48 for pcm16 24 kHz)."""
        return self.format.bytes_per_ms

    def decode(self, data: bytes) -> bytes:
        """The pcm16 24 kHz samples of the client's next chunk."""
        if self.identity or not data:
            return data
        if self._g711_8k:
            levels = _DECODE[self.format.encoding][np.frombuffer(data, dtype=np.uint8)]
            wide = levels.astype(np.int32)
            out = _upsample(wide, self._previous)
            self._previous = int(wide[-1])
            return bytes(out.astype("<i2").tobytes())
        audio = _floats(data, self.format.encoding)
        if self._resampler is not None:
            audio = self._resampler.process(audio)
        return float_to_pcm16(audio)

    def reset(self) -> None:
        """Forget the carried sample (the input buffer was cleared or committed)."""
        self._previous = 0


class OutputEncoder:
    """One session's output deltas, pcm16 LE mono 24 kHz in, the client's format out.

    Deltas split anywhere, even inside a sample, give the same bytes as one delta: an odd
    byte waits for the next delta, and so do up to two samples for G.711 at 8 kHz. For
    ``audio/pcm`` at 24 kHz the delta itself is returned, not a copy.
    """

    __slots__ = ("_format", "_g711_8k", "_identity", "_pending", "_resampler")

    def __init__(self, fmt: AudioFormat) -> None:
        """Encode to ``fmt``, the session's (or one response's) output format."""
        self._format = fmt
        self._identity = fmt == AudioFormat.PCM24K
        self._g711_8k = _g711_8k(fmt)
        self._pending = b""  # under one sample (or one 8 kHz group), carried to the next delta
        self._resampler = (None if fmt.rate == PCM_RATE or self._g711_8k
                           else SincResampler(PCM_RATE, fmt.rate))

    @property
    def format(self) -> AudioFormat:
        """The client's format."""
        return self._format

    @property
    def bytes_per_ms(self) -> float:
        """Client bytes one millisecond takes (8 for G.711, 48 for pcm16 24 kHz)."""
        return self._format.bytes_per_ms

    def encode(self, pcm24k: bytes) -> bytes:
        """The client's bytes for the next output delta (``b""`` while under one sample)."""
        if self._identity:
            return pcm24k
        data = self._pending + pcm24k if self._pending else pcm24k
        group = _GROUP_BYTES if self._g711_8k else _PCM_SAMPLE_BYTES
        whole = len(data) - len(data) % group
        self._pending = data[whole:]
        samples = np.frombuffer(data, dtype="<i2", count=whole // _PCM_SAMPLE_BYTES)
        if self._g711_8k:
            return self._compand(_downsample(samples.astype(np.int32)))
        audio = (samples.astype(np.float32) / _SCALE).astype(np.float32)
        if self._resampler is not None:
            audio = self._resampler.process(audio)
        if self._format.encoding is Encoding.PCM_F32LE:
            return bytes(np.clip(audio, -1.0, 1.0).astype("<f4").tobytes())
        pcm = float_to_pcm16(audio)
        if self._format.encoding in _G711:
            return self._compand(np.frombuffer(pcm, dtype="<i2").astype(np.int32))
        return pcm

    def flush(self) -> bytes:
        """For G.711 at 8 kHz, the code of the last, partial group (the mean of its one or two
        samples), if any; nothing for other formats, whose carry is under one sample.

        At most one 8 kHz sample: call it at a response's end to send every sample the
        model made, or skip it and lose 125 us at most.
        """
        count = len(self._pending) // _PCM_SAMPLE_BYTES
        if count == 0 or not self._g711_8k:
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
        table = _ENCODE[self._format.encoding]
        return bytes(table[samples.astype(np.int16).view(np.uint16)].tobytes())


class AppendDecoder:
    """A session's appends as pcm16 24 kHz: each in its own format where it names one (the
    seed's per-append ``format`` and ``sample_rate_hz``), else in the session's.

    One :class:`InputDecoder` streams while the appends' format stays the same; another
    format starts a new one (its filter starts from silence).
    """

    __slots__ = ("_decoder", "_session")

    def __init__(self, session: AudioFormat) -> None:
        """Decode appends that name no format from ``session``, the session's input format."""
        self._session = session
        self._decoder = InputDecoder(session)

    def configure(self, session: AudioFormat) -> None:
        """The session's input format is now ``session``."""
        if session != self._session:  # the same one stays the same object: see decode
            self._session = session

    def decode(self, audio: bytes, name: str | None, rate: int | None) -> bytes | Refusal:
        """The pcm16 24 kHz samples of one append, or why it is refused: the seed's
        ``unsupported_audio_format`` and ``bad_event`` (see :func:`append_format`), and for
        audio that ends inside a sample its ``bad_audio``, or GA's ``invalid_value`` where
        the append is GA's (no format or rate of its own, in a GA ``audio/pcm`` session).
        A refused append changes nothing: the stream stays aligned on whole samples."""
        decoder = self._decoder
        if (name is None and rate is None and decoder.format is self._session
                and not len(audio) % decoder.sample_bytes):
            # Every GA append: in the session's format, streaming on, in one call.
            return audio if decoder.identity else decoder.decode(audio)
        if not audio:
            return audio
        fmt = self._session if name is None and rate is None else append_format(
            name, rate, self._session)
        if isinstance(fmt, Refusal):
            return fmt
        if len(audio) % fmt.bytes_per_sample:
            if name is None and rate is None and fmt == AudioFormat.PCM24K:
                return BROKEN_SAMPLE
            return Refusal(code=RefusalCode.BAD_AUDIO, param="audio",
                           message=f"{fmt.encoding.name.lower()} audio must be whole "
                                   f"{fmt.bytes_per_sample}-byte samples, got {len(audio)} "
                                   "bytes")
        if fmt != self._decoder.format:
            self._decoder = InputDecoder(fmt)
        return self._decoder.decode(audio)
