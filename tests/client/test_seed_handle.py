"""``DuplexClient`` as the seed's ``DuplexSessionHandle`` is used, against scripted gateways
(tests/client/scripted.py): typed events, ``append_audio`` and ``commit`` with the seed's
arguments as the gateway's parser reads them, ``close()`` that waits for ``session.closed``,
``session_closed`` after the end, and the resume constructor."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from contract import messages as m
from duplex_client import (
    AudioDelta,
    DuplexClient,
    DuplexClientError,
    ErrorEvent,
    InputAudioBufferAppendEvent,
    ListenDecision,
    RealtimeEvent,
    ResponseCreated,
    ResponseDone,
    SessionClosed,
    SessionClosedError,
    SessionReplaced,
    SessionUpdated,
    SpeakDecision,
    TranscriptDelta,
)
from duplex_client.events import event_of
from gateway.protocol.parse import parse_client_frame
from tests.client.scripted import (
    DEADLINE_S,
    FAST,
    SESSION_ID,
    Peer,
    ScriptedGateway,
    closed,
    collect,
    connect,
    created,
    open_and_stream,
    resumed,
    seeded_jitter,
    trace,
)
from tests.store._support import until

pytestmark = pytest.mark.timeout(30)

Factory = Callable[..., Awaitable[ScriptedGateway]]
_JPEG = "/9j/4AAQSkZJRg=="


def parsed(frame: dict[str, Any]) -> m.Command:
    """What the gateway's parser makes of a frame the client sent."""
    command = parse_client_frame(json.dumps(frame), max_frame_bytes=1 << 20).command
    assert command is not None
    return command


def answer_turn(seq: int) -> list[dict[str, Any]]:
    """A short answer, numbered from ``seq``: created, speak, one audio delta with its
    transcript, done."""
    response = {"id": "resp_1", "object": "realtime.response", "status": "in_progress"}
    return [
        {"type": "response.created", "server_event_seq": seq, "response": response},
        {"type": "response.speak", "server_event_seq": seq + 1, "response_id": "resp_1"},
        {"type": "response.output_audio.delta", "server_event_seq": seq + 2,
         "response_id": "resp_1", "item_id": "item_1", "delta": base64.b64encode(b"\1\2").decode()},
        {"type": "response.output_audio_transcript.delta", "server_event_seq": seq + 3,
         "response_id": "resp_1", "delta": "hi"},
        {"type": "response.done", "server_event_seq": seq + 4,
         "response": {**response, "status": "completed"}},
    ]


# --------------------------------------------------------------------------- typed events


async def test_events_are_typed_by_their_type(gateway_factory: Factory) -> None:
    """Each kind a caller branches on is its own class (isinstance works, as with the seed's
    client); the rest stay plain RealtimeEvents; every one still has type, seq and data."""
    async def answer(peer: Peer) -> None:
        await peer.expect("session.update")
        await peer.send(created(), {"type": "session.updated", "server_event_seq": 1,
                                    "session": {"instructions": "x"}},
                        *answer_turn(2), {"type": "rate_limits.updated", "server_event_seq": 7,
                                          "rate_limits": []}, closed(8))

    gateway = await gateway_factory(answer)
    client = await connect(gateway.url)
    events = await collect(client, [])
    kinds = [type(e) for e in events]
    assert kinds == [SessionUpdated, ResponseCreated, SpeakDecision, AudioDelta, TranscriptDelta,
                     ResponseDone, RealtimeEvent, SessionClosed]
    assert trace(events) == list(range(1, 9))
    audio = events[3]
    assert isinstance(audio, AudioDelta)
    assert (audio.audio, audio.response_id, audio.item_id) == (b"\1\2", "resp_1", "item_1")
    assert (audio.format, audio.sample_rate_hz) == (None, None)  # a GA delta says neither
    done = events[5]
    assert isinstance(done, ResponseDone)
    assert (done.response_id, done.status) == ("resp_1", "completed")  # nested id read
    transcript = events[4]
    assert isinstance(transcript, TranscriptDelta) and transcript.text == "hi"
    assert isinstance(events[7], SessionClosed) and events[7].reason == "client_close"


# --------------------------------------------------------------------------- the seed's arguments


async def test_append_commit_and_clear_send_the_seeds_arguments(gateway_factory: Factory) -> None:
    """append_audio, commit and clear_output_audio take the seed handle's arguments and send
    them as the fields the gateway's parser reads back; what is not given is not sent."""
    sent = 6

    async def read_them(peer: Peer) -> None:
        await peer.expect("session.update")
        await peer.send(created())
        for _ in range(sent):
            await peer.read()
        await peer.send(closed(1))

    gateway = await gateway_factory(read_them)
    client = await connect(gateway.url)
    await client.append_audio(b"\0\0\0", format="pcm16", sample_rate_hz=16000, is_speech=True,
                              video_frames=[f"data:image/jpeg;base64,{_JPEG}", _JPEG],
                              duration_ms=200, audio_end_ms=1200,
                              hints={"vad": {"is_speech": True}, "force_listen": False})
    await client.append_audio(b"\0\0\0")
    await client.append_audio(b"", video_frames=[_JPEG])
    await client.commit(final=False, create_response=True, is_speech=False)
    await client.commit()
    await client.clear_output_audio("resp_1")
    async with asyncio.timeout(DEADLINE_S):
        assert await client.wait_closed() == "client_close"
    frames = gateway.frames(0)[1:]
    assert [parsed(frame) for frame in frames] == [
        m.AppendAudio(audio=b"\0\0\0", format="pcm16", sample_rate_hz=16000, is_speech=True,
                      video_frames=(_JPEG, _JPEG), hints={
                          "duration_ms": 200, "audio_end_ms": 1200, "force_listen": False,
                          "vad": {"is_speech": True}}),
        m.AppendAudio(audio=b"\0\0\0"),
        m.AppendAudio(audio=b"", video_frames=(_JPEG,)),
        m.CommitInput(final=False, create_response=True, is_speech=False),
        m.CommitInput(),
        m.ClearOutputAudio(response_id="resp_1"),
    ]
    assert frames[0]["video_frames"] == [_JPEG, _JPEG]  # bare base64, in order
    assert frames[3]["response_create"] is True  # the seed's wire name
    assert set(frames[1]) == {"type", "audio", "client_seq"}  # nothing unasked for
    assert "audio" not in frames[2]  # frames alone
    assert set(frames[4]) == {"type", "client_seq"}


@pytest.mark.parametrize(("hints", "extra", "message"), [
    ({"colour": 1}, {}, "not a hint"),
    ({"duration_ms": 20}, {"duration_ms": 20}, "given both"),
])
def test_a_hint_the_gateway_would_not_read_is_refused_at_once(
    hints: dict[str, Any], extra: dict[str, Any], message: str,
) -> None:
    with pytest.raises(ValueError, match=message):
        InputAudioBufferAppendEvent(b"", hints=hints, **extra)


# --------------------------------------------------------------------------- close


async def test_close_waits_for_session_closed_and_then_does_nothing(gateway_factory: Factory,
                                                                    ) -> None:
    """close() sends session.close and returns the terminal event's reason once it came;
    the events read meanwhile are handed out next by recv(), the terminal one last. A
    second close() sends nothing."""
    async def close_on_request(peer: Peer) -> None:
        await peer.expect("session.update")
        await peer.send(created())
        request = await peer.expect("session.close")
        await peer.send(*answer_turn(1)[:2], closed(3, request["reason"]))
        await peer.ws.wait_closed()

    gateway = await gateway_factory(close_on_request)
    client = await connect(gateway.url)
    async with asyncio.timeout(DEADLINE_S):
        assert await client.close("done") == "done"
        assert client.closed and client.close_reason == "done"
        assert await client.close() == "done"
        held = [await client.recv() for _ in range(3)]
    assert trace(held) == [1, 2, 3] and isinstance(held[-1], SessionClosed)
    await client.detach()
    assert [f["type"] for f in gateway.frames(0)].count("session.close") == 1


async def test_close_inside_an_events_loop_lets_the_loop_read_on(gateway_factory: Factory,
                                                                 ) -> None:
    """Called from inside the caller's own events() loop, close() reads by itself (the loop
    is paused in the same task: waiting on it could never end), and the loop then gets the
    rest, up to session.closed, and ends."""
    async def close_on_request(peer: Peer) -> None:
        await open_and_stream(peer, 1)
        await peer.expect("session.close")
        await peer.send(*answer_turn(2), closed(7))

    gateway = await gateway_factory(close_on_request)
    client = await connect(gateway.url)
    seen: list[RealtimeEvent] = []
    async with asyncio.timeout(DEADLINE_S):
        async for event in client.events():
            seen.append(event)
            if event.server_event_seq == 1:
                await client.ack(1)
                assert await client.close() == "client_close"
    assert trace(seen) == list(range(1, 8))


async def test_close_waits_on_a_reader_in_another_task(gateway_factory: Factory) -> None:
    """While another task iterates events(), close() reads nothing: that reader gets every
    event, session.closed included, and close() returns after it did."""
    async def close_on_request(peer: Peer) -> None:
        await open_and_stream(peer, 2)
        await peer.expect("session.close")
        await peer.send(closed(3))

    gateway = await gateway_factory(close_on_request)
    client = await connect(gateway.url)
    events: list[RealtimeEvent] = []
    reader = asyncio.create_task(collect(client, events))
    async with asyncio.timeout(DEADLINE_S):
        await until(lambda: len(events) >= 2, "the first two events")
        assert await client.close() == "client_close"
        await reader
    assert trace(events) == [1, 2, 3]


async def test_close_times_out_when_no_terminal_event_comes(gateway_factory: Factory) -> None:
    async def never_close(peer: Peer) -> None:
        await peer.expect("session.update")
        await peer.send(created())
        await peer.ws.wait_closed()

    gateway = await gateway_factory(never_close)
    client = await connect(gateway.url)
    with pytest.raises(DuplexClientError) as timed_out:
        await client.close(timeout=0.2)
    assert timed_out.value.code == "close_timeout" and not client.closed
    await client.detach()


async def test_every_command_after_the_end_raises_session_closed(gateway_factory: Factory,
                                                                ) -> None:
    """Once session.closed was read, a command raises SessionClosedError (code
    session_closed, as the seed's handle does) and nothing goes out; an ack or a heartbeat has
    nothing left to do and is dropped. The same after another connection took the session."""
    async def end(peer: Peer) -> None:
        await peer.expect("session.update")
        await peer.send(created(), closed(1, "idle"))
        await peer.ws.wait_closed()

    async def replace(peer: Peer) -> None:
        await peer.expect("session.update")
        await peer.send(created(), {"type": "session.replaced", "session_id": SESSION_ID})
        await peer.ws.wait_closed()

    gateway = await gateway_factory(end, replace)
    client = await connect(gateway.url)
    async with asyncio.timeout(DEADLINE_S):
        assert await client.wait_closed() == "idle"
    with pytest.raises(SessionClosedError) as after:
        await client.append_audio(b"\0\0")
    assert after.value.code == "session_closed"
    await client.ack()
    await client.heartbeat()
    await client.detach()
    assert [f["type"] for f in gateway.frames(0)] == ["session.update"]

    replaced = await connect(gateway.url)
    with pytest.raises(SessionReplaced):
        await collect(replaced, [])
    with pytest.raises(SessionClosedError) as after_replace:
        await replaced.commit()
    assert after_replace.value.code == "session_closed"
    assert isinstance(after_replace.value.__cause__, SessionReplaced)


# --------------------------------------------------------------------------- resume constructor


async def test_resume_session_takes_over_from_an_id_and_a_token(gateway_factory: Factory) -> None:
    """A fresh client resumes from (session_id, resume_token) and the position it names: the
    resume carries them, the replay and later events follow, and its commands are numbered
    after the input log's last one."""
    async def resume_and_serve(peer: Peer) -> None:
        request = await peer.expect("session.resume")
        assert (request["session_id"], request["resume_token"]) == (SESSION_ID, "token-1")
        held = request["last_received_server_event_seq"]
        await peer.send(resumed(token="token-2", generation=3, last_client_seq=9,
                                replay_from=held + 1), *answer_turn(held + 1))
        commit = await peer.expect("input_audio_buffer.commit")
        await peer.send(closed(held + 6, f"after {commit['client_seq']}"))

    gateway = await gateway_factory(resume_and_serve)
    async with asyncio.timeout(DEADLINE_S):
        client = await DuplexClient.resume_session(
            gateway.url, session_id=SESSION_ID, resume_token="token-1",
            last_received_server_event_seq=4, settings=FAST, jitter=seeded_jitter())
        assert (client.resume_token, client.generation) == ("token-2", 3)
        await client.commit()
        events = await collect(client, [])
    assert trace(events) == list(range(5, 11))
    assert client.close_reason == "after 10"


async def test_a_refused_resume_session_raises(gateway_factory: Factory) -> None:
    async def refuse(peer: Peer) -> None:
        await peer.expect("session.resume")
        await peer.send({"type": "error", "error": {"type": "invalid_request_error",
                                                    "code": "invalid_resume_token",
                                                    "message": "no"}})
        await peer.close(1008)

    gateway = await gateway_factory(refuse)
    with pytest.raises(DuplexClientError) as refused:
        await DuplexClient.resume_session(gateway.url, session_id=SESSION_ID,
                                          resume_token="wrong", settings=FAST)
    assert refused.value.code == "invalid_resume_token"


def test_error_events_read_both_shapes() -> None:
    ga = ErrorEvent("error", None, {"type": "error", "error": {
        "type": "invalid_request_error", "code": "item_not_found", "message": "gone",
        "event_id": "c1"}})
    flat = ErrorEvent("error", None, {"type": "error", "error": "Duplex API is not available",
                                      "code": "unsupported"})
    assert (ga.code, ga.message, ga.related_event_id) == ("item_not_found", "gone", "c1")
    assert (flat.code, flat.message, flat.related_event_id) == (
        "unsupported", "Duplex API is not available", None)


def test_a_listen_decision_is_typed() -> None:
    listen = event_of({"type": "response.listen", "server_event_seq": 3, "response_id": "r",
                       "response": {"object": "realtime.response", "status": "listening"}})
    assert isinstance(listen, ListenDecision) and listen.response_id == "r"
    assert listen.server_event_seq == 3
