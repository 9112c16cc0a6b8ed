"""``POST /v1/realtime/client_secrets``: the request and the answer, without I/O.

The body is the OpenAI one::

    {"expires_after": {"anchor": "created_at", "seconds": 600},
     "session": {"type": "realtime", "instructions": "...", "audio": {...}}}

Both keys are optional (600 s; a default realtime session). The session is checked for shape
here; whether each setting may apply is the worker's call, as for ``session.update``, so a
setting the model refuses becomes an ``error`` event on the session that starts with it.
Failures are :class:`ClientProtocolError` values, answered as HTTP 400 with OpenAI's error body.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from gateway.protocol.bounds import check_bounds, load_json
from gateway.protocol.errors import ClientProtocolError, ErrorCode

__all__ = [
    "CLIENT_SECRET_PREFIX",
    "DEFAULT_TTL_S",
    "MAX_TTL_S",
    "MIN_TTL_S",
    "ClientSecretRequest",
    "new_client_secret",
    "parse_client_secret_request",
    "render_client_secret",
]

#: Every client secret starts with this, so a key tells which kind it is without a lookup.
CLIENT_SECRET_PREFIX = "ek_"
DEFAULT_TTL_S = 600
MIN_TTL_S = 10
MAX_TTL_S = 7200
_DECODER = json.JSONDecoder()
_BODY_KEYS = frozenset({"expires_after", "session"})
_EXPIRY_KEYS = frozenset({"anchor", "seconds"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientSecretRequest:
    """A valid request: how long the secret lives, and the session it configures."""

    ttl_s: int
    session: dict[str, Any]


def _fail(code: str, message: str, param: str | None = None) -> ClientProtocolError:
    return ClientProtocolError(code, message, param=param)


def _unknown(keys: set[str], where: str) -> ClientProtocolError:
    name = sorted(keys)[0]
    param = f"{where}.{name}" if where else name
    return _fail("unknown_parameter", f"Unknown parameter: '{param}'.", param)


def parse_client_secret_request(body: bytes) -> ClientSecretRequest:
    """Validate the request body (empty means every default).

    Raises:
        ClientProtocolError: ``invalid_json``, ``invalid_type``, ``invalid_value`` or
            ``unknown_parameter``, naming the field in ``param``.
    """
    if not body.strip():
        return ClientSecretRequest(ttl_s=DEFAULT_TTL_S, session={"type": "realtime"})
    try:
        # Decoded as UTF-8 explicitly: json.loads(bytes) would also guess UTF-16/32.
        data = load_json(body.decode("utf-8"), _DECODER)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        raise _fail(ErrorCode.INVALID_JSON, "The body is not valid JSON.") from None
    if type(data) is not dict:
        raise _fail(ErrorCode.INVALID_TYPE, "The body must be a JSON object.")
    # The session configuration goes to the worker as the session's first session.update:
    # the same bounds as that frame's (depth, values, strings, numbers), named by path.
    check_bounds(data)
    if extra := set(data) - _BODY_KEYS:
        raise _unknown(extra, "")
    return ClientSecretRequest(ttl_s=_ttl(data.get("expires_after")),
                               session=_session(data.get("session")))


def _ttl(expires_after: Any) -> int:
    if expires_after is None:
        return DEFAULT_TTL_S
    if type(expires_after) is not dict:
        raise _fail(ErrorCode.INVALID_TYPE, "'expires_after' must be an object.",
                    "expires_after")
    if extra := set(expires_after) - _EXPIRY_KEYS:
        raise _unknown(extra, "expires_after")
    if expires_after.get("anchor", "created_at") != "created_at":
        raise _fail(ErrorCode.INVALID_VALUE, "'expires_after.anchor' must be 'created_at'.",
                    "expires_after.anchor")
    seconds = expires_after.get("seconds", DEFAULT_TTL_S)
    if type(seconds) is not int:  # bool is not a JSON integer
        raise _fail(ErrorCode.INVALID_TYPE, "'expires_after.seconds' must be an integer.",
                    "expires_after.seconds")
    if not MIN_TTL_S <= seconds <= MAX_TTL_S:
        raise _fail(ErrorCode.INVALID_VALUE,
                    f"'expires_after.seconds' must be between {MIN_TTL_S} and {MAX_TTL_S}.",
                    "expires_after.seconds")
    return seconds


def _session(session: Any) -> dict[str, Any]:
    if session is None:
        return {"type": "realtime"}
    if type(session) is not dict:
        raise _fail(ErrorCode.INVALID_TYPE, "'session' must be an object.", "session")
    kind = session.get("type", "realtime")
    if kind != "realtime":
        raise _fail(ErrorCode.INVALID_VALUE,
                    f"'session.type' {kind!r} is not supported; only 'realtime' sessions are.",
                    "session.type")
    return {**session, "type": "realtime"}


def new_client_secret() -> str:
    """A fresh secret: the prefix and 256 random bits."""
    return CLIENT_SECRET_PREFIX + secrets.token_urlsafe(32)


def render_client_secret(secret: str, *, expires_at: int, session: dict[str, Any]) -> dict[
        str, Any]:
    """The answer body (the SDK's ``ClientSecretCreateResponse``).

    ``session.id`` names this configuration, not a session: each session opened with the
    secret gets its own id in ``session.created``.
    """
    config_id = "sess_cfg_" + secrets.token_hex(12)
    return {
        "value": secret,
        "expires_at": expires_at,
        "session": {**session, "id": config_id, "object": "realtime.session",
                    "expires_at": expires_at},
    }
