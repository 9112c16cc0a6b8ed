"""Client secrets through real gateways, minted and used by the official openai SDK."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI
from redis.asyncio import Redis
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Subprotocol

from duplex_client import DuplexClient, DuplexClientError
from store.client_secrets import secret_digest
from store.keys import client_secret
from tests.e2e.helpers import collect_until
from tests.e2e.stack import Proc, Stack
from tests.gateway.strict import validate_server_event

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

SESSION = {"type": "realtime", "instructions": "from the secret"}


def sdk(gateway: Proc, key: str) -> AsyncOpenAI:
    """The official client, pointed at ``gateway`` for HTTP and websocket alike."""
    return AsyncOpenAI(api_key=key, base_url=gateway.http_url + "/v1",
                       websocket_base_url=gateway.ws_url.removesuffix("/realtime"),
                       max_retries=0)


async def mint(gateway: Proc, key: str, **params: Any) -> Any:
    """``client_secrets.create`` with a client that is closed afterwards."""
    async with sdk(gateway, key) as client:
        return await client.realtime.client_secrets.create(**params)


async def first_events(conn: Any, count: int) -> list[dict[str, Any]]:
    """The next ``count`` server events of an SDK connection, as JSON, strictly validated."""
    events = []
    for _ in range(count):
        event = await asyncio.wait_for(conn.recv(), 10)
        data = json.loads(event.to_json())
        validate_server_event(data)
        events.append(data)
    return events


async def test_sdk_mints_and_a_browser_key_opens_configured_sessions(stack: Stack) -> None:
    """Minted on one gateway, accepted by another; sessions start with the secret's config."""
    stack.env["DUPLEX_GATEWAY_API_KEYS"] = "k1"
    minting, other = stack.gateway(), stack.gateway()
    stack.worker()
    created = await mint(minting, "k1", session=SESSION,
                         expires_after={"anchor": "created_at", "seconds": 60})
    assert created.value.startswith("ek_") and created.session.type == "realtime"
    assert created.session.instructions == "from the secret"

    async with sdk(other, created.value) as client, \
            client.realtime.connect(model="loopback") as conn:
        created_event, updated = await first_events(conn, 2)
        assert created_event["type"] == "session.created"
        assert updated["type"] == "session.updated"
        assert updated["session"]["instructions"] == "from the secret"
        await conn.session.update(session={"type": "realtime", "instructions": "mine"})
        (changed,) = await first_events(conn, 1)
        assert changed["session"]["instructions"] == "mine", "the client may still change it"

    offered = [Subprotocol("realtime"), Subprotocol(f"openai-insecure-api-key.{created.value}")]
    async with connect(minting.ws_url + "?model=loopback", subprotocols=offered) as ws:
        kinds = [json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] for _ in range(2)]
        assert kinds == ["session.created", "session.updated"]


async def test_refusals(stack: Stack) -> None:
    """Wrong key, a secret minting a secret, a bad body, an expired secret: each refused."""
    stack.env["DUPLEX_GATEWAY_API_KEYS"] = "k1"
    gateway = stack.gateway()
    stack.worker()
    with pytest.raises(openai.AuthenticationError):
        await mint(gateway, "wrong")
    secret = (await mint(gateway, "k1")).value
    with pytest.raises(openai.AuthenticationError, match="cannot mint"):
        await mint(gateway, secret)
    with pytest.raises(openai.BadRequestError) as bad:
        await mint(gateway, "k1", expires_after={"anchor": "created_at", "seconds": 5})
    assert bad.value.code == "invalid_value" and bad.value.param == "expires_after.seconds"

    redis = Redis.from_url(stack.redis.url)
    await redis.delete(client_secret(secret_digest(secret)))  # what its TTL does in time
    await redis.aclose()
    with pytest.raises(InvalidStatus) as refused:
        async with connect(gateway.ws_url + "?model=loopback",
                           additional_headers={"Authorization": f"Bearer {secret}"}):
            pass
    assert refused.value.response.status_code == 401
    assert b"expired" in refused.value.response.body


async def test_secret_sessions_count_against_the_minting_tenant(stack: Stack) -> None:
    """A tenant at its cap cannot escape it through a secret it minted."""
    stack.env["DUPLEX_GATEWAY_API_KEYS"] = "k1,k2"
    stack.env["DUPLEX_GATEWAY_TENANT_MAX_SESSIONS"] = "1"
    gateway = stack.gateway()
    stack.worker()
    secret = (await mint(gateway, "k1")).value
    async with await DuplexClient.connect(gateway.ws_url, api_key="k1") as first:
        await collect_until(first, "session.updated", [])
        with pytest.raises(DuplexClientError) as refused:
            await DuplexClient.connect(gateway.ws_url, api_key=secret)
        assert refused.value.code == "resource_exhausted"
        async with await DuplexClient.connect(gateway.ws_url, api_key="k2") as other:
            await collect_until(other, "session.updated", [])
