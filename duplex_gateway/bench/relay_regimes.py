"""The Redis regimes of ``duplex-gateway bench relay``: the project measured again by topology
and by how busy Redis is, next to the sweep (:mod:`duplex_gateway.bench.relay`).

* **Topology.** ``single``: one gateway and one worker, so every session shares one
  (gateway, worker) pair and the pair's calls can carry several sessions. ``spread`` (``--spread
  G,W``): G gateways and W workers, each worker with room for its share of the
  sessions only, so least-loaded placement deals them out in turn while the clients connect to
  the gateways in turn: each session sits on its own (gateway, worker) pair as far as G x W and
  the counts allow (one session per call, what a fleet's gateway holds of any one worker). The
  pairs found are read from Redis while the sessions are attached and reported.
* **Regime.** ``idle``: the relay alone, as the sweep measures it. ``busy`` (``--busy N``): a load
  generator (:mod:`duplex_gateway.bench.busy`) keeps N connections busy on the server through
  the point; its Redis CPU per command is measured alone before and after the point (nothing
  else streaming) and its commands in the window, which Redis counts by name, are charged at
  that cost and taken out, so what is left is the relay's marginal Redis CPU. Once per
  ``--io-threads`` count (Valkey's I/O threads with ``--server valkey``).
* **Path.** The workers' backend (``--backend``): ``loopback``, 20 ms log entries with the
  worker pushed its input; ``fake``, the frame path (80 ms frames both ways, the input cut on
  the frames and pulled once a tick), which echoes, so the load client finds its chunks in
  the frames (:mod:`duplex_gateway.bench.load`).

Per point: Redis us per chunk round trip (whole process, and its main thread where the server
reports it), commands sent (a script call or a ``MULTI`` block one) and run inside them (a
script's, a ``MULTI``'s) per session-second (the generator's taken out), writes per
session-second (the server's reads from clients, one per batch of commands that arrived
together, less the generator's: a call, a pipelined batch or a ``MULTI`` block each count
once), the server's core share, lossless and the p99 round trip.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from duplex_gateway.bench.busy import (
    GENERATOR_COMMAND,
    GeneratorCost,
    RedisCpu,
    ServerChoice,
    averaged,
    busy_load,
    marginal_s,
    measure_alone,
    server_choices,
)
from duplex_gateway.bench.kit import (
    START_TIMEOUT_S,
    spawn,
    start_http_server,
    stop_process,
)
from duplex_gateway.bench.relay_point import ClientPool, run_point
from duplex_gateway.bench.relay_setups import Target, script_only_commands
from duplex_gateway.bench.spec import TARGET_REDIS_US_PER_CHUNK, BenchError, Setup
from duplex_gateway.bench.svgplot import Chart, write_chart

__all__ = ["BACKENDS", "FRAME_BACKEND", "Regime", "add_regime_arguments", "format_regimes",
           "plan_regimes", "plot_regimes", "run_regime"]

#: How long the generator is measured alone, before and after each busy point.
ALONE_S: Final = 2.0
#: The backend whose workers run the frame path (echo: it speaks back each tick what it
#: heard the tick before, in 80 ms frames, so the load client finds its chunks in them).
FRAME_BACKEND: Final = "fake"
BACKENDS: Final = ("loopback", FRAME_BACKEND)


@dataclass(frozen=True, slots=True)
class Regime:
    """One series of the regimes: a topology (gateways, workers) and a server, busy or idle."""

    gateways: int
    workers: int
    server: ServerChoice
    busy: int  # the generator's connections; 0: idle
    #: The workers' backend: ``loopback`` (20 ms entries, its input pushed) or ``fake`` (the
    #: frame path: 80 ms frames both ways, its input pulled once a tick).
    backend: str = "loopback"

    @property
    def label(self) -> str:
        """How the table and the plot name it."""
        topology = "single" if (self.gateways, self.workers) == (1, 1) else "spread"
        load = f"busy {self.busy}" if self.busy else "idle"
        path = ", frame path" if self.backend == FRAME_BACKEND else ""
        return (f"{topology} {self.gateways}g x {self.workers}w{path}, {load}, "
                f"{self.server.label}")


def _spread(text: str) -> tuple[int, int]:
    parts = text.split(",")
    try:
        gateways, workers = (int(part) for part in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected G,W (two whole numbers), got {text!r}") from None
    if gateways < 1 or workers < 1:
        raise argparse.ArgumentTypeError(f"G and W must be at least 1, got {text!r}")
    return gateways, workers


def add_regime_arguments(parser: argparse.ArgumentParser) -> None:
    """``--spread``; the busy flags are :func:`duplex_gateway.bench.busy.add_busy_arguments`'s."""
    parser.add_argument("--spread", type=_spread, default=None, metavar="G,W",
                        help="also run the project on G gateways and W workers, each "
                             "session on its own (gateway, worker) pair as far as G x W allows, "
                             "next to one gateway and one worker; with --busy, in both regimes "
                             "(default: not run)")
    parser.add_argument("--backend", choices=BACKENDS, default="loopback",
                        help="the regimes' workers: loopback (20 ms log entries, the worker "
                             "pushed its input) or fake (the frame path: 80 ms frames both "
                             "ways, the worker reading its input once a tick; it echoes) "
                             "(default: %(default)s)")


def plan_regimes(*, spread: tuple[int, int] | None, busy: int | None, kind: str,
                 io_threads: list[int] | None, backend: str = "loopback") -> list[Regime]:
    """The regime series of a run: none unless ``--spread`` or ``--busy`` was given."""
    if spread is None and not busy:
        return []
    topologies = [(1, 1)] + ([spread] if spread is not None and spread != (1, 1) else [])
    idle = ServerChoice(kind)
    regimes = []
    for gateways, workers in topologies:
        regimes.append(Regime(gateways, workers, idle, 0, backend))
        regimes += [Regime(gateways, workers, choice, busy or 0, backend)
                    for choice in (server_choices(kind, io_threads) if busy else [])]
    return regimes


def _pairs(url: str) -> dict[str, Any]:
    """Sessions per (gateway, worker) pair, from each worker's held set."""
    from redis import Redis

    client = Redis.from_url(url)
    counts: dict[tuple[bytes, bytes], int] = {}
    try:
        for key in client.scan_iter(match="dg:*:held", count=1000):
            members: list[bytes] = client.zrange(key, 0, -1)  # type: ignore[assignment]
            for member in members:
                pair = (member.split(b" ", 1)[0], bytes(key))
                counts[pair] = counts.get(pair, 0) + 1
    finally:
        client.close()
    held = sum(counts.values())
    return {"sessions": held, "pairs": len(counts),
            "max_sessions_per_pair": max(counts.values(), default=0),
            "sessions_per_pair": held / len(counts) if counts else None}


def _start_workers(stack: contextlib.ExitStack, url: str, count: int, slots: int,
                   log_dir: Path, backend: str) -> dict[str, int]:
    from redis import Redis

    from store.keys import WORKER_DIRECTORY

    names = ["worker"] if count == 1 else [f"worker{number}" for number in range(count)]
    servers = {}
    for name in names:
        args = ["duplex_gateway", "--log-level", "warning", "worker", "--redis-url", url,
                "--backend", backend, "--slots", str(slots)]
        server = spawn(name, args, log_dir)
        stack.callback(stop_process, server.process)
        servers[name] = server
    client = Redis.from_url(url)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while int(client.zcard(WORKER_DIRECTORY)) < count:
            for server in servers.values():
                if server.process.poll() is not None:
                    raise BenchError(f"{server.name} exited at start; see {server.log_path}")
            if time.monotonic() > deadline:
                raise BenchError("timed out waiting for the workers' registration")
            time.sleep(0.05)  # polling children's readiness: no event to wait on
    finally:
        client.close()
    return {name: server.pid for name, server in servers.items()}


def _serve(stack: contextlib.ExitStack, regime: Regime, sessions: int, log_dir: Path
           ) -> tuple[Target, Any, Any]:
    """The point's servers: Redis (the generator on it, and measured alone, when busy), the
    workers, the gateways."""
    from runtime.embedded import free_port, start_server

    log_dir.mkdir(parents=True, exist_ok=True)
    redis = start_server(regime.server.kind, extra_args=regime.server.extra_args)
    stack.callback(shutil.rmtree, redis.workdir, True)
    stack.callback(redis.stop)
    load, before = None, None
    if regime.busy:
        load = stack.enter_context(busy_load(redis.url, redis.port, regime.busy))
        before = measure_alone(redis.url, load, ALONE_S)
    servers = _start_workers(stack, redis.url, regime.workers,
                             math.ceil(sessions / regime.workers), log_dir, regime.backend)
    urls = []
    for number in range(regime.gateways):
        port = free_port()
        name = f"gateway{number}"
        gateway = start_http_server(stack, name, [
            "duplex_gateway", "--log-level", "warning", "serve", "--host", "127.0.0.1",
            "--port", str(port), "--redis-url", redis.url], port, log_dir)
        urls.append(f"ws://127.0.0.1:{port}/v1/realtime")
        servers[name] = gateway.pid
    mode = "frames" if regime.backend == FRAME_BACKEND else "gateway"
    target = Target(setup=Setup("project", regime.gateways), mode=mode, urls=tuple(urls),
                    servers={**servers, "redis": redis.process.pid}, redis_url=redis.url,
                    script_commands=script_only_commands(), redis_name=redis.binary.name,
                    while_attached=lambda: _pairs(redis.url))
    return target, load, before


def _figures(point: dict[str, Any], cost: GeneratorCost | None) -> dict[str, Any]:
    """The regime's figures of a point: the generator's share taken out of Redis's CPU,
    commands and reads."""
    redis, cpu = point["redis"] or {}, point["cpu"].get("redis", {})
    chunks = point["chunks"]["measured_received"]
    session_s = redis.get("session_seconds") or 0.0
    echoes = int(redis.get("calls_by_command", {}).get(GENERATOR_COMMAND, 0))
    spent = None
    if cpu.get("cpu_s") is not None:
        spent = RedisCpu(float(cpu["cpu_s"]), redis.get("main_thread_cpu_s"))
        if cost is not None:
            spent = marginal_s(spent, echoes, cost)

    def per_chunk(value: float | None) -> float | None:
        return None if value is None or not chunks else value / chunks * 1e6

    def per_session_s(count: float | None) -> float | None:
        return None if count is None or not session_s else count / session_s

    total = per_chunk(None if spent is None else spent.total)
    # Where the relay's share is smaller than the generator's drift between its two
    # measurements alone, the difference is noise (it may come out negative): no figure.
    drowned = total is not None and total < 0
    return {
        "redis_us_per_round_trip": None if drowned else total,
        "main_thread_us_per_round_trip": None if drowned or spent is None
        else per_chunk(spent.main_thread),
        "under_generator_drift": drowned,
        "commands_sent_per_session_s": per_session_s(
            None if not redis else redis["client_commands"] - echoes),
        "in_scripts_per_session_s": redis.get("in_scripts_per_session_second"),
        "writes_per_session_s": per_session_s(
            None if not redis else redis["reads_processed"] - echoes),
        "redis_core_share": cpu.get("core_share"),
        "generator_commands": echoes,
        # A busy server's cost of the relay without subtraction: the execution time of what
        # the relay sent, plus a generator command's whole cost alone per write (the fixed
        # cost of a call on a busy server: read, parse, reply).
        "modelled_us_per_round_trip": None if cost is None or not redis or not chunks else
        (redis["sent_usec"] - redis["usec_by_command"].get(GENERATOR_COMMAND, 0.0)
         + cost.us_per_command * (redis["reads_processed"] - echoes)) / chunks,
    }


def run_regime(pool: ClientPool, regime: Regime, sessions: int, seconds: float,
               compression: bool, log_dir: Path) -> dict[str, Any]:
    """One point of ``regime`` at ``sessions``, on fresh servers."""
    with contextlib.ExitStack() as stack:
        target, load, before = _serve(stack, regime, sessions, log_dir)
        point = run_point(pool, target, sessions, seconds, compression)
        cost = None
        if load is not None and before is not None:
            # Again after the point (its sessions closed): the mean weighs drift on both sides.
            cost = averaged(before, measure_alone(target.redis_url or "", load, ALONE_S))
    return {"regime": regime.label, "gateways": regime.gateways, "workers": regime.workers,
            "backend": regime.backend,
            "server": regime.server.label, "busy": regime.busy, "sessions": sessions,
            "lossless": point["lossless"], "round_trip_ms": point["round_trip_ms"],
            "pairs": point["while_attached"], "redis_server": target.redis_name,
            "generator_alone": None if cost is None else asdict(cost),
            **_figures(point, cost), "point": point}


def _cell(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _measured(row: dict[str, Any], key: str) -> str:
    return "drift" if row.get("under_generator_drift") else _cell(row[key])


def format_regimes(rows: Sequence[dict[str, Any]]) -> str:
    """The regimes side by side, one line per point."""
    lines = [
        "Redis regimes: Redis us per 20 ms chunk round trip (busy: the generator's share "
        "subtracted, drift: smaller than the generator's own drift; [main thread]; "
        "model: execution + a busy call's fixed cost per write; "
        f"target {TARGET_REDIS_US_PER_CHUNK:g}); per session-second: commands sent, inside "
        "scripts, writes; sessions per (gateway, worker) pair",
        f"{'regime':<60} {'sessions':>8} {'us/rt':>7} {'[main]':>7} {'model':>7} {'sent':>6} "
        f"{'inside':>6} "
        f"{'writes':>6} {'per pair':>8} {'redis %':>7} {'p99 ms':>7} {'ok':>3}"]
    for row in rows:
        pairs = row["pairs"] or {}
        share = row["redis_core_share"]
        lines.append(
            f"{row['regime']:<60} {row['sessions']:>8}"
            f" {_measured(row, 'redis_us_per_round_trip'):>7}"
            f" {_measured(row, 'main_thread_us_per_round_trip'):>7}"
            f" {_cell(row['modelled_us_per_round_trip']):>7}"
            f" {_cell(row['commands_sent_per_session_s']):>6}"
            f" {_cell(row['in_scripts_per_session_s']):>6}"
            f" {_cell(row['writes_per_session_s']):>6}"
            f" {_cell(pairs.get('sessions_per_pair'), 2):>8}"
            f" {_cell(None if share is None else share * 100, 0):>7}"
            f" {_cell(row['round_trip_ms'].get('p99')):>7} {'yes' if row['lossless'] else 'NO':>3}")
    for row in rows:
        alone = row["generator_alone"]
        if alone is not None:
            lines.append(f"generator alone, {row['regime']}, {row['sessions']} sessions: "
                         f"{alone['tool']}, {alone['commands_per_s'] / 1000:.1f} k commands/s, "
                         f"{alone['us_per_command']:.2f} us each, the server at "
                         f"{alone['redis_core_share'] * 100:.0f} % of a core")
    return "\n".join(lines)


def plot_regimes(rows: Sequence[dict[str, Any]], output: Path) -> list[str]:
    """Redis us per round trip against sessions, one series per regime."""
    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        if row["redis_us_per_round_trip"] is not None:
            series.setdefault(row["regime"], []).append(
                (float(row["sessions"]), row["redis_us_per_round_trip"]))
    if not series:
        return []
    path = write_chart(output.with_name(f"{output.stem}-regimes.svg"), Chart(
        title="Redis CPU per chunk round trip, by topology and regime",
        x_label="concurrent sessions", y_label="Redis us per round trip", series=series,
        integer_x=True, reference=(TARGET_REDIS_US_PER_CHUNK, "target")))
    return [f"plot: {path}"]
