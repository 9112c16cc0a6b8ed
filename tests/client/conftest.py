"""The scripted gateways the client's tests run against."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.client.scripted import Script, ScriptedGateway


@pytest.fixture
async def gateway_factory() -> AsyncIterator[Callable[..., Awaitable[ScriptedGateway]]]:
    """Start scripted gateways; at the end, stop them and fail on any failed script."""
    started: list[ScriptedGateway] = []

    async def start(*scripts: Script) -> ScriptedGateway:
        gateway = ScriptedGateway(list(scripts))
        await gateway.start()
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        await gateway.stop()
    failures = [failure for gateway in started for failure in gateway.failures]
    if failures:
        raise failures[0]
