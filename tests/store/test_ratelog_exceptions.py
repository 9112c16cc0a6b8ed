"""The rate-limited log with tracebacks: one traceback per cause per period, the rest counted."""

from __future__ import annotations

import logging

import pytest

from store.ratelog import RateLimitedLog, cause_of

LOGGER = "tests.ratelog"


class Clock:
    """Seconds that the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def raised(kind: type[Exception], line: int) -> Exception:
    """An exception raised (so it has a traceback) from one of two places."""
    try:
        if line == 1:
            raise kind("first place")
        raise kind("second place")
    except Exception as exc:
        return exc


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
