"""The client factory bounds every command: a connection gone silent fails the command in time,
and it is sent again on a new connection, instead of hanging until TCP gives up (minutes)."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import TimeoutError as RedisTimeoutError

from store import Scripts, create_client
from store.client import COMMAND_TIMEOUT_S, CONNECT_TIMEOUT_S
from store.keys import new_worker_id
from tests.faultproxy import FaultProxy

#: Far below redis-py's own default socket timeout (5 s in 8.x, none before 6.0), far above
#: the bound these tests set: a command that waits for it did not get the bound.
WAIT_S = 3.0
BOUND_S = 0.3


async def test_a_command_on_a_silent_connection_fails_in_time_and_the_next_reconnects(
        proxy: FaultProxy) -> None:
    """Its caller hears redis-py's TimeoutError (a ``RedisError``: ``store_call`` makes it
    ``StoreUnavailable``), not the wait_for's; the connection is dropped."""
    client = create_client(proxy.url, command_timeout_s=BOUND_S)
    try:
        await client.set("key", b"value")
        proxy.freeze()  # no reset, no reply: the pooled connection's peer vanished
        with pytest.raises(RedisTimeoutError):
            await asyncio.wait_for(client.get("key"), WAIT_S)
        assert await asyncio.wait_for(client.get("key"), WAIT_S) == b"value"
    finally:
        await client.aclose()


async def test_a_script_on_a_silent_connection_is_resent_on_a_new_one(
        proxy: FaultProxy) -> None:
    """redis-py's path for scripts (a Cluster's): the store resends after the timeout."""
    client = create_client(proxy.url, command_timeout_s=BOUND_S)
    scripts = Scripts(client, own_connection=False)
    worker = new_worker_id()
    try:
        await scripts.worker_heartbeat(worker, slots=1, ttl_ms=10_000, register=True,
                                       drain=False)
        proxy.freeze()
        beat = await asyncio.wait_for(scripts.worker_heartbeat(
            worker, slots=1, ttl_ms=10_000, register=False, drain=False), WAIT_S)
        assert beat.state == "live"
    finally:
        await scripts.aclose()
        await client.aclose()


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "redis+sentinel://127.0.0.1:1/main"])
async def test_one_node_and_sentinel_clients_carry_the_bounds(url: str) -> None:
    client = create_client(url)
    assert isinstance(client, Redis)
    try:
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == COMMAND_TIMEOUT_S
        assert kwargs["socket_connect_timeout"] == CONNECT_TIMEOUT_S
        manager = getattr(client, "sentinel_manager", None)  # the Sentinels are asked alike
        for sentinel in manager.sentinels if manager is not None else ():
            assert sentinel.connection_pool.connection_kwargs["socket_timeout"] == (
                COMMAND_TIMEOUT_S)
    finally:
        await client.aclose()


async def test_cluster_clients_carry_the_bounds() -> None:
    client = create_client("redis+cluster://127.0.0.1:1")
    assert isinstance(client, RedisCluster)
    kwargs = client.nodes_manager.connection_kwargs  # what every node's connections get
    assert kwargs["socket_timeout"] == COMMAND_TIMEOUT_S
    assert kwargs["socket_connect_timeout"] == CONNECT_TIMEOUT_S
    await client.aclose()
