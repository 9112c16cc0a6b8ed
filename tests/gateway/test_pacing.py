"""Per-connection pacing: token buckets on a clock the test moves by hand."""

from __future__ import annotations

import pytest

from gateway.protocol.pacing import (
    REAL_TIME_AUDIO_BYTES_PER_S,
    InputPacer,
    PacingLimits,
    TokenBucket,
)

pytestmark = pytest.mark.timeout(10)


def test_a_bucket_allows_one_second_of_burst_then_its_rate() -> None:
    """100/s: the first 100 go at once, the 101st waits 1/100 s; after a pause the burst is
    back, never more than one second of it."""
    bucket = TokenBucket(100, now=0.0)
    assert [bucket.charge(1, 0.0) for _ in range(100)] == [0.0] * 100
    assert bucket.charge(1, 0.0) == pytest.approx(0.01)
    assert bucket.charge(1, 10.0) == 0.0  # ten idle seconds refill one second, not ten
    waits = [bucket.charge(1, 10.0) for _ in range(100)]
    assert waits[98] == 0.0 and waits[99] == pytest.approx(0.01)


def test_a_large_item_puts_the_bucket_in_debt() -> None:
    """An item over the burst is let through and paid for by waiting (never refused here)."""
    bucket = TokenBucket(1000, now=0.0)
    assert bucket.charge(3000, 0.0) == pytest.approx(2.0)
    assert bucket.charge(1, 1.0) == pytest.approx(1.001)
    assert bucket.charge(0, 2.001) == pytest.approx(0.0)


def test_rate_zero_is_unlimited() -> None:
    """A rate of 0 never makes anyone wait."""
    bucket = TokenBucket(0, now=0.0)
    assert all(bucket.charge(10**9, 0.0) == 0.0 for _ in range(10))


def test_the_pacer_waits_for_the_tightest_of_its_three_rates() -> None:
    """Frames, bytes and audio are counted separately; the longest wait wins."""
    limits = PacingLimits(frames_per_s=1000, bytes_per_s=10**9, audio_speed=2)
    pacer = InputPacer(limits, now=0.0)
    second = REAL_TIME_AUDIO_BYTES_PER_S
    # Two seconds of audio fit the burst of a 2x limit; one more second costs half a second.
    assert pacer.charge(frame_bytes=100, audio_bytes=2 * second, now=0.0) == 0.0
    assert pacer.charge(frame_bytes=100, audio_bytes=second, now=0.0) == pytest.approx(0.5)
    # A frame without audio is paced by the frame rate only.
    frames = InputPacer(PacingLimits(frames_per_s=2, bytes_per_s=0, audio_speed=0), now=0.0)
    waits = [frames.charge(frame_bytes=10, audio_bytes=0, now=0.0) for _ in range(3)]
    assert waits == [0.0, 0.0, pytest.approx(0.5)]


def test_audio_at_real_time_is_never_paced() -> None:
    """A client streaming 20 ms chunks in real time, for a minute, never waits."""
    pacer = InputPacer(PacingLimits(frames_per_s=200, bytes_per_s=2 * 1024 * 1024,
                                    audio_speed=1), now=0.0)
    chunk = REAL_TIME_AUDIO_BYTES_PER_S // 50
    waits = [pacer.charge(frame_bytes=1300, audio_bytes=chunk, now=i * 0.02)
             for i in range(3000)]
    assert max(waits) == 0.0
