"""A burst of pushes is handled a notice at a time, never as one step of the worker's loop.

The push connection hands over every push one socket read carries (hundreds, from a
saturated Redis) and a queue's ``get`` need not suspend while notices are queued, so a
notice loop that never yields would run the whole backlog as one step: the heartbeat behind
it came past its TTL and a healthy, saturated worker was declared lost (``bench relay`` at
200 sessions through 2 gateways). Counted in steps, not timed: another task must get turns
while the burst is handled.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from store.keys import new_session_id
from store.pushes import SessionEnded
from tests.worker._running import running_worker

pytestmark = pytest.mark.timeout(60)

BURST = 500


async def test_a_burst_of_notices_leaves_the_loop_turns_between_them(
        redis_client: Redis) -> None:
    async with running_worker(redis_client, slots=2) as running:
        worker = running.worker
        notices = worker._notices  # the queue the push connection feeds
        # Close notices of sessions it never had: each is handled without suspending.
        for _ in range(BURST):
            notices.put(SessionEnded(new_session_id(worker.worker_id)))
        turns = 0
        while not notices.empty():
            turns += 1
            await asyncio.sleep(0)
        # One turn each if the loop yields between notices; 1 if it ran them in one step.
        assert turns >= BURST // 2, turns
