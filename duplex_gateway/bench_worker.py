"""``duplex-gateway bench worker``: what one batched model step costs, per batch size.

For each batch size B it opens B slots of the backend, runs a few warm-up steps, then times
``--steps`` steps of all B slots together (one ``Backend.step`` each, as the worker's model
thread runs them) and reports the step time (p50, p99), the cost per session, the ratio to a
B=1 step and whether the p99 fits inside one frame. The table goes to stdout, the figures to
a JSON file (by default ``bench-results/worker-<UTC time>.json``, a new one each run) and an
SVG plot next to it. This is a benchmark, not a test: the figures depend on the machine.

``--backend moshi`` loads ``--model-path`` (a ``save_pretrained`` directory), or without it
builds a tiny random Moshi on the fly (the project's design target for it on a CPU: a B=16
step costs at most 4x a B=1 step). ``--backend fake`` needs nothing and shows the harness's
own overhead.

Then, unless ``--relay-seconds 0``, a **relay phase** for each measured B (frame backends: fake
and moshi): an embedded Redis, one gateway and one worker of the same backend with B slots, and
B sessions streaming 20 ms pcm16 24 kHz chunks in real time from client processes for
``--relay-seconds`` (the first second is warm-up, left out); the backend answers in frames.
The worker's CPU over the window is split by thread (:mod:`duplex_gateway.bench_stack`): the
**relay** is its main thread, which runs the event loop (Redis, the JSON and base64 of every
chunk), the **model** is the rest of the process (the model thread and its library's threads).
Python 3.11 does not name OS threads, so the model thread is not found by name; the main
thread is the event loop's by construction. Each row shows the relay's CPU per session-second
and per 20 ms input chunk next to the model's (measured in the same window) and the step
phase's step time per session-second at the same B, in the table and under ``"relay"`` in
the JSON; a second SVG (``<name>-relay.svg``) plots them against B. Compare the relay's CPU per
chunk with ``bench relay``'s bare echo (the design target: at most the echo's).

Heavy imports happen inside the functions: building the CLI parser imports nothing of torch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from duplex_gateway import bench_stack
from duplex_gateway.bench_kit import (
    non_negative_int,
    output_help,
    output_path,
    positive_int,
    positive_int_list,
)
from duplex_gateway.bench_spec import CHUNK_S, BenchError
from duplex_gateway.svgplot import Chart, write_chart

if TYPE_CHECKING:
    from inference_worker.backend import Backend

__all__ = [
    "BenchRow",
    "RelayRow",
    "add_arguments",
    "format_relay_table",
    "format_table",
    "largest_batch_within",
    "measure_batch",
    "run_worker_bench",
    "write_relay_chart",
    "write_step_chart",
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
class BenchRow:
    """The step times of one batch size (milliseconds)."""

    batch: int
    steps: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    per_session_ms: float
    ratio_vs_b1: float | None
    fits_frame: bool


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    index = max(0, math.ceil(q * len(sorted_values)) - 1)
    return sorted_values[min(index, len(sorted_values) - 1)]


def measure_batch(backend: Backend, batch: int, *, steps: int, warmup: int,
                  clock: Callable[[], float] = time.perf_counter,
                  sync: Callable[[], None] | None = None,
                  out_of_time: Callable[[], bool] | None = None) -> list[float]:
    """Time ``steps`` batched steps of slots ``0 .. batch-1`` after ``warmup`` untimed ones.

    Slots are opened fresh and closed afterwards. ``sync`` (e.g. ``torch.cuda.synchronize``)
    runs before each clock read so asynchronous devices are timed honestly. When
    ``out_of_time()`` turns true, timing stops early (after at least 5 timed steps).

    Returns:
        Each timed step's seconds.
    """
    import numpy as np

    from inference_worker.backend import SlotStep

    spec = backend.spec
    rng = np.random.default_rng(batch)
    frames = [(0.05 * rng.standard_normal(spec.in_samples)).astype(np.float32)
              for _ in range(batch)]
    for slot in range(batch):
        backend.open_slot(slot)
    try:
        inputs = [SlotStep(slot=slot, pcm=frames[slot]) for slot in range(batch)]
        for _ in range(warmup):
            backend.step(inputs)
        times: list[float] = []
        for n in range(steps):
            if out_of_time is not None and n >= 5 and out_of_time():
                break
            if sync is not None:
                sync()
            started = clock()
            backend.step(inputs)
            if sync is not None:
                sync()
            times.append(clock() - started)
        return times
    finally:
        for slot in range(batch):
            backend.close_slot(slot)


def summarize(batch: int, times: Sequence[float], frame_ms: float,
              base_p50_ms: float | None) -> BenchRow:
    """One table row from a batch size's step times (seconds)."""
    ordered = sorted(t * 1000 for t in times)
    p50, p99 = _percentile(ordered, 0.5), _percentile(ordered, 0.99)
    return BenchRow(batch=batch, steps=len(ordered), p50_ms=round(p50, 3), p99_ms=round(p99, 3),
                    mean_ms=round(sum(ordered) / len(ordered), 3),
                    per_session_ms=round(p50 / batch, 3),
                    ratio_vs_b1=None if not base_p50_ms else round(p50 / base_p50_ms, 3),
                    fits_frame=p99 <= frame_ms)


def format_table(rows: Sequence[BenchRow], frame_ms: float) -> str:
    """The human-readable table of ``rows``."""
    lines = [f"budget {frame_ms:.1f} ms per step (p99)",
             f"{'batch':>5} {'p50 ms':>9} {'p99 ms':>9} {'per-session ms':>15} "
             f"{'x B=1':>7} {'fits':>5}"]
    for row in rows:
        ratio = "-" if row.ratio_vs_b1 is None else f"{row.ratio_vs_b1:.2f}"
        fits = "yes" if row.fits_frame else "NO"
        lines.append(f"{row.batch:>5} {row.p50_ms:>9.2f} {row.p99_ms:>9.2f} "
                     f"{row.per_session_ms:>15.3f} {ratio:>7} {fits:>5}")
    return "\n".join(lines)


def largest_batch_within(fits: Callable[[int], bool], *, limit: int, start: int = 1,
                         out_of_time: Callable[[], bool] = lambda: False) -> int:
    """The largest B in ``1 .. limit`` for which ``fits(B)``, assuming fit is monotone.

    Doubles B from ``start`` until a size does not fit (or ``limit``), then bisects between
    the last size that fit (0 if none) and the first that did not. Starting near the
    expected answer saves measurements when each new size is expensive (a compile). ``fits``
    may raise ``MemoryError`` (not fitting). Stops early, keeping the best so far, once
    ``out_of_time()``.

    Returns:
        The largest fitting B found, 0 when even B=1 does not fit.
    """
    def check(batch: int) -> bool:
        try:
            return fits(batch)
        except MemoryError:
            return False

    good, bad, batch = 0, limit + 1, max(1, min(start, limit))
    while not out_of_time():
        if not check(batch):
            bad = batch
            break
        good = batch
        if batch == limit:
            return good
        batch = min(batch * 2, limit)
    while bad - good > 1 and not out_of_time():
        middle = (good + bad) // 2
        if check(middle):
            good = middle
        else:
            bad = middle
    return good


# --------------------------------------------------------------------------- the relay phase


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


def _relay_seconds(text: str) -> float:
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
    clients = bench_stack.client_count(sessions)
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


# --------------------------------------------------------------------------- the command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``bench worker``."""
    parser.add_argument("--backend", default="fake", choices=["fake", "moshi", "cascade"],
                        help="backend to step (default: %(default)s)")
    parser.add_argument("--batch", type=positive_int_list, default="1,2,4,8,16,32",
                        help="batch sizes, comma-separated; sizes above the backend's slots "
                             "are skipped (default: %(default)s)")
    parser.add_argument("--steps", type=positive_int, default=50,
                        help="timed steps per batch size (default: %(default)s)")
    parser.add_argument("--warmup", type=non_negative_int, default=5,
                        help="untimed steps before them (default: %(default)s)")
    parser.add_argument("--model-path", default="",
                        help="moshi: save_pretrained directory (default: a tiny random Moshi "
                             "built on the fly)")
    parser.add_argument("--device", default="cpu",
                        help="torch device of the model (default: %(default)s)")
    parser.add_argument("--dtype", default="float32",
                        help="torch dtype of the model (default: %(default)s)")
    parser.add_argument("--backend-options", default="",
                        help="key=value,... for the backend (default: none)")
    parser.add_argument("--threads", type=non_negative_int, default=0,
                        help="torch intra-op threads; 0: torch's default (default: %(default)s)")
    parser.add_argument("--relay-seconds", type=_relay_seconds, default=5.0,
                        help="frame backends: per batch size B, stream B real-time sessions "
                             "through Redis, a gateway and a worker this long (the first "
                             f"{RELAY_WARMUP_S:g} s warm-up) and split the worker's CPU into "
                             "relay and model; 0: skip (default: %(default)s)")
    parser.add_argument("--output", help=output_help(
        "worker", plot="its step-time plot next to it, and the relay plot as <name>-relay.svg; "))


def build_backend(args: argparse.Namespace, slots: int,
                  scratch: Path) -> Backend:
    """The backend ``args`` names, with ``slots`` slots (a tiny Moshi is saved in ``scratch``)."""
    from inference_worker.backends.registry import (
        BackendRequest,
        create_backend,
        parse_options,
    )

    return create_backend(BackendRequest(
        name=args.backend, slots=slots, model_path=resolve_model_path(args, scratch),
        device=args.device, dtype=args.dtype, options=parse_options(args.backend_options)))


def resolve_model_path(args: argparse.Namespace, scratch: Path) -> str:
    """``--model-path``, or for moshi without one a tiny random Moshi in ``scratch`` (written
    once: the relay phase's workers load the same one)."""
    if args.backend != "moshi" or args.model_path:
        return str(args.model_path)
    tiny = scratch / "tiny-moshi"
    if not tiny.exists():
        make_tiny_moshi(tiny)
    return str(tiny)


def make_tiny_moshi(directory: Path) -> Path:
    """Save a tiny random Moshi (+ Mimi + tokenizer) in ``directory``; returns it."""
    from inference_worker.backends.moshi_tiny import write_tiny_moshi

    write_tiny_moshi(directory, seed=0)
    return directory


def _device_sync(device: str) -> Callable[[], None] | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return torch.cuda.synchronize


def run_batches(backend: Backend, batches: Sequence[int], *, steps: int, warmup: int,
                sync: Callable[[], None] | None = None) -> list[BenchRow]:
    """Measure every batch size (those above the backend's slots are skipped)."""
    frame_ms = backend.spec.frame_seconds * 1000
    rows: list[BenchRow] = []
    base: float | None = None
    for batch in batches:
        if batch > backend.spec.max_slots:
            continue
        times = measure_batch(backend, batch, steps=steps, warmup=warmup, sync=sync)
        if batch == 1:
            base = _percentile(sorted(t * 1000 for t in times), 0.5)
        row = summarize(batch, times, frame_ms, base)
        rows.append(row)
        print(format_table([row], frame_ms).splitlines()[-1], file=sys.stderr, flush=True)
    return rows


def _cuda_missing(device: str) -> str | None:
    """Why ``device`` cannot be timed here, or None (torch asserts instead of saying so)."""
    if not device.startswith("cuda"):
        return None
    try:
        import torch
    except ImportError:
        return f"--device {device} needs torch"
    if not torch.cuda.is_available():
        return f"--device {device}: this torch {torch.__version__} sees no CUDA device"
    return None


def _load_backend(args: argparse.Namespace, slots: int, scratch: Path) -> Backend | None:
    """The backend, or None after saying on stderr why it cannot be loaded (a bad path,
    device, dtype or option: an operator's mistake, not a traceback)."""
    missing = _cuda_missing(args.device)
    if missing is not None:
        print(f"bench worker: {missing}", file=sys.stderr)
        return None
    try:
        return build_backend(args, slots, scratch)
    except (ValueError, ImportError, OSError, RuntimeError, AssertionError) as exc:
        print(f"bench worker: cannot load the {args.backend} backend: {exc}", file=sys.stderr)
        return None


def _measure_all(args: argparse.Namespace, batches: Sequence[int],
                 scratch: Path) -> tuple[list[BenchRow], float] | None:
    """Every batch size's row and the frame in ms; None when the backend did not load."""
    backend = _load_backend(args, max(batches), scratch)
    if backend is None:
        return None
    try:
        rows = run_batches(backend, batches, steps=args.steps, warmup=args.warmup,
                           sync=_device_sync(args.device))
    finally:
        close = getattr(backend, "close", None)
        if callable(close):
            close()
    return rows, backend.spec.frame_seconds * 1000


def _relay_skipped(args: argparse.Namespace) -> str | None:
    """Why the relay phase does not run, or None."""
    if args.relay_seconds == 0:
        return "--relay-seconds 0"
    if args.backend not in FRAME_BACKENDS:
        return f"{args.backend} is not a frame backend"
    return None


def _relay_phase(args: argparse.Namespace, rows: Sequence[BenchRow], frame_ms: float,
                 scratch: Path) -> list[RelayRow] | None:
    """The relay rows ([] when skipped); None after saying on stderr why it could not run."""
    if _relay_skipped(args) is not None:
        return []
    try:
        return run_relays(args, rows, frame_ms, resolve_model_path(args, scratch))
    except RuntimeError as exc:
        print(f"bench worker: the relay phase could not run: {exc}", file=sys.stderr)
        return None


def _relay_result(args: argparse.Namespace, relays: Sequence[RelayRow]) -> dict[str, Any]:
    skipped = _relay_skipped(args)
    return {"skipped": skipped, "seconds": args.relay_seconds, "warmup_s": RELAY_WARMUP_S,
            "chunk_ms": CHUNK_S * 1000, "method": RELAY_METHOD,
            "rows": [asdict(row) for row in relays]}


def run_worker_bench(args: argparse.Namespace) -> int:
    """Run ``bench worker``: print the tables, write the JSON and the plots; returns the exit
    status (0 measured, 2 the backend could not be loaded or the relay phase could not run)."""
    batches: list[int] = args.batch
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-worker-") as scratch:
        measured = _measure_all(args, batches, Path(scratch))
        if measured is None:
            return 2
        rows, frame_ms = measured
        relays = _relay_phase(args, rows, frame_ms, Path(scratch))
    if relays is None:
        return 2
    print(format_table(rows, frame_ms))
    if relays:
        print(format_relay_table(relays))
    by_batch = {row.batch: row for row in rows}
    ratio_16 = by_batch[16].ratio_vs_b1 if 16 in by_batch else None
    if ratio_16 is not None:
        print(f"B=16 step costs {ratio_16:.2f}x a B=1 step (the project's design target for "
              "the tiny Moshi on a CPU: at most 4x)")
    result: dict[str, Any] = {
        "backend": args.backend, "model_path": args.model_path or None,
        "device": args.device, "dtype": args.dtype, "frame_ms": frame_ms,
        "steps": args.steps, "warmup": args.warmup, "ratio_b16_vs_b1": ratio_16,
        "rows": [asdict(row) for row in rows], "relay": _relay_result(args, relays),
    }
    output = output_path(args.output, "worker")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    plot = write_step_chart(output.with_suffix(".svg"), {args.backend: rows}, frame_ms,
                            title=f"bench worker: {args.backend} step time by batch size")
    print(f"results: {output}\nstep time plot: {plot}")
    if relays:
        relay_plot = write_relay_chart(
            output.with_name(f"{output.stem}-relay.svg"), relays,
            title=f"bench worker: {args.backend} worker CPU, relay vs model, by batch size")
        print(f"relay plot: {relay_plot}")
    return 0


def write_step_chart(path: Path, runs: Mapping[str, Sequence[BenchRow]], budget_ms: float, *,
                     title: str) -> Path:
    """p50 and p99 step time against batch size, per run, with the frame budget line."""
    series: dict[str, list[tuple[float, float]]] = {}
    for name, rows in runs.items():
        ordered = sorted(rows, key=lambda row: row.batch)
        series[f"{name} p50"] = [(row.batch, row.p50_ms) for row in ordered]
        series[f"{name} p99"] = [(row.batch, row.p99_ms) for row in ordered]
    return write_chart(path, Chart(title=title, x_label="batch (sessions per step)",
                                   y_label="step time (ms)", series=series, integer_x=True,
                                   reference=(budget_ms, f"budget {budget_ms:g} ms")))
