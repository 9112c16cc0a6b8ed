"""How late the event loop runs what is due: the process's own share of every latency.

One step that holds the loop (a burst of pushes handled in one go, a collector pass, a call
that blocks by mistake) delays every connection and session the process serves. It shows in
the relay's p99 long before it shows in CPU, and nothing else names the process it came from.
A probe that sleeps a fixed interval and observes how much later than due it woke measures
it: about zero on a loop that keeps up, the length of the step that held it otherwise.
Shared by the gateway and the worker (it lives in the lower layer); a wake-up every
:data:`PROBE_INTERVAL_S` costs nothing measurable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["LAG_BUCKETS", "PROBE_INTERVAL_S", "watch_loop_lag"]

#: How often the probe wakes, seconds.
PROBE_INTERVAL_S = 0.1

#: Histogram buckets for the lateness, seconds: DESIGN §5's 2 ms relay budget, a worker's
#: 80 ms frame, and the 0.5 s of heartbeat slack past which a worker is taken for lost.
LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 1.0, 2.5)


async def watch_loop_lag(observe: Callable[[float], None], *,
                         interval_s: float = PROBE_INTERVAL_S) -> None:
    """Hand ``observe`` the loop's lateness, in seconds, every ``interval_s``, until
    cancelled (run it as a task of the loop to watch)."""
    while True:
        due = time.monotonic() + interval_s
        await asyncio.sleep(interval_s)  # the probe itself: how late it wakes is the measure
        observe(max(0.0, time.monotonic() - due))
