"""`duplex-gateway dev` prints its URL only once a session can be opened on it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from gateway.client import DuplexClient
from store.embedded import free_port
from tests.e2e.helpers import collect_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


async def test_the_first_session_right_after_the_url_line_opens() -> None:
    """A client that starts the moment `dev` prints its URL gets a session (the gateway
    listens and a worker is registered): no refused connection, no resource_exhausted."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "duplex_gateway", "--log-level", "warning", "dev",
         "--port", str(port), "--slots", "2"],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()  # bounded by the test's timeout
        match = re.search(r"(ws://\S+/v1/realtime) \(redis ", banner)
        assert match, banner
        client = await DuplexClient.connect(match.group(1))
        assert client.session_id is not None
        await collect_until(client, "session.updated", [])
        await client.close()
        await collect_until(client, "session.closed", [])
        await client.aclose()
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()
    assert code == 0, f"dev exited with {code} on SIGTERM"
