"""Client secrets: short-lived keys a browser may hold instead of an API key (DESIGN §3).

A gateway mints one for a caller with a real API key; any gateway accepts it until it expires,
so the record lives in Redis, keyed by the secret's SHA-256 digest (the secret itself is never
stored) and expiring with it. The record is written once and never changed: one ``SET`` with a
TTL, safe to send twice.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from store.client import RedisClient, store_call
from store.keys import client_secret

__all__ = ["ClientSecretGrant", "load_client_secret", "save_client_secret", "secret_digest"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientSecretGrant:
    """What a client secret grants.

    Attributes:
        tenant: the tenant of the API key that minted it; sessions count against its cap.
        session: the Realtime session configuration every session opened with it starts with.
        expires_at: Unix seconds after which it opens no session.
    """

    tenant: str
    session: dict[str, Any]
    expires_at: int


def secret_digest(secret: str) -> str:
    """The SHA-256 hex digest a secret is stored under."""
    return hashlib.sha256(secret.encode()).hexdigest()


async def save_client_secret(client: RedisClient, secret: str, grant: ClientSecretGrant, *,
                             ttl_ms: int) -> None:
    """Store ``grant`` under ``secret`` for ``ttl_ms``.

    Raises:
        StoreUnavailable: Redis failed the write; the secret must not be handed out.
    """
    record = json.dumps({"tenant": grant.tenant, "session": grant.session,
                         "expires_at": grant.expires_at}, separators=(",", ":"))
    with store_call("SET client secret"):
        await client.set(client_secret(secret_digest(secret)), record, px=ttl_ms)


async def load_client_secret(client: RedisClient, secret: str) -> ClientSecretGrant | None:
    """The grant of a live ``secret``, or None if it is unknown or expired.

    Raises:
        StoreUnavailable: Redis could not be asked.
    """
    with store_call("GET client secret"):
        raw = await client.get(client_secret(secret_digest(secret)))
    if raw is None:
        return None
    record = json.loads(raw)
    return ClientSecretGrant(tenant=str(record["tenant"]), session=dict(record["session"]),
                             expires_at=int(record["expires_at"]))
