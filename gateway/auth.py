"""Who is calling: API keys, client secrets, and the HTTP answers that refuse them.

A connection presents a key as ``Authorization: Bearer <key>`` or, from a browser that cannot
set headers, as the subprotocol ``openai-insecure-api-key.<key>``. The key is either one of
the configured API keys or a client secret (``ek_...``) minted by ``POST
/v1/realtime/client_secrets`` and looked up in Redis, so any gateway accepts it.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse

from gateway.protocol.client_secrets import CLIENT_SECRET_PREFIX
from gateway.settings import GatewaySettings
from store.client import RedisClient
from store.client_secrets import load_client_secret
from store.errors import StoreUnavailable

__all__ = ["Caller", "error_response", "identify", "presented_key", "tenant_of_key"]

_BROWSER_KEY_PREFIX = "openai-insecure-api-key."


def error_response(status: int, code: str, message: str, *, error_type: str =
                   "invalid_request_error", param: str | None = None) -> JSONResponse:
    """OpenAI's HTTP error body, which the SDK turns into its typed exceptions."""
    return JSONResponse({"error": {"message": message, "type": error_type, "param": param,
                                   "code": code}}, status_code=status)


def presented_key(conn: HTTPConnection) -> str | None:
    """The key a request or websocket presents, if any."""
    auth: str = conn.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    protocols: list[str] = conn.scope.get("subprotocols", [])
    for protocol in protocols:
        if protocol.startswith(_BROWSER_KEY_PREFIX):
            return protocol[len(_BROWSER_KEY_PREFIX):]
    return None


def tenant_of_key(key: str | None) -> str:
    """The tenant a key counts against: the key, hashed (never stored in clear)."""
    return hashlib.sha256(key.encode()).hexdigest()[:32] if key else "anonymous"


def is_api_key(settings: GatewaySettings, key: str | None) -> bool:
    """Whether ``key`` is a configured API key (any key, when none is configured)."""
    if not settings.api_keys:
        return True
    presented = (key or "").encode()
    # Compare against every key so timing does not reveal which prefix matched.
    return any([hmac.compare_digest(presented, k.encode()) for k in settings.api_keys])


@dataclass(frozen=True, slots=True, kw_only=True)
class Caller:
    """An authenticated websocket caller.

    Attributes:
        tenant: what its sessions count against.
        initial_session: a client secret's session configuration (None for an API key).
    """

    tenant: str
    initial_session: dict[str, Any] | None = None


async def identify(settings: GatewaySettings, client: RedisClient,
                   conn: HTTPConnection) -> Caller | JSONResponse:
    """The caller of a websocket, or the HTTP answer that refuses it (401, or 503)."""
    key = presented_key(conn)
    if key is not None and key.startswith(CLIENT_SECRET_PREFIX):
        try:
            grant = await load_client_secret(client, key)
        except StoreUnavailable:
            return error_response(503, "internal_error", "Could not check the client secret;"
                                  " try again.", error_type="server_error")
        if grant is None:
            return error_response(401, "invalid_api_key",
                                  "The client secret is unknown or has expired.")
        return Caller(tenant=grant.tenant, initial_session=grant.session)
    if not is_api_key(settings, key):
        return error_response(401, "invalid_api_key", "Incorrect API key provided.")
    return Caller(tenant=tenant_of_key(key))
