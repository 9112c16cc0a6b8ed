"""The official openai SDK manages conversation items against a `duplex-gateway dev` stack:
create, retrieve, truncate at the played position after an interruption, delete."""

from __future__ import annotations

import base64

import pytest
from openai import AsyncOpenAI

from tests.gateway.strict import validate_server_event

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


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
    assert seen[:5] == ["session.created", "session.updated", "conversation.item.added",
                        "conversation.item.created", "conversation.item.done"]
    assert "response.done" in seen
    assert bytes(played) == pcm[:len(played)], "the created item's audio is played back"
    await client.close()
