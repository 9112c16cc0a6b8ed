"""The seed's released client resumes by itself after the gateway serving it is SIGKILLed
mid-answer, through a load balancer in front of two gateways (what a deployment puts in front
of them; the client knows one URL).

The client comes from the released wheel (how: ``tests/seed_client.py``). Its resume is its
own: on a dropped transport it dials the same URL again and sends ``session.resume`` with
its session id, resume token and the last ``server_event_seq`` it received; it drops any
event numbered at or below that one (a replayed duplicate) and acks every numbered event.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from tests.e2e.seed_session import AUDIO_DELTA, duration_ms, encode, seq_numbers, speech
from tests.e2e.stack import Balancer, Stack
from tests.seed_client import SeedClient, load

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CHUNK_MS = 200
#: How much of the answer is played before its gateway is killed.
KILL_AT_MS = 1000


@pytest.fixture(scope="module")
def seed() -> SeedClient:
    return load()


async def test_the_seed_clients_resume_after_a_gateway_sigkill_mid_answer(
        seed: SeedClient, stack: Stack) -> None:
    """A question of a few seconds; the loopback plays it back at real-time pace. A second
    into the answer, the gateway the balancer gave the session is SIGKILLed. The client
    reconnects through the balancer (to the other gateway) and resumes, once; the answer
    completes, as long as the question (nothing lost, nothing played twice); every numbered
    event arrives once, in order (``server_event_seq`` without a gap); no ``error``."""
    gateways = [stack.gateway(), stack.gateway()]
    stack.worker(backend="loopback")
    balancer = Balancer(gateways)
    await balancer.start()
    duplex = seed.duplex
    config = duplex.SessionConfig()
    question = encode(speech(config.input_audio.sample_rate_hz, min_ms=4000), "pcm16")
    collector = duplex.EventCollector()
    answer = bytearray()
    spoken: Any = None
    try:
        async with asyncio.timeout(120):
            async with duplex.DuplexClient(balancer.url, model="loopback",
                                           config=config) as client:
                serving = next(g for g in gateways if g.port == balancer.picks[0])
                consumer = asyncio.create_task(collector.consume(client))
                await asyncio.sleep(0)  # lets the collector subscribe before anything is sent
                await client.stream_pcm(question, realtime=False)
                await client.commit()
                async for response in client.responses():
                    if response.decision == "listen":
                        continue
                    async for chunk in response.audio():
                        answer += chunk
                        if response.played_ms >= KILL_AT_MS and serving.process.poll() is None:
                            serving.kill()  # mid-answer: the rest is still to be played
                        # An ack sent while the transport is down is lost; the next one
                        # carries the same progress further.
                        with contextlib.suppress(duplex.DuplexConnectionError):
                            await client.ack_playback(response.played_ms)
                    spoken = response
                    break
            await asyncio.wait_for(consumer, 20)
    finally:
        await balancer.aclose()
    events: list[dict[str, Any]] = collector.events
    assert serving.process.poll() is not None, "the serving gateway was killed mid-answer"
    other = next(g for g in gateways if g is not serving)
    assert other.port in balancer.picks[1:], balancer.picks
    assert collector.errors() == [], collector.errors()
    assert collector.count("connection.resumed") == 1, "the client resumed once, by itself"
    assert collector.count("session.resumed") == 1
    assert spoken is not None and spoken.done_event is not None, "the answer completed"
    assert spoken.done_event.type == "response.done", spoken.done_event.raw
    done = [e for e in events if e["type"] == "response.done"]
    assert [duplex.DuplexEvent(e).response_id for e in done] == [spoken.response_id]
    heard = duration_ms(answer, config.output_audio)
    said = duration_ms(question, config.input_audio)
    assert abs(heard - said) <= CHUNK_MS, f"answer {heard:.0f} ms for a {said:.0f} ms question"
    delta_bytes = sum(len(duplex.DuplexEvent(e).audio or b"") for e in events
                      if e["type"] == AUDIO_DELTA)
    assert delta_bytes == len(answer), "every delta once"
    seqs = seq_numbers(events)
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    assert events[-1]["type"] == "session.closed"
