"""The three setups of ``duplex-gateway bench relay`` (:mod:`duplex_gateway.bench.relay`):
the echo, the peer and the project. Each point gets its servers fresh, and a :class:`Target`
that says where its clients connect."""

from __future__ import annotations

import contextlib
import importlib
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from duplex_gateway.bench.kit import (
    start_http_server,
    start_worker,
)
from duplex_gateway.bench.profiling import profiled
from duplex_gateway.bench.spec import (
    Setup,
)

__all__ = ["PEER_SKIPPED", "Target", "peer_unavailable", "script_only_commands", "serve",
           "sweep_setups"]

#: Why the peer is missing from a run, in the table and the JSON.
PEER_SKIPPED: Final = "python-socketio not installed"
# Read commands that the gateway and worker send themselves as well as from scripts.
_ALSO_DIRECT: Final = frozenset({"xrange", "smembers", "zrangebyscore"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """What one point runs against, once its servers are up."""

    setup: Setup
    mode: str  # what the clients speak: "echo", "peer", "gateway" or "frames"
    urls: tuple[str, ...]
    servers: dict[str, int]  # name -> pid
    redis_url: str | None
    script_commands: frozenset[str] = frozenset()
    redis_name: str | None = None
    # name -> where its profile is written (bench relay --profile; every server but Redis).
    profiles: dict[str, Path] = field(default_factory=dict)
    # name -> (its /metrics page, its event loop lag histogram): the project's processes.
    loop_lag: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Read once the window's counters are, while the sessions are still attached.
    while_attached: Callable[[], dict[str, Any]] | None = None


def _ws_url(port: int, path: str = "/v1/realtime") -> str:
    return f"ws://127.0.0.1:{port}{path}"


def _start_redis(stack: contextlib.ExitStack) -> Any:
    from runtime.embedded import start_server

    redis = start_server("auto")
    stack.callback(shutil.rmtree, redis.workdir, True)
    stack.callback(redis.stop)
    return redis


def _profiled_as(name: str, args: list[str], profiles: dict[str, Path], log_dir: Path,
                 profile: bool) -> list[str]:
    """``args``, run under the profiler into ``log_dir`` (noted in ``profiles``) when
    ``profile``: every websocket server and the worker, so each process's calls per chunk
    stand beside the echo's, the baseline of the CPU targets."""
    if not profile:
        return args
    profiles[name] = log_dir / f"{name}.prof"
    return profiled(args, profiles[name])


def _serve_echo(stack: contextlib.ExitStack, setup: Setup, log_dir: Path, *,
                profile: bool = False) -> Target:
    from runtime.embedded import free_port

    port = free_port()
    profiles: dict[str, Path] = {}
    args = _profiled_as("echo", ["duplex_gateway.bench.echo", "--port", str(port)], profiles,
                        log_dir, profile)
    echo = start_http_server(stack, "echo", args, port, log_dir)
    return Target(setup=setup, mode="echo", urls=(_ws_url(port),),
                   servers={"echo": echo.pid}, redis_url=None, profiles=profiles)


def _serve_peer(stack: contextlib.ExitStack, setup: Setup, log_dir: Path, *,
                profile: bool = False) -> Target:
    from runtime.embedded import free_port

    redis = _start_redis(stack)
    urls, servers = [], {}
    profiles: dict[str, Path] = {}
    for number in range(setup.gateways):
        port = free_port()
        name = f"peer{number}"
        args = _profiled_as(name, ["duplex_gateway.bench.peer", "--port", str(port),
                                   "--redis-url", redis.url], profiles, log_dir, profile)
        peer = start_http_server(stack, name, args, port, log_dir)
        urls.append(f"http://127.0.0.1:{port}")
        servers[peer.name] = peer.pid
    return Target(setup=setup, mode="peer", urls=tuple(urls),
                   servers={**servers, "redis": redis.process.pid}, redis_url=redis.url,
                   redis_name=redis.binary.name, profiles=profiles)


def _serve_project(stack: contextlib.ExitStack, setup: Setup, sessions: int,
                   log_dir: Path, *, profile: bool = False) -> Target:
    from runtime.embedded import free_port

    redis = _start_redis(stack)
    profiles: dict[str, Path] = {}
    if profile:
        profiles["worker"] = log_dir / "worker.prof"
    # First: a gateway is ready (/readyz 200) only once a worker is live.
    worker_metrics = free_port()
    worker = start_worker(stack, redis.url, max(sessions, 1), log_dir,
                          profile_to=profiles.get("worker"), metrics_port=worker_metrics)
    loop_lag = {"worker": (f"http://127.0.0.1:{worker_metrics}/metrics",
                           "duplex_worker_event_loop_lag_seconds")}
    urls, servers = [], {}
    for number in range(setup.gateways):
        port = free_port()
        name = f"gateway{number}"
        args = _profiled_as(name, ["duplex_gateway", "--log-level", "warning", "serve",
                                   "--host", "127.0.0.1", "--port", str(port),
                                   "--redis-url", redis.url], profiles, log_dir, profile)
        gateway = start_http_server(stack, name, args, port, log_dir)
        loop_lag[name] = (f"http://127.0.0.1:{port}/metrics",
                          "duplex_gateway_event_loop_lag_seconds")
        urls.append(_ws_url(port))
        servers[gateway.name] = gateway.pid
    return Target(setup=setup, mode="gateway", urls=tuple(urls),
                   servers={**servers, "worker": worker.pid, "redis": redis.process.pid},
                   redis_url=redis.url, script_commands=script_only_commands(),
                   redis_name=redis.binary.name, profiles=profiles, loop_lag=loop_lag)


def serve(stack: contextlib.ExitStack, setup: Setup, sessions: int, log_dir: Path, *,
           profile: bool = False) -> Target:
    """Start the servers of one point (fresh for each point, so no point inherits another's
    sessions, keys or warmed caches) and say where the clients connect; ``profile``: every
    server process but Redis under :mod:`duplex_gateway.bench.profiling`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    if setup.name == "echo":
        return _serve_echo(stack, setup, log_dir, profile=profile)
    if setup.name == "peer":
        return _serve_peer(stack, setup, log_dir, profile=profile)
    return _serve_project(stack, setup, sessions, log_dir, profile=profile)


def peer_unavailable() -> str | None:
    """Why the peer cannot run here (the ``[bench]`` extra is missing), or None."""
    try:
        importlib.import_module("socketio")
        importlib.import_module("aiohttp")
    except ImportError:
        return PEER_SKIPPED
    return None


def sweep_setups(gateways: Sequence[int], *, peer: bool) -> list[Setup]:
    """The series of one run, in the order each session count runs them."""
    setups = [Setup("echo", 1)]
    if peer:
        setups += [Setup("peer", count) for count in gateways]
    return setups + [Setup("project", count) for count in gateways]


def script_only_commands() -> frozenset[str]:
    """Commands that only run inside a call: what the store's Lua scripts run (read from
    ``store.lua``), which the input append's ``MULTI`` also carries (``XADD``, ``SPUBLISH``:
    no process sends them on their own).

    Redis counts a command run inside a script or a transaction like one a client sent, so
    the client-side count (round trips: a script call or a transaction is one) is the total
    less these (and each transaction's ``MULTI``). The reads that the Python code also issues
    itself stay client commands.
    """
    from store import lua

    text = "".join(getattr(lua, name) for name in lua.__all__
                   if isinstance(getattr(lua, name), str))
    called = {name.lower() for name in re.findall(r"redis\.call\('(\w+)'", text)}
    return frozenset(called - _ALSO_DIRECT)
