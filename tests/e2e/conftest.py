"""Fixtures for end-to-end tests: a Redis server and a stack of real processes on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from store.embedded import EmbeddedServer, start_server
from tests.e2e.stack import Stack

# Small timings so expiry and loss show up within a test; every wait polls a condition.
FAST_ENV = {
    "DUPLEX_GATEWAY_DISCONNECT_GRACE_S": "30",
    "DUPLEX_GATEWAY_REAPER_INTERVAL_S": "0.1",
    "DUPLEX_GATEWAY_HEARTBEAT_INTERVAL_S": "0.25",
    "DUPLEX_GATEWAY_HEARTBEAT_TTL_S": "1.0",
    "DUPLEX_GATEWAY_LOG_POLL_INTERVAL_S": "0.5",
}


@pytest.fixture
def e2e_redis() -> Iterator[EmbeddedServer]:
    """A fresh Redis server for one test."""
    server = start_server("auto")
    yield server
    server.stop()


@pytest.fixture
def stack(e2e_redis: EmbeddedServer) -> Iterator[Stack]:
    """An empty stack; the test starts the gateways and workers it needs."""
    running = Stack(redis=e2e_redis, env=dict(FAST_ENV))
    yield running
    running.stop()
