"""Fixtures of the store tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from runtime.embedded import EmbeddedServer, start_server
from store import Scripts, create_client
from tests.conftest import SERVER_KINDS
from tests.faultproxy import FaultProxy

#: Both ways the scripts reach Redis: redis-py's pool, and the store's own pipelined
#: connection (store/script_lane.py). Every contract test that takes ``scripts`` or ``lossy``
#: runs on both.
CONNECTIONS = ("redis-py", "own")


@pytest.fixture(params=CONNECTIONS)
async def scripts(redis_client: Redis, request: pytest.FixtureRequest) -> AsyncIterator[Scripts]:
    """The store's scripts on the per-test client."""
    registered = Scripts(redis_client, own_connection=request.param == "own")
    yield registered
    await registered.aclose()


@pytest.fixture
async def own(redis_client: Redis) -> AsyncIterator[Scripts]:
    """The store's scripts on its own connection alone, for the paths only it takes (plain
    input appends, the output flush's fast script)."""
    registered = Scripts(redis_client, own_connection=True)
    yield registered
    await registered.aclose()


@pytest.fixture(params=(False, True), ids=("pushed worker", "pulling worker"))
def pulls(request: pytest.FixtureRequest) -> bool:
    """Both kinds of worker a session's input goes to: pushed each append, or reading its
    input itself, whose appends go as plain XADDs on the store's own connection
    (store/input_appends.py)."""
    return bool(request.param)


@pytest.fixture
async def proxy(redis_server: EmbeddedServer, redis_client: Redis) -> AsyncIterator[FaultProxy]:
    """A fault proxy in front of the (freshly flushed) server."""
    fault = FaultProxy("127.0.0.1", redis_server.port)
    await fault.start()
    yield fault
    await fault.aclose()


@pytest.fixture(params=CONNECTIONS)
async def lossy(proxy: FaultProxy, request: pytest.FixtureRequest) -> AsyncIterator[Scripts]:
    """The store's scripts through the proxy, on the production client factory."""
    client = create_client(proxy.url)
    registered = Scripts(client, own_connection=request.param == "own")
    yield registered
    await registered.aclose()
    await client.aclose()


@pytest.fixture(params=SERVER_KINDS)
def own_server(request: pytest.FixtureRequest) -> Iterator[EmbeddedServer]:
    """A server this test alone uses, so it may restart it."""
    server = start_server(request.param)
    yield server
    server.stop()
