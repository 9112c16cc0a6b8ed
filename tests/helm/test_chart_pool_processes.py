"""Two worker pools run as the chart declares them, and sessions land on the pool of the model
they name.

The chart is rendered with two pools of loopback workers (``alpha``; ``beta`` with the alias
``beta-latest``) and a gateway whose default model is ``beta``; the gateway and one worker of
each pool are started from their rendered command, args and environment
(tests/helm/render.py) against a local Redis. Each worker's id is the one it logs at start and
``duplex-gateway status --json`` (run with a worker pod's environment, as ``kubectl exec``
would) lists it with the pool's model names; a session's id names its worker
(``sess_<worker id>.<hex>``), so where each session landed is read from the id.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from runtime.embedded import free_port, start_server
from store.keys import worker_of_session
from tests.e2e.stack import Proc, print_tail, wait_for
from tests.gateway.strict import validate_server_event
from tests.helm.render import (
    Rendered,
    container_env,
    container_ports,
    http_probe,
    render,
    run_container,
    wait_for_probe,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

#: Each pool's model names, as its values give them.
POOLS = {"alpha": ["alpha"], "beta": ["beta", "beta-latest"]}
DEFAULT_MODEL = "beta"
PUSH_TO_TALK: dict[str, Any] = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
_REGISTERED = re.compile(r"worker (w[0-9a-f]{12}) registered")


def chart_values(redis_port: int, gateway_port: int) -> dict[str, Any]:
    """The local Redis as an external one, and two loopback pools, each on its own metrics
    port (pods would have their own addresses; these processes share one)."""
    return {
        "redis": {"mode": "external", "external": {"url": f"redis://127.0.0.1:{redis_port}/0"}},
        "gateway": {"port": gateway_port, "settings": {"default_model": DEFAULT_MODEL}},
        "workerPools": [{"name": name, "models": models, "metricsPort": free_port()}
                        for name, models in POOLS.items()],
    }


@dataclass(frozen=True, slots=True)
class PoolRelease:
    """The rendered chart, its gateway's websocket URL and each pool's worker id."""

    rendered: Rendered
    ws_url: str
    worker_ids: dict[str, str]


def registered_id(proc: Proc) -> str | None:
    """The worker id the process logged when it registered, once it has."""
    found = _REGISTERED.search(proc.output())
    return found.group(1) if found else None


def has_registered(proc: Proc) -> bool:
    return registered_id(proc) is not None


def start(name: str, rendered: Rendered, container: dict[str, Any], variable: str) -> Proc:
    """A container as a local process, its all-addresses listener kept to loopback."""
    declared = {item["name"]: item.get("value") for item in container["env"]}
    assert declared[variable] == "0.0.0.0", declared[variable]
    return run_container(name, rendered, container, overrides={variable: "127.0.0.1"})


@pytest.fixture
def release() -> Iterator[PoolRelease]:
    """Redis, then each pool's worker (waited on through its startup probe, then until it
    has registered) and the gateway (through its readiness probe)."""
    redis = start_server("auto")
    rendered = render(chart_values(redis.port, free_port()))
    procs: list[Proc] = []
    try:
        workers = {}
        for pool in POOLS:
            container = rendered.pool_container(pool)
            workers[pool] = start(f"chart-pool-{pool}", rendered, container,
                                  "DUPLEX_GATEWAY_METRICS_HOST")
            procs.append(workers[pool])
        for pool, worker in workers.items():
            wait_for_probe(worker, http_probe(rendered.pool_container(pool), "startupProbe"),
                           f"the {pool} worker's startup probe")
            wait_for(partial(has_registered, worker), f"the {pool} worker's registration",
                     timeout=30)
        container = rendered.container("gateway")
        gateway = start("chart-pool-gateway", rendered, container, "DUPLEX_GATEWAY_HOST")
        procs.append(gateway)
        wait_for_probe(gateway, http_probe(container, "readinessProbe"),
                       "the gateway's readiness probe")
        port = container_ports(container)["http"]
        yield PoolRelease(rendered, f"ws://127.0.0.1:{port}/v1/realtime",
                          {pool: str(registered_id(worker)) for pool, worker in workers.items()})
    finally:
        for proc in reversed(procs):
            proc.kill()
            if proc.log is not None:
                print_tail(proc.name, proc.log)
        redis.stop()


def fleet_status(rendered: Rendered, pool: str) -> dict[str, Any]:
    """``duplex-gateway status --json`` run with the pool's worker container's environment."""
    env = {"PATH": str(Path(sys.executable).parent), "HOME": "/tmp",
           **container_env(rendered, rendered.pool_container(pool))}
    result = subprocess.run(["duplex-gateway", "status", "--json"], env=env, capture_output=True,
                            text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


async def open_session(url: str) -> dict[str, Any]:
    """Open a session at ``url`` and return its ``session.created``; the connection closes."""
    async with connect(url) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": PUSH_TO_TALK}))
        event: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 10))
        validate_server_event(event)
        await ws.send(json.dumps({"type": "session.close"}))
    return event


def test_status_lists_each_pools_worker_with_its_models(release: PoolRelease) -> None:
    """Each pool's worker is registered under the id it logged, serving its pool's names."""
    workers = {row["id"]: row for row in fleet_status(release.rendered, "alpha")["workers"]}
    assert len(set(release.worker_ids.values())) == len(POOLS)
    for pool, worker_id in release.worker_ids.items():
        assert workers[worker_id]["models"] == POOLS[pool]
        assert workers[worker_id]["backend"] == "loopback"


async def test_sessions_land_on_the_pool_of_their_model(release: PoolRelease) -> None:
    """?model=alpha lands on the alpha pool's worker; beta and its alias on the beta pool's;
    a session naming no model on the gateway's default model's pool (beta)."""
    for query, pool, model in [("?model=alpha", "alpha", "alpha"),
                               ("?model=beta", "beta", "beta"),
                               ("?model=beta-latest", "beta", "beta-latest"),
                               ("", "beta", DEFAULT_MODEL)]:
        created = await open_session(release.ws_url + query)
        assert created["type"] == "session.created", created
        assert worker_of_session(created["session_id"]) == release.worker_ids[pool], query
        assert created["session"]["model"] == model, query
