"""Capabilities are readable before a session opens: ``GET /v1/models`` and
``/v1/models/{model}`` show each model's, exactly what its workers publish and what
``session.created`` then carries."""

from __future__ import annotations

import pytest
from openai import AsyncOpenAI

from duplex_client import DuplexClient
from inference_worker.backends.loopback import CHUNK_SECONDS
from inference_worker.backends.registry import capabilities_of
from tests.e2e.helpers import PUSH_TO_TALK_SESSION
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


async def test_the_model_list_shows_each_backends_capabilities(stack: Stack) -> None:
    """A loopback and a recording worker: each model's capabilities on the list and on its own
    page are its backend's, answered for its slots (the seed's fields, video only where the
    model sees it), before any session, and the same in a session's session.created."""
    gateway = stack.gateway()
    stack.worker(slots=1, models=("eyes-closed",))
    stack.worker(slots=3, backend="recording", models=("eyes-open",))
    expected = {
        "eyes-closed": capabilities_of("loopback", frame_seconds=CHUNK_SECONDS, slots=1),
        "eyes-open": capabilities_of("recording", frame_seconds=0.08, slots=3),
    }
    client = AsyncOpenAI(api_key="sk-test", base_url=gateway.http_url + "/v1", max_retries=0)
    listed = await client.models.list()
    assert {m.id: m.model_dump()["capabilities"] for m in listed.data} == expected
    for name, capabilities in expected.items():
        model = await client.models.retrieve(name)
        assert model.model_dump()["capabilities"] == capabilities
    await client.close()
    assert expected["eyes-open"]["optional_input_modalities"] == ["video"]
    assert expected["eyes-closed"]["supports_multi_session_same_replica"] is False
    session = {**PUSH_TO_TALK_SESSION, "model": "eyes-open"}
    async with await DuplexClient.connect(gateway.ws_url, session=session) as duplex:
        assert dict(duplex.capabilities) == expected["eyes-open"]
