"""The official openai SDK runs a full turn against a `duplex-gateway dev` stack."""

from __future__ import annotations

import base64
from typing import Any, cast

import pytest
from openai import AsyncOpenAI

from tests.gateway.strict import validate_server_event
from tests.worker.speech import synthesize, to_pcm16

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


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


def _spoken_turn() -> tuple[bytes, int]:
    """1 s of silence, a spoken sentence (Piper), 1 s of silence: pcm16 24 kHz mono; and the
    sentence's length in ms. Speech, not a tone: the worker's detector may be Silero, which
    hears voices only."""
    speech, _ = synthesize("What is the weather like today?", 24_000)
    pcm = to_pcm16(speech)
    return bytes(48_000) + pcm + bytes(48_000), len(pcm) // 48


async def test_sdk_server_vad_turn_is_detected_and_answered(dev_stack: str) -> None:
    """A server_vad session hears a turn in streamed audio: speech_started, speech_stopped,
    the commit and an automatic response that plays the turn back, every event strictly
    valid."""
    client = AsyncOpenAI(api_key="sk-test", base_url="http://unused.invalid/v1",
                         websocket_base_url=dev_stack)
    pcm, speech_ms = _spoken_turn()
    seen: list[str] = []
    audio = bytearray()
    span: dict[str, int] = {}
    async with client.realtime.connect(model="loopback") as conn:
        await conn.session.update(session={
            "type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad"}}}})
        for start in range(0, len(pcm), 4800):  # 100 ms appends
            await conn.input_audio_buffer.append(
                audio=base64.b64encode(pcm[start:start + 4800]).decode())
        async for event in conn:
            validate_server_event(event.to_dict())
            seen.append(event.type)
            if event.type == "session.updated":
                session = cast(dict[str, Any], event.to_dict()["session"])
                detection = session["audio"]["input"]["turn_detection"]
                assert detection["type"] == "server_vad"
                assert detection["silence_duration_ms"] == 500
            if event.type == "input_audio_buffer.speech_started":
                # The sentence starts at 1000 ms; 300 ms of padding come before its onset.
                assert 600 <= event.audio_start_ms <= 1000
                span["start"] = event.audio_start_ms
            if event.type == "input_audio_buffer.speech_stopped":
                # After the sentence, plus 500 ms of silence (and a detector's window or two).
                assert 1000 + speech_ms <= event.audio_end_ms <= 1000 + speech_ms + 700
                span["end"] = event.audio_end_ms
            if event.type == "response.output_audio.delta":
                audio += base64.b64decode(event.delta)
            if event.type == "response.done":
                assert event.response.status == "completed"
                break
    assert seen[:2] == ["session.created", "session.updated"]
    assert seen[2:9] == ["input_audio_buffer.speech_started",
                         "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
                         "conversation.item.added", "conversation.item.created",
                         "conversation.item.done", "response.created"]
    assert bytes(audio) == pcm[span["start"] * 48:span["end"] * 48], "the turn is played back"
    await client.close()
