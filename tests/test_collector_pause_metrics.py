"""A collector pass observed into the metrics never waits on the metrics' own locks.

The pass's callback runs on whatever allocation started it. A scrape allocates while holding
a labelled metric's lock (prometheus_client copies the children's dict under it; CPython
3.11 usually takes that dict from its free list, which starts no pass, but not always), so a
pass that began there and then asked the same metric for a child by ``labels()`` would wait
for its own thread forever: the gateway's or the worker's whole process stopped, by a scrape.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.metrics import GatewayMetrics
from inference_worker.metrics import WorkerMetrics
from runtime.heap import CollectorPauses

pytestmark = pytest.mark.timeout(60)

_DEADLINE_S = 20.0
_Observe = Callable[[int, float], None]


def _gateway() -> tuple[_Observe, Any, CollectorRegistry]:
    metrics = GatewayMetrics()
    return metrics.observe_gc_pause, metrics.gc_pause_seconds, metrics.registry


def _worker() -> tuple[_Observe, Any, CollectorRegistry]:
    metrics = WorkerMetrics("loopback")
    histogram = metrics.registry._names_to_collectors["duplex_worker_gc_pause_seconds"]
    return metrics.observe_gc_pause, histogram, metrics.registry


@pytest.mark.parametrize("make", [_gateway, _worker], ids=["gateway", "worker"])
def test_a_pass_that_starts_under_the_metrics_lock_is_observed_without_a_deadlock(
        make: Callable[[], tuple[_Observe, Any, CollectorRegistry]]) -> None:
    """A pass that starts while the pause histogram's own lock is held (where a scrape
    holds it: prometheus_client's private ``_lock``, the one thing this test reaches into)
    is observed, and the holder goes on. On a thread of its own, so that a deadlock fails
    the test instead of hanging the run."""
    observe, histogram, registry = make()
    pauses = CollectorPauses(observe)
    finished = threading.Event()

    def collect_while_scraping() -> None:
        with histogram._lock:
            gc.collect(0)
            gc.collect(2)
        finished.set()

    holder = threading.Thread(target=collect_while_scraping, name="scraper", daemon=True)
    pauses.install()
    try:
        holder.start()
        holder.join(_DEADLINE_S)
    finally:
        pauses.remove()
    assert finished.is_set(), "a collector pass deadlocked on the metric's lock"
    exposed = generate_latest(registry).decode()
    for generation in ("0", "2"):
        counts = [line for line in exposed.splitlines()
                  if "gc_pause_seconds_count" in line and f'generation="{generation}"' in line]
        assert counts and float(counts[0].rsplit(" ", 1)[1]) >= 1, exposed
