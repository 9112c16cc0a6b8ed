"""The seed's released client, unmodified, against ``serve`` and a worker: its documented
example on a loopback, and its camera frames.

The client is vLLM-Omni 0.30.0's own ``vllm_omni.clients.duplex`` (``DuplexClient``,
``SessionConfig``, ``EventCollector``), taken from the released wheel at test time and loaded
without the package's ``__init__`` (which needs vllm): ``tests/seed_client.py`` fetches the
wheel with pip (pinned by version and sha256, cached in ``.deps/seed-client/``), registers bare
module objects for ``vllm_omni`` and its subpackages in ``sys.modules``, and executes
``clients/utils.py``, ``clients/duplex.py`` and the presets from the zip with ``importlib``.

Camera frames go to the ``recording`` backend (the test backend that sees video): it reports,
for each frame it received, the sha256 of the frame (of its bytes or of its base64 text, whole
or its first hex digits) and the unit (of its audio) the frame came with, in its output: text
deltas or any event field, ``<sha256 hex> ... unit <n>`` in either order
(:func:`~tests.e2e.seed_session.frame_reports`).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import itertools
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.seed_session import (
    AUDIO_DELTA,
    SeedStack,
    duration_ms,
    encode,
    frame_reports,
    names_frame,
    png,
    seed_stack,
    seq_numbers,
    speech,
)
from tests.seed_client import SHA256, WHEEL_NAME, SeedClient, load, wheel
from tests.store._support import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

#: ``stream_pcm``'s default append: the tolerance on an echo's length.
CHUNK_MS = 200


@pytest.fixture(scope="module")
def seed() -> SeedClient:
    return load()


@pytest.fixture(scope="module")
def loopback() -> Iterator[SeedStack]:
    yield from seed_stack("loopback")


@pytest.fixture(scope="module")
def recording() -> Iterator[SeedStack]:
    yield from seed_stack("recording")


def test_the_client_is_the_released_one_and_needs_no_vllm(seed: SeedClient) -> None:
    """The wheel is the pinned one; its client modules ran without vllm (nor the package's
    ``__init__``) and are the wheel's own files, byte for byte."""
    data = seed.wheel.read_bytes()
    assert hashlib.sha256(data).hexdigest() == SHA256
    assert "vllm" not in sys.modules
    with zipfile.ZipFile(io.BytesIO(data)) as wheel:
        source = wheel.read("vllm_omni/clients/duplex.py")
    assert seed.duplex.__spec__.loader.get_data("") == source
    assert seed.duplex.DuplexClient.__module__ == "vllm_omni.clients.duplex"
    assert {"invalid_input_modality", "unsupported_audio_format"} <= set(seed.error_types)


def test_a_cached_wheel_is_used_only_with_the_pinned_hash(tmp_path: Path) -> None:
    """A file in the cache that is not the pinned wheel (a truncated download, another
    build) is replaced by the pinned one; the pinned one is then used as it is."""
    cached = tmp_path / WHEEL_NAME
    cached.write_bytes(b"not the wheel")
    assert wheel(tmp_path) == cached
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == SHA256
    stamp = cached.stat().st_mtime_ns
    assert wheel(tmp_path) == cached and cached.stat().st_mtime_ns == stamp


async def test_the_documented_example_on_a_loopback(seed: SeedClient, loopback: SeedStack) -> None:
    """The example of the client's module docstring, with the model-neutral default config
    (16 kHz pcm16 in, 24 kHz pcm16 out; the MiniCPM-o preset's model-specific keys are the
    presets' test): the handshake, real speech streamed in real time, ``commit()``,
    ``responses()`` with ``audio()`` and ``ack_playback``, then ``close()`` on leaving the
    ``async with``. No ``error`` event all along; the loopback's answer (the question played
    back) lasts as long as the question, within one append."""
    duplex = seed.duplex
    config = duplex.SessionConfig()
    question = encode(speech(config.input_audio.sample_rate_hz, chunk_ms=CHUNK_MS), "pcm16")
    collector = duplex.EventCollector()
    answer = bytearray()
    spoken: Any = None
    async with asyncio.timeout(90):
        async with duplex.DuplexClient(loopback.url, model="loopback", config=config) as client:
            assert client.session_id, "the handshake named the session"
            consumer = asyncio.create_task(collector.consume(client))
            await asyncio.sleep(0)  # lets the collector subscribe before anything is sent
            await client.stream_pcm(question)
            await client.commit()
            async for response in client.responses():
                if response.decision == "listen":
                    continue
                async for chunk in response.audio():
                    answer += chunk
                    await client.ack_playback(response.played_ms)
                spoken = response
                break
        await asyncio.wait_for(consumer, 20)
    events: list[dict[str, Any]] = collector.events
    assert collector.errors() == [], collector.errors()
    assert spoken is not None and spoken.decision == "speak", "an answer was spoken"
    assert spoken.done_event is not None and spoken.done_event.type == "response.done"
    assert [e["type"] for e in events][-1] == "session.closed", "close() waited for the close"
    heard = duration_ms(answer, config.output_audio)
    said = duration_ms(question, config.input_audio)
    assert abs(heard - said) <= CHUNK_MS, f"answer {heard:.0f} ms for a {said:.0f} ms question"
    assert all(e.get("sample_rate_hz") == config.output_audio.sample_rate_hz
               for e in events if e["type"] == AUDIO_DELTA), "each delta names its rate"
    seqs = seq_numbers(events)
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs


async def test_camera_frames_reach_the_recording_backend_with_their_units(
        seed: SeedClient, recording: SeedStack) -> None:
    """``stream_pcm(..., video_frames=[...])`` in real time: each frame rides the append that
    closes its one-second unit. The recording backend receives every frame, byte for byte,
    in order, each with its own unit: one frame per unit, the units a second apart."""
    duplex = seed.duplex
    config = duplex.SessionConfig()
    frames = [png(200, 0, 0), png(0, 200, 0), png(0, 0, 200)]
    audio = encode(speech(config.input_audio.sample_rate_hz, min_ms=3400), "pcm16")
    collector = duplex.EventCollector()
    async with asyncio.timeout(90):
        async with duplex.DuplexClient(recording.url, model="recording", config=config) as client:
            consumer = asyncio.create_task(collector.consume(client))
            await asyncio.sleep(0)  # lets the collector subscribe before anything is sent
            sent = await client.stream_pcm(
                audio, video_frames=[duplex.image_data_url(f, mime="image/png") for f in frames])
            assert sent == len(frames)
            await until(lambda: len(frame_reports(collector.events)) >= len(frames)
                        or bool(collector.errors()), "the backend's report of every frame",
                        timeout=20)
        await asyncio.wait_for(consumer, 20)
    assert collector.errors() == [], collector.errors()
    reports = frame_reports(collector.events)
    assert len(reports) == len(frames), reports
    assert all(names_frame(digest, frame)
               for (digest, _), frame in zip(reports, frames, strict=True)), reports
    units = [unit for _, unit in reports]
    steps = {later - earlier for earlier, later in itertools.pairwise(units)}
    assert len(steps) == 1 and steps.pop() > 0, f"one frame per unit, a second apart: {units}"


async def test_camera_frames_are_refused_by_the_loopback(
        seed: SeedClient, loopback: SeedStack) -> None:
    """The loopback sees no video: the first frame is refused with the seed's
    ``invalid_input_modality`` (an ``error`` event), and nothing else goes wrong; the session
    still closes cleanly."""
    duplex = seed.duplex
    config = duplex.SessionConfig()
    audio = encode(speech(config.input_audio.sample_rate_hz), "pcm16")
    collector = duplex.EventCollector()
    async with asyncio.timeout(90):
        async with duplex.DuplexClient(loopback.url, model="loopback", config=config) as client:
            consumer = asyncio.create_task(collector.consume(client))
            await asyncio.sleep(0)  # lets the collector subscribe before anything is sent
            frames = [duplex.image_data_url(png(9, 9, 9), mime="image/png")]
            assert await client.stream_pcm(audio, video_frames=frames) > 1  # a frame a second
            await until(lambda: bool(collector.errors()), "the refusal", timeout=20)
        await asyncio.wait_for(consumer, 20)
    codes = [duplex.ErrorEvent(e).code for e in collector.errors()]
    assert codes and set(codes) == {"invalid_input_modality"}, codes
    assert collector.events[-1]["type"] == "session.closed"
