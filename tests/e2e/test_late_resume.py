"""A late copy of an abandoned resume attempt takes nothing from the attempt that came after it.

A client's first try of a resume reaches gateway B, whose call to Redis then waits (a proxy
holds it, as a call waits out a failover inside the Redis client). The client gives up on that
try and resumes through gateway A with the same ``control_id``, as DESIGN §2.7 asks, numbering
it attempt 2. When B's call finally lands, it is a retry of the resume that landed, and without
the attempt numbers it would take the session from A: A's connection, the one the client now
uses, would be replaced and closed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from store.keys import SessionKeys
from tests.e2e.helpers import chunk_index, marked_chunk, streaming_session
from tests.e2e.stack import Stack
from tests.e2e.test_endpoints import get, metric_value
from tests.faultproxy import FaultProxy
from tests.store._support import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

CONFLICTS = 'duplex_gateway_resumes_total{outcome="session_resume_conflict"}'


@pytest.fixture
async def proxy(stack: Stack) -> AsyncIterator[FaultProxy]:
    """A proxy in front of the stack's Redis server."""
    fault = FaultProxy("127.0.0.1", stack.redis.port)
    await fault.start()
    yield fault
    fault.release()
    await fault.aclose()


def resume_frame(session: dict[str, Any], control_id: str, attempt: int) -> str:
    return json.dumps({"type": "session.resume", **session, "control_id": control_id,
                       "attempt": attempt})


async def next_frame(ws: ClientConnection) -> dict[str, Any]:
    frame: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 10))
    return frame


async def echo(ws: ClientConnection, index: int) -> list[dict[str, Any]]:
    """Send marked chunk ``index`` and read up to its echo; every frame read on the way."""
    audio = base64.b64encode(marked_chunk(0, index)).decode()
    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
    frames = []
    while True:
        frames.append(await next_frame(ws))
        delta = frames[-1]
        if (delta["type"] == "response.output_audio.delta"
                and chunk_index(base64.b64decode(delta["delta"])) == index):
            return frames


async def test_a_late_copy_of_an_abandoned_resume_attempt_is_refused(
    stack: Stack, proxy: FaultProxy,
) -> None:
    """Attempt 1 reaches gateway B and its RESUME call is held; the client abandons it and
    attempt 2 (same control_id) resumes through gateway A. B's call then lands: it is refused
    as stale (session_resume_conflict, counted in B's metrics), and A's connection hears no
    session.replaced, keeps its generation and streams on."""
    gateway_a = stack.gateway()
    # On a thread: the proxy relays on this event loop, which the start's wait would block.
    gateway_b = await asyncio.to_thread(stack.gateway, redis_url=proxy.url)
    stack.worker()
    client, _ = await streaming_session(gateway_a.ws_url, 3)
    assert client.session_id is not None
    session = {"session_id": client.session_id, "resume_token": client.resume_token,
               "last_received_server_event_seq": client.last_seq}
    await client.drop_connection()
    control_id = "late-" + secrets.token_hex(8)

    proxy.hold_command(control_id.encode())
    async with connect(gateway_b.ws_url) as abandoned:
        await abandoned.send(resume_frame(session, control_id, 1))
        await asyncio.wait_for(proxy.holding.wait(), 10)  # B's call is on its way to Redis
    async with connect(gateway_a.ws_url) as current:
        await current.send(resume_frame(session, control_id, 2))
        resumed = await next_frame(current)
        assert resumed["type"] == "session.resumed", resumed
        generation = resumed["lease_generation"]
        await echo(current, 3)

        proxy.release()

        async def refused_at_b() -> bool:
            _, text = await asyncio.to_thread(get, gateway_b.http_url + "/metrics")
            return metric_value(text, CONFLICTS) == 1

        await until(refused_at_b, "gateway B to refuse the late attempt")
        reader = stack.reader()
        record = SessionKeys(client.session_id).record
        assert int(reader.hget(record, "gen") or 0) == generation
        reader.close()
        frames = await echo(current, 4)
        assert "session.replaced" not in [f["type"] for f in frames]
    await client.aclose()
