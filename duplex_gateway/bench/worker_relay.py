"""The relay phase of ``duplex-gateway bench worker`` (:mod:`duplex_gateway.bench.worker`): the
worker's CPU while B sessions stream through a real stack, split between its event-loop thread
(the relay) and the rest of the process (the model)."""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from duplex_gateway.bench import stack as bench_stack
from duplex_gateway.bench.spec import CHUNK_S, BenchError, client_count
from duplex_gateway.bench.svgplot import Chart, write_chart
from duplex_gateway.bench.worker_rows import BenchRow

__all__ = [
    "FRAME_BACKENDS",
    "RELAY_WARMUP_S",
    "RelayRow",
    "format_relay_table",
    "relay_result",
    "relay_row",
    "relay_seconds",
    "relay_skipped",
    "run_relays",
    "write_relay_chart",
]

#: The backends whose worker steps frames on a model thread (the relay phase runs for these).
FRAME_BACKENDS: Final = ("fake", "moshi")
#: The start of every relay phase left out of its figures: sessions open over its first half.
RELAY_WARMUP_S: Final = 1.0
#: How the worker's CPU is split, in the JSON.
RELAY_METHOD: Final = (
    "per-thread CPU from /proc/<pid>/task/<tid>/stat over the window: relay = the worker's "
    "main thread (tid == pid), which runs its event loop (Redis, JSON and base64 of every "
    "chunk); model = the rest of the process (the model thread, which also converts frames "
    "to pcm16, and its library's threads). Python 3.11 does not name OS threads, so the "
    "model thread is not identified by name.")


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayRow:
    """The worker's CPU while B sessions stream through a real stack, split relay / model.

    Per session-second: CPU milliseconds per second of one streaming session. Per chunk: CPU
    microseconds per 20 ms input chunk sent in the window. ``step_ms_per_session_s`` is the
    step phase's mean step time at the same B, per session-second: what the model costs
    stepped alone, in-process, in wall time (the fake's ``per_slot_ms`` sleeps, so its
    model threads spend far less CPU than that). ``threads`` lists each thread's CPU so the
    split can be checked: a frame backend's worker shows its main thread and its model
    thread (plus the model library's own threads, e.g. torch's).
    """

    batch: int
    sessions_opened: int
    sessions_failed: int
    window_s: float
    chunks: int
    output_deltas: int
    worker_cpu_s: float
    relay_cpu_s: float
    model_cpu_s: float
    relay_ms_per_session_s: float | None
    relay_us_per_chunk: float | None
    model_ms_per_session_s: float | None
    step_ms_per_session_s: float
    relay_share: float | None
    worker_core_share: float
    clients: int
    client_max_core_share: float | None
    threads: tuple[tuple[int, float], ...]  # (tid, CPU seconds) of each thread busy in it
    errors: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class _RelayWindow:
    """What one relay phase read: the worker's CPU around the window and the clients' own."""

    worker_pid: int
    before: bench_stack.ProcessCpu
    after: bench_stack.ProcessCpu
    wall_s: float
    client_cpu_s: tuple[float, ...]
    streamed: bench_stack.StreamResult


def relay_seconds(text: str) -> float:
    """An argparse type: 0 (skip the relay phase), or seconds longer than its warm-up."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value == 0:
        return 0.0
    if not math.isfinite(value) or value <= RELAY_WARMUP_S:
        raise argparse.ArgumentTypeError(
            f"must be 0 (no relay phase) or more than {RELAY_WARMUP_S:g} (the warm-up, left "
            f"out of the figures), got {text!r}")
    return value


def _stream_specs(url: str, model: str, sessions: int,
                  seconds: float) -> list[bench_stack.StreamSpec]:
    """The sessions spread over the client processes, interleaved (each gets a spread of
    start times)."""
    clients = client_count(sessions)
    return [bench_stack.StreamSpec(url=url, model=model, sessions=sessions,
                                   indices=tuple(range(first, sessions, clients)),
                                   warmup_s=RELAY_WARMUP_S, seconds=seconds)
            for first in range(clients)]


def _sleep_until(when: float) -> None:
    # The benchmark's own clock: the window is a span of time, there is no event to await.
    time.sleep(max(0.0, when - time.monotonic()))


def _client_cpu(pids: Sequence[int]) -> list[float]:
    return [bench_stack.read_process_cpu(pid).total_s for pid in pids]


def _stream_and_read(stack: contextlib.ExitStack, worker_pid: int,
                     specs: Sequence[bench_stack.StreamSpec]) -> _RelayWindow:
    """Stream every session; read the worker's and clients' CPU at the window's ends."""
    clients = bench_stack.start_clients(stack, specs)
    t0 = time.monotonic() + 0.2
    bench_stack.go(clients, t0)
    start, end = bench_stack.window(specs[0], t0)
    _sleep_until(start)
    before, began = bench_stack.read_process_cpu(worker_pid), time.monotonic()
    clients_before = _client_cpu(clients.pids)
    _sleep_until(end)
    after, wall = bench_stack.read_process_cpu(worker_pid), time.monotonic() - began
    spent = [a - b for a, b in zip(_client_cpu(clients.pids), clients_before, strict=True)]
    streamed = bench_stack.collect(clients, end + 30.0)
    return _RelayWindow(worker_pid=worker_pid, before=before, after=after, wall_s=wall,
                        client_cpu_s=tuple(spent), streamed=streamed)


def measure_relay(command: bench_stack.WorkerCommand, *, seconds: float,
                  log_dir: Path) -> _RelayWindow:
    """Run one relay phase: Redis, a worker of ``command`` (B = its slots), a gateway, and
    B real-time sessions. Every process it started is stopped on the way out.

    Raises:
        BenchError, RuntimeError, OSError: a server or a client did not start or answer.
    """
    with contextlib.ExitStack() as stack:
        redis_url = bench_stack.start_redis(stack)
        worker_pid = bench_stack.start_frame_worker(stack, redis_url, command, log_dir)
        url = bench_stack.start_gateway(stack, redis_url, log_dir)
        specs = _stream_specs(url, command.backend, command.slots, seconds)
        return _stream_and_read(stack, worker_pid, specs)


def _busy_threads(window: _RelayWindow) -> tuple[tuple[int, float], ...]:
    spent = ((tid, cpu - window.before.by_thread.get(tid, 0.0))
             for tid, cpu in sorted(window.after.by_thread.items()))
    return tuple((tid, round(cpu, 4)) for tid, cpu in spent if cpu > 0)


def _per(value: float, count: float, scale: float) -> float | None:
    return round(value / count * scale, 3) if count > 0 else None


def relay_row(window: _RelayWindow, step: BenchRow, frame_ms: float) -> RelayRow:
    """The row of one relay phase, next to the step phase's row at the same B."""
    main = window.worker_pid
    total = window.after.total_s - window.before.total_s
    # /proc rounds a thread's time and its process's to clock ticks apart, so the main
    # thread's delta can come out a tick above the whole process's: no thread spends more.
    relay = min(total, window.after.by_thread.get(main, 0.0)
                - window.before.by_thread.get(main, 0.0))
    model = max(0.0, total - relay)
    streamed = window.streamed
    session_s = streamed.opened * window.wall_s
    shares = [cpu / window.wall_s for cpu in window.client_cpu_s] if window.wall_s else []
    return RelayRow(
        batch=step.batch, sessions_opened=streamed.opened, sessions_failed=streamed.failed,
        window_s=round(window.wall_s, 3), chunks=streamed.sent_in_window,
        output_deltas=streamed.deltas_in_window, worker_cpu_s=round(total, 4),
        relay_cpu_s=round(relay, 4), model_cpu_s=round(model, 4),
        relay_ms_per_session_s=_per(relay, session_s, 1e3),
        relay_us_per_chunk=_per(relay, streamed.sent_in_window, 1e6),
        model_ms_per_session_s=_per(model, session_s, 1e3),
        step_ms_per_session_s=round(step.mean_ms / step.batch * 1000 / frame_ms, 3),
        relay_share=round(relay / total, 3) if total > 0 else None,
        worker_core_share=round(total / window.wall_s, 3) if window.wall_s else 0.0,
        clients=len(window.client_cpu_s),
        client_max_core_share=round(max(shares), 3) if shares else None,
        threads=_busy_threads(window), errors=tuple(streamed.errors))


def _relay_command(args: argparse.Namespace, batch: int,
                   model_path: str) -> bench_stack.WorkerCommand:
    return bench_stack.WorkerCommand(backend=args.backend, slots=batch, model_path=model_path,
                                     device=args.device, dtype=args.dtype,
                                     backend_options=args.backend_options)


def run_relays(args: argparse.Namespace, steps: Sequence[BenchRow], frame_ms: float,
               model_path: str) -> list[RelayRow]:
    """One relay phase per measured batch size.

    Raises:
        BenchError, RuntimeError, OSError: as :func:`measure_relay`; the servers' logs are
        kept and named in the message.
    """
    rows: list[RelayRow] = []
    log_root = Path(tempfile.mkdtemp(prefix="bench-worker-relay-"))
    try:
        for step in steps:
            folder = log_root / f"b{step.batch}"
            folder.mkdir()
            window = measure_relay(_relay_command(args, step.batch, model_path),
                                   seconds=args.relay_seconds, log_dir=folder)
            rows.append(relay_row(window, step, frame_ms))
            print(format_relay_table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    except (BenchError, RuntimeError, OSError) as exc:
        raise RuntimeError(f"{exc} (server logs: {log_root})") from exc
    shutil.rmtree(log_root, ignore_errors=True)
    return rows


def _figure(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_relay_table(rows: Sequence[RelayRow]) -> str:
    """The relay phase's table: worker CPU per session-second, relay next to model."""
    lines = ["worker CPU while B sessions stream in real time (relay: the event-loop thread; "
             "model: the other threads; step: the step phase)",
             f"{'batch':>5} {'relay ms/s-s':>13} {'relay us/chunk':>15} {'model ms/s-s':>13} "
             f"{'step ms/s-s':>12} {'relay share':>12} {'sessions':>9} {'deltas':>7}"]
    for row in rows:
        lines.append(f"{row.batch:>5} {_figure(row.relay_ms_per_session_s, 3):>13} "
                     f"{_figure(row.relay_us_per_chunk, 1):>15} "
                     f"{_figure(row.model_ms_per_session_s, 3):>13} "
                     f"{row.step_ms_per_session_s:>12.3f} {_figure(row.relay_share, 2):>12} "
                     f"{row.sessions_opened:>9} {row.output_deltas:>7}")
    return "\n".join(lines)


def write_relay_chart(path: Path, rows: Sequence[RelayRow], *, title: str) -> Path:
    """Relay and model CPU per session-second against batch size."""
    ordered = sorted(rows, key=lambda row: row.batch)

    def points(values: Sequence[float | None]) -> list[tuple[float, float]]:
        return [(row.batch, value) for row, value in zip(ordered, values, strict=True)
                if value is not None]

    series = {
        "relay (event loop)": points([row.relay_ms_per_session_s for row in ordered]),
        "model threads": points([row.model_ms_per_session_s for row in ordered]),
        "model step (step phase)": points([row.step_ms_per_session_s for row in ordered]),
    }
    return write_chart(path, Chart(title=title, x_label="batch (streaming sessions)",
                                   y_label="worker CPU (ms per session-second)", series=series,
                                   integer_x=True))


def relay_skipped(args: argparse.Namespace) -> str | None:
    """Why the relay phase does not run, or None."""
    if args.relay_seconds == 0:
        return "--relay-seconds 0"
    if args.backend not in FRAME_BACKENDS:
        return f"{args.backend} is not a frame backend"
    return None


def relay_result(args: argparse.Namespace, relays: Sequence[RelayRow]) -> dict[str, Any]:
    skipped = relay_skipped(args)
    return {"skipped": skipped, "seconds": args.relay_seconds, "warmup_s": RELAY_WARMUP_S,
            "chunk_ms": CHUNK_S * 1000, "method": RELAY_METHOD,
            "rows": [asdict(row) for row in relays]}
