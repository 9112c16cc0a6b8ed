"""store.script_lane: scripts on the store's own pipelined connection, against real servers.

The store's contract suite runs on this connection too (the ``scripts`` and ``lossy`` fixtures
take both connections, lost replies included, and the Sentinel failover test); here: what the
lane itself promises. One connection for all calls, replies matched to their callers when some
stop waiting, a connection that goes silent dropped, a flushed script cache, a restart.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
    OutOfMemoryError,
    ResponseError,
)

from runtime.embedded import EmbeddedServer
from store import Scripts, create_client
from store.resp import endpoint_of
from store.script_lane import ScriptLane
from tests.faultproxy import FaultProxy
from tests.store._support import ev, open_session, register_worker

ECHO = "return ARGV[1]"
ECHO_SHA = hashlib.sha1(ECHO.encode()).hexdigest()
WAIT_S = 5.0


def lane_for(client: Redis, stall_s: float = 10.0) -> ScriptLane:
    return ScriptLane(lambda: endpoint_of(client), stall_s=stall_s)


@pytest.fixture
async def proxied(redis_server: EmbeddedServer) -> AsyncIterator[tuple[FaultProxy, Redis]]:
    fault = FaultProxy("127.0.0.1", redis_server.port)
    await fault.start()
    client = Redis.from_url(fault.url)
    yield fault, client
    await client.aclose()
    await fault.aclose()


async def connected_clients(admin: Redis) -> int:
    return int((await admin.info("clients"))["connected_clients"])


async def test_every_call_shares_one_connection(redis_server: EmbeddedServer,
                                                redis_client: Redis) -> None:
    client = create_client(redis_server.url)
    scripts = Scripts(client, own_connection=True)
    before = await connected_clients(redis_client)
    try:
        worker = await register_worker(scripts, slots=20)
        opened = await asyncio.gather(*(open_session(scripts, worker) for _ in range(20)))
        firsts = await asyncio.gather(*(
            scripts.append_output(o.session_id, [ev(1), ev(2)], first_seq=1) for o in opened))
        assert firsts == [1] * 20
        assert await connected_clients(redis_client) == before + 1
    finally:
        await scripts.aclose()
        await client.aclose()
    async with asyncio.timeout(WAIT_S):  # the server notices the close on its own time
        while await connected_clients(redis_client) != before:
            await asyncio.sleep(0.02)


async def test_a_caller_that_stops_waiting_leaves_the_others_their_replies(
        proxied: tuple[FaultProxy, Redis]) -> None:
    fault, client = proxied
    lane = lane_for(client)
    try:
        assert await lane.evalsha(ECHO_SHA, ECHO, [], [b"warm"]) == b"warm"  # loaded, connected
        fault.hold_command(b"first")  # it, and what follows it on the connection, waits
        calls = [asyncio.create_task(lane.evalsha(ECHO_SHA, ECHO, [], [name]))
                 for name in (b"first", b"second", b"third", b"fourth")]
        await asyncio.wait_for(fault.holding.wait(), WAIT_S)
        calls[0].cancel()
        calls[2].cancel()
        fault.release()
        assert await asyncio.wait_for(calls[1], WAIT_S) == b"second"
        assert await asyncio.wait_for(calls[3], WAIT_S) == b"fourth"
        assert calls[0].cancelled() and calls[2].cancelled()
        assert await lane.evalsha(ECHO_SHA, ECHO, [], [b"after"]) == b"after"
    finally:
        await lane.aclose()


async def test_a_silent_connection_fails_its_calls_and_the_next_call_reconnects(
        proxied: tuple[FaultProxy, Redis]) -> None:
    fault, client = proxied
    lane = lane_for(client, stall_s=0.3)
    try:
        assert await lane.evalsha(ECHO_SHA, ECHO, [], [b"1"]) == b"1"
        fault.freeze()  # no reset, no reply: a peer that vanished
        with pytest.raises(RedisConnectionError, match="no reply from Redis"):
            await asyncio.wait_for(lane.evalsha(ECHO_SHA, ECHO, [], [b"2"]), WAIT_S)
        assert await asyncio.wait_for(lane.evalsha(ECHO_SHA, ECHO, [], [b"3"]), WAIT_S) == b"3"
    finally:
        await lane.aclose()


async def test_a_flushed_script_cache_is_refilled(redis_client: Redis) -> None:
    lane = lane_for(redis_client)
    try:
        assert await lane.evalsha(ECHO_SHA, ECHO, [], [b"a"]) == b"a"
        await redis_client.script_flush()
        assert await lane.evalsha(ECHO_SHA, ECHO, [], [b"b"]) == b"b"  # sent as EVAL
        assert (await redis_client.script_exists(ECHO_SHA)) == [True]
    finally:
        await lane.aclose()


async def test_an_error_reply_is_redis_pys_exception_and_the_connection_stays(
        redis_client: Redis) -> None:
    lane = lane_for(redis_client)
    before = await connected_clients(redis_client)
    try:
        with pytest.raises(ResponseError, match="boom"):
            await lane.evalsha(hashlib.sha1(b"return redis.error_reply('boom')").hexdigest(),
                               "return redis.error_reply('boom')", [], [])
        assert await lane.evalsha(ECHO_SHA, ECHO, [], [b"ok"]) == b"ok"
        assert await connected_clients(redis_client) == before + 1
    finally:
        await lane.aclose()


async def test_a_transaction_answers_each_command_and_names_why_one_was_refused(
        redis_client: Redis) -> None:
    """A MULTI's replies come back per command, a command's runtime error among them as
    redis-py's exception (the others ran); a command Redis refuses to queue (out of memory)
    aborts the whole EXEC, and that refusal, not the bare EXECABORT, is the error raised.
    The connection stays."""
    lane = lane_for(redis_client)
    before = await connected_clients(redis_client)
    try:
        replies = await lane.transaction("k", [["SET", "k", "1"], ["LPUSH", "k", "x"],
                                               ["INCR", "k"]])
        assert replies[0] == b"OK" and replies[2] == 2
        assert isinstance(replies[1], ResponseError) and "WRONGTYPE" in str(replies[1])
        used = int((await redis_client.info("memory"))["used_memory"])
        await redis_client.config_set("maxmemory", max(1, used - 1024 * 1024))
        try:
            with pytest.raises(OutOfMemoryError):
                await lane.transaction("k", [["INCR", "k"], ["SET", "j", "y"]])
        finally:
            await redis_client.config_set("maxmemory", 0)
        assert await redis_client.get("k") == b"2" and not await redis_client.exists("j")
        assert await lane.transaction("k", [["INCR", "k"]]) == [3]
        assert await connected_clients(redis_client) == before + 1
    finally:
        await lane.aclose()


async def test_scripts_carry_on_after_a_redis_restart(own_server: EmbeddedServer) -> None:
    """The restart breaks the connection under a live Scripts; its next calls reconnect (the
    first one is resent by Scripts after the broken connection), with the data gone."""
    client = create_client(own_server.url)
    scripts = Scripts(client, own_connection=True)
    try:
        worker = await register_worker(scripts)
        await open_session(scripts, worker)
        await asyncio.to_thread(own_server.restart)
        worker = await register_worker(scripts)
        opened = await open_session(scripts, worker)
        assert await scripts.append_output(opened.session_id, [ev(1)], first_seq=1) == 1
    finally:
        await scripts.aclose()
        await client.aclose()


async def test_a_closed_lane_refuses_calls(redis_client: Redis) -> None:
    lane = lane_for(redis_client)
    assert await lane.evalsha(ECHO_SHA, ECHO, [], [b"x"]) == b"x"
    await lane.aclose()
    with pytest.raises(RedisConnectionError):
        await lane.evalsha(ECHO_SHA, ECHO, [], [b"y"])


class _Count(int):
    """An int subclass (hiredis's packer takes exact ints only)."""


ARGUMENTS = [b"\x00\xffraw", "text", "\u00e9\u4e2d", 0, -7, 2**70, 1.5, 0.1, -0.0, 1e20, 2.5e-7,
             float("inf")]
# Those hiredis does not take: packed by the store's own loop, still as redis-py would.
UNCOMMON_ARGUMENTS = [_Count(12), bytearray(b"ba"), memoryview(b"mv"), "\u00e9"]


async def test_arguments_reach_redis_as_redis_py_sends_them(redis_client: Redis) -> None:
    """Every kind of argument the scripts take arrives as the bytes redis-py would send for
    it (UTF-8 text, decimal integers of any size, floats as ``repr`` writes them), and a bool,
    which redis-py refuses too, is refused before anything is written: the lane stays."""
    echo_all = "return ARGV"
    sha = hashlib.sha1(echo_all.encode()).hexdigest()
    expected = await redis_client.eval(echo_all, 0, *ARGUMENTS)  # type: ignore[arg-type]
    lane = lane_for(redis_client)
    try:
        assert await lane.evalsha(sha, echo_all, [], ARGUMENTS) == expected
        uncommon = await redis_client.eval(echo_all, 0, *UNCOMMON_ARGUMENTS)  # type: ignore[arg-type]
        assert uncommon == [b"12", b"ba", b"mv", "\u00e9".encode()]
        assert await lane.evalsha(sha, echo_all, [], UNCOMMON_ARGUMENTS) == uncommon
        assert expected[:3] == [b"\x00\xffraw", b"text", "\u00e9\u4e2d".encode()]
        assert expected[5:7] == [str(2**70).encode(), b"1.5"]
        for bad in (True, None, [1]):
            with pytest.raises(TypeError):
                await lane.evalsha(sha, echo_all, [], [b"a", bad])
        assert await lane.evalsha(ECHO_SHA, ECHO, [], [b"still"]) == b"still"
    finally:
        await lane.aclose()
