"""The process's startup heap, kept out of the garbage collector's full passes.

CPython's cyclic collector stops every thread while it runs, and a full (generation 2) pass
walks every container object alive: the modules, the app, the model. Such a pass takes tens
of milliseconds in a gateway or a worker, and far more once torch and a model's classes are
imported (docs/operations/observability.md): every session's output is late by as much, and a
frame backend's budget for the frame is gone.

What startup builds lives as long as the process, so there is nothing to find in it: the
gateway and the worker move it into the collector's permanent generation once they are
ready to serve (:func:`freeze_startup_heap`), and full passes then walk only what came
after. Each pass's pause is observed (:class:`CollectorPauses`), so a regression is seen in
the metrics, not guessed at from a latency tail.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

__all__ = ["GENERATIONS", "PAUSE_BUCKETS", "CollectorPauses", "freeze_startup_heap"]

#: The collector's generations, as a pass reports them (2: a full pass).
GENERATIONS = tuple(range(len(gc.get_threshold())))

#: Histogram buckets for a pass's length, seconds: tens of microseconds for the young
#: generation, up to hundreds of milliseconds for a full pass over an unfrozen heap with a
#: model loaded. One set for every process that exports its passes.
PAUSE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                 0.5, 1.0)


def freeze_startup_heap() -> int:
    """Collect what startup left as garbage (frozen garbage would never be freed), then
    freeze everything alive; returns how many objects the permanent generation holds.

    Call it once the process is ready to serve: it blocks for one full pass.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class CollectorPauses:
    """Hands the length of every collector pass, with its generation, to ``observe``.

    :meth:`install` adds it to :data:`gc.callbacks` and :meth:`remove` takes it away. The
    callback runs inside the pass, on whichever thread's allocation triggered it, so
    ``observe`` must be thread-safe and must never wait for a lock that code could hold while
    it allocates: the pass may have started on that very allocation, on the same thread, and
    would wait for itself forever. A labelled Prometheus histogram's ``labels()`` is such a
    lock (every scrape copies the children's dict under it), so the callers bind one child
    per generation (:data:`GENERATIONS`) before they install this, and ``observe`` only
    observes: prometheus_client holds a value's lock only around float arithmetic, which
    allocates nothing the collector tracks, and a pass that waits for another thread's
    value lock releases the GIL while it waits, so that thread finishes and lets go.
    """

    def __init__(self, observe: Callable[[int, float], None]) -> None:
        self._observe = observe
        self._started = 0.0

    def install(self) -> None:
        """Start observing (once)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def remove(self) -> None:
        """Stop observing."""
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._observe(int(info["generation"]), time.perf_counter() - self._started)
