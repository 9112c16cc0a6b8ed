"""``duplex-gateway bench relay``: a sweep of the relay's cost against a bare echo and a peer.

Three setups, measured in one run, on the same client processes, with the same load:

* **echo**: a bare websocket echo (:mod:`duplex_gateway._echo`, the gateway's own server stack
  with nothing in between) sends every frame back as is;
* **peer**: what a Python team would deploy for one Redis hop and nothing durable: python-socketio
  servers (``AsyncServer`` + ``AsyncRedisManager`` under uvicorn, :mod:`duplex_gateway.bench_peer`)
  that emit each chunk back to its sender's room through the manager. It needs the ``[bench]``
  extra; without it the peer is skipped and the report says so (``"peer": null``);
* **project**: an embedded Redis, G gateways and one loopback worker in stream mode, which sends
  every appended chunk back as a ``response.output_audio.delta`` with the same bytes.

The sweep runs every session count N of ``--sessions`` (10 to 400 by default) for the echo, and
for the peer and the project once per gateway count G of ``--gateways`` (G python-socketio
servers for the peer, G gateways for the project; sessions spread over them in turn), each
point on freshly started servers. Points run by session count, every setup at a count before
the next count, so setups compared at one load ran minutes apart at most.

Each of N sessions streams 20 ms pcm16 chunks (960 bytes at 24 kHz, base64 in
``input_audio_buffer.append``, the same text for the peer's ``audio`` event) in real time on an
absolute clock for S seconds. Sessions start over the first second (the ramp); the first
second of each point is warm-up and left out of every figure. The first 8 bytes of each chunk
carry (session, chunk) so each returned chunk is matched to its send time: round trip =
receive time - send time, both taken in the client process on the system-wide monotonic
clock. The load runs in its own client processes (:func:`_default_clients`, started once with
``spawn`` and reused for every point), whose CPU is reported with every point so the load
generator is never a hidden bottleneck.

Figures per point, from the end of warm-up until every chunk is back:

* round trip p50/p90/p99/max; **added latency** = the setup's round-trip percentile minus the
  echo's at the same session count, and **per direction** half of that. The servers add no
  timestamps of their own (and client and servers could not share a clock anyway), so the
  split is an even one by construction, labelled as such in the table and the JSON;
* CPU seconds of every server process per relayed chunk (``/proc/<pid>/stat``, or psutil when
  installed), summed by tier (websocket servers, worker, Redis, whole stack), the share of it
  spent in user space per process and per tier (the rest is the kernel's: system calls,
  the network stack, scheduling), and the core share of every process, the clients included;
* Redis (peer and project): commands sent and run inside scripts per session-second, bytes in
  and out per session-second, and memory per session. Method: ``INFO commandstats`` counts a
  command a script calls under its own name and the script call (``EVALSHA``) once, and
  ``total_commands_processed`` counts both. Commands that only the store's Lua scripts call
  (read from :mod:`store.lua`) are counted as run inside scripts; everything else as sent,
  including the reads that the gateway and worker also issue themselves (``XRANGE``,
  ``SMEMBERS``, ``ZRANGEBYSCORE``) when a script called them, so "sent" is an upper bound and
  "inside" a lower bound. python-socketio runs no scripts: all of its commands are sent.
  Memory: ``MEMORY USAGE`` of every session's keys while attached (the peer keeps no
  per-session keys: its figure is every key's memory over N);
* **real time**: a point keeps up when no chunk was lost (nor duplicated, corrupt, misrouted,
  a session failed to open or was dropped), the p99 round trip is below one chunk interval
  (20 ms) and every server process used less than one core. The most sessions a setup holds
  in real time is the largest swept count at which it, and every smaller swept count, kept up
  (``None`` when the smallest did not).

Numbers go to a plain-text table and a JSON file (by default
``bench-results/relay-<UTC time>.json``), with two SVG plots next to it: whole-stack CPU per
chunk and p99 round trip against sessions, for the project, the echo and the peer. While it
runs, a progress bar goes to stderr when stderr is a terminal (nothing otherwise).

The table compares the project's points with the design targets (:data:`TARGETS_NOTE`), up to
200 sessions: at most 2 ms added per direction at p99, gateway CPU per chunk at most twice the
echo's, worker CPU per chunk at most the echo's, the whole stack at most the peer's, at most 30
Redis commands sent and 150 run inside scripts per session-second, at most 30 us of Redis CPU per
chunk and 256 KiB of Redis memory per session. Each is ``met`` or ``MISSED`` for this run, on
this machine, at this load: a finding, not a failure.

The benchmark asserts nothing about speed: it exits 0 when it ran and every chunk came back,
1 when chunks were lost (or came back corrupt, duplicated or to the wrong session), 2 when it
could not run and 130 when interrupted (Ctrl-C, or SIGTERM from a time limit), after writing
the points it finished, marked ``"interrupted": true``. Every process it started is stopped on
the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib
import math
import multiprocessing
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final, TextIO

from duplex_gateway.bench_kit import (
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    bucket_bounds,
    cpu_snapshot,
    distribution,
    histogram_counts,
    machine_report,
    machine_ticks,
    output_help,
    output_path,
    positive_float,
    positive_int_list,
    receive_from_client,
    sigterm_as_interrupt,
    start_http_server,
    start_worker,
)
from duplex_gateway.bench_load import ClientSpec, LoadSession, SessionLog
from duplex_gateway.bench_profile import START, STOP, calls_per_chunk, profiled
from duplex_gateway.bench_spec import (
    CHUNK_BYTES,
    CHUNK_S,
    DRAIN_S,
    MAX_ERRORS,
    OPEN_TIMEOUT_S,
    RAMP_S,
    BenchError,
    Setup,
)

__all__ = ["add_arguments", "peer_unavailable", "run_relay_bench"]

WARMUP_S: Final = 1.0
#: Sessions one client process drives. Measured: a client process spends 100-150 us of CPU
#: per chunk (send plus receive, mostly the loopback send syscall), so 100 sessions (5,000
#: chunks/s) keep it at 0.5-0.75 of a core, with room to stay on its clock.
SESSIONS_PER_CLIENT: Final = 100
#: The default sweep: the full one.
DEFAULT_SESSIONS: Final = (10, 25, 50, 100, 200, 400)
DEFAULT_GATEWAYS: Final = (1, 2)
#: Why the peer is missing from a run, in the table and the JSON.
PEER_SKIPPED: Final = "python-socketio not installed"

# How long a profiled server may take to write its statistics once told to.
_PROFILE_WRITE_S: Final = 30.0
# Read commands that the gateway and worker send themselves as well as from scripts.
_ALSO_DIRECT: Final = frozenset({"xrange", "smembers", "zrangebyscore"})


def _relay_seconds(text: str) -> float:
    value = positive_float(text)
    if value <= WARMUP_S + CHUNK_S:
        raise argparse.ArgumentTypeError(f"must be more than {WARMUP_S:g} (the warm-up, left "
                                         f"out of every figure), got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``bench relay``."""
    parser.add_argument("--sessions", type=positive_int_list, default=list(DEFAULT_SESSIONS),
                        help="concurrent real-time session counts to sweep, a comma list "
                             "(default: %(default)s)")
    parser.add_argument("--gateways", type=positive_int_list, default=list(DEFAULT_GATEWAYS),
                        help="gateway counts to sweep for the project (the peer runs as many "
                             "python-socketio servers), a comma list (default: %(default)s)")
    parser.add_argument("--seconds", type=_relay_seconds, default=10.0,
                        help="length of each point in seconds, the first one warm-up "
                             "(default: %(default)s)")
    parser.add_argument("--output", help=output_help("relay", plot="its two plots next to it; "))
    parser.add_argument("--profile", action="store_true",
                        help="run every server but Redis (the echo, the peer's servers, the "
                             "gateways, the worker) under cProfile over each point's measured "
                             "window and report Python calls per relayed chunk, also as a "
                             "multiple of the echo's (reproducible, unlike CPU time; this "
                             "run's CPU figures then include the profiler's overhead); "
                             "default: not profiled")


def _session_class(mode: str) -> type[LoadSession]:
    if mode == "peer":
        from duplex_gateway.bench_peer import PeerSession

        return PeerSession
    return LoadSession


async def _drive(conn: Connection, spec: ClientSpec, t0: float) -> None:
    """Run every session of this process, report their logs, close when told to."""
    kind = _session_class(spec.mode)
    sessions = [kind(index, spec, t0) for index in spec.indices]
    await asyncio.gather(*(session.run() for session in sessions))
    conn.send([session.log for session in sessions])
    # Sessions stay open until the parent has read the CPU counters: closing costs CPU too.
    await asyncio.to_thread(conn.recv)
    await asyncio.gather(*(session.close() for session in sessions))
    conn.send("closed")


def _client_main(conn: Connection) -> None:
    """Entry point of one client process: for each point, take its spec, say ready (imports
    done), take the start time, drive; ``None`` ends the process."""
    with contextlib.suppress(KeyboardInterrupt, EOFError, BrokenPipeError):
        conn.send("ready")
        while (spec := conn.recv()) is not None:
            _session_class(spec.mode)  # imported before the clock starts
            conn.send("ready")
            t0: float = conn.recv()
            asyncio.run(_drive(conn, spec, t0))


@dataclass(frozen=True, slots=True)
class RedisCounters:
    """One ``INFO all`` read: commands (all, and calls per command) and bytes on the wire."""

    total: int
    net_in: int
    net_out: int
    calls: dict[str, int]


class _RedisProbe:
    """Reads Redis counters over one connection, opened before the window."""

    def __init__(self, url: str | None) -> None:
        from redis import Redis

        self._client = Redis.from_url(url) if url is not None else None
        if self._client is not None:
            self._client.ping()  # connect now: the handshake's commands stay out of the window

    def counters(self) -> RedisCounters | None:
        """Command and byte counters (one ``INFO all`` command)."""
        if self._client is None:
            return None
        info: dict[str, Any] = self._client.info("all")
        calls = {key[len("cmdstat_"):]: int(value["calls"]) for key, value in info.items()
                 if key.startswith("cmdstat_") and isinstance(value, dict)}
        return RedisCounters(total=int(info["total_commands_processed"]),
                             net_in=int(info["total_net_input_bytes"]),
                             net_out=int(info["total_net_output_bytes"]), calls=calls)

    def session_memory(self, sessions: int, *, per_session_keys: bool) -> dict[str, float] | None:
        """Redis memory per session, read while the sessions are still attached.

        With ``per_session_keys`` (the project): every session's keys (record and logs),
        grouped by session; otherwise (the peer, which keeps no per-session keys) the memory
        of every key over ``sessions``.
        """
        if self._client is None:
            return None
        pattern = "dg:*:s:*" if per_session_keys else "*"
        per_session: dict[bytes, int] = {}
        for key in self._client.scan_iter(match=pattern, count=1000):
            group = key.rsplit(b":", 1)[0] if per_session_keys else b""
            usage = self._client.memory_usage(key, samples=0)
            per_session[group] = per_session.get(group, 0) + int(usage or 0)
        if not per_session_keys:
            mean = per_session.get(b"", 0) / max(1, sessions) / 1024
            return {"sessions": sessions, "mean_kib": mean, "max_kib": mean}
        if not per_session:
            return None
        sizes = sorted(per_session.values())
        return {"sessions": len(sizes), "mean_kib": sum(sizes) / len(sizes) / 1024,
                "max_kib": sizes[-1] / 1024}

    def close(self) -> None:
        """Close the connection."""
        if self._client is not None:
            self._client.close()


@dataclass(slots=True)
class _Window:
    """Counters read at the end of warm-up and once every chunk is back."""

    cpu_before: dict[str, tuple[float, float] | None]  # (user, system) seconds
    redis_before: RedisCounters | None
    cpu_after: dict[str, tuple[float, float] | None] = field(default_factory=dict)
    redis_after: RedisCounters | None = None
    machine_before: tuple[int, int] | None = None
    machine_after: tuple[int, int] | None = None
    session_memory: dict[str, float] | None = None
    wall_s: float = 0.0
    profiles: dict[str, Path] = field(default_factory=dict)  # name -> its written profile
    # name -> its event loop lag histogram's bucket counts (None: not read)
    lag_before: dict[str, dict[float, float] | None] = field(default_factory=dict)
    lag_after: dict[str, dict[float, float] | None] = field(default_factory=dict)


def _round_trips(logs: Sequence[SessionLog], since: float) -> tuple[list[float], int]:
    """Round trips (s) of the chunks sent at or after ``since``, and how many were sent."""
    trips: list[float] = []
    measured = 0
    for log in logs:
        for chunk, sent in enumerate(log.sent):
            if sent < since:
                continue
            measured += 1
            received = log.received.get(chunk)
            if received is not None:
                trips.append(received - sent)
    return trips, measured


def _chunk_counts(logs: Sequence[SessionLog], measured: int, returned: int) -> dict[str, int]:
    sent = sum(len(log.sent) for log in logs)
    received = sum(len(log.received) for log in logs)
    return {
        "sent": sent, "received": received, "lost": sent - received,
        "measured_sent": measured, "measured_received": returned,
        "duplicates": sum(log.duplicates for log in logs),
        "corrupt": sum(log.corrupt for log in logs),
        "misrouted": sum(log.misrouted for log in logs),
        "sessions_failed": sum(1 for log in logs if log.open_s is None),
        "sessions_disconnected": sum(1 for log in logs if log.disconnected),
    }


def _cpu_report(window: _Window, chunks: int) -> dict[str, dict[str, float | None]]:
    """Per process: CPU seconds, per chunk, core share, and the share spent in user space
    (the process's own code and libraries; the rest is the kernel's: system calls, the
    network stack of what it sends, scheduling)."""
    report: dict[str, dict[str, float | None]] = {}
    for name, before in window.cpu_before.items():
        after = window.cpu_after.get(name)
        user = after[0] - before[0] if after is not None and before is not None else None
        system = after[1] - before[1] if after is not None and before is not None else None
        spent = user + system if user is not None and system is not None else None
        per_chunk = spent / chunks * 1e6 if spent is not None and chunks else None
        share = spent / window.wall_s if spent is not None and window.wall_s else None
        report[name] = {"cpu_s": spent, "user_s": user, "system_s": system,
                        "us_per_chunk": per_chunk, "core_share": share,
                        "user_share": user / spent if user is not None and spent else None}
    return report


def _script_only_commands() -> frozenset[str]:
    """Commands that only the store's Lua scripts run (read from ``store.lua``).

    Redis counts a command run inside a script like one a client sent, so the client-side
    count (round trips: a script call is one) is the total less these. The reads that the
    Python code also issues itself stay client commands.
    """
    from store import lua

    text = "".join(getattr(lua, name) for name in lua.__all__
                   if isinstance(getattr(lua, name), str))
    called = {name.lower() for name in re.findall(r"redis\.call\('(\w+)'", text)}
    return frozenset(called - _ALSO_DIRECT)


def _redis_report(window: _Window, session_seconds: float,
                  script_commands: frozenset[str]) -> dict[str, Any] | None:
    before, after = window.redis_before, window.redis_after
    if before is None or after is None:
        return None
    total = after.total - before.total - 1  # less our own INFO
    calls = {name: n - before.calls.get(name, 0) for name, n in after.calls.items()}
    calls["info"] = calls.get("info", 0) - 1
    calls = {name: n for name, n in sorted(calls.items(), key=lambda kv: -kv[1]) if n > 0}
    in_scripts = sum(n for name, n in calls.items() if name in script_commands)
    client = total - in_scripts
    return {"client_commands": client, "per_session_second": client / session_seconds,
            "commands_in_scripts": in_scripts,
            "in_scripts_per_session_second": in_scripts / session_seconds,
            "commands_incl_in_scripts": total,
            "bytes_in_per_session_second": (after.net_in - before.net_in) / session_seconds,
            "bytes_out_per_session_second": (after.net_out - before.net_out) / session_seconds,
            "session_seconds": session_seconds, "calls_by_command": calls}


def _is_server(name: str) -> bool:
    return not name.startswith("client")


def _tier_us(cpu: dict[str, dict[str, float | None]], names: Sequence[str]) -> float | None:
    """CPU per chunk of these processes together; None when one is unknown or none ran."""
    values = [cpu[name]["us_per_chunk"] for name in names]
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


def _tier_names(cpu: dict[str, dict[str, float | None]]) -> dict[str, list[str]]:
    """The server processes of each tier: the websocket servers (echo, peer or gateway
    processes), the worker, Redis, and all of them together (the whole stack)."""
    servers = [name for name in cpu if _is_server(name)]
    return {"whole_stack": servers,
            "websocket_servers": [n for n in servers if n.startswith(("echo", "peer", "gateway"))],
            "worker": [n for n in servers if n == "worker"],
            "redis": [n for n in servers if n == "redis"]}


def _tiers(cpu: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    """CPU per chunk by tier (:func:`_tier_names`)."""
    return {tier: _tier_us(cpu, names) for tier, names in _tier_names(cpu).items()}


def _user_shares(cpu: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    """The user-space share of each tier's CPU; None when a process's is unknown or the tier
    spent none (or has no process)."""
    shares: dict[str, float | None] = {}
    for tier, names in _tier_names(cpu).items():
        users = [cpu[name]["user_s"] for name in names]
        totals = [cpu[name]["cpu_s"] for name in names]
        known = names and None not in users and None not in totals
        total = sum(t for t in totals if t is not None) if known else 0.0
        shares[tier] = sum(u for u in users if u is not None) / total if total else None
    return shares


def _clients_report(cpu: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    shares = {name: entry["core_share"] for name, entry in cpu.items() if not _is_server(name)}
    known = [share for share in shares.values() if share is not None]
    return {"processes": len(shares), "core_share": shares,
            "max_core_share": max(known) if known else None}


def _summarize(target: _Target, logs: Sequence[SessionLog], t0: float, seconds: float,
               window: _Window) -> dict[str, Any]:
    since = t0 + WARMUP_S
    trips, measured = _round_trips(logs, since)
    errors = [e for log in logs for e in log.errors][:MAX_ERRORS]
    opens = [log.open_s for log in logs if log.open_s is not None]
    lags = [lag for log in logs for sent, lag in zip(log.sent, log.lag, strict=True)
            if sent >= since]
    cpu = _cpu_report(window, len(trips))
    summary: dict[str, Any] = {
        "setup": target.setup.name, "gateways": target.setup.gateways, "sessions": len(logs),
        "round_trip_ms": distribution(trips),
        "chunks": _chunk_counts(logs, measured, len(trips)),
        "send_lag_ms": distribution(lags),
        "open_ms": distribution(opens),
        "window_s": window.wall_s,
        "machine_cpu": machine_report(window.machine_before, window.machine_after),
        "cpu": cpu,
        "cpu_us_per_chunk": _tiers(cpu),
        "cpu_user_share": _user_shares(cpu),
        "clients": _clients_report(cpu),
        "redis": _redis_report(window, len(logs) * (seconds - WARMUP_S),
                               target.script_commands),
        "redis_memory_per_session": window.session_memory,
        "event_loop_lag_ms": _loop_lag_report(window),
        "errors": errors,
    }
    if window.profiles:
        summary["python_calls"] = {name: calls_per_chunk(path, max(len(trips), 1))
                                   for name, path in sorted(window.profiles.items())}
    summary["lossless"] = lossless(summary)
    return summary


def lossless(point: dict[str, Any]) -> bool:
    """Every chunk came back once, intact, to its own session; every session stayed open."""
    chunks = point["chunks"]
    return bool(chunks["sent"] > 0 and chunks["lost"] == 0 and chunks["duplicates"] == 0
                and chunks["corrupt"] == 0 and chunks["misrouted"] == 0
                and chunks["sessions_failed"] == 0 and chunks["sessions_disconnected"] == 0)


# ============================================================================ setups


@dataclass(frozen=True, slots=True, kw_only=True)
class _Target:
    """What one point runs against, once its servers are up."""

    setup: Setup
    mode: str  # what the clients speak: "echo", "peer" or "gateway"
    urls: tuple[str, ...]
    servers: dict[str, int]  # name -> pid
    redis_url: str | None
    script_commands: frozenset[str] = frozenset()
    redis_name: str | None = None
    # name -> where its profile is written (bench relay --profile; every server but Redis).
    profiles: dict[str, Path] = field(default_factory=dict)
    # name -> (its /metrics page, its event loop lag histogram): the project's processes.
    loop_lag: dict[str, tuple[str, str]] = field(default_factory=dict)


def _ws_url(port: int, path: str = "/v1/realtime") -> str:
    return f"ws://127.0.0.1:{port}{path}"


def _start_redis(stack: contextlib.ExitStack) -> Any:
    from store.embedded import start_server

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
                profile: bool = False) -> _Target:
    from store.embedded import free_port

    port = free_port()
    profiles: dict[str, Path] = {}
    args = _profiled_as("echo", ["duplex_gateway._echo", "--port", str(port)], profiles,
                        log_dir, profile)
    echo = start_http_server(stack, "echo", args, port, log_dir)
    return _Target(setup=setup, mode="echo", urls=(_ws_url(port),),
                   servers={"echo": echo.pid}, redis_url=None, profiles=profiles)


def _serve_peer(stack: contextlib.ExitStack, setup: Setup, log_dir: Path, *,
                profile: bool = False) -> _Target:
    from store.embedded import free_port

    redis = _start_redis(stack)
    urls, servers = [], {}
    profiles: dict[str, Path] = {}
    for number in range(setup.gateways):
        port = free_port()
        name = f"peer{number}"
        args = _profiled_as(name, ["duplex_gateway.bench_peer", "--port", str(port),
                                   "--redis-url", redis.url], profiles, log_dir, profile)
        peer = start_http_server(stack, name, args, port, log_dir)
        urls.append(f"http://127.0.0.1:{port}")
        servers[peer.name] = peer.pid
    return _Target(setup=setup, mode="peer", urls=tuple(urls),
                   servers={**servers, "redis": redis.process.pid}, redis_url=redis.url,
                   redis_name=redis.binary.name, profiles=profiles)


def _serve_project(stack: contextlib.ExitStack, setup: Setup, sessions: int,
                   log_dir: Path, *, profile: bool = False) -> _Target:
    from store.embedded import free_port

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
    return _Target(setup=setup, mode="gateway", urls=tuple(urls),
                   servers={**servers, "worker": worker.pid, "redis": redis.process.pid},
                   redis_url=redis.url, script_commands=_script_only_commands(),
                   redis_name=redis.binary.name, profiles=profiles, loop_lag=loop_lag)


def _serve(stack: contextlib.ExitStack, setup: Setup, sessions: int, log_dir: Path, *,
           profile: bool = False) -> _Target:
    """Start the servers of one point (fresh for each point, so no point inherits another's
    sessions, keys or warmed caches) and say where the clients connect; ``profile``: every
    server process but Redis under :mod:`duplex_gateway.bench_profile`."""
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


# ============================================================================ clients


class _ClientPool:
    """The load generator: client processes started once and reused for every point."""

    def __init__(self, count: int, stack: contextlib.ExitStack) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conns: list[Connection] = []
        self.pids: dict[str, int] = {}
        for number in range(count):
            parent, child = ctx.Pipe()
            process = ctx.Process(target=_client_main, args=(child,), daemon=True,
                                  name=f"bench-client-{number}")
            process.start()
            stack.callback(_stop_client, process)
            # Closed first on the way out: a client waiting for its next spec then sees EOF.
            stack.callback(parent.close)
            child.close()
            self.conns.append(parent)
            self.pids[f"client{number}"] = process.pid or 0
        for conn in self.conns:
            receive_from_client(conn, START_TIMEOUT_S, "start handshake")

    def start(self, target: _Target, sessions: int, seconds: float, compression: bool) -> float:
        """Give every client its share of the point's sessions; returns the common start."""
        shares = _split(sessions, len(self.conns))
        for conn, indices in zip(self.conns, shares, strict=True):
            conn.send(ClientSpec(urls=target.urls, mode=target.mode, indices=indices,
                                 sessions=sessions, seconds=seconds, compression=compression))
        for conn in self.conns:
            receive_from_client(conn, START_TIMEOUT_S, "ready")
        t0 = time.monotonic() + 0.2
        for conn in self.conns:
            conn.send(t0)
        return t0

    def results(self, deadline: float) -> list[SessionLog]:
        """Every session's log, once every client has finished streaming."""
        logs: list[SessionLog] = []
        for conn in self.conns:
            logs += receive_from_client(conn, deadline - time.monotonic(), "results")
        return logs

    def close_sessions(self) -> None:
        """Tell the clients to close their sessions, and wait until they have."""
        for conn in self.conns:
            conn.send("close")
        for conn in self.conns:
            receive_from_client(conn, STOP_TIMEOUT_S + 2 * OPEN_TIMEOUT_S, "close")

    def stop(self) -> None:
        """End every client process (each then exits on its own)."""
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)


def _split(sessions: int, clients: int) -> list[tuple[int, ...]]:
    """Session indices per client, interleaved so each process gets a spread of start times."""
    return [tuple(range(first, sessions, clients)) for first in range(clients)]


def _stop_client(process: Any) -> None:
    process.join(STOP_TIMEOUT_S)
    if process.is_alive():
        process.terminate()
        process.join(STOP_TIMEOUT_S)
    if process.is_alive():
        process.kill()
        process.join()


def _run_point(pool: _ClientPool, target: _Target, sessions: int, seconds: float,
               compression: bool) -> dict[str, Any]:
    """Drive one point; read counters around the measured window."""
    t0 = pool.start(target, sessions, seconds, compression)
    pids = {**target.servers, **pool.pids}
    with contextlib.ExitStack() as stack:
        probe = _RedisProbe(target.redis_url)
        stack.callback(probe.close)
        time.sleep(max(0.0, t0 + WARMUP_S - time.monotonic()))  # the warm-up: nothing to poll
        began = time.monotonic()
        lag_before = _loop_lag_counts(target)  # outside the CPU window: a scrape costs CPU
        window = _Window(cpu_snapshot(pids), probe.counters(), machine_before=machine_ticks(),
                         lag_before=lag_before)
        _signal_servers(target, START)
        logs = pool.results(t0 + seconds + DRAIN_S + 2 * OPEN_TIMEOUT_S + 10)
        window.cpu_after = cpu_snapshot(pids)
        window.machine_after = machine_ticks()
        window.redis_after = probe.counters()
        window.lag_after = _loop_lag_counts(target)
        _signal_servers(target, STOP)  # after every counter: writing a profile takes a while
        window.profiles = _written_profiles(target)
        window.session_memory = probe.session_memory(
            sessions, per_session_keys=target.setup.name == "project")
        window.wall_s = time.monotonic() - began
    pool.close_sessions()
    logs.sort(key=lambda log: log.index)
    return _summarize(target, logs, t0, seconds, window)


def _loop_lag_counts(target: _Target) -> dict[str, dict[float, float] | None]:
    return {name: histogram_counts(url, metric)
            for name, (url, metric) in target.loop_lag.items()}


def _loop_lag_report(window: _Window) -> dict[str, dict[str, float | None]]:
    """Per process, how late its event loop woke the probe due every 0.1 s over the window
    (store/loop_lag.py), ms: the bucket bounds of the p99 and of the latest wake-up (None:
    not read, or past the last bucket)."""
    report: dict[str, dict[str, float | None]] = {}
    for name, after in window.lag_after.items():
        bounds = bucket_bounds(window.lag_before.get(name), after, (0.99, 1.0))
        report[name] = {
            "p99_at_most": None if bounds is None or math.isinf(bounds[0]) else bounds[0] * 1000,
            "max_at_most": None if bounds is None or math.isinf(bounds[1]) else bounds[1] * 1000,
        }
    return report


def _signal_servers(target: _Target, signum: int) -> None:
    """Send ``signum`` to every profiled server of ``target`` (none unless --profile)."""
    for name in target.profiles:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target.servers[name], signum)


def _written_profiles(target: _Target) -> dict[str, Path]:
    """The profiles the servers wrote on :data:`STOP`; a server that wrote none (it died) is
    left out, and said so in the point's errors by its absence."""
    deadline = time.monotonic() + _PROFILE_WRITE_S
    waiting = dict(target.profiles)
    while waiting and time.monotonic() < deadline:
        waiting = {name: path for name, path in waiting.items() if not path.exists()}
        if waiting:
            time.sleep(0.05)  # polling for a file another process writes: no event to wait on
    return {name: path for name, path in target.profiles.items() if name not in waiting}


# ============================================================================ the sweep


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal (a log or a
    pipe gets nothing: the table at the end says it all)."""

    _WIDTH: Final = 24

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._on = self._stream.isatty()
        self._total = max(1, total)
        self._began = time.monotonic()

    def show(self, done: int, label: str) -> None:
        """Redraw the bar: ``done`` of the total points finished, ``label`` running now."""
        if not self._on:
            return
        filled = round(self._WIDTH * done / self._total)
        elapsed = time.monotonic() - self._began
        left = f", ~{elapsed / done * (self._total - done):.0f} s left" if done else ""
        self._stream.write(f"\r[{'#' * filled}{'.' * (self._WIDTH - filled)}] "
                           f"{done}/{self._total} {label}{left}\x1b[K")
        self._stream.flush()

    def close(self) -> None:
        """Erase the bar, so the table starts on a clean line."""
        if self._on:
            self._stream.write("\r\x1b[K")
            self._stream.flush()


@dataclass(frozen=True, slots=True, kw_only=True)
class _Plan:
    """What one run sweeps."""

    sessions: tuple[int, ...]
    gateways: tuple[int, ...]
    seconds: float
    clients: int
    compression: bool
    peer_skipped: str | None
    profile: bool = False


def _config(plan: _Plan) -> dict[str, Any]:
    return {
        "sessions": list(plan.sessions), "gateways": list(plan.gateways),
        "seconds": plan.seconds, "chunk_ms": CHUNK_S * 1000,
        "chunk_bytes": CHUNK_BYTES, "warmup_s": WARMUP_S, "ramp_s": RAMP_S,
        "drain_s": DRAIN_S, "client_processes": plan.clients, "profiled": plan.profile,
        "websocket_compression": {
            "echo": "permessage-deflate" if plan.compression else None,
            "project": "permessage-deflate" if plan.compression else None,
            # python-socketio's client (aiohttp) does not offer it.
            "peer": None},
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "python": platform.python_version(), "platform": platform.platform(),
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _sweep(plan: _Plan, log_root: Path, points: list[dict[str, Any]],
           config: dict[str, Any]) -> None:
    """Run every point, appending each to ``points`` as it is measured and naming the Redis
    server in ``config`` once known, so an interrupted sweep keeps what it measured."""
    setups = sweep_setups(plan.gateways, peer=plan.peer_skipped is None)
    with contextlib.ExitStack() as stack:
        pool = _ClientPool(plan.clients, stack)
        stack.callback(pool.stop)
        progress = Progress(len(plan.sessions) * len(setups))
        stack.callback(progress.close)
        for sessions in plan.sessions:
            for setup in setups:
                progress.show(len(points), f"{setup.label}, {sessions} sessions")
                folder = log_root / f"{setup.name}{setup.gateways}-{sessions}"
                with contextlib.ExitStack() as servers:
                    target = _serve(servers, setup, sessions, folder, profile=plan.profile)
                    points.append(_run_point(pool, target, sessions, plan.seconds,
                                             plan.compression))
                config["redis_server"] = target.redis_name or config["redis_server"]
        progress.show(len(points), "done")


def _default_clients(sessions: int) -> int:
    """One client process per :data:`SESSIONS_PER_CLIENT` sessions, at most one per CPU."""
    cpus = os.cpu_count() or 1
    return max(1, min(cpus, math.ceil(sessions / SESSIONS_PER_CLIENT)))


def _keep_profiles(log_root: Path, output: Path) -> list[str]:
    """Move the profiles of a --profile run next to the results (``pstats`` reads them)."""
    written = sorted(log_root.rglob("*.prof"))
    if not written:
        return []
    kept = output.with_name(f"{output.stem}-profiles")
    shutil.rmtree(kept, ignore_errors=True)
    for profile in written:
        target = kept / profile.relative_to(log_root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(profile), target)
    return [f"profiles (python -m pstats FILE): {kept}"]


def _keep_logs(log_root: Path, output: Path) -> list[str]:
    """Move the servers' logs next to the results when one is not empty; else drop them."""
    written = [log for log in sorted(log_root.rglob("*.log")) if log.stat().st_size]
    if not written:
        shutil.rmtree(log_root, ignore_errors=True)
        return []
    kept = output.with_name(f"{output.stem}-logs")
    shutil.rmtree(kept, ignore_errors=True)
    shutil.move(str(log_root), kept)
    return [f"server log (not empty): {kept / log.relative_to(log_root)}" for log in written]


def run_relay_bench(*, sessions: Sequence[int] | int, seconds: float,
                    gateways: Sequence[int] = DEFAULT_GATEWAYS,
                    output: str | os.PathLike[str] | None = None,
                    clients: int | None = None, compression: bool = True,
                    profile: bool = False) -> int:
    """Run the sweep, print the table, write the JSON and the plots.

    Args:
        sessions: the concurrent real-time session counts to sweep (N; one count is a sweep of
            one point per setup).
        seconds: length of each point (S); the first second is warm-up.
        gateways: the gateway counts (G) the project and the peer run at.
        output: the JSON file; its folder is created, the plots go next to it (default:
            :func:`default_output` of ``"relay"``).
        clients: load-generator processes (default: one per 100 sessions of the largest count,
            at most one per CPU).
        compression: negotiate permessage-deflate (echo and project), as the OpenAI SDK and
            browsers do.
        profile: count the Python calls per relayed chunk of the project's gateways and
            worker (:mod:`duplex_gateway.bench_profile`); their CPU figures then include the
            profiler's overhead.

    Returns:
        0 when it ran and every chunk came back intact, 1 when chunks were lost (or came
        back duplicated, corrupt or misrouted), 2 when it could not run, 130 when interrupted
        (the points finished by then are written, the report's config saying
        ``"interrupted": true``).
    """
    from duplex_gateway import bench_relay_report as report_mod

    counts = tuple(sorted({sessions} if isinstance(sessions, int) else set(sessions)))
    servers = tuple(sorted(set(gateways)))
    if (not counts or counts[0] < 1 or not servers or servers[0] < 1
            or seconds <= WARMUP_S + CHUNK_S):
        print(f"bench relay: need --sessions >= 1, --gateways >= 1 and --seconds > "
              f"{WARMUP_S:g}", file=sys.stderr)
        return 2
    path = output_path(output, "relay")
    path.parent.mkdir(parents=True, exist_ok=True)
    plan = _Plan(sessions=counts, gateways=servers, seconds=seconds,
                 clients=clients or _default_clients(counts[-1]), compression=compression,
                 peer_skipped=peer_unavailable(), profile=profile)
    config = _config(plan) | {"redis_server": None}
    log_root = Path(tempfile.mkdtemp(prefix="dg-bench-relay-"))
    points: list[dict[str, Any]] = []
    interrupted = False
    try:
        with sigterm_as_interrupt():
            _sweep(plan, log_root, points, config)
    except KeyboardInterrupt:
        # A long sweep stopped by Ctrl-C or a time limit (TERM) keeps the points it finished.
        interrupted = True
        print(f"bench relay: interrupted after {len(points)} point(s); every started process"
              " was stopped", file=sys.stderr)
        if not points:
            return 130
    except (BenchError, OSError, RuntimeError) as exc:
        print(f"bench relay: could not run: {exc} (logs: {log_root})", file=sys.stderr)
        return 2
    config["interrupted"] = interrupted
    report = report_mod.build(config, points, plan.peer_skipped)
    notes = (report_mod.write(report, path) + _keep_profiles(log_root, path)
             + _keep_logs(log_root, path))
    print(report_mod.format_table(report))
    print("\n".join(notes))
    if not report["lossless"]:
        print("bench relay: chunks were lost, duplicated, corrupted or misrouted",
              file=sys.stderr)
        return 1
    return 130 if interrupted else 0
