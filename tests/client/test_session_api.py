"""``DuplexClient``'s session API against scripted gateways (tests/client/scripted.py): every
command as the gateway's codec reads it, the shorthands, ``wait_closed``, ``async with``,
``detach``, and what the client remembers of the session."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable

import pytest

from contract import messages as m
from duplex_client import (
    BargeInEvent,
    ClientCommand,
    ConversationItemCreateEvent,
    ConversationItemDeleteEvent,
    ConversationItemRetrieveEvent,
    ConversationItemTruncateEvent,
    DuplexClientError,
    InputAudioBufferAppendEvent,
    InputAudioBufferClearEvent,
    InputAudioBufferCommitEvent,
    InputCancelEvent,
    InputTextAppendEvent,
    OutputAudioBufferClearEvent,
    PlaybackAckEvent,
    RealtimeEvent,
    ResponseCancelEvent,
    ResponseCreateEvent,
    ResumeRefused,
    SessionCloseEvent,
    SessionEventAckEvent,
    SessionHeartbeatEvent,
    SessionUpdateEvent,
    TurnSignalEvent,
)
from gateway.protocol.parse import CLIENT_EVENT_ALIASES, CLIENT_EVENT_TYPES, parse_client_frame
from tests.client.scripted import (
    DEADLINE_S,
    Peer,
    ScriptedGateway,
    closed,
    collect,
    connect,
    created,
    delta,
    error,
    open_and_stream,
    resumed,
    trace,
)

pytestmark = pytest.mark.timeout(30)


# --------------------------------------------------------------------------- the session API

#: One of every command, each with an event_id to echo.
EVERY_COMMAND: tuple[ClientCommand, ...] = (
    SessionUpdateEvent({"type": "realtime", "instructions": "Be brief."}, event_id="c1"),
    InputAudioBufferAppendEvent(b"\x01\x00\x02\x00", event_id="c2"),
    InputAudioBufferCommitEvent(event_id="c3"),
    InputAudioBufferClearEvent(event_id="c4"),
    ResponseCreateEvent({"instructions": "Now."}, event_id="c5"),
    ResponseCancelEvent("resp_1", event_id="c6"),
    ConversationItemCreateEvent({"type": "message", "role": "user", "content": []}, "item_0",
                                event_id="c7"),
    ConversationItemRetrieveEvent("item_1", event_id="c8"),
    ConversationItemDeleteEvent("item_1", event_id="c9"),
    ConversationItemTruncateEvent("item_2", audio_end_ms=120, content_index=0, event_id="c10"),
    OutputAudioBufferClearEvent(event_id="c11"),
    InputTextAppendEvent("hello", event_id="c12"),
    InputCancelEvent(event_id="c13"),
    BargeInEvent(event_id="c14"),
    TurnSignalEvent("user.typing", {"n": 1}, event_id="c15"),
    PlaybackAckEvent(640, committed_ms=320, response_id="resp_1", item_id="item_2", event_id="c16"),
    SessionHeartbeatEvent(event_id="c17"),
    SessionEventAckEvent(0, event_id="c18"),
    SessionCloseEvent("done", event_id="c19"),
)


def test_there_is_a_command_for_every_client_event_the_gateway_parses() -> None:
    """Every client event type the codec accepts has a command class, session.resume aside
    (the client sends it itself) and the seed's aliases (a command sends the canonical name);
    a new parser without one fails here."""
    assert set(CLIENT_EVENT_ALIASES.values()) <= CLIENT_EVENT_TYPES
    expected = CLIENT_EVENT_TYPES - {"session.resume"} - set(CLIENT_EVENT_ALIASES)
    assert {type(c).type for c in EVERY_COMMAND} == expected


def test_each_command_is_named_after_its_event_and_no_log_command_shares_the_name() -> None:
    """A command class is its Realtime event's name in CamelCase plus ``Event``
    (``input_audio_buffer.append``: ``InputAudioBufferAppendEvent``), so none of them is
    spelled like one of the store's log commands, whose shapes differ."""
    for command in EVERY_COMMAND:
        words = type(command).type.replace(".", "_").split("_")
        assert type(command).__name__ == "".join(w.capitalize() for w in words) + "Event"
    log_names = {cls.__name__ for cls in vars(m).values() if isinstance(cls, type)}
    assert not {type(c).__name__ for c in EVERY_COMMAND} & log_names


async def test_submit_sends_every_command_as_the_gateway_reads_it(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """submit() puts each command on the wire in call order, as the gateway's codec parses
    it, with its event_id; session changes are numbered 1, 2, 3, ..., the heartbeat and the
    ack are not."""
    async def read_everything(peer: Peer) -> None:
        await peer.expect("session.update")
        await peer.send(created())
        for _ in EVERY_COMMAND:
            await peer.read()
        await peer.send(closed(1))

    gateway = await gateway_factory(read_everything)
    client = await connect(gateway.url)
    for command in EVERY_COMMAND:
        await client.submit(command)
    async with asyncio.timeout(DEADLINE_S):
        assert await client.wait_closed() == "client_close"
    frames = gateway.frames(0)[1:]
    assert [f["type"] for f in frames] == [type(c).type for c in EVERY_COMMAND]
    assert [f["event_id"] for f in frames] == [c.event_id for c in EVERY_COMMAND]
    parsed = [parse_client_frame(json.dumps(f), max_frame_bytes=1 << 20) for f in frames]
    numbered = [p.client_seq for p in parsed if p.client_seq is not None]
    assert numbered == list(range(1, len(EVERY_COMMAND) - 1))
    assert [f["type"] for f in frames if "client_seq" not in f] == [
        "session.heartbeat", "session.event_ack"]
    assert frames[1]["audio"] == base64.b64encode(b"\x01\x00\x02\x00").decode()


async def test_a_command_submitted_while_disconnected_goes_out_with_the_resume(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """A numbered command submitted while the connection is down is resent after the resume;
    a heartbeat submitted then is dropped (the resume is activity enough)."""
    async def open_then_wait(peer: Peer) -> None:
        await open_and_stream(peer, 1)
        await peer.ws.wait_closed()

    async def resume_and_read(peer: Peer) -> None:
        await peer.expect("session.resume")
        await peer.send(resumed(token="token-2", generation=2, replay_from=2))
        await peer.expect("input_audio_buffer.commit")
        await peer.send(closed(2))

    gateway = await gateway_factory(open_then_wait, resume_and_read)
    client = await connect(gateway.url)
    async with asyncio.timeout(DEADLINE_S):
        await client.recv()
        await client.ack(1)
        await client.drop_connection()
        await client.submit(SessionHeartbeatEvent())
        await client.submit(InputAudioBufferCommitEvent())
        await client.resume()
        assert await client.wait_closed() == "client_close"
    assert [f["type"] for f in gateway.frames(1)] == ["session.resume",
                                                      "input_audio_buffer.commit"]
    assert gateway.frames(1)[1]["client_seq"] == 1


async def test_wait_closed_reads_by_itself_and_returns_the_reason(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """With no one reading, wait_closed() reads the events (across a dropped connection, as
    events() would) until the terminal one and returns its reason; close_reason is None until
    then."""
    async def stream_then_drop(peer: Peer) -> None:
        await peer.expect("session.update")
        await peer.send(created(), delta(1), delta(2))
        peer.drop()

    async def resume_then_end(peer: Peer) -> None:
        request = await peer.expect("session.resume")
        held = request["last_received_server_event_seq"]
        await peer.send(resumed(token="token-2", generation=2, replay_from=held + 1),
                        *(delta(seq) for seq in range(held + 1, 4)), closed(4, "model_error"))

    gateway = await gateway_factory(stream_then_drop, resume_then_end)
    client = await connect(gateway.url)
    reason_while_open = client.close_reason
    async with asyncio.timeout(DEADLINE_S):
        assert await client.wait_closed() == "model_error"
    assert reason_while_open is None
    assert (client.close_reason, client.closed, client.last_seq) == ("model_error", True, 4)
    assert len(gateway.peers) == 2


async def test_wait_closed_leaves_the_events_to_a_running_events_reader(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """While another task iterates events(), wait_closed() reads nothing itself: that reader
    gets every event, the terminal one included, and wait_closed() returns after it."""
    async def stream_then_end(peer: Peer) -> None:
        await open_and_stream(peer, 3)
        await peer.send(closed(4, "worker_lost"))

    gateway = await gateway_factory(stream_then_end)
    client = await connect(gateway.url)
    events: list[RealtimeEvent] = []
    reader = asyncio.create_task(collect(client, events))
    async with asyncio.timeout(DEADLINE_S):
        assert await client.wait_closed() == "worker_lost"
        await reader
    assert trace(events) == [1, 2, 3, 4]


async def test_wait_closed_takes_over_when_the_reader_breaks_out(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """A reader that leaves its events() loop early hands the reading over: wait_closed(),
    waiting meanwhile, reads the rest and returns the reason."""
    async def stream_then_end(peer: Peer) -> None:
        await open_and_stream(peer, 1)
        await peer.send(delta(2), closed(3))

    gateway = await gateway_factory(stream_then_end)
    client = await connect(gateway.url)
    seen: list[RealtimeEvent] = []

    async def read_one() -> None:
        async for event in client.events():
            seen.append(event)
            await client.ack(1)
            break

    reader = asyncio.create_task(read_one())
    async with asyncio.timeout(DEADLINE_S):
        assert await client.wait_closed() == "client_close"
        await reader
    assert trace(seen) == [1]
    assert client.last_seq == 3


async def test_wait_closed_times_out_and_raises_after_detach(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """wait_closed(timeout) raises TimeoutError when the session goes on; after detach() it
    raises client_detached at once, and the session was never closed."""
    async def open_and_wait(peer: Peer) -> None:
        await peer.expect("session.update")
        await peer.send(created(), delta(1))
        await peer.ws.wait_closed()

    gateway = await gateway_factory(open_and_wait)
    client = await connect(gateway.url)
    with pytest.raises(TimeoutError):
        await client.wait_closed(timeout=0.2)
    await client.detach()
    with pytest.raises(DuplexClientError) as detached:
        await client.wait_closed(timeout=DEADLINE_S)
    assert detached.value.code == "client_detached"
    assert "session.close" not in [f["type"] for f in gateway.frames(0)]


async def test_leaving_async_with_closes_the_session(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """Leaving the block sends session.close, waits for session.closed and closes the
    connection normally."""
    async def close_on_request(peer: Peer) -> None:
        await open_and_stream(peer, 1)
        await peer.expect("session.close")
        await peer.send(closed(2))
        await peer.ws.wait_closed()

    gateway = await gateway_factory(close_on_request)
    async with asyncio.timeout(DEADLINE_S):
        async with await connect(gateway.url) as client:
            await client.recv()
            await client.ack(1)
    assert (client.closed, client.close_reason) == (True, "client_close")
    assert gateway.peers[0].ws.close_code == 1000


async def test_an_exception_in_async_with_closes_the_session_and_propagates(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """An exception inside the block still closes the session, and it is the exception the
    caller gets."""
    async def close_on_request(peer: Peer) -> None:
        await peer.expect("session.update")
        await peer.send(created())
        await peer.expect("session.close")
        await peer.send(closed(1))

    gateway = await gateway_factory(close_on_request)
    with pytest.raises(KeyError, match="inside"):
        async with asyncio.timeout(DEADLINE_S), await connect(gateway.url) as client:
            raise KeyError("inside")
    assert client.close_reason == "client_close"


async def test_async_with_resumes_once_to_close_when_the_connection_is_gone(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """The connection is gone when the block ends: the client resumes once, through the next
    URL, and the resend delivers the session.close."""
    async def open_then_wait(peer: Peer) -> None:
        await open_and_stream(peer, 1)
        await peer.ws.wait_closed()

    async def resume_and_close(peer: Peer) -> None:
        await peer.expect("session.resume")
        await peer.send(resumed(token="token-2", generation=2, replay_from=2))
        await peer.expect("session.close")
        await peer.send(closed(2))

    gateway_a = await gateway_factory(open_then_wait)
    gateway_b = await gateway_factory(resume_and_close)
    async with asyncio.timeout(DEADLINE_S):
        async with await connect(gateway_a.url, gateway_b.url) as client:
            await client.recv()
            await client.ack(1)
            await client.drop_connection()
    assert client.close_reason == "client_close"
    assert len(gateway_a.peers) == 1 and len(gateway_b.peers) == 1


async def test_a_failed_close_on_the_way_out_does_not_hide_the_exception(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """With the connection gone and the one resume refused, leaving the block gives up: an
    exception from inside comes out with the failure as a note; a normal exit raises it."""
    async def open_then_wait(peer: Peer) -> None:
        await open_and_stream(peer, 1)
        await peer.ws.wait_closed()

    async def refuse(peer: Peer) -> None:
        await peer.expect("session.resume")
        await peer.send(error("session_resume_expired"))
        await peer.close(1008)

    gateway = await gateway_factory(open_then_wait, refuse, open_then_wait, refuse)
    with pytest.raises(KeyError) as inside:
        async with asyncio.timeout(DEADLINE_S), await connect(gateway.url) as client:
            await client.recv()
            await client.ack(1)
            await client.drop_connection()
            raise KeyError("inside")
    assert any("session_resume_expired" in note for note in inside.value.__notes__)
    with pytest.raises(ResumeRefused):
        async with asyncio.timeout(DEADLINE_S), await connect(gateway.url) as client:
            await client.recv()
            await client.ack(1)
            await client.drop_connection()
    assert len(gateway.peers) == 4


async def test_detach_inside_async_with_leaves_the_session_open(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """detach() closes the connection (1000) without session.close; leaving the block then
    sends nothing, so the session stays resumable."""
    async def open_and_wait(peer: Peer) -> None:
        await open_and_stream(peer, 1)
        await peer.ws.wait_closed()

    gateway = await gateway_factory(open_and_wait)
    async with asyncio.timeout(DEADLINE_S):
        async with await connect(gateway.url) as client:
            await client.recv()
            await client.ack(1)
            await client.detach()
        await gateway.peers[0].ws.wait_closed()
    assert "session.close" not in [f["type"] for f in gateway.frames(0)]
    assert gateway.peers[0].ws.close_code == 1000 and not client.closed


async def test_session_and_capabilities_show_what_the_gateway_announced(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """capabilities is what session.created announced; session is the session object of
    session.created, then of each session.updated as it is read; both are read-only."""
    first = {"type": "realtime", "instructions": ""}
    second = {"type": "realtime", "instructions": "Be brief."}
    flags = {"supports_barge_in": True, "chunk_period_ms": 40}

    async def update(peer: Peer) -> None:
        await peer.expect("session.update")
        await peer.send({**created(), "session": first, "capabilities": flags},
                        {"type": "session.updated", "server_event_seq": 1, "session": second},
                        closed(2))

    gateway = await gateway_factory(update)
    client = await connect(gateway.url)
    assert dict(client.session) == first and dict(client.capabilities) == flags
    async with asyncio.timeout(DEADLINE_S):
        assert (await client.recv()).type == "session.updated"
    assert dict(client.session) == second and dict(client.capabilities) == flags
    with pytest.raises(TypeError):
        client.session["instructions"] = "x"  # type: ignore[index]
    with pytest.raises(TypeError):
        client.capabilities["supports_barge_in"] = False  # type: ignore[index]


async def test_the_duplex_wrappers_send_the_commands_the_gateway_decodes(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """append_text, cancel_input, barge_in, signal_turn and ack_playback each submit one
    numbered command that the gateway's codec decodes to the typed command the worker gets;
    a signal naming a client event (barge_in) is that event."""
    sent = 7

    async def read_them(peer: Peer) -> None:
        await peer.expect("session.update")
        await peer.send(created())
        for _ in range(sent):
            await peer.read()
        await peer.send(closed(1))

    gateway = await gateway_factory(read_them)
    client = await connect(gateway.url)
    await client.append_text("hello")
    await client.cancel_input()
    await client.barge_in()
    await client.signal_turn("user.typing")
    await client.signal_turn("barge_in", {"why": "test"})
    await client.ack_playback(960)
    await client.ack_playback(960, response_id="resp_1", item_id="item_2", committed_ms=640)
    async with asyncio.timeout(DEADLINE_S):
        assert await client.wait_closed() == "client_close"
    parsed = [parse_client_frame(json.dumps(frame), max_frame_bytes=1 << 20)
              for frame in gateway.frames(0)[1:]]
    assert [p.command for p in parsed] == [
        m.AppendText(text="hello"),
        m.CancelInput(),
        m.BargeIn(),
        m.SignalTurn(event="user.typing"),
        m.BargeIn(),
        m.AckPlayback(played_ms=960),
        m.AckPlayback(played_ms=960, committed_ms=640, response_id="resp_1", item_id="item_2"),
    ]
    assert [p.client_seq for p in parsed] == list(range(1, sent + 1))
