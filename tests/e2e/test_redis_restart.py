"""Redis restarts and loses everything: clients are told, and the stack serves again."""

from __future__ import annotations

import asyncio
import time

import pytest
from websockets.exceptions import ConnectionClosed

from duplex_client import DuplexClient, DuplexClientError
from tests.e2e.helpers import STREAM_SESSION, collect_until, marked_chunk
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


async def open_when_ready(url: str, deadline_s: float = 20.0) -> DuplexClient:
    """Open a session, retrying while no worker has rejoined yet (resource_exhausted)."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return await DuplexClient.connect(url, session=STREAM_SESSION)
        except (DuplexClientError, ConnectionClosed):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)  # retry pacing; the condition is the open succeeding


@pytest.mark.logs_errors
async def test_redis_restart_ends_sessions_loudly_and_service_recovers(stack: Stack) -> None:
    """After a data-losing restart: error and close (no hang), no resume, new opens work."""
    gateway = stack.gateway()
    stack.worker()
    client = await DuplexClient.connect(gateway.ws_url, session=STREAM_SESSION)
    await collect_until(client, "session.updated", [])
    await asyncio.to_thread(stack.redis.restart)

    errors: list[str] = []
    with pytest.raises(ConnectionClosed) as closed:
        for i in range(200):
            await client.append_audio(marked_chunk(0, i))
            event = await asyncio.wait_for(client.recv(), 10)
            if event.type == "error":
                errors.append(event.data["error"]["code"])
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011
    assert errors and errors[-1] in ("internal_error", "session_lost")

    with pytest.raises(DuplexClientError) as refused:
        await client.resume()
    assert refused.value.code == "session_resume_expired"
    await client.aclose()

    fresh = await open_when_ready(gateway.ws_url)
    await fresh.append_audio(marked_chunk(1, 0))
    await collect_until(fresh, "response.output_audio.delta", [])
    await fresh.aclose()
