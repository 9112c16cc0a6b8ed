"""The official openai SDK runs a full turn against a `duplex-gateway dev` stack: push-to-talk,
server_vad asked for, and OpenAI's own minimal flow, which streams audio without any
``session.update`` and relies on the GA session defaults."""

from __future__ import annotations

import asyncio
import base64
from typing import Any, cast

import pytest
from openai import AsyncOpenAI

from tests.gateway.strict import validate_server_event
from tests.worker.speech import synthesize, to_pcm16

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PCM_24K = {"type": "audio/pcm", "rate": 24000}
#: OpenAI's GA server_vad, every default filled in (openai_realtime.md §5).
GA_SERVER_VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                 "silence_duration_ms": 500, "idle_timeout_ms": None, "create_response": True,
                 "interrupt_response": True}
#: The event types of a turn the server detected, committed and answered by itself.
DETECTED_TURN = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                 "input_audio_buffer.committed", "conversation.item.added",
                 "conversation.item.created", "conversation.item.done", "response.created"]


def sdk(websocket_base_url: str) -> AsyncOpenAI:
    """The official client, pointed at the stack."""
    return AsyncOpenAI(api_key="sk-test", base_url="http://unused.invalid/v1",
                       websocket_base_url=websocket_base_url)


async def test_sdk_full_turn(dev_stack: str) -> None:
    """Push-to-talk (``turn_detection: null``, the §6d example): session.created,
    session.updated, response.created, audio deltas, response.done."""
    client = sdk(dev_stack)
    pcm = bytes(range(256)) * 19  # 4864 bytes: just over the 100 ms commit minimum
    seen: list[str] = []
    audio = bytearray()
    async with client.realtime.connect(model="loopback") as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"],
                                           "audio": {"input": {"turn_detection": None}}})
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


async def append_in_100ms(conn: Any, pcm: bytes) -> None:
    """Stream ``pcm`` as a microphone client does, in 100 ms appends."""
    for start in range(0, len(pcm), 4800):
        await conn.input_audio_buffer.append(
            audio=base64.b64encode(pcm[start:start + 4800]).decode())


async def test_sdk_minimal_flow_without_session_update_is_answered(dev_stack: str) -> None:
    """OpenAI's minimal flow: connect with ``?model=loopback`` and stream a spoken turn with
    silence after it, never sending session.update. session.created announces GA's defaults
    (server_vad, pcm16 24 kHz both ways, voice marin), and the server detects the turn,
    commits it and answers it: the loopback plays the turn back."""
    client = sdk(dev_stack)
    pcm, _ = _spoken_turn()
    seen: list[str] = []
    audio = bytearray()
    span: dict[str, int] = {}
    async with client.realtime.connect(model="loopback") as conn:
        await append_in_100ms(conn, pcm)
        async for event in conn:
            data = event.to_dict()
            validate_server_event(data)
            seen.append(event.type)
            if event.type == "session.created":
                session = cast(dict[str, Any], data["session"])
                assert session["audio"]["input"]["turn_detection"] == GA_SERVER_VAD
                assert session["audio"]["input"]["format"] == PCM_24K
                assert session["audio"]["output"]["format"] == PCM_24K
                assert session["audio"]["output"]["voice"] == "marin"
            if event.type == "input_audio_buffer.speech_started":
                span["start"] = event.audio_start_ms
            if event.type == "input_audio_buffer.speech_stopped":
                span["end"] = event.audio_end_ms
            if event.type == "response.output_audio.delta":
                audio += base64.b64decode(event.delta)
            if event.type == "response.done":
                assert event.response.status == "completed"
                break
    assert seen[0] == "session.created"
    assert seen[1:8] == DETECTED_TURN
    assert bytes(audio) == pcm[span["start"] * 48:span["end"] * 48], "the turn is played back"
    await client.close()


async def test_sdk_turn_detection_null_keeps_push_to_talk(dev_stack: str) -> None:
    """``turn_detection: null``: the same spoken turn is not detected or answered; once a
    later session.update is answered (the worker applies commands in order, so every append
    was heard by then) nothing else has arrived. Commit and response.create then get the
    answer, which plays the whole buffer back."""
    client = sdk(dev_stack)
    pcm, _ = _spoken_turn()
    audio = bytearray()
    async with client.realtime.connect(model="loopback") as conn:

        async def next_event() -> Any:
            event = await asyncio.wait_for(conn.recv(), 30)
            validate_server_event(event.to_dict())
            return event

        assert (await next_event()).type == "session.created"
        await conn.session.update(session={"type": "realtime",
                                           "audio": {"input": {"turn_detection": None}}})
        updated = await next_event()
        assert updated.type == "session.updated"
        assert updated.to_dict()["session"]["audio"]["input"]["turn_detection"] is None
        await append_in_100ms(conn, pcm)
        await conn.session.update(session={"type": "realtime", "instructions": "barrier"})
        barrier = await next_event()
        assert barrier.type == "session.updated", "nothing but the update's answer came"
        assert barrier.to_dict()["session"]["audio"]["input"]["turn_detection"] is None
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        seen: list[str] = []
        while True:
            event = await next_event()
            seen.append(event.type)
            if event.type == "response.output_audio.delta":
                audio += base64.b64decode(event.delta)
            if event.type == "response.done":
                assert event.response.status == "completed"
                break
    assert "input_audio_buffer.speech_started" not in seen
    assert seen[0] == "input_audio_buffer.committed"
    assert bytes(audio) == pcm, "the committed buffer is played back whole"
    await client.close()


async def test_sdk_server_vad_turn_is_detected_and_answered(dev_stack: str) -> None:
    """A server_vad session hears a turn in streamed audio: speech_started, speech_stopped,
    the commit and an automatic response that plays the turn back, every event strictly
    valid."""
    client = sdk(dev_stack)
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
    assert seen[2:9] == DETECTED_TURN
    assert bytes(audio) == pcm[span["start"] * 48:span["end"] * 48], "the turn is played back"
    await client.close()
