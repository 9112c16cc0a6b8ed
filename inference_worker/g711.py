"""G.711 mu-law and A-law, exactly as ITU-T G.711's classic reference coder does.

mu-law quantises the top 14 bits of a pcm16 sample, A-law the top 13; decoding gives each
code's reconstruction level as pcm16. Both run through lookup tables built once at import
(256 entries to decode, 65,536 to encode), so a chunk costs one numpy indexing pass.

Pure: numpy only, no I/O, no clock.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "ALAW_DECODE",
    "ALAW_ENCODE",
    "ULAW_DECODE",
    "ULAW_ENCODE",
    "alaw_decode",
    "alaw_encode",
    "ulaw_decode",
    "ulaw_encode",
]

_Samples = npt.NDArray[np.int32]
_Codes = npt.NDArray[np.uint8]

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


ULAW_ENCODE: Final = _ulaw_codes(_EVERY_PCM16)
ALAW_ENCODE: Final = _alaw_codes(_EVERY_PCM16)
ULAW_DECODE: Final = _ulaw_levels(_EVERY_CODE).astype("<i2")
ALAW_DECODE: Final = _alaw_levels(_EVERY_CODE).astype("<i2")


def ulaw_encode(pcm16: bytes) -> bytes:
    """G.711 mu-law codes of pcm16 LE samples (an even number of bytes)."""
    return _compand(pcm16, ULAW_ENCODE)


def ulaw_decode(codes: bytes) -> bytes:
    """pcm16 LE samples of G.711 mu-law codes."""
    return bytes(ULAW_DECODE[np.frombuffer(codes, dtype=np.uint8)].tobytes())


def alaw_encode(pcm16: bytes) -> bytes:
    """G.711 A-law codes of pcm16 LE samples (an even number of bytes)."""
    return _compand(pcm16, ALAW_ENCODE)


def alaw_decode(codes: bytes) -> bytes:
    """pcm16 LE samples of G.711 A-law codes."""
    return bytes(ALAW_DECODE[np.frombuffer(codes, dtype=np.uint8)].tobytes())


def _compand(pcm16: bytes, table: _Codes) -> bytes:
    return bytes(table[np.frombuffer(pcm16, dtype="<u2")].tobytes())
