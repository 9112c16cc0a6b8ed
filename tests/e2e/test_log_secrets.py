"""No secret reaches a log: API keys (even sent in a URL), client secrets, resume tokens.

The whole suite's process logs are scanned at the end of the run too (tests/conftest.py); this
test makes a gateway log at ``info`` (its access lines included) while every kind of secret
goes past it, and scans that log for the exact values.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Subprotocol

from duplex_client import DuplexClient, DuplexClientError
from tests.conftest import secrets_in_logs
from tests.e2e.helpers import collect_until
from tests.e2e.stack import Stack, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

KEY = "sk-test-Zq8rT2mW5vB7nK4xJ6yH3"


def mint(http_url: str, key: str) -> str:
    """A client secret minted over plain HTTP."""
    request = urllib.request.Request(
        http_url + "/v1/realtime/client_secrets", method="POST",
        data=json.dumps({"session": {"type": "realtime"}}).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(json.loads(response.read())["value"])


async def test_no_key_secret_or_token_in_the_gateway_log(stack: Stack) -> None:
    """A key in the URL query (refused and accepted), a client secret in the browser
    subprotocol, resume tokens old and new, a forged token: none is in the log, although
    the log holds the access lines of those very requests."""
    stack.env["DUPLEX_GATEWAY_API_KEYS"] = KEY
    gateway = stack.gateway(log_level="info")
    stack.worker()
    with pytest.raises(InvalidStatus):  # a key in the query is not a way in
        await connect(f"{gateway.ws_url}?model=loopback&api_key={KEY}")
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"{gateway.http_url}/v1/realtime/client_secrets?key={KEY}",
                               data=b"{}", timeout=10)
    client = await DuplexClient.connect(f"{gateway.ws_url}?model=loopback&api_key={KEY}",
                                        api_key=KEY)
    first_token = client.resume_token
    await client.resume(gateway.ws_url)
    seen = {KEY, str(first_token), str(client.resume_token)}
    forged = DuplexClient(gateway.ws_url, api_key=KEY)
    forged.session_id, forged.resume_token = client.session_id, "Forged-Token-9xYz" * 3
    with pytest.raises(DuplexClientError):
        await forged.resume()
    seen.add(str(forged.resume_token))
    secret = mint(gateway.http_url, KEY)
    seen.add(secret)
    protocols = [Subprotocol("realtime"), Subprotocol(f"openai-insecure-api-key.{secret}")]
    async with connect(gateway.ws_url, subprotocols=protocols) as browser:
        await browser.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(await asyncio.wait_for(browser.recv(), 10))["type"] == \
            "session.created"
    await client.close()
    await collect_until(client, "session.closed", [])
    await client.aclose()
    await forged.aclose()
    wait_for(lambda: gateway.output().count("WebSocket /v1/realtime") >= 4,
             "the gateway's access lines")
    log = gateway.output()
    assert "/v1/realtime/client_secrets" in log
    # A refused connection is an access line, not an ERROR a client can repeat at will.
    assert " 401" in log and "ERROR" not in log, log
    for value in seen:
        assert value not in log, value
    assert gateway.log is not None
    assert secrets_in_logs(gateway.log.parent, seen) == []
