"""Python function calls per relayed chunk: a server profiled over the bench's window only.

``python -m duplex_gateway.bench.profiling OUT MODULE [ARGS...]`` runs ``MODULE`` as
``python -m MODULE ARGS...`` would, with ``cProfile`` switched on by :data:`START` and its
statistics written to ``OUT`` by :data:`STOP`. ``bench relay --profile`` starts the gateways and
the worker this way and sends the two signals at the start and the end of its measured window,
so startup, warm-up and shutdown are not counted.

What it is for: the count of Python calls per chunk is reproducible from run to run, where CPU
time on a shared machine is not, so it shows whether a change removed Python steps from the hot
path. What it is not for: ``cProfile``'s timings inflate small calls several-fold, so a
profiled run's CPU figures are not comparable with an unprofiled run's. A coroutine counts one
call per resumption (an append that awaits once counts two).
"""

from __future__ import annotations

import cProfile
import os
import pstats
import runpy
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["START", "STOP", "calls_per_chunk", "main", "profiled"]

#: Switches the profiler on (once the bench's measured window begins).
START = signal.SIGUSR1
#: Switches it off and writes the statistics (once the window ends).
STOP = signal.SIGUSR2
# The functions listed per process, most called first.
_TOP = 8


def profiled(module_args: list[str], out: Path) -> list[str]:
    """The ``python -m`` arguments that run ``module_args`` under this profiler into ``out``."""
    return [__name__, str(out), *module_args]


def main(argv: list[str]) -> None:
    """Run ``argv[1]`` as ``python -m`` would, profiled between :data:`START` and
    :data:`STOP` into ``argv[0]``."""
    out, module = Path(argv[0]), argv[1]
    profile = cProfile.Profile()

    def start(signum: int, frame: FrameType | None) -> None:
        profile.enable()  # the main thread's, where the event loop runs

    def stop(signum: int, frame: FrameType | None) -> None:
        profile.disable()
        partial = out.with_name(out.name + ".partial")
        profile.dump_stats(partial)
        os.replace(partial, out)  # whole or absent: the bench waits for the file

    signal.signal(START, start)
    signal.signal(STOP, stop)
    sys.argv = [module, *argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _where(function: tuple[str, int, str]) -> str:
    path, line, name = function
    parts = Path(path).parts
    for root in ("site-packages", "duplex_gateway", "gateway", "store", "inference_worker",
                 "contract", "runtime"):
        if root in parts:
            at = parts.index(root) + (root == "site-packages")
            return f"{'/'.join(parts[at:])}:{line} {name}"
    return f"{Path(path).name}:{line} {name}"


def calls_per_chunk(stats_file: Path, chunks: int) -> dict[str, Any]:
    """The profile in ``stats_file`` per relayed chunk: every call (built-ins included), the
    calls of functions written in Python, and the most called of those."""
    # pstats keeps, per function, (primitive calls, all calls, own time, cumulative, callers)
    # in ``stats``, which its type stubs do not declare.
    stats = pstats.Stats(str(stats_file))
    table: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    python = {function: row[1] for function, row in table.items() if function[0] != "~"}
    ranked = sorted(python.items(), key=lambda item: -item[1])[:_TOP]
    return {
        "calls_per_chunk": sum(row[1] for row in table.values()) / chunks,
        "python_calls_per_chunk": sum(python.values()) / chunks,
        "most_called": [{"function": _where(function), "calls_per_chunk": calls / chunks}
                        for function, calls in ranked],
    }


if __name__ == "__main__":
    main(sys.argv[1:])
