"""The ``loopback`` backend: a "model" that answers a user turn by playing its audio back.

It is the load and latency test double of DESIGN.md §4. This module holds how it plays audio
back (:class:`PacedPlayback`): 40 ms chunks at real-time pace. It does no I/O and reads no
clock: time is passed in.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CHUNK_BYTES", "CHUNK_SECONDS", "PacedPlayback"]

# 40 ms per audio delta: small enough for barge-in to feel immediate, big enough to keep the
# number of log entries per second (DESIGN.md §5, Redis commands per session) low.
CHUNK_SECONDS: Final = 0.04
CHUNK_BYTES: Final = 1920
# Tolerance when comparing `now` with a chunk's due time: callers compute times as sums of
# floats (start + k * 0.04), which may land a hair below the exact value.
_EPSILON: Final = 1e-9


class PacedPlayback:
    """Releases a turn's audio in 40 ms chunks at real-time pace.

    The chunk covering ``[t, t + 40 ms)`` of the audio is due at ``start + t``, so the first
    chunk is due at once and the last one when the audio is nearly played out. A late caller
    gets every chunk that is due, in order: the loopback never drops audio to catch up.
    """

    __slots__ = ("_audio", "_next", "_start")

    def __init__(self, audio: bytes, *, start: float) -> None:
        """Prepare ``audio`` (pcm16 24 kHz mono) for playback starting at ``start`` seconds."""
        self._audio = audio
        self._start = start
        self._next = 0  # index of the next chunk to release

    @property
    def finished(self) -> bool:
        """Whether every chunk has been released."""
        return self._next * CHUNK_BYTES >= len(self._audio)

    def next_due(self) -> float | None:
        """When the next chunk is due, or None once every chunk has been released."""
        if self.finished:
            return None
        return self._start + self._next * CHUNK_SECONDS

    def release(self, now: float) -> list[bytes]:
        """Return the chunks due at ``now`` (possibly none), in playback order."""
        chunks: list[bytes] = []
        due = self.next_due()
        while due is not None and now + _EPSILON >= due:
            offset = self._next * CHUNK_BYTES
            chunks.append(self._audio[offset : offset + CHUNK_BYTES])
            self._next += 1
            due = self.next_due()
        return chunks
