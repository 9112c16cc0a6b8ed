"""``duplex-gateway bench relay``: a sweep of the relay's cost against a bare echo and a peer.

Three setups, measured in one run, on the same client processes, with the same load:

* **echo**: a bare websocket echo (:mod:`duplex_gateway.bench.echo`, the gateway's own server stack
  with nothing in between) sends every frame back as is;
* **peer**: what a Python team would deploy for one Redis hop and nothing durable: python-socketio
  servers (``AsyncServer`` + ``AsyncRedisManager`` under uvicorn, :mod:`duplex_gateway.bench.peer`)
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
clock. The load runs in its own client processes (as many as
:func:`~duplex_gateway.bench.spec.client_count` says, started once with ``spawn`` and reused
for every point), whose CPU is reported with every point so the load
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
echo's, worker CPU per chunk at most the echo's, the whole stack at most the peer's, one Redis
write per chunk per direction (100 per session-second), at most 20 us of Redis CPU per chunk round
trip (its worker relays 20 ms entries) and 256 KiB of Redis memory per session. Each is ``met``
or ``MISSED`` for this run, on this machine, at this load: a finding, not a failure.

With ``--busy N`` or ``--spread G,W`` the project is also measured by Redis regime
(:mod:`duplex_gateway.bench.relay_regimes`): one gateway and one worker, and G gateways with W
workers (each session on its own pair), each idle and with a load generator keeping N
connections busy on the server (its own cost measured alone and subtracted), once per
``--io-threads`` count; a second table and plot, and ``"regimes"`` in the JSON.

The benchmark asserts nothing about speed: it exits 0 when it ran and every chunk came back,
1 when chunks were lost (or came back corrupt, duplicated or to the wrong session), 2 when it
could not run and 130 when interrupted (Ctrl-C, or SIGTERM from a time limit), after writing
the points it finished, marked ``"interrupted": true``. Every process it started is stopped on
the way out.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO

from duplex_gateway.bench.busy import add_busy_arguments
from duplex_gateway.bench.kit import (
    output_help,
    output_path,
    positive_float,
    positive_int_list,
    sigterm_as_interrupt,
)
from duplex_gateway.bench.relay_point import WARMUP_S, ClientPool, run_point
from duplex_gateway.bench.relay_regimes import (
    Regime,
    add_regime_arguments,
    format_regimes,
    plan_regimes,
    plot_regimes,
    run_regime,
)
from duplex_gateway.bench.relay_setups import peer_unavailable, serve, sweep_setups
from duplex_gateway.bench.spec import (
    CHUNK_BYTES,
    CHUNK_S,
    DRAIN_S,
    RAMP_S,
    BenchError,
    client_count,
)

__all__ = ["Progress", "add_arguments", "run_relay_bench"]

#: The default sweep: the full one.
DEFAULT_SESSIONS: Final = (10, 25, 50, 100, 200, 400)
DEFAULT_GATEWAYS: Final = (1, 2)


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
    add_busy_arguments(parser)
    add_regime_arguments(parser)


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
    regimes: tuple[Regime, ...] = ()


def _config(plan: _Plan) -> dict[str, Any]:
    return {
        "sessions": list(plan.sessions), "gateways": list(plan.gateways),
        "seconds": plan.seconds, "chunk_ms": CHUNK_S * 1000,
        "chunk_bytes": CHUNK_BYTES, "warmup_s": WARMUP_S, "ramp_s": RAMP_S,
        "drain_s": DRAIN_S, "client_processes": plan.clients, "profiled": plan.profile,
        "regimes": [regime.label for regime in plan.regimes],
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
           config: dict[str, Any], regimes: list[dict[str, Any]]) -> None:
    """Run every point, appending each to ``points`` as it is measured and naming the Redis
    server in ``config`` once known, so an interrupted sweep keeps what it measured."""
    setups = sweep_setups(plan.gateways, peer=plan.peer_skipped is None)
    with contextlib.ExitStack() as stack:
        pool = ClientPool(plan.clients, stack)
        stack.callback(pool.stop)
        progress = Progress(len(plan.sessions) * (len(setups) + len(plan.regimes)))
        stack.callback(progress.close)
        for sessions in plan.sessions:
            for setup in setups:
                progress.show(len(points), f"{setup.label}, {sessions} sessions")
                folder = log_root / f"{setup.name}{setup.gateways}-{sessions}"
                with contextlib.ExitStack() as servers:
                    target = serve(servers, setup, sessions, folder, profile=plan.profile)
                    points.append(run_point(pool, target, sessions, plan.seconds,
                                             plan.compression))
                config["redis_server"] = target.redis_name or config["redis_server"]
            for number, regime in enumerate(plan.regimes):
                progress.show(len(points) + len(regimes), f"{regime.label}, {sessions} sessions")
                regimes.append(run_regime(pool, regime, sessions, plan.seconds,
                                          plan.compression,
                                          log_root / f"regime{number}-{sessions}"))
        progress.show(len(points) + len(regimes), "done")


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
                    profile: bool = False, busy: int | None = None,
                    spread: tuple[int, int] | None = None, server: str = "auto",
                    io_threads: list[int] | None = None, backend: str = "loopback") -> int:
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
            worker (:mod:`duplex_gateway.bench.profiling`); their CPU figures then include the
            profiler's overhead.
        busy: the busy regime's generator connections (None: idle only).
        spread: (gateways, workers) of the spread topology (None: not run).
        server, io_threads: the regimes' server (``auto``, ``redis`` or ``valkey``) and the
            I/O thread counts its busy regime runs at.
        backend: the regimes' workers' backend (``loopback``; ``fake``: the frame path).

    Returns:
        0 when it ran and every chunk came back intact, 1 when chunks were lost (or came
        back duplicated, corrupt or misrouted), 2 when it could not run, 130 when interrupted
        (the points finished by then are written, the report's config saying
        ``"interrupted": true``).
    """
    from duplex_gateway.bench import relay_report as report_mod

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
                 clients=clients or client_count(counts[-1]), compression=compression,
                 peer_skipped=peer_unavailable(), profile=profile,
                 regimes=tuple(plan_regimes(spread=spread, busy=busy, kind=server,
                                            io_threads=io_threads, backend=backend)))
    config = _config(plan) | {"redis_server": None}
    log_root = Path(tempfile.mkdtemp(prefix="dg-bench-relay-"))
    points: list[dict[str, Any]] = []
    regimes: list[dict[str, Any]] = []
    interrupted = False
    try:
        with sigterm_as_interrupt():
            _sweep(plan, log_root, points, config, regimes)
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
    report["regimes"] = regimes
    notes = (report_mod.write(report, path) + plot_regimes(regimes, path)
             + _keep_profiles(log_root, path) + _keep_logs(log_root, path))
    print(report_mod.format_table(report))
    if regimes:
        print(format_regimes(regimes))
    print("\n".join(notes))
    if not report["lossless"] or not all(row["lossless"] for row in regimes):
        print("bench relay: chunks were lost, duplicated, corrupted or misrouted",
              file=sys.stderr)
        return 1
    return 130 if interrupted else 0
