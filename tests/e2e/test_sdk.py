"""The official openai SDK runs a full turn against a `duplex-gateway dev` stack."""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from openai import AsyncOpenAI
from redis import Redis

from store.embedded import free_port
from store.keys import WORKER_DIRECTORY
from tests.e2e.stack import http_ok, wait_for
from tests.gateway.strict import validate_server_event

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture
def dev_stack() -> Iterator[str]:
    """`duplex-gateway dev` as a user runs it; yields its websocket base URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "duplex_gateway", "--log-level", "warning", "dev",
         "--port", str(port)],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        match = re.search(r"ws://(\S+)/v1/realtime \(redis (\S+),", banner)
        assert match, banner
        redis = Redis.from_url(match.group(2))
        wait_for(lambda: redis.zcard(WORKER_DIRECTORY) > 0, "the dev worker")
        redis.close()
        wait_for(lambda: http_ok(f"http://{match.group(1)}/readyz"), "the dev gateway")
        yield f"ws://{match.group(1)}/v1"
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()
    assert code == 0, f"dev exited with {code} on SIGTERM"


async def test_sdk_full_turn(dev_stack: str) -> None:
    """session.created, session.updated, response.created, audio deltas, response.done."""
    client = AsyncOpenAI(api_key="sk-test", base_url="http://unused.invalid/v1",
                         websocket_base_url=dev_stack)
    pcm = bytes(range(256)) * 19  # 4864 bytes: just over the 100 ms commit minimum
    seen: list[str] = []
    audio = bytearray()
    async with client.realtime.connect(model="loopback") as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"]})
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm).decode())
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        async for event in conn:
            validate_server_event(event.to_dict())
            seen.append(event.type)
            if event.type == "response.output_audio.delta":
                audio += base64.b64decode(event.delta)
            if event.type == "response.done":
                assert event.response.status == "completed"
                break
    assert seen[:2] == ["session.created", "session.updated"]
    order = ["response.created", "response.output_audio.delta", "response.done"]
    assert next(t for t in seen if t in order) == "response.created"
    assert seen[-1] == "response.done"
    assert bytes(audio) == pcm, "loopback plays the committed audio back exactly"
    await client.close()
