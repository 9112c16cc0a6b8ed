"""Fixtures of the store tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from store import Scripts, create_client
from store.embedded import EmbeddedServer
from tests.faultproxy import FaultProxy


@pytest.fixture
def scripts(redis_client: Redis) -> Scripts:
    """The store's scripts, registered on the per-test client."""
    return Scripts(redis_client)


@pytest.fixture
async def proxy(redis_server: EmbeddedServer, redis_client: Redis) -> AsyncIterator[FaultProxy]:
    """A fault proxy in front of the (freshly flushed) server."""
    fault = FaultProxy("127.0.0.1", redis_server.port)
    await fault.start()
    yield fault
    await fault.aclose()


@pytest.fixture
async def lossy(proxy: FaultProxy) -> AsyncIterator[Scripts]:
    """The store's scripts through the proxy, on the production client factory."""
    client = create_client(proxy.url)
    yield Scripts(client)
    await client.aclose()
