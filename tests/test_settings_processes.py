"""Real ``serve`` and ``worker`` processes refuse each bad setting: exit 2, one line naming it.

The refusals come before any connection is made, so no Redis is needed for them (the URLs
point at a closed port); the one case that must start shows a flag beating a bad variable.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from redis import Redis

from runtime.embedded import free_port, start_server
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
    # Every command reads how to log, and refuses a bad level or format like any setting.
    ("serve", {"DUPLEX_GATEWAY_LOG_LEVEL": "loud"}, [], "DUPLEX_GATEWAY_LOG_LEVEL=loud"),
    ("worker", {"DUPLEX_GATEWAY_LOG_FORMAT": "xml"}, [], "DUPLEX_GATEWAY_LOG_FORMAT=xml"),
    ("dev", {"DUPLEX_GATEWAY_LOG_FORMAT": "xml"}, [], "DUPLEX_GATEWAY_LOG_FORMAT=xml"),
    ("bench", {"DUPLEX_GATEWAY_LOG_LEVEL": "DEBUG"}, ["relay"], "DUPLEX_GATEWAY_LOG_LEVEL=DEBUG"),
]
# The global flags come before the command: (flags, what the refusal starts with).
GLOBAL_CASES = [
    (["--log-level", "loud"], "--log-level loud"),
    (["--log-format", "xml"], "--log-format xml"),
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


@pytest.mark.parametrize("command", ["serve", "worker", "dev"])
@pytest.mark.parametrize(("flags", "named"), GLOBAL_CASES, ids=[c[1] for c in GLOBAL_CASES])
def test_a_bad_global_log_flag_stops_every_command_with_one_line(
        command: str, flags: list[str], named: str) -> None:
    """A bad --log-level or --log-format exits 2 with one line naming the flag."""
    done = run_cli([*flags, command], {})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"duplex-gateway: {named}: expected one of "
        + ("debug, info, warning, error" if "level" in named else "text, json")]


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


# What a bind address refusal says it accepts (runtime.config.BindAddress).
BIND_ADDRESS = ("expected an IPv4 or IPv6 address, or a host name (letters, digits, hyphens,"
                " dots), without a port")
# TEST-NET-1 (RFC 5737): documentation only, never an address of the machine running the tests.
NOT_THIS_MACHINE = "192.0.2.1"

# Kept apart from CASES: every listener's address is checked for its form before anything binds.
BIND_ADDRESS_CASES: list[tuple[str, dict[str, str], list[str], str]] = [
    ("serve", {"DUPLEX_GATEWAY_HOST": "http://127.0.0.1"}, [],
     "DUPLEX_GATEWAY_HOST=http://127.0.0.1"),
    ("serve", {"DUPLEX_GATEWAY_HOST": ""}, [], "DUPLEX_GATEWAY_HOST=''"),
    ("serve", {}, ["--host", "1.2.3.4:80"], "--host 1.2.3.4:80"),
    ("dev", {}, ["--host", "local host"], "--host 'local host'"),
    ("worker", {"DUPLEX_GATEWAY_METRICS_HOST": "[::1]"}, [], "DUPLEX_GATEWAY_METRICS_HOST=[::1]"),
    ("worker", {}, ["--metrics-host", "1.2.3.4:9100"], "--metrics-host 1.2.3.4:9100"),
]


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m duplex_gateway ARGS`` run to its end with ``env`` over a clean environment."""
    return subprocess.run([sys.executable, "-m", "duplex_gateway", *args],
                          env=settings_env(env), capture_output=True, text=True, timeout=90,
                          check=False)


@pytest.mark.parametrize(("command", "env", "flags", "named"), BIND_ADDRESS_CASES,
                         ids=[case[3] for case in BIND_ADDRESS_CASES])
def test_a_malformed_bind_address_stops_the_process_with_one_line(
        command: str, env: dict[str, str], flags: list[str], named: str) -> None:
    """An empty address, spaces, a URL or a port suffix: exit 2, one line saying what is taken."""
    done = run_cli([command, *flags], env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"duplex-gateway: {named}: {BIND_ADDRESS}"], done.stderr


def test_a_metrics_address_of_another_machine_stops_the_worker_when_it_binds() -> None:
    """A well-formed METRICS_HOST this machine lacks is found out binding: exit 2, one line."""
    done = run_cli(["worker", "--metrics-host", NOT_THIS_MACHINE,
                    "--metrics-port", str(free_port())], {})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"duplex-gateway: --metrics-host: cannot listen on"
                               f" {NOT_THIS_MACHINE}:"), lines[0]


@pytest.mark.parametrize("command", ["serve", "dev"])
@pytest.mark.parametrize("unbindable", ["taken port", "address of another machine"])
def test_a_gateway_that_cannot_listen_says_so_in_one_line(command: str, unbindable: str) -> None:
    """A taken port or a HOST this machine lacks ends ``serve`` and ``dev`` before they start
    anything: exit 2, one line naming the flag and the address (no Redis is reached first)."""
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1] if unbindable == "taken port" else free_port()
        host = "127.0.0.1" if unbindable == "taken port" else NOT_THIS_MACHINE
        done = run_cli([command, "--host", host, "--port", str(port)], {})
    finally:
        holder.close()
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    named, advice = (("--port", "choose another port") if unbindable == "taken port"
                     else ("--host", "choose an address of this machine"))
    assert lines[0].startswith(f"duplex-gateway: {named}: cannot listen on {host}:{port}:"), lines
    assert advice in lines[0], lines[0]


def test_dev_hands_its_log_flags_to_its_gateway_and_worker(tmp_path: Path) -> None:
    """`--log-format json --log-level info dev` (a bad variable beside each flag): the gateway
    and the worker it starts log JSON at info too, every line of its stderr a JSON object."""
    errors = tmp_path / "dev.stderr"
    env = settings_env({"DUPLEX_GATEWAY_PORT": "0", "DUPLEX_GATEWAY_LOG_FORMAT": "xml",
                        "DUPLEX_GATEWAY_LOG_LEVEL": "loud"})
    with errors.open("w") as sink:
        dev = subprocess.Popen([sys.executable, "-m", "duplex_gateway", "--log-format", "json",
                                "--log-level", "info", "dev"], env=env,
                               stdout=subprocess.PIPE, stderr=sink, text=True)
    try:
        assert dev.stdout is not None
        banner = dev.stdout.readline()  # printed once the stack serves, or EOF if it failed
        assert "/v1/realtime" in banner, errors.read_text()
    finally:
        dev.send_signal(signal.SIGTERM)
        dev.communicate(timeout=60)
    lines = [json.loads(text) for text in errors.read_text().splitlines() if text.strip()]
    loggers = {line["logger"] for line in lines}
    # The worker's "registered" and uvicorn's start lines are INFO: the level reached them too.
    assert {"inference_worker.worker", "uvicorn.error"} <= loggers, lines
    assert all(set(line) >= {"ts", "level", "logger", "message"} for line in lines), lines
