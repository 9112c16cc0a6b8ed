"""A Moshi slot's context as step records, and the slot rebuilt from them
(docs/design/hand-over.md, "Moshi's context").

After a step a slot is a function of what it was given and what it sampled: the user's audio
(through Mimi's encoder), the tokens the temporal step read (the text token, Moshi's codes and
the user's, each at its delay), the frames it decoded (through Mimi's decoder), how often its
sampling generator drew, and the text stream's context. A step's record keeps these for that
step, and the delay ring and the counters as the step left them. Replaying the records on a
fresh slot, teacher-forced (the recorded tokens fed to the temporal step, nothing sampled, the
depth transformer skipped: it keeps nothing from one step to the next), puts every cache where
the recording slot's was: Mimi's conv tails and transformer rings, the temporal KV ring, the
generator (drawn as often), then the ring, the counters and the text context are copied.

A record older than the codec's reach is kept compact (:func:`compact_record`): the step's
position and the tokens its temporal step read, 40 bytes, which rebuild the temporal
transformer's context over its whole window; Mimi's caches and the rest are rebuilt from the
whole records that follow (its rings placed at their positions, its older history lost).

The input is kept as PCM16 where the frame is exactly that (a client's PCM16 at 24 kHz,
every frame the worker gives a slot unresampled), as float32 otherwise, so the rebuilt
encoder hears what the recording one heard, bit for bit. Records that do not reach back to
the slot's first step rebuild it from their first (its older context lost, its rings placed
at the right positions): exact only within the whole records (the backend's
``codec_steps``), the temporal context within all of them (its ``resume_steps``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

__all__ = ["RecordShape", "StepRecord", "TokenRecord", "compact_record", "decode_record",
           "encode_record"]

_VERSION = 1
# version, flags, text-context length, offset after the step, generator seed, muted frames
_HEADER = struct.Struct("<BBHIqI")
_FRAME_DECODED = 1  # flags: the step decoded a frame
_PCM_FLOAT = 2  # flags: the input is float32 (else PCM16)
_TOKEN = np.dtype("<i4")
# A compact record: version, flags (_COMPACT, _WIDE), the offset after the step; then the
# tokens the temporal step read, as int16 unless one does not fit (_WIDE: int32).
_COMPACT_HEADER = struct.Struct("<BBI")
_COMPACT = 4
_WIDE = 8


@dataclass(frozen=True, slots=True)
class RecordShape:
    """The sizes a backend's records have: what a record is checked against."""

    codebooks: int
    ring_size: int
    samples: int

    @property
    def streams(self) -> int:
        """Token streams the temporal step reads: text, Moshi's codebooks, the user's."""
        return 1 + 2 * self.codebooks


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step of a slot, as the rebuild replays it.

    Attributes:
        offset: the slot's temporal position after the step (1 after its first).
        seed: the seed its sampling generator was opened with.
        muted: frames it still plays as silence after the step (a stopped response's).
        lm_input: the tokens the temporal step read, one per stream.
        frame: the text token and codes of the frame the step decoded (None: none yet).
        ring: the delay ring after the step, stream by stream.
        text_context: the text stream's detokenizing context after the step.
        pcm: the step's input frame.
    """

    offset: int
    seed: int
    muted: int
    lm_input: tuple[int, ...]
    frame: tuple[int, ...] | None
    ring: tuple[int, ...]
    text_context: tuple[int, ...]
    pcm: np.ndarray


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """A step kept compact: what rebuilds the temporal transformer's context.

    Attributes:
        offset: the slot's temporal position after the step.
        lm_input: the tokens the temporal step read, one per stream.
    """

    offset: int
    lm_input: tuple[int, ...]


def compact_record(data: bytes, shape: RecordShape) -> bytes:
    """A whole record made compact (a compact one as it is).

    Raises:
        ValueError: not a record of a slot of this shape.
    """
    if _checked_flags(data) & _COMPACT:
        _decode_compact(data, data[1], shape)
        return data
    _, offset, _, _, _ = _whole_layout(data, shape)  # its audio is neither read nor copied
    tokens = np.frombuffer(data, dtype=_TOKEN, count=shape.streams, offset=_HEADER.size)
    wide = bool(tokens.max(initial=0) > 32767 or tokens.min(initial=0) < -32768)
    packed = tokens.astype("<i4" if wide else "<i2").tobytes()
    return _COMPACT_HEADER.pack(_VERSION, _COMPACT | (_WIDE if wide else 0), offset) + packed


def encode_record(record: StepRecord) -> bytes:
    """The record's bytes (little-endian: the header, the tokens as int32, the input)."""
    pcm16 = np.round(record.pcm * 32768.0)
    exact = bool(np.all(np.abs(pcm16) <= 32767)
                 and np.array_equal(pcm16 / 32768.0, record.pcm.astype(np.float64)))
    flags = (_FRAME_DECODED if record.frame is not None else 0) | (0 if exact else _PCM_FLOAT)
    tokens = np.array([*record.lm_input, *(record.frame or ()), *record.ring,
                       *record.text_context], dtype=_TOKEN)
    pcm = pcm16.astype("<i2") if exact else record.pcm.astype("<f4")
    return b"".join((_HEADER.pack(_VERSION, flags, len(record.text_context), record.offset,
                                  record.seed, record.muted), tokens.tobytes(), pcm.tobytes()))


def decode_record(data: bytes, shape: RecordShape) -> StepRecord | TokenRecord:
    """The record ``data`` holds, whole or compact, checked against ``shape``.

    Raises:
        ValueError: not a record of a slot of this shape.
    """
    flags = _checked_flags(data)
    if flags & _COMPACT:
        return _decode_compact(data, flags, shape)
    _, offset, seed, muted, count = _whole_layout(data, shape)
    frame = 1 + shape.codebooks if flags & _FRAME_DECODED else 0
    sample = np.dtype("<f4") if flags & _PCM_FLOAT else np.dtype("<i2")
    tokens = np.frombuffer(data, dtype=_TOKEN, count=count, offset=_HEADER.size).tolist()
    pcm = np.frombuffer(data, dtype=sample, offset=_HEADER.size + count * _TOKEN.itemsize)
    at = shape.streams + frame
    ring_end = at + shape.streams * shape.ring_size
    return StepRecord(
        offset=offset, seed=seed, muted=muted, lm_input=tuple(tokens[:shape.streams]),
        frame=tuple(tokens[shape.streams:at]) if frame else None,
        ring=tuple(tokens[at:ring_end]), text_context=tuple(tokens[ring_end:]),
        pcm=(pcm.astype(np.float32) if flags & _PCM_FLOAT
             else (pcm.astype(np.float32) / np.float32(32768.0))))


def _checked_flags(data: bytes) -> int:
    """The flags of a record of this version (whole or compact)."""
    if len(data) < _COMPACT_HEADER.size:
        raise ValueError(f"a Moshi step record of {len(data)} bytes is shorter than its header")
    if data[0] != _VERSION:
        raise ValueError(f"a Moshi step record of version {data[0]}, not {_VERSION}")
    return data[1]


def _whole_layout(data: bytes, shape: RecordShape) -> tuple[int, int, int, int, int]:
    """A whole record's text-context length, offset, seed, muted frames and token count,
    its size checked against ``shape``."""
    if len(data) < _HEADER.size:
        raise ValueError(f"a Moshi step record of {len(data)} bytes is shorter than its header")
    _, flags, context, offset, seed, muted = _HEADER.unpack_from(data)
    frame = 1 + shape.codebooks if flags & _FRAME_DECODED else 0
    count = shape.streams + frame + shape.streams * shape.ring_size + context
    sample = 4 if flags & _PCM_FLOAT else 2
    if len(data) != _HEADER.size + count * _TOKEN.itemsize + shape.samples * sample or offset < 1:
        raise ValueError(f"a Moshi step record of {len(data)} bytes (offset {offset}) is not"
                         f" one of a slot of {shape.codebooks} codebooks and"
                         f" {shape.samples}-sample frames")
    return context, offset, seed, muted, count


def _decode_compact(data: bytes, flags: int, shape: RecordShape) -> TokenRecord:
    token = np.dtype("<i4") if flags & _WIDE else np.dtype("<i2")
    (_, _, offset) = _COMPACT_HEADER.unpack_from(data)
    if len(data) != _COMPACT_HEADER.size + shape.streams * token.itemsize or offset < 1:
        raise ValueError(f"a compact Moshi step record of {len(data)} bytes (offset {offset})"
                         f" is not one of a slot of {shape.codebooks} codebooks")
    tokens = np.frombuffer(data, dtype=token, offset=_COMPACT_HEADER.size)
    return TokenRecord(offset=offset, lm_input=tuple(tokens.tolist()))
