"""Per-connection input pacing: token buckets that say how long to wait, with no clock of
their own.

A connection may not make the gateway, Redis and the worker do unbounded work: frames, frame
bytes and input audio each have a rate per connection. A sender over a rate is not refused
(an audio stream sent faster than real time is legitimate: a file, a backlog after a resume);
it is *paced*: the driver reads its next frame only once the buckets allow, so the socket's
flow control (TCP) slows the sender and nothing queues up unbounded in between.

Each bucket holds one second of its rate as burst, and may go into debt by one large item
(a 1 MiB frame at 512 KiB/s waits 2 s), so a single frame is never refused for its size here
(the frame-size limit does that).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["REAL_TIME_AUDIO_BYTES_PER_S", "InputPacer", "PacingLimits", "TokenBucket"]

#: One second of the Realtime API's input audio: 24 kHz, 16-bit, mono.
REAL_TIME_AUDIO_BYTES_PER_S = 24_000 * 2


class TokenBucket:
    """A rate with one second of burst; :meth:`charge` answers how long the caller must wait.

    Args:
        rate: units per second; 0 or less: unlimited (never waits).
        now: the current time, in seconds on any monotonic clock.
    """

    __slots__ = ("_last", "_rate", "_tokens")

    def __init__(self, rate: float, now: float) -> None:
        self._rate = rate
        self._tokens = rate  # a connection starts with its full burst
        self._last = now

    def charge(self, amount: float, now: float) -> float:
        """Take ``amount`` units at ``now``; the seconds until the bucket is out of debt."""
        if self._rate <= 0:
            return 0.0
        self._tokens = min(self._rate, self._tokens + (now - self._last) * self._rate)
        self._last = now
        self._tokens -= amount
        return 0.0 if self._tokens >= 0 else -self._tokens / self._rate


@dataclass(frozen=True, slots=True, kw_only=True)
class PacingLimits:
    """The per-connection rates (0: that rate is unlimited)."""

    frames_per_s: float
    bytes_per_s: float
    audio_speed: float  # multiple of real time (REAL_TIME_AUDIO_BYTES_PER_S)


class InputPacer:
    """The three buckets of one connection: frames, frame bytes, input audio bytes."""

    __slots__ = ("_audio", "_bytes", "_frames")

    def __init__(self, limits: PacingLimits, now: float) -> None:
        self._frames = TokenBucket(limits.frames_per_s, now)
        self._bytes = TokenBucket(limits.bytes_per_s, now)
        self._audio = TokenBucket(limits.audio_speed * REAL_TIME_AUDIO_BYTES_PER_S, now)

    def charge(self, *, frame_bytes: int, audio_bytes: int, now: float) -> float:
        """Account for one frame read at ``now``; the seconds to wait before reading the next
        one (0: read on at once)."""
        return max(self._frames.charge(1, now), self._bytes.charge(frame_bytes, now),
                   self._audio.charge(audio_bytes, now) if audio_bytes else 0.0)
