"""Fixtures of the store tests."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from store import Scripts


@pytest.fixture
def scripts(redis_client: Redis) -> Scripts:
    """The store's scripts, registered on the per-test client."""
    return Scripts(redis_client)
