"""``duplex-gateway bench leases``: the Redis cost of attachment leases, per session count.

The design says a gateway holds every session it attaches under its lease on the session's
worker and renews it in bulk: the cost of renewal grows with gateways x workers, never with
sessions. This bench measures that claim instead of stating it. It starts its own stack
(embedded Redis, ONE gateway, ``--workers`` loopback workers whose slots together hold the
largest session count), then for each session count N, in ascending order, opens idle sessions
up to N (turn mode, nothing sent afterwards; at most :data:`OPEN_CONCURRENCY` opens at a time)
and measures over a window of about ``--seconds``:

* lease renewal calls per second: the delta of the gateway's
  ``duplex_gateway_lease_renewals_total`` (its ``/metrics``), next to the rate on paper,
  workers with sessions x (1 / renewal period);
* Redis commands per second and per session-second: the delta of Redis's own
  ``total_commands_processed`` (``INFO``; it counts the commands run inside scripts, too), so
  what the idle sessions cost besides their lease shows next to it;
* the seconds between renewal rounds as measured, and the cores the gateway, the workers,
  Redis and the whole machine were busy: a round starts a period after the previous one
  ended, so on a saturated machine the rounds stretch and the rate falls below the one on
  paper, while each round still costs one call per worker.

The window starts and ends on a renewal round seen in ``/metrics`` (polled every
:data:`_POLL_S`), so it holds whole rounds: a rate over a short window is not off by one round.
If opening sessions fails at some N (the machine cannot hold it), the bench stops there and
says so. It prints a table, writes JSON (by default ``bench-results/leases-<UTC time>.json``),
asserts nothing about speed, and exits 0 when it
measured at least one N (1 when it measured none, 2 when it could not run, 130 when
interrupted). Every process it started is stopped on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from duplex_gateway.bench.kit import (
    cpu_seconds,
    machine_ticks,
    output_help,
    output_path,
    positive_float,
    positive_int,
    positive_int_list,
    sigterm_as_interrupt,
    start_http_server,
    start_worker,
)
from duplex_gateway.bench.spec import BenchError

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from duplex_client import DuplexClient

__all__ = ["OPEN_CONCURRENCY", "LeaseRow", "add_arguments", "run_leases_bench"]

#: Opens in flight at once: enough to fill thousands of sessions quickly, few enough that a
#: 2-core machine answers each within the client's attempt timeout.
OPEN_CONCURRENCY: Final = 50
_RENEWALS_METRIC: Final = "duplex_gateway_lease_renewals_total"
_CONNECTIONS_METRIC: Final = "duplex_gateway_connections"
#: How often ``/metrics`` is read while waiting for a renewal round (the window's edges).
_POLL_S: Final = 0.05
#: Rounds that may pass unseen before waiting for one gives up (a gateway that stopped).
_ROUNDS_BEFORE_GIVING_UP: Final = 10
_REGISTER_TIMEOUT_S: Final = 30.0
_CLOSE_TIMEOUT_S: Final = 15.0
_GATEWAY_START_ATTEMPTS: Final = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRow:
    """What one session count cost over its window."""

    sessions: int
    workers_with_sessions: int
    gateway_connections: int
    window_s: float
    renewals: int
    renewals_per_s: float
    expected_renewals_per_s: float
    #: Seconds between renewal rounds, as measured: every round renews each worker with
    #: sessions once, so this is the window over the rounds it held.
    round_period_s: float
    redis_commands: int
    redis_commands_per_s: float
    redis_commands_per_session_s: float
    #: Cores the gateway, the workers together and Redis were busy over the window (None
    #: where unreadable): whether the machine, not the design, limited the renewal rate.
    gateway_cpu_share: float | None
    workers_cpu_share: float | None
    redis_cpu_share: float | None
    #: CPUs of the whole machine busy over the window (the bench's own client too).
    machine_busy_cpus: float | None
    #: Calls per Redis command in the window, most first (``INFO`` ``cmdstat_*``).
    calls_by_command: dict[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class Stopped:
    """The session count the machine could not hold (opens failed, or no renewal round was
    seen), and why."""

    sessions: int
    opened: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class _Stack:
    """Where the bench's stack answers, and its renewal period."""

    ws_url: str
    metrics_url: str
    redis_url: str
    renewal_period_s: float
    gateway_pid: int
    worker_pids: tuple[int, ...]
    redis_pid: int


@dataclass(frozen=True, slots=True)
class _GatewaySample:
    """The gateway's counters read at one moment (``time.monotonic()``)."""

    at: float
    renewals: int
    connections: int


@dataclass(frozen=True, slots=True)
class _RedisSample:
    """Redis's command counters, and the CPU seconds of the stack's processes, at one moment."""

    at: float
    total: int
    calls: dict[str, int]
    gateway_cpu_s: float | None
    workers_cpu_s: float | None
    redis_cpu_s: float | None
    machine_ticks: tuple[int, int] | None  # (busy, total) since boot


def _renewal_period_s() -> float:
    """The period the bench's gateway renews at: its default lease over renewals per lease.

    The gateway is started with default settings (the harness drops ``DUPLEX_GATEWAY_*``).
    """
    # The gateway's own constant, so the figure on paper cannot drift from the code.
    from gateway.leases import _RENEWALS_PER_LEASE
    from gateway.settings import GatewaySettings

    return GatewaySettings().attach_lease_s / _RENEWALS_PER_LEASE


# ============================================================================ reading counters


def _read_metrics(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
        return body.decode()


def _metric_value(text: str, name: str) -> float:
    """The value of the unlabelled sample ``name`` in Prometheus text."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == name:
            return float(parts[1])
    raise BenchError(f"the gateway's /metrics has no {name}")


async def _gateway_sample(url: str) -> _GatewaySample:
    text = await asyncio.to_thread(_read_metrics, url)
    return _GatewaySample(time.monotonic(), int(_metric_value(text, _RENEWALS_METRIC)),
                          int(_metric_value(text, _CONNECTIONS_METRIC)))


async def _redis_sample(client: Redis, stack: _Stack) -> _RedisSample:
    """One ``INFO all`` (the command total and the calls per command), and the CPU times."""
    info: dict[str, Any] = await client.info("all")
    at = time.monotonic()
    calls = {key.removeprefix("cmdstat_"): int(value["calls"]) for key, value in info.items()
             if key.startswith("cmdstat_") and isinstance(value, dict)}
    workers = [cpu_seconds(pid) for pid in stack.worker_pids]
    workers_s = None if None in workers else sum(s for s in workers if s is not None)
    return _RedisSample(at, int(info["total_commands_processed"]), calls,
                        cpu_seconds(stack.gateway_pid), workers_s,
                        cpu_seconds(stack.redis_pid), machine_ticks())


def _share(before: float | None, after: float | None, seconds: float) -> float | None:
    return (after - before) / seconds if before is not None and after is not None else None


def _busy_cpus(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1]) * (os.cpu_count() or 1)


async def _next_round(url: str, after: int, period_s: float) -> _GatewaySample:
    """Poll ``/metrics`` until the renewal counter passes ``after``: a round just ended."""
    deadline = time.monotonic() + _ROUNDS_BEFORE_GIVING_UP * period_s
    while (sample := await _gateway_sample(url)).renewals <= after:
        if sample.at > deadline:
            raise BenchError(f"the gateway sent no lease renewal for "
                             f"{_ROUNDS_BEFORE_GIVING_UP} periods")
        await asyncio.sleep(_POLL_S)  # polling another process's counter; no event to wait on
    return sample


async def _connections_reach(url: str, sessions: int, period_s: float) -> None:
    """Wait until the gateway counts ``sessions`` open connections."""
    deadline = time.monotonic() + _ROUNDS_BEFORE_GIVING_UP * period_s
    while (sample := await _gateway_sample(url)).connections < sessions:
        if sample.at > deadline:
            raise BenchError(f"the gateway counts {sample.connections} connections, "
                             f"not {sessions}")
        await asyncio.sleep(_POLL_S)  # polling another process's gauge; no event to wait on


# ============================================================================ sessions


async def _open_one(url: str, gate: asyncio.Semaphore) -> DuplexClient:
    from duplex_client import DuplexClient

    async with gate:
        return await DuplexClient.connect(url)  # turn mode; nothing is sent afterwards


async def _open_up_to(url: str, clients: list[DuplexClient], sessions: int) -> str | None:
    """Open idle sessions until ``clients`` holds ``sessions``; the first error, if any."""
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)
    opened = await asyncio.gather(*(_open_one(url, gate)
                                    for _ in range(sessions - len(clients))),
                                  return_exceptions=True)
    clients.extend(client for client in opened if not isinstance(client, BaseException))
    errors = [error for error in opened if isinstance(error, BaseException)]
    for error in errors:
        if not isinstance(error, Exception):  # cancelled, interrupted: not a result
            raise error
    return f"{len(errors)} opens failed, first: {errors[0]!r}"[:300] if errors else None


async def _close_all(clients: Sequence[DuplexClient]) -> None:
    """Close every connection normally; the sessions are left to their grace."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(c.aclose() for c in clients),
                                              return_exceptions=True), _CLOSE_TIMEOUT_S)


def _workers_used(clients: Sequence[DuplexClient]) -> int:
    """Workers that hold at least one of the sessions (the session id names its worker)."""
    from store.keys import worker_of_session

    return len({worker_of_session(c.session_id) for c in clients if c.session_id is not None})


# ============================================================================ measuring


def _row(sessions: int, workers_used: int, period_s: float, start: _GatewaySample,
         end: _GatewaySample, redis_start: _RedisSample,
         redis_end: _RedisSample) -> LeaseRow:
    window = end.at - start.at
    redis_window = redis_end.at - redis_start.at
    commands = redis_end.total - redis_start.total - 1  # less the window's first INFO
    calls = {name: n - redis_start.calls.get(name, 0) for name, n in redis_end.calls.items()}
    calls["info"] = calls.get("info", 0) - 1
    by_count = dict(sorted(((k, v) for k, v in calls.items() if v > 0), key=lambda kv: -kv[1]))
    return LeaseRow(
        sessions=sessions, workers_with_sessions=workers_used,
        gateway_connections=end.connections, window_s=window,
        renewals=end.renewals - start.renewals,
        renewals_per_s=(end.renewals - start.renewals) / window,
        expected_renewals_per_s=workers_used / period_s,
        round_period_s=window * workers_used / max(1, end.renewals - start.renewals),
        redis_commands=commands, redis_commands_per_s=commands / redis_window,
        redis_commands_per_session_s=commands / (redis_window * sessions),
        gateway_cpu_share=_share(redis_start.gateway_cpu_s, redis_end.gateway_cpu_s,
                                 redis_window),
        workers_cpu_share=_share(redis_start.workers_cpu_s, redis_end.workers_cpu_s,
                                 redis_window),
        redis_cpu_share=_share(redis_start.redis_cpu_s, redis_end.redis_cpu_s, redis_window),
        machine_busy_cpus=_busy_cpus(redis_start.machine_ticks, redis_end.machine_ticks),
        calls_by_command=by_count)


async def _measure(stack: _Stack, redis: Redis, sessions: int, workers_used: int,
                   seconds: float) -> LeaseRow:
    """One window of whole renewal rounds, about ``seconds`` long.

    It starts at the first round that ends after the opens returned: every later round began
    after the last session was held, so each renews every worker with sessions.
    """
    period = stack.renewal_period_s
    await _connections_reach(stack.metrics_url, sessions, period)
    start = await _next_round(stack.metrics_url, (await _gateway_sample(
        stack.metrics_url)).renewals, period)
    redis_start = await _redis_sample(redis, stack)
    # The window's length: sleep to half a period before its end, then wait for the round
    # that ends nearest it, so the window holds a whole number of rounds.
    await asyncio.sleep(max(0.0, start.at + seconds - period / 2 - time.monotonic()))
    end = await _next_round(stack.metrics_url, (await _gateway_sample(
        stack.metrics_url)).renewals, period)
    redis_end = await _redis_sample(redis, stack)
    return _row(sessions, workers_used, period, start, end, redis_start, redis_end)


async def _measure_counts(stack: _Stack, counts: Sequence[int],
                          seconds: float) -> tuple[list[LeaseRow], Stopped | None]:
    """Open up to each count in turn and measure it; stop at the first count that fails."""
    from redis.asyncio import Redis

    redis = Redis.from_url(stack.redis_url)
    await redis.ping()  # connect now: the handshake's commands stay out of every window
    clients: list[DuplexClient] = []
    rows: list[LeaseRow] = []
    try:
        for sessions in counts:
            print(f"opening {sessions} sessions ...", flush=True)
            failure = await _open_up_to(stack.ws_url, clients, sessions)
            if failure is not None:
                return rows, Stopped(sessions=sessions, opened=len(clients), reason=failure)
            print(f"measuring {sessions} sessions for about {seconds:g} s ...", flush=True)
            try:
                rows.append(await _measure(stack, redis, sessions, _workers_used(clients),
                                           seconds))
            except BenchError as exc:  # the stack is too loaded to show a round: a result
                return rows, Stopped(sessions=sessions, opened=len(clients), reason=str(exc))
        return rows, None
    finally:
        await _close_all(clients)
        await redis.aclose()


def _wait_for_workers(redis_url: str, workers: int) -> None:
    """Wait until every worker is registered, so the first count spreads over all of them."""
    from redis import Redis

    from store.keys import WORKER_DIRECTORY

    client = Redis.from_url(redis_url)
    deadline = time.monotonic() + _REGISTER_TIMEOUT_S
    try:
        while int(client.zcard(WORKER_DIRECTORY)) < workers:
            if time.monotonic() > deadline:
                raise BenchError(f"fewer than {workers} workers registered")
            time.sleep(_POLL_S)  # polling other processes' registration; no event to wait on
    finally:
        client.close()


def _start_gateway(stack: contextlib.ExitStack, redis_url: str,
                   log_dir: Path) -> tuple[int, int]:
    """Start the gateway on a free port; its port and process id.

    A port free a moment ago may be taken before the gateway binds it (other processes on
    the machine pick free ports too), so a failed start is tried again on another port.
    """
    from runtime.embedded import free_port

    def start_on(port: int) -> tuple[int, int]:
        gateway = start_http_server(stack, "gateway", [
            "duplex_gateway", "--log-level", "warning", "serve", "--host", "127.0.0.1",
            "--port", str(port), "--redis-url", redis_url], port, log_dir)
        return port, gateway.pid

    for _ in range(_GATEWAY_START_ATTEMPTS - 1):
        with contextlib.suppress(BenchError):
            return start_on(free_port())
    return start_on(free_port())


def _run_stack(counts: Sequence[int], workers: int, seconds: float,
               log_dir: Path) -> tuple[list[LeaseRow], Stopped | None, dict[str, Any]]:
    """Start Redis, the workers and the gateway; measure every count; stop them all."""
    from runtime.embedded import start_server

    slots = math.ceil(counts[-1] / workers)
    with contextlib.ExitStack() as stack:
        redis = start_server("auto")
        stack.callback(redis.stop)
        worker_pids = []
        for number in range(workers):  # one log folder each: the harness names the log
            folder = log_dir / f"worker-{number}"
            folder.mkdir(parents=True, exist_ok=True)
            worker_pids.append(start_worker(stack, redis.url, slots, folder).pid)
        _wait_for_workers(redis.url, workers)
        port, gateway_pid = _start_gateway(stack, redis.url, log_dir)
        target = _Stack(ws_url=f"ws://127.0.0.1:{port}/v1/realtime",
                        metrics_url=f"http://127.0.0.1:{port}/metrics",
                        redis_url=redis.url, renewal_period_s=_renewal_period_s(),
                        gateway_pid=gateway_pid, worker_pids=tuple(worker_pids),
                        redis_pid=redis.process.pid)
        rows, stopped = asyncio.run(_measure_counts(target, counts, seconds))
        config = {"slots_per_worker": slots, "redis_server": redis.binary.name,
                  "renewal_period_s": target.renewal_period_s}
    return rows, stopped, config


# ============================================================================ report


def _config(counts: Sequence[int], workers: int, seconds: float) -> dict[str, Any]:
    return {
        "sessions": list(counts), "gateways": 1, "workers": workers, "seconds": seconds,
        "open_concurrency": OPEN_CONCURRENCY,
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "python": platform.python_version(), "platform": platform.platform(),
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _report(config: dict[str, Any], rows: Sequence[LeaseRow],
            stopped: Stopped | None) -> dict[str, Any]:
    return {"config": config, "rows": [dataclasses.asdict(row) for row in rows],
            "largest_measured": rows[-1].sessions if rows else None,
            "stopped": dataclasses.asdict(stopped) if stopped is not None else None}


def _cores(share: float | None) -> str:
    return "-" if share is None else f"{share:.2f}"


def _format_table(report: dict[str, Any]) -> str:
    config = report["config"]
    lines = [f"leases bench: 1 gateway, {config['workers']} workers "
             f"({config['slots_per_worker']} slots each), renewed every "
             f"{config['renewal_period_s']:g} s, windows of ~{config['seconds']:g} s; "
             f"{config['cpus']} CPUs, {config['redis_server']}; CPU in cores busy"]
    header = ("sessions", "workers used", "renewals/s", "on paper/s", "round every",
              "Redis cmds/s", "cmds/session-s", "CPU: gateway", "workers", "Redis", "machine")
    cells = [header] + [
        (str(row["sessions"]), str(row["workers_with_sessions"]),
         f"{row['renewals_per_s']:.2f}", f"{row['expected_renewals_per_s']:.2f}",
         f"{row['round_period_s']:.2f} s",
         f"{row['redis_commands_per_s']:.1f}", f"{row['redis_commands_per_session_s']:.2f}",
         _cores(row["gateway_cpu_share"]), _cores(row["workers_cpu_share"]),
         _cores(row["redis_cpu_share"]), _cores(row["machine_busy_cpus"]))
        for row in report["rows"]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines += ["  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
              for row in cells]
    stopped = report["stopped"]
    if stopped is not None:
        lines.append(f"stopped at {stopped['sessions']} sessions: the machine could not hold "
                     f"them ({stopped['opened']} open; {stopped['reason']}); largest measured: "
                     f"{report['largest_measured'] or 'none'}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``bench leases``."""
    parser.add_argument("--sessions", type=positive_int_list, default="100,1000,2000",
                        help="idle session counts, comma-separated, measured in ascending "
                             "order (default: %(default)s)")
    parser.add_argument("--workers", type=positive_int, default=4,
                        help="loopback workers the sessions are spread over "
                             "(default: %(default)s)")
    parser.add_argument("--seconds", type=positive_float, default=10.0,
                        help="measured window per count, rounded to whole renewal rounds "
                             "(default: %(default)s)")
    parser.add_argument("--output", help=output_help("leases", plot=""))


def run_leases_bench(*, sessions: Sequence[int], workers: int, seconds: float,
                     output: str | os.PathLike[str] | None = None) -> int:
    """Measure lease renewals and Redis commands per session count; print, write JSON.

    Args:
        sessions: the session counts, measured in ascending order.
        workers: loopback workers; their slots together hold the largest count.
        seconds: the length of each measured window (rounded to whole renewal rounds).
        output: the JSON file; its folder is created (default: ``default_output("leases")``
            of the relay bench's harness).

    Returns:
        0 when at least one count was measured, 1 when none was, 2 when the bench could not
        run, 130 when interrupted.
    """
    counts = sorted(set(sessions))
    if not counts or counts[0] < 1 or workers < 1 or seconds <= 0:
        print("bench leases: need --sessions >= 1, --workers >= 1 and --seconds > 0",
              file=sys.stderr)
        return 2
    from redis.exceptions import RedisError

    log_dir = Path(tempfile.mkdtemp(prefix="dg-bench-leases-"))
    try:
        with sigterm_as_interrupt():
            rows, stopped, stack_config = _run_stack(counts, workers, seconds, log_dir)
    except KeyboardInterrupt:
        print("bench leases: interrupted; every started process was stopped", file=sys.stderr)
        return 130
    except (BenchError, OSError, RuntimeError, RedisError) as exc:
        print(f"bench leases: could not run: {exc} (logs: {log_dir})", file=sys.stderr)
        return 2
    shutil.rmtree(log_dir, ignore_errors=True)
    report = _report({**_config(counts, workers, seconds), **stack_config}, rows, stopped)
    path = output_path(output, "leases")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(_format_table(report))
    print(f"results: {path}")
    return 0 if rows else 1
