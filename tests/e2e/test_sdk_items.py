"""The official openai SDK manages conversation items against a `duplex-gateway dev` stack:
create, retrieve, truncate at the played position after an interruption, delete."""

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


async def test_sdk_creates_truncates_retrieves_and_deletes_items(dev_stack: str) -> None:
    """A user audio item created through the SDK is played back by response.create; after
    an interruption (response.cancel) the truncation at the played position is taken, the
    retrieved item has no transcript left, and delete removes it: no error at any step."""
    client = AsyncOpenAI(api_key="sk-test", base_url="http://unused.invalid/v1",
                         websocket_base_url=dev_stack)
    pcm = bytes(range(256)) * 187  # ~1 s (a string of the frame holds at most 64 Ki chars)
    seen: list[str] = []
    played = bytearray()
    async with client.realtime.connect(model="loopback") as conn:
        await conn.session.update(session={"type": "realtime"})
        await conn.conversation.item.create(item={
            "type": "message", "role": "user",
            "content": [{"type": "input_audio", "audio": base64.b64encode(pcm).decode()}]})
        assistant_id = ""
        heard_ms: int | None = None  # where the user interrupted
        async for event in conn:
            payload = event.to_dict()
            validate_server_event(payload)
            seen.append(event.type)
            assert event.type != "error", payload
            if event.type == "conversation.item.done" and not assistant_id and \
                    "response.created" not in seen:
                await conn.response.create()
            if event.type == "response.output_item.added":
                assistant_id = event.item.id or ""
            if event.type == "response.output_audio.delta":
                played += base64.b64decode(event.delta)
                if heard_ms is None and len(played) >= 4 * 1920:  # interrupted at 160 ms
                    heard_ms = len(played) // 48
                    await conn.response.cancel()
                    await conn.conversation.item.truncate(
                        item_id=assistant_id, content_index=0, audio_end_ms=heard_ms)
            if event.type == "conversation.item.truncated":
                assert event.audio_end_ms == heard_ms
                await conn.conversation.item.retrieve(item_id=assistant_id)
            if event.type == "conversation.item.retrieved":
                assert event.item.content[0].transcript == ""  # type: ignore[union-attr]
                await conn.conversation.item.delete(item_id=assistant_id)
            if event.type == "conversation.item.deleted":
                assert event.item_id == assistant_id
                break
    assert seen[:4] == ["session.created", "session.updated", "conversation.item.added",
                        "conversation.item.done"]
    assert "response.done" in seen
    assert bytes(played) == pcm[:len(played)], "the created item's audio is played back"
    await client.close()
