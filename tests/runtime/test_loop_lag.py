"""runtime.loop_lag: the probe reports how long a step held the event loop, and about nothing
while the loop keeps up."""

from __future__ import annotations

import asyncio
import time

import pytest

from runtime.loop_lag import watch_loop_lag

pytestmark = pytest.mark.timeout(30)

INTERVAL_S = 0.02
HELD_S = 0.3


async def test_a_step_that_holds_the_loop_is_observed_as_its_length() -> None:
    seen: list[float] = []
    woke = asyncio.Event()

    def observe(lag_s: float) -> None:
        seen.append(lag_s)
        woke.set()

    probe = asyncio.create_task(watch_loop_lag(observe, interval_s=INTERVAL_S))
    try:
        async with asyncio.timeout(10):
            await woke.wait()  # the probe runs: its first wake-up on a loop that keeps up
            assert seen[0] < HELD_S / 2
            before = len(seen)
            time.sleep(HELD_S)  # the step that holds the loop: what the probe must see
            while len(seen) == before:
                woke.clear()
                await woke.wait()
    finally:
        probe.cancel()
        await asyncio.gather(probe, return_exceptions=True)
    # It woke that much late, less the interval it was waiting out anyway.
    assert HELD_S - INTERVAL_S - 0.01 <= seen[before] <= HELD_S + 1.0
    assert all(lag >= 0 for lag in seen)
