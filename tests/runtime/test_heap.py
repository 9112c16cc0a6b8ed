"""The startup heap is frozen out of the collector's passes, and every pass is observed."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from runtime.heap import CollectorPauses

pytestmark = pytest.mark.timeout(60)

# Run in a process of its own: freezing this test process's heap would keep every earlier
# test's garbage for the rest of the run.
_FREEZE = """
import gc, json
from runtime.heap import freeze_startup_heap
import store.scripts, gateway.app  # a heap of a gateway's size
garbage = []
garbage.append(garbage)  # a cycle nothing refers to: collected, not frozen
del garbage
tracked = len(gc.get_objects())
frozen = freeze_startup_heap()
print(json.dumps({"tracked": tracked, "frozen": frozen, "count": gc.get_freeze_count(),
                  "left": len(gc.get_objects()), "garbage": gc.garbage}))
"""


def test_freezing_moves_the_startup_heap_out_of_every_pass() -> None:
    """Everything alive is frozen (the collector's generations are left empty), and the
    startup's cyclic garbage is collected first, not frozen."""
    done = subprocess.run([sys.executable, "-c", _FREEZE], capture_output=True, text=True,
                          check=True, timeout=50)
    answer = json.loads(done.stdout)
    assert answer["frozen"] == answer["count"]
    assert answer["frozen"] > 10_000, answer  # the imports' functions, classes, dicts
    assert answer["frozen"] < answer["tracked"], "the unreachable cycle was collected first"
    assert answer["left"] < 100, answer  # only what the print itself made
    assert answer["garbage"] == []


def test_every_pass_is_observed_with_its_generation() -> None:
    """A full pass and a young one each reach the observer, with a duration; once removed,
    nothing does. (A young pass of the collector's own may come in between: the order and
    the full pass are what is checked.)"""
    seen: list[tuple[int, float]] = []
    pauses = CollectorPauses(lambda generation, seconds: seen.append((generation, seconds)))
    pauses.install()
    pauses.install()  # once only
    try:
        gc.collect(2)
        gc.collect(0)
    finally:
        pauses.remove()
    generations = [generation for generation, _ in seen]
    assert generations.count(2) == 1 and generations[-1] == 0, generations
    assert all(seconds >= 0 for _, seconds in seen)
    observed = len(seen)
    gc.collect(2)
    assert len(seen) == observed, "a removed observer hears nothing"
