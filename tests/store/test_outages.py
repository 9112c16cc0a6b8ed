"""The outage log: one line when an outage has lasted, one when it ends, none per retry."""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
    NoPermissionError,
    ResponseError,
)

from store.errors import StoreUnavailable
from store.outages import OutageLog, is_outage


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


def wrapped(cause: Exception) -> StoreUnavailable:
    """``cause`` as the store raises it: a StoreUnavailable raised from redis-py's error."""
    try:
        raise StoreUnavailable(f"script failed: {cause}") from cause
    except StoreUnavailable as exc:
        return exc


def test_only_redis_not_answering_is_an_outage() -> None:
    """A broken or refused connection, a timeout or a Redis loading its data is an outage; a
    script Redis ran and refused, a missing permission or a bug is not."""
    assert is_outage(wrapped(RedisConnectionError("Connection closed by server.")))
    assert is_outage(wrapped(TimeoutError()))
    assert is_outage(ConnectionRefusedError())
    assert not is_outage(wrapped(ResponseError("ERR user_script:12: attempt to index nil")))
    assert not is_outage(wrapped(NoPermissionError("NOPERM this user has no permissions")))
    assert not is_outage(ValueError("a bug"))


def test_a_refusal_neither_starts_nor_ends_an_outage(caplog: pytest.LogCaptureFixture) -> None:
    """call_failed counts an outage towards the one line and says so; a refusal returns False
    for its caller to log, writes nothing, and does not interrupt an outage in progress."""
    clock = Clock()
    log = OutageLog(logging.getLogger("test.outages"), "127.0.0.1:6379", told_after_s=1.0,
                    clock=clock)
    broken = wrapped(RedisConnectionError("Connection closed by server."))
    refused = wrapped(ResponseError("ERR user_script:12: attempt to index nil"))
    with caplog.at_level(logging.DEBUG, logger="test.outages"):
        assert log.call_failed("input append", refused) is False
        clock.now += 5.0
        assert log.call_failed("input append", refused) is False and not log.lost
        assert log.call_failed("input append", broken) is True and not log.lost
        clock.now += 1.5
        assert log.call_failed("detach", refused) is False
        assert log.call_failed("detach", broken) is True and log.lost
    lines = [record.getMessage() for record in caplog.records]
    assert lines == ["lost Redis at 127.0.0.1:6379: detach failed (the connection broke)"]
