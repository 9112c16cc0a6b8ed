"""Sessions whose client left: a normal close (the SDK's way) frees the slot after the short
DEPARTED_GRACE_S; a lost connection, or a close that says "going away" (1001) or asks to come
back (4000-4999), keeps the full disconnect grace, resumable."""

from __future__ import annotations

import json

import pytest
from openai import AsyncOpenAI
from redis.asyncio import Redis

from duplex_client import DuplexClient
from store.keys import SessionKeys, WorkerKeys, worker_of_session
from tests.e2e.stack import Stack
from tests.store._support import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


async def used_slots(redis: Redis, worker_id: str) -> int:
    """Slots the worker holds."""
    return int(await redis.hget(WorkerKeys(worker_id).record, "used") or 0)


async def test_slots_held_under_a_churn_of_short_sdk_sessions(stack: Stack) -> None:
    """20 SDK sessions that open and leave (close 1000), 10 closed with 1001, 10 closed with
    4000, 10 dropped: once the departed grace ran out only the 30 that may come back hold a
    slot (the grace would otherwise hold all 50 for 30 s), and a kept one still resumes."""
    stack.env["DUPLEX_GATEWAY_DEPARTED_GRACE_S"] = "1.0"
    gateway = stack.gateway()
    stack.worker(slots=64)
    redis = Redis.from_url(stack.redis.url)
    sdk = AsyncOpenAI(api_key="sk-test", base_url=gateway.http_url + "/v1",
                      websocket_base_url=gateway.ws_url.removesuffix("/realtime"),
                      max_retries=0)
    departed: list[str] = []
    for _ in range(20):
        async with sdk.realtime.connect(model="loopback") as conn:
            created = json.loads(await conn.recv_bytes())
            departed.append(created["session_id"])
    await sdk.close()
    kept: list[DuplexClient] = []
    for code in [1001] * 10 + [4000] * 10:
        client = await DuplexClient.connect(gateway.ws_url)
        assert client._ws is not None
        await client._ws.close(code)
        kept.append(client)
    for _ in range(10):
        client = await DuplexClient.connect(gateway.ws_url)
        await client.drop_connection()
        kept.append(client)
    worker_id = worker_of_session(departed[0])
    print("slots held right after the churn:", await used_slots(redis, worker_id))

    async def departed_ended() -> bool:
        states = [await redis.hmget(SessionKeys(sid).record, "state", "reason")
                  for sid in departed]
        return all(s == [b"closed", b"disconnect_grace_expired"] for s in states)

    await until(departed_ended, "the SDK sessions' short grace to end them")
    held = await used_slots(redis, worker_id)
    print(f"slots held after the departed grace: {held} (50 sessions; 30 may come back)")
    assert held == 30
    for client in kept:
        assert client.session_id is not None
        state = await redis.hget(SessionKeys(client.session_id).record, "state")
        assert state == b"detached"
    resumed = await kept[5].resume()
    assert resumed.type == "session.resumed"
    await kept[5].aclose()
    await redis.aclose()


async def test_a_client_that_closed_normally_may_still_resume_within_the_grace(
    stack: Stack,
) -> None:
    """A client that closes 1000 and comes back within the departed grace resumes."""
    gateway = stack.gateway()
    stack.worker()
    client = await DuplexClient.connect(gateway.ws_url)
    await client.aclose()  # close 1000: the departed grace (2 s by default) starts
    resumed = await client.resume()
    assert resumed.type == "session.resumed"
    await client.aclose()
