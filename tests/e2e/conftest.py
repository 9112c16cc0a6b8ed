"""Fixtures for end-to-end tests: a Redis server and a stack of real processes on it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from redis import Redis

from runtime.embedded import EmbeddedServer, start_server
from store.keys import WORKER_DIRECTORY
from tests.e2e.served import BACKENDS, FRAMEWORK_MODELS, Served
from tests.e2e.stack import Stack, http_ok, new_log_path, print_tail, wait_for

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


@pytest.fixture
def dev_stack() -> Iterator[str]:
    """`duplex-gateway dev` as a user runs it; yields its websocket base URL."""
    # Its stderr (its children's too) goes to the log folder, scanned for ERROR lines and
    # secrets like a stack's; stdout carries only the URL line.
    log = new_log_path("dev")
    with log.open("wb") as sink:  # the child keeps its own descriptor
        process = subprocess.Popen(
            # dev picks a free port itself: no race with a port chosen here
            [sys.executable, "-m", "duplex_gateway", "--log-level", "warning", "dev",
             "--port", "0", "--backend", "loopback",
             "--served-model-name", ",".join(("loopback", *FRAMEWORK_MODELS))],
            stdout=subprocess.PIPE, stderr=sink, text=True, env=dict(os.environ))
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        match = re.search(r"ws://(\S+)/v1/realtime \(redis (\S+),", banner)
        assert match, banner
        redis = Redis.from_url(match.group(2))
        wait_for(lambda: redis.zcard(WORKER_DIRECTORY) > 0, "the dev worker")
        redis.close()
        wait_for(lambda: http_ok(f"http://{match.group(1)}/readyz"), "the dev gateway")
        yield f"ws://{match.group(1)}/v1"
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()
        print_tail("dev", log)
    assert code == 0, f"dev exited with {code} on SIGTERM"


@pytest.fixture(scope="module")
def cascade_stack() -> Iterator[str]:
    """One gateway and one cascade worker on a fresh Redis, with the product's default timings,
    shared by a module's tests (the models load once); yields its websocket base URL."""
    server = start_server("auto")
    running = Stack(redis=server)
    try:
        gateway = running.gateway()
        running.worker(slots=4, backend="cascade", models=("cascade", *FRAMEWORK_MODELS))
        yield f"ws://127.0.0.1:{gateway.port}/v1"
    finally:
        running.stop()
        server.stop()


@pytest.fixture(params=BACKENDS)
def served(request: pytest.FixtureRequest) -> Served:
    """Each test in turn against the loopback (``dev_stack``, one per test) and the cascade
    (``cascade_stack``, one per module)."""
    backend: str = request.param
    fixture = "dev_stack" if backend == "loopback" else "cascade_stack"
    return Served(backend=backend, base_url=request.getfixturevalue(fixture))
