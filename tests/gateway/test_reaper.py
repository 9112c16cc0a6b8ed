"""The reaper through a Redis outage: a worker that could not beat is not declared lost at once."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from redis.asyncio import Redis

import gateway.reaper
from gateway.metrics import GatewayMetrics
from gateway.reaper import run_reaper
from runtime.embedded import EmbeddedServer
from runtime.ratelog import RateLimitedLog
from store import Scripts, create_client
from store.directory import announce_worker
from store.keys import SessionKeys
from tests.faultproxy import FaultProxy
from tests.store._support import (
    open_session,
    redis_now_ms,
    register_worker,
    until,
    wait_redis_clock_past,
    worker_field,
)

TTL_MS = 400
OUTAGE_LINE = "(a failover or an outage)"
LATE_LINE = "its event loop was late"
FIRST_LINE = "before this gateway's reaper first did"


@pytest.fixture(autouse=True)
def fresh_reaper_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees every line: the module's rate limit would hold back a cause that an
    earlier test wrote within its interval."""
    monkeypatch.setattr(gateway.reaper, "_rare",
                        RateLimitedLog(logging.getLogger("gateway.reaper"), interval_s=10.0))


@pytest.mark.parametrize("beats_again", [True, False])
async def test_after_an_outage_a_lapsed_worker_gets_one_ttl(
    redis_server: EmbeddedServer, redis_client: Redis, caplog: pytest.LogCaptureFixture,
    beats_again: bool,
) -> None:
    """The worker's heartbeat lapses while the reaper cannot reach Redis. Once it can, the
    worker has a TTL to beat: if it does it stays live, if not it is lost then."""
    scripts = Scripts(redis_client)
    wid = await register_worker(scripts, slots=2, ttl_ms=TTL_MS)
    await announce_worker(redis_client, wid, await redis_now_ms(redis_client) + 60_000)
    opened = await open_session(scripts, wid)
    proxy = FaultProxy("127.0.0.1", redis_server.port)
    await proxy.start()
    lossy = create_client(proxy.url)
    reaper = asyncio.create_task(run_reaper(lossy, Scripts(lossy), GatewayMetrics(), 0.02))
    try:
        proxy.cut()
        beat = await scripts.worker_heartbeat(wid, slots=2, ttl_ms=TTL_MS, register=False,
                                              drain=False)
        await wait_redis_clock_past(redis_client, beat.alive_until_ms + 50)  # lapsed
        with caplog.at_level(logging.WARNING, logger="gateway.reaper"):
            await until(lambda: "reaper pass failed" in caplog.text, "a failed reaper pass")
            back = await redis_now_ms(redis_client)  # the reaper can only recover after this
            proxy.restore()
            # Told as what it may be: this reaper's own passes failed, so its lateness
            # explains nothing.
            await until(lambda: OUTAGE_LINE in caplog.text, "the slot outage told")
        assert LATE_LINE not in caplog.text
        await wait_redis_clock_past(redis_client, back + TTL_MS // 2)
        assert await worker_field(redis_client, wid, "state") == "live", "lost at once"
        if beats_again:
            await scripts.worker_heartbeat(wid, slots=2, ttl_ms=TTL_MS, register=False,
                                           drain=False)
            await wait_redis_clock_past(redis_client, back + TTL_MS + 100)
            assert await worker_field(redis_client, wid, "state") == "live"
        else:
            async def lost() -> bool:
                return await worker_field(redis_client, wid, "state") == "lost"

            await until(lost, "the worker declared lost a TTL after the outage")
            assert await redis_now_ms(redis_client) >= back + TTL_MS
            record = SessionKeys(opened.session_id).record

            async def ended() -> bool:
                # The worker is marked lost by one script and its sessions ended by the next.
                return await redis_client.hget(record, "state") == b"closed"

            await until(ended, "the lost worker's session ended")
            assert await redis_client.hget(record, "reason") == b"worker_lost"
    finally:
        reaper.cancel()
        await asyncio.gather(reaper, return_exceptions=True)
        await lossy.aclose()
        await proxy.aclose()


async def test_a_gap_of_this_gateways_own_making_is_told_as_that(
        redis_client: Redis, caplog: pytest.LogCaptureFixture) -> None:
    """The gateway's event loop is held up (a load spike) past the script's outage
    threshold: the reap that follows finds the gap and gives the worker a full TTL, as after
    an outage, but the line says it was this gateway's own lateness, at INFO, not a WARNING
    sending an operator to look for a Redis failover that never happened."""
    scripts = Scripts(redis_client)
    wid = await register_worker(scripts, slots=2, ttl_ms=60_000)
    await announce_worker(redis_client, wid, await redis_now_ms(redis_client) + 60_000)
    metrics = GatewayMetrics()
    reaper = asyncio.create_task(run_reaper(redis_client, Scripts(redis_client), metrics, 0.02))
    try:
        with caplog.at_level(logging.INFO, logger="gateway.reaper"):
            first = await worker_field(redis_client, wid, "reaped_ms")
            await until(lambda: _reached_since(redis_client, wid, first), "a first reap")
            time.sleep(0.5)  # the load spike itself: the loop is held, not waited on
            await until(lambda: LATE_LINE in caplog.text, "the late reap told")
        assert OUTAGE_LINE not in caplog.text
        late = [r for r in caplog.records if LATE_LINE in r.getMessage()]
        assert late and all(r.levelno == logging.INFO for r in late)
        assert await worker_field(redis_client, wid, "state") == "live"
    finally:
        reaper.cancel()
        await asyncio.gather(reaper, return_exceptions=True)


async def _reached_since(client: Redis, worker_id: str, before: str | None) -> bool:
    return await worker_field(client, worker_id, "reaped_ms") not in (None, before)


async def test_a_gap_before_this_gateways_first_reap_is_told_as_that(
        redis_client: Redis, caplog: pytest.LogCaptureFixture) -> None:
    """A deployment starting: the worker registers, and the gateway's reaper comes later than
    the outage threshold. Its first reap gives the worker a full TTL, and says why at INFO:
    no reaper had come since the worker registered, not a failover."""
    scripts = Scripts(redis_client)
    wid = await register_worker(scripts, slots=2, ttl_ms=60_000)
    registered = await redis_now_ms(redis_client)
    await announce_worker(redis_client, wid, registered + 60_000)
    await wait_redis_clock_past(redis_client, registered + 300)  # past 2 x (0.02 s + a pass)
    reaper = asyncio.create_task(run_reaper(redis_client, Scripts(redis_client),
                                            GatewayMetrics(), 0.02))
    try:
        with caplog.at_level(logging.INFO, logger="gateway.reaper"):
            await until(lambda: FIRST_LINE in caplog.text, "the first reap told")
        assert OUTAGE_LINE not in caplog.text
        first = [r for r in caplog.records if FIRST_LINE in r.getMessage()]
        assert [r.levelno for r in first] == [logging.INFO]
    finally:
        reaper.cancel()
        await asyncio.gather(reaper, return_exceptions=True)


async def test_a_reap_that_waited_on_redis_is_no_lateness_of_the_reaper(
        redis_server: EmbeddedServer, redis_client: Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    """The reaper's passes all succeed, but one reap waits in the network (a failover its
    Redis client rides out) past the outage threshold: the gap it finds is told as a
    possible outage, a WARNING, not as this gateway's event loop running late, since the
    reaper sent it on time."""
    scripts = Scripts(redis_client)
    wid = await register_worker(scripts, slots=2, ttl_ms=60_000)
    await announce_worker(redis_client, wid, await redis_now_ms(redis_client) + 60_000)
    proxy = FaultProxy("127.0.0.1", redis_server.port)
    await proxy.start()
    slow = create_client(proxy.url)
    reaper = asyncio.create_task(run_reaper(slow, Scripts(slow), GatewayMetrics(), 0.02))
    try:
        with caplog.at_level(logging.INFO, logger="gateway.reaper"):
            first = await worker_field(redis_client, wid, "reaped_ms")
            await until(lambda: _reached_since(redis_client, wid, first), "a first reap")
            proxy.hold_command(wid.encode())  # the next reap of this worker waits in the proxy
            async with asyncio.timeout(10):
                await proxy.holding.wait()
            await wait_redis_clock_past(redis_client, await redis_now_ms(redis_client) + 300)
            proxy.release()
            await until(lambda: OUTAGE_LINE in caplog.text, "the gap told as an outage")
        assert LATE_LINE not in caplog.text
    finally:
        reaper.cancel()
        await asyncio.gather(reaper, return_exceptions=True)
        await slow.aclose()
        await proxy.aclose()
