"""``POST /v1/realtime/client_secrets``: mint a short-lived key for a browser or phone app.

The caller proves an API key (``Authorization: Bearer``); a client secret cannot mint another.
The secret is stored in Redis (as a digest) for its lifetime, so any gateway accepts it; every
session opened with it counts against the minting key's tenant and starts with the session
configuration given here (applied as its first ``session.update``, so the client sees
``session.updated``), which the client may change later like any setting.

HTTP answers: 200 ``ClientSecretCreateResponse``; 400 a bad body (``error.code`` as in
:mod:`gateway.protocol.client_secrets`); 401 no or a wrong API key, or a client secret;
413 a body over 64 KiB; 503 draining, or Redis unreachable.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.auth import error_response, is_api_key, presented_key, tenant_of_key
from gateway.protocol.client_secrets import (
    CLIENT_SECRET_PREFIX,
    new_client_secret,
    parse_client_secret_request,
    render_client_secret,
)
from gateway.protocol.errors import ClientProtocolError
from gateway.settings import GatewaySettings
from store.client import RedisClient
from store.client_secrets import ClientSecretGrant, save_client_secret
from store.errors import StoreUnavailable

__all__ = ["MAX_BODY_BYTES", "mint_client_secret"]

MAX_BODY_BYTES = 64 * 1024


async def mint_client_secret(request: Request, settings: GatewaySettings,
                             client: RedisClient) -> Response:
    """Answer one mint request."""
    key = presented_key(request)
    if key is not None and key.startswith(CLIENT_SECRET_PREFIX):
        return error_response(401, "invalid_api_key",
                              "A client secret cannot mint client secrets; use an API key.")
    if not is_api_key(settings, key) or (settings.api_keys and key is None):
        return error_response(401, "invalid_api_key", "Incorrect API key provided.")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            return error_response(413, "request_too_large",
                                  f"The body is over {MAX_BODY_BYTES} bytes.")
    try:
        wanted = parse_client_secret_request(body)
    except ClientProtocolError as exc:
        return error_response(400, exc.code, exc.message, param=exc.param)
    secret = new_client_secret()
    expires_at = int(time.time()) + wanted.ttl_s
    grant = ClientSecretGrant(tenant=tenant_of_key(key), session=wanted.session,
                              expires_at=expires_at)
    try:
        await save_client_secret(client, secret, grant, ttl_ms=wanted.ttl_s * 1000)
    except StoreUnavailable:
        return error_response(503, "internal_error", "Could not store the client secret;"
                              " try again.", error_type="server_error")
    return JSONResponse(render_client_secret(secret, expires_at=expires_at,
                                             session=wanted.session))
