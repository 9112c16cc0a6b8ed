"""Placement: least loaded first, a refusal moves on, and the tenant count stays exact."""

from __future__ import annotations

import json

import pytest
from redis.asyncio import Redis

from gateway.metrics import GatewayMetrics
from gateway.placement import place_session
from gateway.protocol.errors import ClientProtocolError
from gateway.services import GatewayServices
from gateway.settings import GatewaySettings
from store import Scripts
from store.directory import WorkerProfile, announce_worker
from store.keys import SessionKeys, new_worker_id, tenant_sessions, worker_of_session
from store.pubsub import Subscriber
from tests.store._support import redis_now_ms, register_worker, wait_redis_clock_past


async def services_for(client: Redis, *, tenant_max_sessions: int = 0) -> GatewayServices:
    settings = GatewaySettings(tenant_max_sessions=tenant_max_sessions)
    return GatewayServices(settings, client, Scripts(client), Subscriber(client),
                           GatewayMetrics())


async def test_refused_candidate_moves_on_and_releases_its_reservation(
    redis_client: Redis,
) -> None:
    """A stale directory entry is refused by the open script; the next worker gets it."""
    services = await services_for(redis_client, tenant_max_sessions=1)
    scripts = services.scripts
    # Worker A looks best (most free slots) but its heartbeat has lapsed: the open refuses it.
    stale = await register_worker(scripts, slots=8, ttl_ms=1)
    fresh = await register_worker(scripts, slots=2)
    now = await redis_now_ms(redis_client)
    await announce_worker(redis_client, stale, now + 60_000)
    await announce_worker(redis_client, fresh, now + 60_000)
    await wait_redis_clock_past(redis_client, now + 2)
    tried: list[str] = []

    async def subscribe(session_id: str) -> None:
        tried.append(worker_of_session(session_id))

    lease = (await place_session(services, token_digest="d", tenant="t",
                                 subscribe=subscribe)).lease
    assert tried == [stale, fresh]
    assert worker_of_session(lease.session_id) == fresh
    members = await redis_client.zrange(tenant_sessions("t"), 0, -1)
    assert members == [lease.session_id.encode()], "the refused reservation was released"
    with pytest.raises(ClientProtocolError) as full:
        await place_session(services, token_digest="d", tenant="t", subscribe=subscribe)
    assert full.value.code == "resource_exhausted" and full.value.close_code == 1013
    await services.subscriber.aclose()


async def test_no_live_worker_is_resource_exhausted(redis_client: Redis) -> None:
    """With no worker at all the client is told to retry later (1013)."""
    services = await services_for(redis_client)

    async def subscribe(session_id: str) -> None:
        raise AssertionError("nothing to subscribe to")

    with pytest.raises(ClientProtocolError) as refused:
        await place_session(services, token_digest="d", tenant="t", subscribe=subscribe)
    assert refused.value.code == "resource_exhausted"
    await services.subscriber.aclose()


async def test_placement_announces_and_stores_the_chosen_workers_profile(
    redis_client: Redis,
) -> None:
    """The placed session's object is the chosen worker's default session with its id, object
    and the connection's model; the record holds exactly that and the capabilities, so a
    resume through any gateway announces the same."""
    services = await services_for(redis_client)
    profile = WorkerProfile(session={"type": "realtime", "model": "fake", "instructions": ""},
                            capabilities={"chunk_period_ms": 80})
    worker_id = new_worker_id()
    await services.scripts.worker_heartbeat(worker_id, slots=2, ttl_ms=60_000, register=True,
                                            drain=False, profile=profile)
    await announce_worker(redis_client, worker_id, await redis_now_ms(redis_client) + 60_000)

    async def subscribe(session_id: str) -> None:
        pass

    placed = await place_session(services, token_digest="d", tenant="t", subscribe=subscribe,
                                 model="gpt-realtime")
    sid = placed.lease.session_id
    assert placed.session == {"type": "realtime", "object": "realtime.session", "id": sid,
                              "model": "gpt-realtime", "instructions": ""}
    assert placed.capabilities == profile.capabilities
    session, caps = await redis_client.hmget(SessionKeys(sid).record, "session", "caps")
    assert session is not None and caps is not None
    assert (json.loads(session), json.loads(caps)) == (placed.session, placed.capabilities)
    own_model = await place_session(services, token_digest="d", tenant="t",
                                    subscribe=subscribe)
    assert own_model.session is not None and own_model.session["model"] == "fake"
    await services.subscriber.aclose()


async def test_a_worker_without_a_profile_places_a_session_without_one(
    redis_client: Redis,
) -> None:
    """An older worker (no profile): the placement has no session object or capabilities,
    and the record holds none (the gateway falls back to the minimal session.created)."""
    services = await services_for(redis_client)
    worker_id = await register_worker(services.scripts)
    await announce_worker(redis_client, worker_id, await redis_now_ms(redis_client) + 60_000)

    async def subscribe(session_id: str) -> None:
        pass

    placed = await place_session(services, token_digest="d", tenant="t", subscribe=subscribe,
                                 model="loopback")
    assert (placed.session, placed.capabilities) == (None, None)
    record = await redis_client.hmget(SessionKeys(placed.lease.session_id).record, "session",
                                      "caps")
    assert record == [None, None]
    await services.subscriber.aclose()
