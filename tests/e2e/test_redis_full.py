"""Redis out of memory under a live session: real processes, Redis's own ``maxmemory``.

A Redis that reaches ``maxmemory`` (policy ``noeviction``, the only one a store of logs may
use) refuses every write that would grow it, while reads and the commands that free memory
still run. That is an outage of writes, not of the connection: the processes must treat it
as one, write nothing half-way (a push without its entry, an event twice) and carry on once
memory is back.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from duplex_client import DuplexClient
from tests.e2e.helpers import STREAM_SESSION
from tests.e2e.stack import Stack
from tests.e2e.test_outages import assert_no_traceback_or_error, read_echoes, stream_audio
from tests.store._support import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

#: How long Redis stays full: long enough for every loop (appends, flushes, leases,
#: heartbeats) to meet a refusal several times.
FULL_S = 3.0


async def test_a_full_redis_refuses_writes_and_the_session_streams_on_after(
        stack: Stack) -> None:
    """Redis is made full (``maxmemory`` at what it uses now) while a session streams 20 ms
    chunks through a gateway and a worker, then given room again: no traceback, no ERROR
    line, and the session streams on; every chunk is echoed exactly once, in order."""
    gateway = await asyncio.to_thread(stack.gateway)
    worker = await asyncio.to_thread(stack.worker)
    admin = Redis.from_url(stack.redis.url)
    sent: list[int] = []
    echoed: list[int] = []
    try:
        assert (await admin.config_get("maxmemory-policy"))["maxmemory-policy"] == "noeviction"
        async with await DuplexClient.connect(gateway.ws_url,
                                              session=STREAM_SESSION) as client:
            streaming = [asyncio.create_task(stream_audio(client, sent)),
                         asyncio.create_task(read_echoes(client, echoed))]
            try:
                await until(lambda: len(echoed) >= 10, "the session to stream")
                used = (await admin.info("memory"))["used_memory"]
                await admin.config_set("maxmemory", max(1, used - 1024 * 1024))
                refused_before = await oom_refusals(admin)
                await until(lambda: oom_refusals_above(admin, refused_before),
                            "Redis to refuse a write for want of memory")
                await asyncio.sleep(FULL_S)  # the outage itself: a duration, not a condition
                await admin.config_set("maxmemory", 0)
                sent_by_then = len(sent)
                await until(lambda: len(echoed) > sent_by_then + 10,
                            "the session to stream again once Redis has room", timeout=30)
            finally:
                for task in streaming:
                    task.cancel()
                await asyncio.gather(*streaming, return_exceptions=True)
        print(f"sent {len(sent)} chunks, {len(echoed)} echoed, "
              f"{await oom_refusals(admin)} writes refused for memory")
        assert echoed == list(range(len(echoed))), "an echo was lost, repeated or out of order"
        for proc in (gateway, worker):
            assert_no_traceback_or_error(proc)
    finally:
        await admin.config_set("maxmemory", 0)
        await admin.aclose()


async def oom_refusals(admin: Redis) -> int:
    """Commands Redis refused for want of memory so far (its ``OOM`` error count)."""
    stats = await admin.info("errorstats")
    return int(stats.get("errorstat_OOM", {}).get("count", 0))


async def oom_refusals_above(admin: Redis, count: int) -> bool:
    return await oom_refusals(admin) > count
