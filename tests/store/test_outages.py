"""The outage log: one line when an outage has lasted, one when it ends, none per retry."""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from store.outages import OutageLog


class Clock:
    """Monotonic seconds the test steps by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_is_told_once_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    """Failures for less than the threshold say nothing; past it, one line names the duty and
    the reason in plain words; more failures say nothing; the next success says how long it
    lasted; a blip shorter than the threshold is never told."""
    clock = Clock()
    log = OutageLog(logging.getLogger("test.outages"), "127.0.0.1:6379", told_after_s=1.0,
                    clock=clock)
    refused = RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    with caplog.at_level(logging.INFO, logger="test.outages"):
        assert log.failed("heartbeat", refused) is False
        clock.now += 0.5
        assert log.failed("input poll", refused) is False
        clock.now += 0.6
        assert log.failed("heartbeat", refused) is True and log.lost
        for _ in range(50):  # retries at 10 a second for 5 s: nothing more
            clock.now += 0.1
            assert log.failed("heartbeat", refused) is False
        assert log.succeeded() is True and not log.lost
        assert log.succeeded() is False
        assert log.failed("heartbeat", refused) is False  # a blip
        clock.now += 0.5
        assert log.succeeded() is False
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("lost Redis at 127.0.0.1:6379: heartbeat failed (")
    assert "Error 111" not in lines[0]
    assert lines[1] == "Redis at 127.0.0.1:6379 back after 6.1 s"
