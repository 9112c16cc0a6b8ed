"""``duplex-gateway status`` against real processes: two gateways, a loopback and a fake
worker, sessions of two tenants attached on each gateway and one detached by a dropped
socket; every figure the command prints (text and ``--json``) is checked against them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest
from redis import Redis
from redis.cluster import RedisCluster

from duplex_client import DuplexClient
from gateway.auth import tenant_of_key
from runtime.embedded import free_port
from store.keys import WORKER_DIRECTORY, SessionKeys, WorkerKeys, worker_of_session
from tests.e2e.stack import Stack, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

K1, K2 = "key-one", "key-two"
#: The heartbeat TTL the stack's processes run with (tests/e2e/conftest.py's FAST_ENV).
HEARTBEAT_TTL_MS = 1_000


def status_command(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the real ``duplex-gateway status`` command."""
    return subprocess.run([sys.executable, "-m", "duplex_gateway", "status", *args],
                          capture_output=True, text=True, timeout=60, check=False)


def listed(client: Redis | RedisCluster) -> set[str]:
    """The worker ids in the directory."""
    members: Any = client.zrange(WORKER_DIRECTORY, 0, -1)
    return {member.decode() for member in members}


def record_field(client: Redis | RedisCluster, key: str, name: str) -> str | None:
    """One field of a hash, as text (None: missing)."""
    value: Any = client.hget(key, name)
    return None if value is None else str(value.decode())


@dataclass(frozen=True, slots=True)
class Deployment:
    """What the test set up, to check the command's figures against."""

    fake_worker: str
    loopback_worker: str
    #: session id -> (tenant, gateway id; "" for the detached one)
    sessions: dict[str, tuple[str, str]]


async def open_on(url: str, key: str) -> DuplexClient:
    """A new session through the gateway at ``url`` under API key ``key``."""
    return await DuplexClient.connect(url, api_key=key)


async def set_up(stack: Stack, reader: Redis | RedisCluster) -> tuple[Deployment,
                                                                     list[DuplexClient]]:
    """Two gateways; a fake worker with one session (K1, gateway one), then a loopback worker
    (more free slots, so it gets the rest): K1 and K2 through gateway one and two, and a K2
    session whose socket is dropped, left detached."""
    stack.env["DUPLEX_GATEWAY_API_KEYS"] = f"{K1},{K2}"
    one, two = stack.gateway(), stack.gateway()
    stack.worker(slots=4, backend="fake")
    (fake,) = listed(reader)
    clients = [await open_on(one.ws_url, K1)]
    stack.worker(slots=8, backend="loopback")
    (loopback,) = listed(reader) - {fake}
    clients += [await open_on(one.ws_url, K1), await open_on(two.ws_url, K2),
                await open_on(two.ws_url, K2)]
    dropped = clients[-1]
    await dropped.drop_connection()
    ids = [str(client.session_id) for client in clients]
    assert [worker_of_session(sid) for sid in ids] == [fake, loopback, loopback, loopback]
    wait_for(lambda: record_field(reader, SessionKeys(ids[-1]).record, "state") == "detached",
             "the dropped session to be detached")
    # The fake's engine steps its open slot: wait until a heartbeat carried a p99.
    wait_for(lambda: (record_field(reader, WorkerKeys(fake).record, "tick_p99_ms") or "idle")
             not in ("", "idle"), "a p99 tick time from the fake worker")
    sessions = {sid: (tenant_of_key(key),
                      record_field(reader, SessionKeys(sid).record, "gw") or "")
                for sid, key in zip(ids, (K1, K1, K2, K2), strict=True)}
    return Deployment(fake_worker=fake, loopback_worker=loopback, sessions=sessions), clients


async def test_status_reports_every_worker_and_session_figure(stack: Stack) -> None:
    """``status --json`` and the text tables show both workers (state, backend, slots used,
    a p99 tick only for the fake, a fresh heartbeat), sessions per state, per tenant and per
    gateway exactly as set up: 3 attached (two through gateway one, one through two), 1
    detached (held by no gateway), 2 per tenant."""
    reader = stack.reader()
    deployment, clients = await set_up(stack, reader)
    gateway_one = deployment.sessions[next(iter(deployment.sessions))][1]
    gateway_two = next(gw for _, gw in deployment.sessions.values() if gw not in ("",
                                                                                gateway_one))
    assert sum(gw == "" for _, gw in deployment.sessions.values()) == 1
    fake, loopback = deployment.fake_worker, deployment.loopback_worker

    answer = await asyncio.to_thread(status_command, "--redis-url", stack.url, "--json")
    assert answer.returncode == 0, answer.stderr
    document = json.loads(answer.stdout)
    workers = {worker["id"]: worker for worker in document["workers"]}
    assert set(workers) == {fake, loopback}
    assert {k: workers[fake][k] for k in ("state", "backend", "slots", "used", "engine")} == {
        "state": "live", "backend": "fake", "slots": 4, "used": 1, "engine": True}
    assert {k: workers[loopback][k] for k in ("state", "backend", "slots", "used", "engine",
                                              "tick_p99_ms")} == {
        "state": "live", "backend": "loopback", "slots": 8, "used": 3, "engine": False,
        "tick_p99_ms": None}
    assert isinstance(workers[fake]["tick_p99_ms"], float)
    assert workers[fake]["tick_p99_ms"] > 0
    assert (workers[fake]["models"], workers[loopback]["models"]) == (["fake"], ["loopback"])
    assert document["models"] == {
        "fake": {"workers": 1, "admitting": 1, "slots": 4, "used": 1, "free": 3},
        "loopback": {"workers": 1, "admitting": 1, "slots": 8, "used": 3, "free": 5}}
    assert workers[fake]["sessions"] == {"attached": 1, "detached": 0}
    assert workers[loopback]["sessions"] == {"attached": 2, "detached": 1}
    for worker in workers.values():  # live: beat within its TTL
        assert 0 <= worker["heartbeat_age_ms"] <= HEARTBEAT_TTL_MS
    t1, t2 = tenant_of_key(K1), tenant_of_key(K2)
    assert document["sessions"] == {
        "total": 4, "by_state": {"attached": 3, "detached": 1},
        "by_tenant": {t1: 2, t2: 2}, "by_gateway": {gateway_one: 2, gateway_two: 1}}

    text = await asyncio.to_thread(status_command, "--redis-url", stack.url)
    assert text.returncode == 0, text.stderr
    rows = {line.split()[0]: line.split() for line in text.stdout.splitlines() if line}
    assert rows[fake][1:5] == ["live", "fake", "fake", "1/4"]
    assert float(rows[fake][5]) > 0
    assert rows[loopback][1:6] == ["live", "loopback", "loopback", "3/8", "-"]
    for worker_id in (fake, loopback):
        assert 0 <= float(rows[worker_id][6]) <= HEARTBEAT_TTL_MS / 1000
    # Per model: workers, admitting, sessions/slots, free slots.
    assert (rows["fake"], rows["loopback"]) == (["fake", "1", "1", "1/4", "3"],
                                                ["loopback", "1", "1", "3/8", "5"])
    assert (rows["attached"], rows["detached"], rows["total"]) == (
        ["attached", "3"], ["detached", "1"], ["total", "4"])
    assert (rows[t1], rows[t2]) == ([t1, "2"], [t2, "2"])
    assert (rows[gateway_one], rows[gateway_two]) == ([gateway_one, "2"], [gateway_two, "1"])
    for client in clients:
        await client.aclose()
    reader.close()


def test_unreachable_redis_is_one_line_and_exit_1() -> None:
    """Nothing listening at the URL: exit status 1, one line on stderr naming the URL (its
    password left out), nothing on stdout."""
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    answer = status_command("--redis-url", url, "--timeout", "5")
    assert answer.returncode == 1
    assert answer.stdout == ""
    lines = answer.stderr.splitlines()
    assert len(lines) == 1, answer.stderr
    assert lines[0].startswith("duplex-gateway status: cannot read Redis at redis://***@127.")
    assert "hunter2" not in answer.stderr


def test_a_bad_url_is_refused_with_exit_2() -> None:
    """A URL of no Redis kind: exit status 2 and one line naming the flag."""
    answer = status_command("--redis-url", "http://example.invalid/")
    assert answer.returncode == 2
    assert answer.stderr.count("\n") == 1 and "--redis-url" in answer.stderr
