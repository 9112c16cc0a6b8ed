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

Then a **resume phase** (:mod:`duplex_gateway.bench.worker_resume`), for a backend whose
slots move with their context: a slot rebuilt from another's newest step records, as an adopter
does on its model thread, timed, with the records' size (``"resume"`` in the JSON).

Then, unless ``--relay-seconds 0``, a **relay phase** for each measured B (frame backends: fake
and moshi): an embedded Redis, one gateway and one worker of the same backend with B slots, and
B sessions streaming 20 ms pcm16 24 kHz chunks in real time from client processes for
``--relay-seconds`` (the first second is warm-up, left out); the backend answers in frames.
The worker's CPU over the window is split by thread (:mod:`duplex_gateway.bench.stack`): the
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
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from duplex_gateway.bench.kit import (
    non_negative_int,
    output_help,
    output_path,
    positive_int,
    positive_int_list,
)
from duplex_gateway.bench.svgplot import Chart, write_chart
from duplex_gateway.bench.worker_relay import (
    RELAY_WARMUP_S,
    RelayRow,
    format_relay_table,
    relay_result,
    relay_seconds,
    relay_skipped,
    run_relays,
    write_relay_chart,
)
from duplex_gateway.bench.worker_resume import ResumeRow, format_resume, measure_resume
from duplex_gateway.bench.worker_rows import BenchRow

if TYPE_CHECKING:
    from inference_worker.backend import Backend

__all__ = [
    "add_arguments",
    "format_table",
    "largest_batch_within",
    "measure_batch",
    "run_worker_bench",
    "write_step_chart",
]

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
    parser.add_argument("--relay-seconds", type=relay_seconds, default=5.0,
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


def _measure_all(args: argparse.Namespace, batches: Sequence[int], scratch: Path,
                 ) -> tuple[list[BenchRow], ResumeRow | None, float] | None:
    """Every batch size's row, the resume phase's (None: the backend's slots do not move)
    and the frame in ms; None when the backend did not load."""
    backend = _load_backend(args, max(2, *batches), scratch)
    if backend is None:
        return None
    sync = _device_sync(args.device)
    try:
        rows = run_batches(backend, batches, steps=args.steps, warmup=args.warmup, sync=sync)
        resume = measure_resume(backend, sync=sync)
    finally:
        close = getattr(backend, "close", None)
        if callable(close):
            close()
    return rows, resume, backend.spec.frame_seconds * 1000


def _relay_phase(args: argparse.Namespace, rows: Sequence[BenchRow], frame_ms: float,
                 scratch: Path) -> list[RelayRow] | None:
    """The relay rows ([] when skipped); None after saying on stderr why it could not run."""
    if relay_skipped(args) is not None:
        return []
    try:
        return run_relays(args, rows, frame_ms, resolve_model_path(args, scratch))
    except RuntimeError as exc:
        print(f"bench worker: the relay phase could not run: {exc}", file=sys.stderr)
        return None


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
        rows, resume, frame_ms = measured
        relays = _relay_phase(args, rows, frame_ms, Path(scratch))
    if relays is None:
        return 2
    print(format_table(rows, frame_ms))
    if relays:
        print(format_relay_table(relays))
    if resume is not None:
        print(format_resume(resume))
    by_batch = {row.batch: row for row in rows}
    ratio_16 = by_batch[16].ratio_vs_b1 if 16 in by_batch else None
    if ratio_16 is not None:
        print(f"B=16 step costs {ratio_16:.2f}x a B=1 step (the project's design target for "
              "the tiny Moshi on a CPU: at most 4x)")
    result: dict[str, Any] = {
        "backend": args.backend, "model_path": args.model_path or None,
        "device": args.device, "dtype": args.dtype, "frame_ms": frame_ms,
        "steps": args.steps, "warmup": args.warmup, "ratio_b16_vs_b1": ratio_16,
        "rows": [asdict(row) for row in rows], "relay": relay_result(args, relays),
        "resume": None if resume is None else asdict(resume),
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
