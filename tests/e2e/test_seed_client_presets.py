"""Each released preset of the seed's client (MiniCPM-o 4.5, PersonaPlex, Nemotron VoiceChat)
opens a session on each backend the stack runs: honoured, or refused with one of the seed's
own error codes by a backend that cannot honour it; never ``unknown_parameter`` for a key the
seed knows.

A refusal a backend may make is one of the seed's request errors about what a model can do
(``ref_audio_required``, ``invalid_duplex_runtime_config``, ``voice_update_unsupported``, ...):
not one that says the request was malformed, nor ``unsupported_audio_format``, since the seed
accepts every preset's formats and so must the gateway.

The client and its presets come from the released wheel (how: ``tests/seed_client.py``).
Each preset is given what its users give it (a voice prompt, a persona, instructions and
tools), and its session streams a second of speech in the preset's own input format
(``pcm_f32le`` at 24 or 16 kHz for two of them), commits and closes. Where the session is
honoured, every audio delta names the preset's output rate, and on the loopback the answer
(the question played back) lasts as long as the question: the input format was read right.
"""

from __future__ import annotations

import asyncio
import io
import wave
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.seed_session import (
    AUDIO_DELTA,
    SeedStack,
    duration_ms,
    encode,
    seed_stack,
    speech,
)
from tests.seed_client import PRESETS, SeedClient, load

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

#: Every backend the e2e stack runs without a GPU; the cascade loads its offline models once.
BACKENDS = ("loopback", "fake", "cascade")
CHUNK_MS = 200
#: Seed codes that are no backend's refusal of a preset: a malformed request (the seed's client
#: sends none), or a format the seed accepts.
NOT_A_BACKEND_REFUSAL = frozenset({
    "bad_event", "bad_audio", "invalid_json", "event_too_large", "unknown_event",
    "config_timeout", "unsupported_audio_format",
})


@pytest.fixture(scope="module")
def seed() -> SeedClient:
    return load()


@pytest.fixture(scope="module", params=BACKENDS)
def served(request: pytest.FixtureRequest) -> Iterator[SeedStack]:
    yield from seed_stack(request.param)


def preset_config(seed: SeedClient, preset: str) -> Any:
    """The preset's ``SessionConfig`` with what its users pass it."""
    duplex = seed.duplex
    create = seed.presets[preset].create_duplex_session_config
    if preset == "minicpmo_4_5":
        # The voice prompt MiniCPM-o speaks with: a second of speech as a WAV data URL.
        wav = io.BytesIO()
        with wave.open(wav, "wb") as prompt:
            prompt.setnchannels(1)
            prompt.setsampwidth(2)
            prompt.setframerate(16_000)
            prompt.writeframes(encode(speech(16_000), "pcm16")[:32_000])
        return create(ref_audio=duplex.audio_data_url(wav.getvalue()))
    if preset == "personaplex":
        return create(persona="You are a friendly assistant who answers in one sentence.")
    assert preset == "nemotron_voicechat", preset
    tool = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    return create(instructions="Answer briefly.", tools=[tool], idle_timeout_s=60.0)


@pytest.mark.parametrize("preset", PRESETS)
async def test_a_preset_is_honoured_or_refused_with_a_seed_code(
        seed: SeedClient, served: SeedStack, preset: str) -> None:
    duplex = seed.duplex
    config = preset_config(seed, preset)
    question = encode(speech(config.input_audio.sample_rate_hz, chunk_ms=CHUNK_MS),
                      config.input_audio.encoding)
    collector = duplex.EventCollector()
    refusals: list[tuple[str | None, str]] = []
    answer = bytearray()
    try:
        async with asyncio.timeout(120):
            async with duplex.DuplexClient(served.url, model=served.backend,
                                           config=config) as client:
                consumer = asyncio.create_task(collector.consume(client))
                await asyncio.sleep(0)  # lets the collector subscribe before anything is sent
                await client.stream_pcm(question, realtime=False)
                await client.commit()
                if served.backend == "loopback":
                    async for response in client.responses():
                        if response.decision == "listen":
                            continue
                        async for chunk in response.audio():
                            answer += chunk
                            await client.ack_playback(response.played_ms)
                        break
            await asyncio.wait_for(consumer, 20)
    except duplex.DuplexProtocolError as refused:  # at the handshake, or while answering
        refusals.append((refused.code, str(refused)))
    refusals += [(duplex.ErrorEvent(e).code, duplex.ErrorEvent(e).message)
                 for e in collector.errors()]
    for code, message in refusals:
        assert code != "unknown_parameter", f"{preset} on {served.backend}: {message}"
        assert seed.error_types.get(code or "") == "invalid_request_error", (
            f"{preset} on {served.backend}: not a seed request error: {code}: {message}")
        assert code not in NOT_A_BACKEND_REFUSAL, f"{preset} on {served.backend}: {message}"
    if refusals:
        return
    events: list[dict[str, Any]] = collector.events
    assert events and events[-1]["type"] == "session.closed", [e["type"] for e in events[-3:]]
    rates = {e.get("sample_rate_hz") for e in events if e["type"] == AUDIO_DELTA}
    assert rates <= {config.output_audio.sample_rate_hz}, rates
    if served.backend == "loopback":
        heard = duration_ms(answer, config.output_audio)
        said = duration_ms(question, config.input_audio)
        assert abs(heard - said) <= CHUNK_MS, f"answer {heard:.0f} ms for {said:.0f} ms"
