"""session.created and session.resumed carry the whole public session and its capabilities,
as the official openai SDK receives them, through any gateway.

The worker publishes its new sessions' default session object and capabilities when it
registers, so the gateway announces the session the worker will really run before the
worker has seen it; a resume through another gateway announces the session as the last
session.update left it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from openai import AsyncOpenAI

from tests.e2e.stack import Proc, Stack
from tests.gateway.strict import validate_server_event

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PCM_24K = {"type": "audio/pcm", "rate": 24000}
UPDATE = {"type": "realtime", "instructions": "Be brief.",
          "audio": {"input": {"turn_detection": None}}}
#: OpenAI's GA server_vad, every default filled in: what a new loopback session starts with.
GA_SERVER_VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                 "silence_duration_ms": 500, "idle_timeout_ms": None, "create_response": True,
                 "interrupt_response": True}


def sdk(gateway: Proc) -> AsyncOpenAI:
    """The official client, pointed at ``gateway``."""
    return AsyncOpenAI(api_key="sk-test", base_url=gateway.http_url + "/v1",
                       websocket_base_url=gateway.ws_url.removesuffix("/realtime"),
                       max_retries=0)


async def recv_json(conn: Any) -> dict[str, Any]:
    """The next server event of an SDK connection, as JSON, strictly validated."""
    data: dict[str, Any] = json.loads(await asyncio.wait_for(conn.recv_bytes(), 10))
    validate_server_event(data)
    return data


async def next_of(conn: Any, event_type: str) -> dict[str, Any]:
    """The next event of ``event_type`` (others are validated and skipped)."""
    while True:
        event = await recv_json(conn)
        assert event["type"] != "error", event
        if event["type"] == event_type:
            return event


@pytest.mark.parametrize(("backend", "model", "chunk_ms", "level", "detection", "voice"), [
    ("loopback", "loopback", 40, "turn_based_duplex", GA_SERVER_VAD, "marin"),
    # The fake's model takes turns itself: no turn detection of the worker's runs there.
    ("fake", "fake", 80, "model_native_duplex", None, "fake"),
    # an alias the worker serves it under (the deployment's own name for it)
    ("loopback", "gpt-realtime", 40, "turn_based_duplex", GA_SERVER_VAD, "marin"),
])
async def test_session_created_carries_the_session_the_worker_runs(
    stack: Stack, backend: str, model: str, chunk_ms: int, level: str,
    detection: dict[str, Any] | None, voice: str,
) -> None:
    """session.created holds the whole session object (formats, turn detection, voice,
    instructions, extra_body...) and the capabilities of the worker's backend: exactly what
    the worker's own session.updated then shows for an update that changes nothing, the
    model the client opened it with included. Where the worker detects turns (the loopback)
    that is OpenAI's GA defaults: server_vad, pcm16 24 kHz both ways, voice marin."""
    gateway = stack.gateway()
    stack.worker(backend=backend, models=(backend, model) if model != backend else ())
    async with sdk(gateway) as client, client.realtime.connect(model=model) as conn:
        created = await recv_json(conn)
        assert created["type"] == "session.created"
        session = created["session"]
        assert (session["id"], session["model"]) == (created["session_id"], model)
        assert session["audio"]["input"]["format"] == PCM_24K
        assert session["audio"]["output"]["format"] == PCM_24K
        assert session["audio"]["input"]["turn_detection"] == detection
        assert session["audio"]["output"]["voice"] == voice
        assert "extra_body" in session and session["output_modalities"] == ["audio"]
        capabilities = created["capabilities"]
        assert capabilities["implementation_level"] == level
        assert capabilities["chunk_period_ms"] == chunk_ms
        assert capabilities["supports_session_resume"] is True
        await conn.session.update(session={"type": "realtime"})
        updated = await next_of(conn, "session.updated")
        assert updated["session"] == session


async def test_session_resumed_through_another_gateway_carries_the_updated_session(
    stack: Stack,
) -> None:
    """After a session.update and a dropped connection, session.resumed through another
    gateway carries the session as the update left it, and the capabilities of
    session.created."""
    a, b = stack.gateway(), stack.gateway()
    stack.worker()
    async with sdk(a) as client_a, client_a.realtime.connect(model="loopback") as conn:
        created = await recv_json(conn)
        await conn.session.update(session=UPDATE)  # type: ignore[arg-type]
        updated = await next_of(conn, "session.updated")
        assert updated["session"]["instructions"] == "Be brief."
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
        # Going away (1001), not a normal close: the session keeps its full grace.
        await conn.close(code=1001)
    async with sdk(b) as client_b, client_b.realtime.connect(model="loopback") as conn:
        assert (await recv_json(conn))["type"] == "session.created"  # the URL's, given up
        resume: Any = {"type": "session.resume", "session_id": created["session_id"],
                       "resume_token": created["resume_token"],
                       "last_received_server_event_seq": updated["server_event_seq"]}
        await conn.send(resume)
        resumed = await recv_json(conn)
        assert resumed["type"] == "session.resumed", resumed
        assert resumed["session"] == updated["session"]
        assert resumed["session"] != created["session"]
        assert resumed["capabilities"] == created["capabilities"]
