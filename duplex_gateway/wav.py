"""WAV files for ``duplex-gateway talk``: any rate, channel count and PCM or float depth in,
pcm16 mono 24 kHz (the session's ``audio/pcm``) out, and that format written back.

Pure but for the file reads and writes. Only the standard library is imported at the top (the
``talk`` command's flags are built whenever any command starts); numpy and the resampler are
imported by the functions that convert.
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = ["RATE", "WavAudio", "WavError", "WavFormat", "convert_wav", "parse_wav", "read_wav",
           "write_wav"]

#: What the session speaks: pcm16 little-endian mono at 24 kHz (Realtime ``audio/pcm``).
RATE: Final = 24_000


class WavError(ValueError):
    """The file is not a WAV that talk reads; the message says what it is and what is read."""


_FORMAT_PCM: Final = 0x0001
_FORMAT_FLOAT: Final = 0x0003
_FORMAT_EXTENSIBLE: Final = 0xFFFE
#: The GUID of WAVE_FORMAT_EXTENSIBLE's sub-format, after its first two bytes (the tag).
_SUBFORMAT_TAIL: Final = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
#: Names for the refusal of formats that are seen in the wild.
_CODEC_NAMES: Final = {
    0x0002: "Microsoft ADPCM", 0x0006: "A-law", 0x0007: "mu-law", 0x0011: "IMA ADPCM",
    0x0031: "GSM 6.10", 0x0050: "MPEG", 0x0055: "MP3", 0x0161: "WMA", 0x1610: "AAC",
    0xF1AC: "FLAC",
}
_PCM_BITS: Final = (8, 16, 24, 32)
_FLOAT_BITS: Final = (32, 64)
_MIN_RATE: Final = 1_000
_MAX_RATE: Final = 384_000
_READABLE: Final = ("talk reads integer PCM (8, 16, 24 or 32 bit) and IEEE float (32 or 64"
                    " bit) WAV files")
_CONVERT_HINT: Final = "convert it first, e.g. ffmpeg -i IN -c:a pcm_s16le OUT.wav"


@dataclass(frozen=True, slots=True)
class WavFormat:
    """What a WAV's ``fmt `` chunk says: ``float`` samples (else integer PCM), the channel
    count, the sample rate and the bits of each sample."""

    float: bool
    channels: int
    rate: int
    bits: int

    @property
    def frame_bytes(self) -> int:
        """Bytes of one sample of every channel."""
        return self.channels * self.bits // 8

    def describe(self) -> str:
        """For a person: ``44100 Hz, 2 channels, 16-bit PCM``."""
        kind = "float" if self.float else "PCM"
        channels = "1 channel" if self.channels == 1 else f"{self.channels} channels"
        return f"{self.rate} Hz, {channels}, {self.bits}-bit {kind}"


@dataclass(frozen=True, slots=True)
class WavAudio:
    """A WAV converted for the session: ``pcm16`` LE mono at :data:`RATE`, and its source."""

    pcm16: bytes
    source: WavFormat

    @property
    def duration_s(self) -> float:
        return len(self.pcm16) / (2 * RATE)


def _chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """The RIFF chunks after the ``WAVE`` tag, as ``(id, body)``; a body cut short by the end
    of the file (a writer that never went back to fix the size) is what is there."""
    chunks = []
    at = 12
    while at + 8 <= len(data):
        chunk_id, size = struct.unpack_from("<4sI", data, at)
        body = data[at + 8:at + 8 + size]
        chunks.append((chunk_id, body))
        at += 8 + size + (size & 1)  # bodies are padded to an even length
    return chunks


def _check_riff(data: bytes) -> None:
    if len(data) < 12:
        raise WavError("not a WAV file: shorter than a RIFF header")
    magic, _, form = struct.unpack_from("<4sI4s", data)
    if magic == b"RIFX":
        raise WavError(f"big-endian WAV (RIFX) is not supported; {_CONVERT_HINT}")
    if magic == b"RF64":
        raise WavError(f"RF64 WAV (over 4 GiB) is not supported; {_CONVERT_HINT}")
    if magic != b"RIFF" or form != b"WAVE":
        raise WavError("not a WAV file: no RIFF/WAVE header")


def _format_tag(body: bytes) -> int:
    """The sample format, looking through WAVE_FORMAT_EXTENSIBLE to its sub-format."""
    (tag,) = struct.unpack_from("<H", body)
    if tag != _FORMAT_EXTENSIBLE:
        return int(tag)
    if len(body) < 40 or body[26:40] != _SUBFORMAT_TAIL:
        raise WavError(f"WAVE_FORMAT_EXTENSIBLE with an unknown sub-format; {_READABLE}")
    (sub_tag,) = struct.unpack_from("<H", body, 24)
    return int(sub_tag)


def _parse_format(body: bytes) -> WavFormat:
    if len(body) < 16:
        raise WavError("broken WAV: its fmt chunk is shorter than 16 bytes")
    tag = _format_tag(body)
    _, channels, rate, _, block_align, bits = struct.unpack_from("<HHIIHH", body)
    if tag not in (_FORMAT_PCM, _FORMAT_FLOAT):
        name = _CODEC_NAMES.get(tag, "an unknown encoding")
        raise WavError(f"compressed WAV (format 0x{tag:04x}, {name}) is not supported;"
                       f" {_READABLE}; {_CONVERT_HINT}")
    is_float = tag == _FORMAT_FLOAT
    if bits not in (_FLOAT_BITS if is_float else _PCM_BITS):
        kind = "float" if is_float else "PCM"
        raise WavError(f"{bits}-bit {kind} WAV is not supported; {_READABLE}")
    if channels < 1:
        raise WavError("broken WAV: it has no channels")
    if not _MIN_RATE <= rate <= _MAX_RATE:
        raise WavError(f"a sample rate of {rate} Hz is not supported (talk reads"
                       f" {_MIN_RATE} to {_MAX_RATE} Hz)")
    wav = WavFormat(float=is_float, channels=channels, rate=rate, bits=bits)
    if block_align != wav.frame_bytes:
        raise WavError(f"broken WAV: a frame of {channels} x {bits}-bit samples is"
                       f" {wav.frame_bytes} bytes, its header says {block_align}")
    return wav


def parse_wav(data: bytes) -> tuple[WavFormat, bytes]:
    """The format and the sample bytes (whole frames only) of a WAV file's ``data``.

    Raises:
        WavError: not a RIFF/WAVE file, a compressed or otherwise unsupported encoding, a
            broken header, or no audio.
    """
    _check_riff(data)
    wav: WavFormat | None = None
    for chunk_id, body in _chunks(data):
        if chunk_id == b"fmt ":
            wav = _parse_format(body)
        elif chunk_id == b"data":
            if wav is None:
                raise WavError("broken WAV: its data chunk comes before its fmt chunk")
            usable = len(body) - len(body) % wav.frame_bytes
            if usable == 0:
                raise WavError("the WAV holds no audio")
            return wav, body[:usable]
    if wav is None:
        raise WavError("broken WAV: no fmt chunk")
    raise WavError("broken WAV: no data chunk")


def _samples(wav: WavFormat, payload: bytes) -> Any:
    """The samples as float32 in [-1, 1], shaped ``(frames, channels)``."""
    import numpy as np

    if wav.float:
        values = np.frombuffer(payload, dtype="<f4" if wav.bits == 32 else "<f8")
        values = np.clip(np.nan_to_num(values, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)
    elif wav.bits == 8:  # 8-bit WAV is unsigned, centred on 128
        values = (np.frombuffer(payload, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif wav.bits == 24:
        raw = np.frombuffer(payload, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        unsigned = raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)
        values = ((unsigned ^ 0x800000) - 0x800000) / float(1 << 23)  # sign-extend
    else:
        dtype = "<i2" if wav.bits == 16 else "<i4"
        values = np.frombuffer(payload, dtype=dtype) / float(1 << (wav.bits - 1))
    return values.astype(np.float32).reshape(-1, wav.channels)


def convert_wav(data: bytes) -> WavAudio:
    """A WAV file's bytes as the session's audio: the channels averaged to mono, resampled to
    24 kHz (:func:`_resample`) and quantised to pcm16. 16-bit mono at 24 kHz passes through
    unchanged.

    Raises:
        WavError: see :func:`parse_wav`.
    """
    import numpy as np

    from inference_worker.audio_frames import float_to_pcm16

    wav, payload = parse_wav(data)
    if not wav.float and wav.bits == 16 and wav.channels == 1 and wav.rate == RATE:
        return WavAudio(payload, wav)
    mono = _samples(wav, payload).mean(axis=1, dtype=np.float32)
    return WavAudio(float_to_pcm16(_resample(mono, wav.rate)), wav)


def _resample(mono: Any, rate: int) -> Any:
    """``mono`` at 24 kHz: the polyphase windowed-sinc resampler of
    ``inference_worker.audio_frames``, its filter made longer by the decimation ratio (so 96 kHz
    input is as well anti-aliased as 48 kHz, about 80 dB), fed a second at a time (its work arrays
    grow with the chunk), delay removed."""
    import numpy as np

    from inference_worker.audio_frames import SincResampler

    if rate == RATE:
        return mono
    resampler = SincResampler(rate, RATE, taps_per_phase=24 * max(1, -(-rate // RATE)))
    pieces = [resampler.process(mono[at:at + rate]) for at in range(0, len(mono), rate)]
    pieces.append(resampler.process(np.zeros(resampler.taps, dtype=np.float32)))
    length = len(mono) * RATE // rate
    return np.concatenate(pieces)[resampler.delay:resampler.delay + length]


def read_wav(path: Path) -> WavAudio:
    """:func:`convert_wav` of the file at ``path``.

    Raises:
        WavError: the file cannot be read, or is not a WAV talk reads.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WavError(f"cannot read {path}: {exc.strerror or exc}") from None
    return convert_wav(data)


def write_wav(path: Path, pcm16: bytes) -> None:
    """Write pcm16 mono 24 kHz audio as a WAV, atomically: a reader never sees half a file."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as stream, wave.open(stream, "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(RATE)
            out.writeframes(pcm16)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
