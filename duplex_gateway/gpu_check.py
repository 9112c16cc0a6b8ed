"""GPU capacity check: the largest Moshi batch whose p99 step fits the 80 ms frame.

Run by ``scripts/gpu_check.sh`` on a machine with one NVIDIA GPU. It builds a full-size Moshi
(7.8B parameters, transformers' default ``MoshiConfig``, random weights: no checkpoint can be
downloaded, and compute does not depend on weight values) directly on the GPU in bf16, then
searches, for each mode, the largest batch B whose p99 step time stays within the frame:

* ``eager``: the backend as the worker runs it;
* ``graphs``: the temporal and depth transformers wrapped in
  ``torch.compile(mode="reduce-overhead")``, which records CUDA graphs (cudagraph trees) of
  the compiled regions, as the worker runs them with ``DUPLEX_GATEWAY_MOSHI_CUDA_GRAPHS``
  (:meth:`MoshiBackend.compile_graphs`); a mode that fails to compile is reported as failed,
  not fatal.

The search doubles B (from 1 eager, from ``--graphs-start`` with graphs, where every new size
costs a compile) until a size misses the budget (or runs out of memory), then bisects.
The whole run stays under ``--time-limit`` (default 450 s, so the script's hard 8-minute cap
is never reached): each mode gets a share of the time left, a search that runs out reports
the best size found so far (``complete: false``), and a watchdog writes what was measured and
exits if anything hangs. The table goes to stdout and every figure to ``--output`` (JSON).

``--cpu-tiny`` runs the same logic on a tiny random Moshi on the CPU (for tests of this
script); without it, a machine with no CUDA device fails at once with exit status 2, as does
a transformers release older than the moshi backend supports.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from duplex_gateway.bench.worker import (
    format_table,
    largest_batch_within,
    measure_batch,
    summarize,
    write_step_chart,
)
from duplex_gateway.bench.worker_rows import BenchRow

__all__ = ["ModeResult", "main"]

_NO_CUDA = 2
_WATCHDOG = 3


@dataclass(slots=True, kw_only=True)
class ModeResult:
    """One mode's search: every size measured, the best one, and how it ended."""

    mode: str
    largest_batch: int = 0
    complete: bool = False
    error: str | None = None
    seconds: float = 0.0
    rows: list[BenchRow] = field(default_factory=list)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="bench-results/gpu_check.json")
    parser.add_argument("--time-limit", type=float, default=450.0,
                        help="seconds for the whole run, build included (keep < 480)")
    parser.add_argument("--max-batch", type=int, default=64,
                        help="slots allocated: the largest batch tried")
    parser.add_argument("--context", type=int, default=0,
                        help="temporal KV window in frames (0: the config's, 3000 = 4 min)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per batch size")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per batch size")
    parser.add_argument("--budget-ms", type=float, default=0.0,
                        help="p99 step budget (0: the frame, 80 ms)")
    parser.add_argument("--modes", default="eager,graphs")
    parser.add_argument("--graphs-start", type=int, default=16,
                        help="first batch the graphs mode tries (each new size compiles)")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend of the graphs mode (eager: CPU tests)")
    parser.add_argument("--cpu-tiny", action="store_true",
                        help="a tiny random Moshi on the CPU: exercises this script only")
    return parser


def _build(args: argparse.Namespace, scratch: Path) -> Any:
    """The backend to measure: full size on the GPU, or tiny on the CPU."""
    if args.cpu_tiny:
        from inference_worker.backends.moshi import MoshiBackend
        from inference_worker.backends.moshi_tiny import write_tiny_moshi

        write_tiny_moshi(scratch / "tiny", seed=0)
        return MoshiBackend.load(scratch / "tiny", max_slots=args.max_batch)
    import torch

    from inference_worker.backends.moshi import build_full_size_on

    slots = args.max_batch
    while True:  # halve the slots until the KV caches fit next to the weights
        kwargs: dict[str, Any] = {"context": args.context} if args.context else {}
        try:
            return build_full_size_on("cuda", "bfloat16", max_slots=slots, **kwargs)
        except torch.cuda.OutOfMemoryError:
            if slots == 1:
                raise
            slots //= 2
            torch.cuda.empty_cache()
            print(f"out of memory; retrying with {slots} slots", file=sys.stderr, flush=True)


def _search(backend: Any, mode: str, *, args: argparse.Namespace, budget_ms: float,
            deadline: float, sync: Callable[[], None] | None) -> ModeResult:
    """The largest batch of ``backend`` within ``budget_ms`` at p99, before ``deadline``."""
    import torch

    result = ModeResult(mode=mode)
    started = time.monotonic()
    limit = backend.spec.max_slots
    base: list[float] = []  # the B=1 p50 (ms), the first size the search measures

    def out_of_time() -> bool:
        return time.monotonic() >= deadline

    def fits(batch: int) -> bool:
        try:
            times = measure_batch(backend, batch, steps=args.steps, warmup=args.warmup,
                                  sync=sync, out_of_time=out_of_time)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            print(f"{mode}: B={batch} out of memory", file=sys.stderr, flush=True)
            return False
        row = summarize(batch, times, budget_ms, base[0] if base else None)
        if batch == 1:
            base.append(row.p50_ms)
            row = summarize(batch, times, budget_ms, row.p50_ms)
        result.rows.append(row)
        ok = row.p99_ms <= budget_ms
        print(f"{mode}: B={batch} p50 {row.p50_ms:.1f} ms p99 {row.p99_ms:.1f} ms "
              f"({'fits' if ok else 'over'}) [{time.monotonic() - started:.0f} s]",
              file=sys.stderr, flush=True)
        return ok

    try:
        if mode == "graphs":
            backend.compile_graphs(args.compile_backend)
        start = args.graphs_start if mode == "graphs" else 1
        result.largest_batch = largest_batch_within(fits, limit=limit, start=start,
                                                    out_of_time=out_of_time)
        result.complete = not out_of_time()
    except Exception as exc:  # a mode that cannot run is a finding, not a crash
        result.error = f"{type(exc).__name__}: {exc}"[:500]
        print(f"{mode}: failed: {result.error}", file=sys.stderr, flush=True)
    result.seconds = round(time.monotonic() - started, 1)
    result.rows.sort(key=lambda row: row.batch)
    return result


def _report(results: Sequence[ModeResult], info: dict[str, Any], output: Path) -> None:
    budget_ms = float(info.get("budget_ms", 80.0))
    for result in results:
        state = "complete" if result.complete else "INCOMPLETE (time limit)"
        if result.error:
            state = f"FAILED: {result.error}"
        print(f"\n== {result.mode}: largest batch within {info['budget_ms']:.0f} ms p99: "
              f"{result.largest_batch} ({state}, {result.seconds:.0f} s)")
        if result.rows:
            print(format_table(result.rows, budget_ms))
    payload = {**info, "modes": [{**asdict(r), "rows": [asdict(row) for row in r.rows]}
                                 for r in results]}
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(payload, indent=2) + "\n")
    runs = {result.mode: result.rows for result in results if result.rows}
    if runs:
        plot = write_step_chart(output.with_suffix(".svg"), runs, budget_ms,
                                title=f"gpu check: Moshi step time by batch ({info['device']})")
        print(f"wrote {plot}", flush=True)
    print(f"wrote {output}", flush=True)


def _cannot_run(*, needs_cuda: bool) -> str | None:
    """Why this machine cannot run the check, or None when it can (before minutes of build)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install torch with CUDA support)"
    try:
        from inference_worker.backends.moshi import require_supported_transformers

        require_supported_transformers()
    except ImportError as exc:
        return f"the moshi backend cannot be imported ({exc}); install the moshi extra"
    except RuntimeError as exc:
        return str(exc)
    if needs_cuda and not torch.cuda.is_available():
        build = torch.version.cuda or "a CPU-only build"
        return (f"CUDA is not available (torch {torch.__version__}, {build}); this check"
                " needs an NVIDIA GPU. Use --cpu-tiny to exercise the script on a CPU.")
    return None


def _watchdog(seconds: float, results: list[ModeResult], info: dict[str, Any],
              output: Path) -> threading.Timer:
    """Write what was measured and exit if the run overstays ``seconds``."""
    def expire() -> None:
        print(f"gpu_check: watchdog: {seconds:.0f} s elapsed; writing partial results",
              file=sys.stderr, flush=True)
        info["watchdog"] = True
        _report(results, info, output)
        os._exit(_WATCHDOG)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check; returns the exit status (0 ok, 2 cannot run here, 3 watchdog)."""
    args = _parser().parse_args(argv)
    started = time.monotonic()
    end = started + args.time_limit
    if (reason := _cannot_run(needs_cuda=not args.cpu_tiny)) is not None:
        print(f"gpu_check: {reason}", file=sys.stderr)
        return _NO_CUDA
    import torch

    output = Path(args.output)
    results: list[ModeResult] = []
    info: dict[str, Any] = {"device": "cpu (tiny)" if args.cpu_tiny else
                            torch.cuda.get_device_name(0), "torch": torch.__version__}
    watchdog = _watchdog(args.time_limit + 15, results, info, output)
    sync = None if args.cpu_tiny else torch.cuda.synchronize
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        backend = _build(args, Path(scratch))
        frame_ms = backend.spec.frame_seconds * 1000
        budget_ms = args.budget_ms or frame_ms
        info.update(frame_ms=frame_ms, budget_ms=budget_ms, slots=backend.spec.max_slots,
                    build_seconds=round(time.monotonic() - started, 1))
        print(f"built in {info['build_seconds']} s: {backend.spec.max_slots} slots, "
              f"budget {budget_ms:.0f} ms", file=sys.stderr, flush=True)
        for index, mode in enumerate(modes):
            share = (end - time.monotonic()) / (len(modes) - index)
            results.append(_search(backend, mode, args=args, budget_ms=budget_ms,
                                   deadline=time.monotonic() + share, sync=sync))
    watchdog.cancel()
    info["seconds"] = round(time.monotonic() - started, 1)
    _report(results, info, output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
