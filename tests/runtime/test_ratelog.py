"""The rate-limited log: one line per cause per interval, the rest counted."""

from __future__ import annotations

import logging

import pytest

from runtime.ratelog import RateLimitedLog, cause_of

LOGGER = "tests.store.ratelog"


class Clock:
    """Monotonic seconds that the test moves by hand."""

    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def log(clock: Clock) -> RateLimitedLog:
    return RateLimitedLog(logging.getLogger(LOGGER), interval_s=10.0, clock=clock)


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The messages written to the test's logger, formatted."""
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_first_line_of_a_cause_is_written_then_repeats_are_held_back(
    log: RateLimitedLog, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Within the interval only the first line of a cause is written; repeats are counted."""
    caplog.set_level(logging.WARNING, LOGGER)
    assert log.warning("bad", "peer %s misbehaved", "a") is True
    clock.now += 9.9
    assert log.warning("bad", "peer %s misbehaved", "b") is False
    assert log.warning("bad", "peer %s misbehaved", "c") is False
    assert lines(caplog) == ["peer a misbehaved"]
    assert log.suppressed("bad") == 2


def test_next_line_after_the_interval_says_how_many_were_suppressed(
    log: RateLimitedLog, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Once the interval is over, the next line is written with the count of those held back,
    and the count starts again from zero."""
    caplog.set_level(logging.WARNING, LOGGER)
    log.warning("bad", "peer %s misbehaved", "a")
    for peer in "bcd":
        log.warning("bad", "peer %s misbehaved", peer)
    clock.now += 10.0
    assert log.warning("bad", "peer %s misbehaved", "e") is True
    clock.now += 10.0
    log.warning("bad", "peer %s misbehaved", "f")
    assert lines(caplog) == [
        "peer a misbehaved",
        "peer e misbehaved (3 similar lines suppressed since the last one)",
        "peer f misbehaved",
    ]
    assert log.suppressed("bad") == 0


def test_causes_are_limited_separately(
    log: RateLimitedLog, caplog: pytest.LogCaptureFixture
) -> None:
    """One noisy cause does not silence another."""
    caplog.set_level(logging.INFO, LOGGER)
    log.warning("one", "first")
    log.warning("one", "first again")
    log.log(logging.INFO, "two", "second")
    assert lines(caplog) == ["first", "second"]
    assert [r.levelno for r in caplog.records if r.name == LOGGER] == [logging.WARNING,
                                                                       logging.INFO]


def test_lines_carry_no_traceback(
    log: RateLimitedLog, caplog: pytest.LogCaptureFixture
) -> None:
    """A line is one line: no exception info, even when written inside an except block."""
    caplog.set_level(logging.WARNING, LOGGER)
    try:
        raise ValueError("boom")
    except ValueError:
        log.warning("bad", "handled")
    (record,) = [r for r in caplog.records if r.name == LOGGER]
    assert record.exc_info is None


def test_remembers_a_bounded_number_of_causes(
    log: RateLimitedLog, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the most recent causes are remembered: the oldest is forgotten first, so it is
    written again at its next occurrence, while a recent one is still held back."""
    caplog.set_level(logging.WARNING, LOGGER)
    for n in range(257):
        log.warning(f"cause-{n}", "line %d", n)
    assert log.warning("cause-0", "again") is True
    assert log.warning("cause-256", "again") is False


def test_interval_must_be_positive() -> None:
    """A zero or negative interval is a configuration mistake, refused at once."""
    with pytest.raises(ValueError, match="positive"):
        RateLimitedLog(logging.getLogger(LOGGER), interval_s=0)


# --------------------------------------------------------------------------- tracebacks


def raised(kind: type[Exception], line: int) -> Exception:
    """An exception raised (so it has a traceback) from one of two places."""
    try:
        if line == 1:
            raise kind("first place")
        raise kind("second place")
    except Exception as exc:
        return exc


@pytest.mark.logs_errors
def test_one_cause_is_logged_once_per_period_then_with_a_count(
        caplog: pytest.LogCaptureFixture) -> None:
    """The first failure is logged with its traceback, repeats in the period are only
    counted, and the next report after the period says how many were skipped."""
    clock = Clock()
    log = RateLimitedLog(logging.getLogger(LOGGER), interval_s=60.0, clock=clock)
    exc = raised(KeyError, 1)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert log.exception("cause", "session s1 failed", exc)
        clock.now += 30
        assert not log.exception("cause", "session s2 failed", exc)
        assert not log.exception("cause", "session s3 failed", exc)
        clock.now += 30
        assert log.exception("cause", "session s4 failed", exc)
    assert [r.getMessage() for r in caplog.records] == [
        "session s1 failed", "session s4 failed (2 similar lines suppressed since the last one)"]
    assert all(r.exc_info is not None and r.exc_info[1] is exc for r in caplog.records)


@pytest.mark.logs_errors
def test_different_causes_are_logged_independently(caplog: pytest.LogCaptureFixture) -> None:
    """Another cause in the same period is logged at once."""
    log = RateLimitedLog(logging.getLogger(LOGGER), interval_s=60.0, clock=Clock())
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert log.exception(("receive", "KeyError"), "a", raised(KeyError, 1))
        assert log.exception(("tick", "KeyError"), "b", raised(KeyError, 1))
        assert not log.exception(("receive", "KeyError"), "c", raised(KeyError, 1))
    assert [r.getMessage() for r in caplog.records] == ["a", "b"]


def test_a_cause_is_the_type_and_the_place_it_was_raised() -> None:
    """The same exception type from the same line is one cause; another line or type is not."""
    assert cause_of(raised(KeyError, 1)) == cause_of(raised(KeyError, 1))
    assert cause_of(raised(KeyError, 1)) != cause_of(raised(KeyError, 2))
    assert cause_of(raised(KeyError, 1)) != cause_of(raised(ValueError, 1))
    assert cause_of(ValueError("never raised"))[0] == "ValueError"


def test_a_lines_extra_fields_reach_its_record_suppressed_count_or_not(
    log: RateLimitedLog, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """``extra`` (the structured log's session_id) is on the record of the first line and of
    the line that reports the suppressed ones, so no per-session line loses its id."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    log.warning("stale", "refused entry of %s", "sess_a", extra={"session_id": "sess_a"})
    log.warning("stale", "refused entry of %s", "sess_a", extra={"session_id": "sess_a"})
    clock.now += 10.0
    log.warning("stale", "refused entry of %s", "sess_b", extra={"session_id": "sess_b"})
    records = [r for r in caplog.records if r.name == LOGGER]
    assert [r.__dict__.get("session_id") for r in records] == ["sess_a", "sess_b"]
    assert "1 similar lines suppressed" in records[1].getMessage()
