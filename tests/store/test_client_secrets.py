"""Client-secret records: stored by digest, read back by any process, gone when they expire."""

from __future__ import annotations

from redis.asyncio import Redis

from store.client_secrets import (
    ClientSecretGrant,
    load_client_secret,
    save_client_secret,
    secret_digest,
)
from store.keys import client_secret
from tests.store._support import poll_until

GRANT = ClientSecretGrant(tenant="t1", session={"type": "realtime", "instructions": "hi"},
                          expires_at=1_900_000_000)


async def test_round_trip_by_digest_only(redis_client: Redis) -> None:
    """The grant comes back whole; neither key nor value holds the secret itself."""
    secret = "ek_" + "s" * 43
    await save_client_secret(redis_client, secret, GRANT, ttl_ms=60_000)
    assert await load_client_secret(redis_client, secret) == GRANT
    assert await load_client_secret(redis_client, secret + "x") is None
    keys = [key async for key in redis_client.scan_iter("dg:secret:*")]
    assert keys == [client_secret(secret_digest(secret)).encode()]
    value = await redis_client.get(keys[0])
    assert value is not None and secret.encode() not in value and secret.encode() not in keys[0]
    assert 0 < await redis_client.pttl(keys[0]) <= 60_000


async def test_expired_secret_is_unknown(redis_client: Redis) -> None:
    """The record's TTL is the secret's life: once it lapses, the secret opens nothing."""
    secret = "ek_" + "e" * 43
    await save_client_secret(redis_client, secret, GRANT, ttl_ms=1)
    answers = await poll_until(lambda: load_client_secret(redis_client, secret),
                               lambda grant: grant is None)
    assert answers[-1] is None
