"""`duplex-gateway dev` prints its URL only once a session can be opened on it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from gateway.client import DuplexClient
from tests.e2e.helpers import collect_until
from tests.e2e.stack import new_log_path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


async def test_the_first_session_right_after_the_url_line_opens() -> None:
    """A client that starts the moment `dev` prints its URL gets a session (the gateway
    listens and a worker is registered): no refused connection, no resource_exhausted."""
    # dev picks a free port itself (no race with one chosen here); its stderr, its children's
    # too, goes to the log folder, scanned for ERROR lines and secrets like a stack's.
    with new_log_path("dev").open("wb") as sink:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [sys.executable, "-m", "duplex_gateway", "--log-level", "warning", "dev",
             "--port", "0", "--slots", "2"],
            stdout=subprocess.PIPE, stderr=sink, text=True, env=dict(os.environ))
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
