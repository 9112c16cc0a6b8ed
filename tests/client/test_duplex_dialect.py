"""``DuplexClient(dialect="duplex")`` against a scripted gateway that speaks the seed's
``?duplex=1`` contract with recorded frames.

``seed_frames.json`` holds server events as the released seed (vllm-omni 0.30.0) puts them on
the wire: each was rendered by that wheel's own ``vllm_omni/protocol/duplex/events.py`` classes
(``to_realtime()``, the package loaded without its ``__init__``, which needs vllm), with
``server_event_seq`` stamped as its writer pump does (every event but ``session.created`` and
``session.resumed``; none after a journal overflow). Keyed by ``event_id``. What the seed
shapes differently from the GA connection: no top-level ``session_id`` or
``lease_generation`` on ``session.created`` (the id is ``session.id``, the generation
``attachment_generation``), capabilities under ``session.capabilities``, ``response_id`` at
the top of ``response.created`` / ``.done``, ``format`` and ``sample_rate_hz`` on audio deltas,
``playback.acknowledged``'s fields under ``event``, ``epoch`` on ``turn.event``, no
``replay_from`` / ``last_client_seq`` on ``session.resumed`` and none on
``session.resync_required``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from duplex_client import (
    AudioDelta,
    Dialect,
    DuplexClient,
    DuplexClientError,
    ErrorEvent,
    ListenDecision,
    PlaybackAcknowledged,
    RealtimeEvent,
    ResponseCreated,
    ResponseDone,
    Resumed,
    SessionClosed,
    SessionResyncRequired,
    SpeakDecision,
    TurnEvent,
)
from duplex_client.dialect import dialect_url
from tests.client.scripted import DEADLINE_S, FAST, Peer, ScriptedGateway, seeded_jitter

pytestmark = pytest.mark.timeout(30)

Factory = Callable[..., Awaitable[ScriptedGateway]]
SEED: dict[str, dict[str, Any]] = json.loads(
    (Path(__file__).with_name("seed_frames.json")).read_text())
SEED_SESSION_ID = SEED["event_c"]["session"]["id"]
#: The seed's numbered events of one answer, in order.
ANSWER = ["event_1", "event_2", "event_3", "event_4", "event_5", "event_6", "event_7",
          "event_8"]
#: The session object the seed's client opens with (its SessionConfig, MiniCPM-o's preset).
SEED_SESSION = {
    "model": "openbmb/MiniCPM-o-4_5", "modalities": ["audio", "text"],
    "input_audio_format": "pcm16", "output_audio_format": "pcm16", "sample_rate_hz": 16000,
    "audio": {"input": {"sample_rate_hz": 16000}, "output": {"sample_rate_hz": 24000}},
    "turn_detection": None, "overlap_policy": "listen_only",
    "playback_commit_policy": "ack_only",
    "extra_body": {"auto_response": True, "force_listen_count": 0},
}


def query(peer: Peer) -> dict[str, list[str]]:
    assert peer.ws.request is not None
    return parse_qs(urlsplit(peer.ws.request.path).query)


def test_the_dialect_sets_the_query_and_ga_leaves_the_url_alone() -> None:
    """duplex=1 and autostart=0 are forced (an autostart would open a session before the
    client's own session.update); model only when given and the URL names none."""
    url = "ws://gw/v1/realtime?autostart=1&model=m0"
    assert dialect_url(url, Dialect.GA, "m1") == url
    assert parse_qs(urlsplit(dialect_url(url, Dialect.DUPLEX, "m1")).query) == {
        "autostart": ["0"], "model": ["m0"], "duplex": ["1"]}
    assert parse_qs(urlsplit(dialect_url("ws://gw/v1/realtime", Dialect.DUPLEX, "m1")).query
                    ) == {"duplex": ["1"], "model": ["m1"], "autostart": ["0"]}


async def test_a_duplex_session_reads_the_seeds_shapes_through_a_resume(
    gateway_factory: Factory,
) -> None:
    """Open with the seed's session object on ?duplex=1&autostart=0, read the seed's answer
    (id, generation, token, capabilities where the seed puts them), its typed events, a
    resume answered the seed's way (no replay_from, no last_client_seq: the replay starts
    after the position the resume named, and only the command no socket took is sent
    again), a resync without a number, and the close."""
    async def open_and_answer(peer: Peer) -> None:
        update = await peer.expect("session.update")
        assert update["session"] == SEED_SESSION
        assert query(peer) == {"duplex": ["1"], "autostart": ["0"],
                               "model": ["openbmb/MiniCPM-o-4_5"]}
        await peer.send(SEED["event_c"], *(SEED[key] for key in ANSWER[:4]))
        await peer.expect("input_audio_buffer.commit")
        await peer.wait_ack(4)
        peer.drop()

    async def resume_the_seeds_way(peer: Peer) -> None:
        request = await peer.expect("session.resume")
        assert query(peer)["duplex"] == ["1"] and query(peer)["autostart"] == ["0"]
        assert (request["session_id"], request["resume_token"]) == (SEED_SESSION_ID, "tok-1")
        assert request["last_received_server_event_seq"] == 4
        await peer.send(SEED["event_r"], SEED["event_4"],  # a duplicate, dropped by seq
                        *(SEED[key] for key in ANSWER[4:]))
        resent = await peer.expect("input_audio_buffer.append")
        await peer.send(SEED["event_9"], {**SEED["event_10"], "server_event_seq": 9,
                                          "reason": f"resent {resent['client_seq']}"})

    gateway = await gateway_factory(open_and_answer, resume_the_seeds_way)
    client = await DuplexClient.connect(gateway.url, session=SEED_SESSION, settings=FAST,
                                        jitter=seeded_jitter(), dialect="duplex",
                                        model="openbmb/MiniCPM-o-4_5")
    assert client.session_id == SEED_SESSION_ID
    assert (client.generation, client.resume_token) == (1, "tok-1")
    assert client.capabilities["chunk_period_ms"] == 1000
    assert client.capabilities["optional_input_modalities"] == ["video"]
    assert client.public_session["model"] == "openbmb/MiniCPM-o-4_5"  # the seed's name
    await client.commit()
    events: list[RealtimeEvent] = []
    async with asyncio.timeout(DEADLINE_S):
        async for event in client.events():
            events.append(event)
            if event.server_event_seq == 4:
                await client.ack(4)
                await client.drop_connection()
                await client.append_audio(b"\0\0")  # while down: no socket took it
    kinds = [type(e) for e in events]
    assert kinds == [ResponseCreated, SpeakDecision, AudioDelta, PlaybackAcknowledged, Resumed,
                     TurnEvent, ErrorEvent, ListenDecision, ResponseDone,
                     SessionResyncRequired, SessionClosed]
    created, _, audio, acked, marker, turn, error, listen, done, resync, closed = events
    assert created.response_id == done.response_id == listen.response_id == "resp_1"
    assert isinstance(audio, AudioDelta)
    assert (audio.audio, audio.format, audio.sample_rate_hz) == (b"\1\0\2\0", "pcm16", 24000)
    assert isinstance(acked, PlaybackAcknowledged)
    assert (acked.played_ms, acked.committed_ms, acked.item_id, acked.response_id) == (
        40, 40, "item_resp_1", "resp_1")
    assert isinstance(marker, Resumed)
    assert (marker.replay_from, marker.last_client_seq) == (None, None)
    assert isinstance(turn, TurnEvent)
    assert (turn.event, turn.turn_state, turn.epoch) == ("user_started", "user_speaking", 2)
    assert isinstance(error, ErrorEvent)
    assert (error.code, error.related_event_id) == ("response_not_active", "c9")
    assert isinstance(resync, SessionResyncRequired)
    assert (resync.reason, resync.replay_from) == ("journal_overflow", None)
    assert [e.server_event_seq for e in events if e.server_event_seq is not None] == [
        *range(1, 9), 9]
    assert (client.generation, client.resume_token) == (2, "tok-2")
    assert client.close_reason == "resent 2"  # the append, numbered after the commit
    assert isinstance(closed, SessionClosed)
    frames = [f["type"] for f in gateway.frames(1)]
    assert frames.count("input_audio_buffer.commit") == 0  # a socket took it before


async def test_a_seed_refusal_of_the_open_in_its_flat_shape(gateway_factory: Factory) -> None:
    """The seed refuses a route in a flat shape (``error`` a text, ``code`` beside it): the
    open raises with that code."""
    async def refuse(peer: Peer) -> None:
        await peer.expect("session.update")
        await peer.send({"type": "error", "error": "Duplex API is not available",
                         "code": "unsupported"})
        await peer.close(1008)

    gateway = await gateway_factory(refuse)
    with pytest.raises(DuplexClientError) as refused:
        await DuplexClient.connect(gateway.url, settings=FAST, dialect="duplex")
    assert refused.value.code == "unsupported"
    assert gateway.frames(0)[0]["session"] == {}  # the duplex default: no GA "type"


async def test_the_seeds_resume_codes_retry_or_end_as_they_mean(gateway_factory: Factory) -> None:
    """A resume the seed refuses with ``engine_backpressure`` (its engine is busy: later) is
    tried again; one refused with ``runtime_resume_failed`` (a newer attach holds the lease)
    is final."""
    def refuse_with(code: str) -> Callable[[Peer], Awaitable[None]]:
        async def refuse(peer: Peer) -> None:
            await peer.expect("session.resume")
            await peer.send({"type": "error", "error": {"type": "invalid_request_error",
                                                        "code": code, "message": code}})
            await peer.close(1008)
        return refuse

    async def resume(peer: Peer) -> None:
        await peer.expect("session.resume")
        await peer.send(SEED["event_r"], SEED["event_10"])

    gateway = await gateway_factory(refuse_with("engine_backpressure"), resume,
                                    refuse_with("runtime_resume_failed"))
    async with asyncio.timeout(DEADLINE_S):
        client = await DuplexClient.resume_session(
            gateway.url, session_id=SEED_SESSION_ID, resume_token="tok-1", settings=FAST,
            jitter=seeded_jitter(), dialect="duplex")
        assert client.generation == 2
        assert await client.wait_closed() == "client_close"
        with pytest.raises(DuplexClientError) as final:
            await DuplexClient.resume_session(
                gateway.url, session_id=SEED_SESSION_ID, resume_token="tok-2", settings=FAST,
                jitter=seeded_jitter(), dialect="duplex")
    assert final.value.code == "runtime_resume_failed"
    assert DuplexClient.is_fatal_resume_error(final.value)
    assert len(gateway.peers) == 3
