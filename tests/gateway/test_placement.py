"""Placement: least loaded first, a refusal moves on, and the tenant count stays exact."""

from __future__ import annotations

import json

import pytest
from redis.asyncio import Redis

from gateway.metrics import GatewayMetrics
from gateway.placement import place_session, session_policy
from gateway.protocol.errors import ClientProtocolError
from gateway.services import GatewayServices
from gateway.settings import GatewaySettings
from store import OpenStatus, Scripts
from store.directory import WorkerProfile, announce_worker
from store.keys import (
    SessionKeys,
    new_session_id,
    new_worker_id,
    tenant_sessions,
    worker_of_session,
)
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
    and the model asked for (an alias the worker serves); the record holds exactly that and
    the capabilities, so a resume through any gateway announces the same. A session that
    asks for no model is named after its worker's own name."""
    services = await services_for(redis_client)
    profile = WorkerProfile(session={"type": "realtime", "model": "fake", "instructions": ""},
                            capabilities={"chunk_period_ms": 80})
    worker_id = new_worker_id()
    await services.scripts.worker_heartbeat(worker_id, slots=2, ttl_ms=60_000, register=True,
                                            drain=False, profile=profile,
                                            models=("fake", "gpt-realtime"))
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


async def _listed(client: Redis, scripts: Scripts, models: tuple[str, ...], *,
                  slots: int = 2) -> str:
    """A live worker serving ``models``, listed in the directory."""
    worker_id = await register_worker(scripts, slots=slots, models=models)
    await announce_worker(client, worker_id, await redis_now_ms(client) + 60_000)
    return worker_id


async def _ignore(session_id: str) -> None:
    pass


async def test_a_session_lands_on_a_worker_of_its_model(redis_client: Redis) -> None:
    """By name or alias, whichever worker has more room: never on another model's worker.
    Each model's capacity is its own: one full is resource_exhausted naming it, while the
    other still places."""
    services = await services_for(redis_client)
    alpha = await _listed(redis_client, services.scripts, ("alpha", "alpha-v1"), slots=1)
    beta = await _listed(redis_client, services.scripts, ("beta",), slots=8)
    for model, worker in (("alpha", alpha), ("beta", beta), ("beta", beta)):
        placed = await place_session(services, token_digest="d", tenant="t",
                                     subscribe=_ignore, model=model)
        assert worker_of_session(placed.lease.session_id) == worker
        assert placed.model == model
    with pytest.raises(ClientProtocolError) as full:
        await place_session(services, token_digest="d", tenant="t", subscribe=_ignore,
                            model="alpha-v1")
    assert (full.value.code, full.value.close_code) == ("resource_exhausted", 1013)
    assert "'alpha-v1'" in full.value.message
    again = await place_session(services, token_digest="d", tenant="t", subscribe=_ignore,
                                model="beta")
    assert worker_of_session(again.lease.session_id) == beta
    await services.subscriber.aclose()


async def test_a_model_no_worker_serves_is_model_not_found(redis_client: Redis) -> None:
    """Refused at once (close 1008), naming what is served; nothing is placed elsewhere, and
    the refusal is not counted against the tenant's opens."""
    settings = GatewaySettings(tenant_sessions_per_minute=1)
    services = GatewayServices(settings, redis_client, Scripts(redis_client),
                               Subscriber(redis_client), GatewayMetrics())
    await _listed(redis_client, services.scripts, ("alpha",))
    for _ in range(2):
        with pytest.raises(ClientProtocolError) as unknown:
            await place_session(services, token_digest="d", tenant="t", subscribe=_ignore,
                                model="gamma")
        assert (unknown.value.code, unknown.value.close_code) == ("model_not_found", 1008)
        assert unknown.value.param == "model" and "alpha" in unknown.value.message
    placed = await place_session(services, token_digest="d", tenant="t", subscribe=_ignore,
                                 model="alpha")
    assert placed.model == "alpha"
    await services.subscriber.aclose()


async def test_the_default_model_applies_when_none_is_named(redis_client: Redis) -> None:
    """DEFAULT_MODEL places an unnamed session on its workers; without it, any worker."""
    scripts = Scripts(redis_client)
    alpha = await _listed(redis_client, scripts, ("alpha",), slots=1)
    beta = await _listed(redis_client, scripts, ("beta",), slots=8)
    settings = GatewaySettings(default_model="alpha")
    services = GatewayServices(settings, redis_client, scripts, Subscriber(redis_client),
                               GatewayMetrics())
    placed = await place_session(services, token_digest="d", tenant="t", subscribe=_ignore)
    assert (worker_of_session(placed.lease.session_id), placed.model) == (alpha, "alpha")
    with pytest.raises(ClientProtocolError) as full:
        await place_session(services, token_digest="d", tenant="t", subscribe=_ignore)
    assert full.value.code == "resource_exhausted"
    anywhere = await services_for(redis_client)
    placed = await place_session(anywhere, token_digest="d", tenant="t", subscribe=_ignore)
    assert (worker_of_session(placed.lease.session_id), placed.model) == (beta, "beta")
    await services.subscriber.aclose()
    await anywhere.subscriber.aclose()


async def test_the_open_script_refuses_a_worker_of_another_model(redis_client: Redis) -> None:
    """A stale view of the fleet cannot misplace: the worker's own slot says what it
    serves."""
    scripts = Scripts(redis_client)
    worker = await register_worker(scripts, models=("alpha",))

    async def open_asking(model: str | None) -> OpenStatus:
        return await scripts.open_session(new_session_id(worker), epoch="e", token_digest="d",
                                          tenant="t", policy=session_policy(GatewaySettings()),
                                          model=model)

    assert await open_asking("beta") is OpenStatus.OTHER_MODEL
    assert await open_asking("alpha") is OpenStatus.OK
    assert await open_asking(None) is OpenStatus.OK
