"""Real ``serve`` and ``worker`` processes refuse each bad setting: exit 2, one line naming it.

The refusals come before any connection is made, so no Redis is needed for them (the URLs
point at a closed port); the one case that must start shows a flag beating a bad variable.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest
from redis import Redis

from store.embedded import free_port, start_server
from store.keys import WORKER_DIRECTORY
from tests.e2e.stack import wait_for

pytestmark = pytest.mark.timeout(120)

# A Redis nobody listens on: a process that got past its settings would hang or fail here.
UNREACHABLE = "redis://127.0.0.1:9/0"

CASES: list[tuple[str, dict[str, str], list[str], str]] = [
    ("serve", {"DUPLEX_GATEWAY_PORT": "99999"}, [], "DUPLEX_GATEWAY_PORT=99999"),
    ("serve", {}, ["--port", "70000"], "--port 70000"),
    ("serve", {"DUPLEX_GATEWAY_REDIS_URL": "http://x"}, [], "DUPLEX_GATEWAY_REDIS_URL=http"),
    ("serve", {}, ["--redis-url", "http://x"], "--redis-url http"),
    ("serve", {"DUPLEX_GATEWAY_FIRST_MESSAGE_TIMEOUT_S": "nan"}, [],
     "DUPLEX_GATEWAY_FIRST_MESSAGE_TIMEOUT_S=nan"),
    ("serve", {"DUPLEX_GATEWAY_INPUT_LOG_MAX_BYTES": "10"}, [],
     "DUPLEX_GATEWAY_INPUT_LOG_MAX_BYTES=10"),
    ("worker", {"DUPLEX_GATEWAY_SLOTS": "0"}, [], "DUPLEX_GATEWAY_SLOTS=0"),
    ("worker", {}, ["--slots", "0"], "--slots 0"),
    ("worker", {}, ["--metrics-port", "70000"], "--metrics-port 70000"),
    ("worker", {"DUPLEX_GATEWAY_TICK_BUDGET_FRACTION": "2"}, [],
     "DUPLEX_GATEWAY_TICK_BUDGET_FRACTION=2"),
    ("worker", {"DUPLEX_GATEWAY_HEARTBEAT_TTL_S": "0.5"}, [], "DUPLEX_GATEWAY_HEARTBEAT_TTL_S"),
    ("worker", {}, ["--backend", "tensorrt"], "--backend tensorrt"),
    ("worker", {}, ["--drain-timeout", "inf"], "--drain-timeout inf"),
    # No machine has a 65th GPU: refused with or without CUDA, once torch is asked.
    ("worker", {}, ["--backend", "moshi", "--device", "cuda:64"], "--device cuda:64"),
    # dev reads the gateway's and the worker's variables, and checks them before it starts any.
    ("dev", {"DUPLEX_GATEWAY_SLOTS": "0"}, [], "DUPLEX_GATEWAY_SLOTS=0"),
    ("dev", {"DUPLEX_GATEWAY_PORT": "99999"}, [], "DUPLEX_GATEWAY_PORT=99999"),
    ("dev", {}, ["--port", "-1"], "--port -1"),
]


def settings_env(extra: dict[str, str]) -> dict[str, str]:
    """This environment without any DUPLEX_GATEWAY_* of its own, plus ``extra``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DUPLEX_GATEWAY_")}
    return {**clean, "DUPLEX_GATEWAY_REDIS_URL": UNREACHABLE, **extra}


@pytest.mark.parametrize(("command", "env", "flags", "named"), CASES,
                         ids=[case[3] for case in CASES])
def test_a_bad_setting_stops_the_process_with_one_line(command: str, env: dict[str, str],
                                                       flags: list[str], named: str) -> None:
    """The process exits 2 at once, its stderr one line that starts with what was refused."""
    done = subprocess.run([sys.executable, "-m", "duplex_gateway", command, *flags],
                          env=settings_env(env), capture_output=True, text=True, timeout=90,
                          check=False)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"duplex-gateway: {named}"), lines[0]
    assert "expected" in lines[0] or "can use" in lines[0], lines[0]


def test_a_flag_beats_a_bad_variable_and_the_worker_serves() -> None:
    """SLOTS=0 and a bad REDIS_URL in the environment do not stop a worker given both flags."""
    server = start_server("auto")
    env = settings_env({"DUPLEX_GATEWAY_SLOTS": "0", "DUPLEX_GATEWAY_REDIS_URL": "http://x"})
    worker = subprocess.Popen([sys.executable, "-m", "duplex_gateway", "--log-level", "warning",
                               "worker", "--redis-url", server.url, "--slots", "1"],
                              env=env, stderr=subprocess.PIPE, text=True)
    redis = Redis.from_url(server.url)
    try:
        wait_for(lambda: bool(redis.zcard(WORKER_DIRECTORY)) or worker.poll() is not None,
                 "the worker's registration")
        assert worker.poll() is None, worker.stderr.read() if worker.stderr else ""
    finally:
        redis.close()
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=60)
        server.stop()


def test_dev_listens_on_the_port_its_variable_names() -> None:
    """`dev` without --port serves on DUPLEX_GATEWAY_PORT (its URL line says where)."""
    port = free_port()
    dev = subprocess.Popen([sys.executable, "-m", "duplex_gateway", "--log-level", "warning",
                            "dev"], env=settings_env({"DUPLEX_GATEWAY_PORT": str(port)}),
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert dev.stdout is not None
        banner = dev.stdout.readline()  # printed once the stack serves, or EOF if it failed
        assert re.search(rf"ws://127\.0\.0\.1:{port}/v1/realtime", banner), banner
    finally:
        dev.send_signal(signal.SIGTERM)
        dev.communicate(timeout=60)
