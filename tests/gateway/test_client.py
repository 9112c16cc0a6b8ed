"""``DuplexClient`` against scripted gateways: real websocket servers on 127.0.0.1 that play
one scripted connection after another (drops, close codes, lost answers, refusals, replays)
and record every frame the client sent. The client under test is the real one, on real
sockets; only the gateway's side is a script.

The scripts never guess what arrived: they wait for the client's ``session.event_ack`` (the
collector below acknowledges every numbered event) before they cut a connection, and a replay
starts from what the client says it holds, as the real gateway's does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from gateway.client import (
    AckEvents,
    AckPlayback,
    AppendAudio,
    AppendText,
    BargeIn,
    CancelInput,
    CancelResponse,
    ClearInput,
    ClearOutputAudio,
    ClientCommand,
    ClientSettings,
    CloseSession,
    CommitInput,
    CreateItem,
    CreateResponse,
    DeleteItem,
    DuplexClient,
    DuplexClientError,
    Heartbeat,
    RealtimeEvent,
    Resumed,
    ResumeRefused,
    RetriesExhausted,
    RetrieveItem,
    SessionReplaced,
    SignalTurn,
    TruncateItem,
    UpdateSession,
)
from gateway.protocol.parse import CLIENT_EVENT_ALIASES, CLIENT_EVENT_TYPES, parse_client_frame
from store import messages as m

pytestmark = pytest.mark.timeout(30)

DEADLINE_S = 10.0
SESSION_ID = "sess_scripted"
#: Tiny pauses with a seeded jitter: backoff is deterministic and the tests are quick.
FAST = ClientSettings(backoff_base_s=0.001, backoff_cap_s=0.004, attempt_timeout_s=5.0,
                      heartbeat_interval_s=None)


def seeded_jitter() -> Callable[[], float]:
    return random.Random(20240611).random


# --------------------------------------------------------------------------- the scripted side


@dataclass
class Peer:
    """The gateway's end of one connection: what a script reads, sends and cuts."""

    ws: ServerConnection
    frames: list[dict[str, Any]] = field(default_factory=list)

    async def read(self) -> dict[str, Any]:
        frame: dict[str, Any] = json.loads(await self.ws.recv())
        self.frames.append(frame)
        return frame

    async def expect(self, kind: str) -> dict[str, Any]:
        """The next frame that is not an ack; it must be of type ``kind``."""
        frame = await self.read()
        while frame["type"] == "session.event_ack":
            frame = await self.read()
        assert frame["type"] == kind, frame
        return frame

    async def wait_ack(self, seq: int) -> None:
        """Until the client acknowledged ``seq``: everything up to it has arrived."""
        while True:
            frame = await self.read()
            if frame["type"] == "session.event_ack" and frame["server_event_seq"] >= seq:
                return

    async def send(self, *events: dict[str, Any]) -> None:
        for event in events:
            await self.ws.send(json.dumps(event))

    def drop(self) -> None:
        """Cut the connection without a close frame (a crash or a network loss)."""
        self.ws.transport.abort()

    async def close(self, code: int) -> None:
        await self.ws.close(code)


Script = Callable[[Peer], Awaitable[None]]


class ScriptedGateway:
    """A websocket server playing ``scripts[n]`` on its n-th connection; a connection beyond
    the scripts is cut at once (and counted). A failed script is kept for the test's end."""

    def __init__(self, scripts: list[Script]) -> None:
        self.scripts = scripts
        self.peers: list[Peer] = []
        self.failures: list[BaseException] = []
        self._server: Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"ws://127.0.0.1:{port}/v1/realtime"

    async def start(self) -> None:
        self._server = await serve(self._handle, "127.0.0.1", 0)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, ws: ServerConnection) -> None:
        peer = Peer(ws)
        self.peers.append(peer)
        index = len(self.peers) - 1
        if index >= len(self.scripts):
            peer.drop()
            return
        try:
            await self.scripts[index](peer)
        except Exception as exc:  # surfaced by the fixture: a script that failed is a failure
            self.failures.append(exc)
            peer.drop()

    def frames(self, connection: int) -> list[dict[str, Any]]:
        return self.peers[connection].frames


@pytest.fixture
async def gateway_factory() -> AsyncIterator[Callable[..., Awaitable[ScriptedGateway]]]:
    """Start scripted gateways; at the end, stop them and fail on any failed script."""
    started: list[ScriptedGateway] = []

    async def start(*scripts: Script) -> ScriptedGateway:
        gateway = ScriptedGateway(list(scripts))
        await gateway.start()
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        await gateway.stop()
    failures = [failure for gateway in started for failure in gateway.failures]
    if failures:
        raise failures[0]


# --------------------------------------------------------------------------- server events


def created(token: str = "token-1") -> dict[str, Any]:
    return {"type": "session.created", "session_id": SESSION_ID, "resume_token": token,
            "lease_generation": 1}


def delta(seq: int) -> dict[str, Any]:
    return {"type": "response.output_audio.delta", "server_event_seq": seq,
            "delta": base64.b64encode(seq.to_bytes(4, "little")).decode()}


def resumed(*, token: str, generation: int, last_client_seq: int = 0,
            replay_from: int) -> dict[str, Any]:
    return {"type": "session.resumed", "session_id": SESSION_ID, "resume_token": token,
            "lease_generation": generation, "last_client_seq": last_client_seq,
            "replay_from": replay_from}


def closed(seq: int, reason: str = "client_close") -> dict[str, Any]:
    return {"type": "session.closed", "server_event_seq": seq, "reason": reason}


def error(code: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": "invalid_request_error", "code": code,
                                       "message": code}}


async def open_and_stream(peer: Peer, last: int) -> None:
    """The opening every script starts with: the session, events 1..last, all acknowledged."""
    await peer.expect("session.update")
    await peer.send(created(), *(delta(seq) for seq in range(1, last + 1)))
    await peer.wait_ack(last)


def resume_then(*, generation: int, then_last: int, token: str = "token-2",
                end: bool = True) -> Script:
    """A resume answered, replaying from where the client says it is up to ``then_last``
    (with the client's last event sent again, which the client must drop), then
    ``session.closed`` when ``end``."""
    async def script(peer: Peer) -> None:
        request = await peer.expect("session.resume")
        held = request["last_received_server_event_seq"]
        await peer.send(resumed(token=token, generation=generation, replay_from=held + 1))
        if held:
            await peer.send(delta(held))  # a duplicate on purpose
        await peer.send(*(delta(seq) for seq in range(held + 1, then_last + 1)))
        if end:
            await peer.send(closed(then_last + 1))
    return script


# --------------------------------------------------------------------------- the client side


async def collect(client: DuplexClient, into: list[RealtimeEvent]) -> list[RealtimeEvent]:
    """Everything ``events()`` yields, into ``into``, acknowledging every numbered event."""
    async with asyncio.timeout(DEADLINE_S):
        async for event in client.events():
            into.append(event)
            if event.server_event_seq is not None:
                await client.ack(event.server_event_seq)
    return into


def trace(events: list[RealtimeEvent]) -> list[int | str]:
    """The yielded stream in short: numbers for numbered events, names for the rest."""
    return [e.server_event_seq if e.server_event_seq is not None
            else "resumed" if isinstance(e, Resumed) else e.type for e in events]


async def connect(*urls: str, settings: ClientSettings = FAST,
                  retry_open: bool = False) -> DuplexClient:
    return await DuplexClient.connect(list(urls), settings=settings, jitter=seeded_jitter(),
                                      retry_open=retry_open)


# --------------------------------------------------------------------------- backoff


def test_backoff_doubles_per_retry_up_to_the_cap_scaled_by_the_jitter() -> None:
    """The pause before retry n is jitter x min(cap, base x 2^n)."""
    settings = ClientSettings(backoff_base_s=0.1, backoff_cap_s=0.5)
    assert [settings.backoff_s(n, 1.0) for n in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert settings.backoff_s(2, 0.25) == pytest.approx(0.1)
    assert settings.backoff_s(10_000, 0.5) == 0.25  # no overflow on a long outage
    assert settings.backoff_s(0, 0.0) == 0.0


@pytest.mark.parametrize("bad", [
    {"max_retries": -1}, {"retry_deadline_s": 0}, {"backoff_base_s": 0},
    {"backoff_base_s": 2.0, "backoff_cap_s": 1.0}, {"heartbeat_interval_s": 0},
    {"close_timeout_s": 0},
])
def test_settings_that_cannot_work_are_refused(bad: dict[str, Any]) -> None:
    """Settings that would retry forever at once, or never, are a ValueError."""
    with pytest.raises(ValueError):
        ClientSettings(**bad)


# --------------------------------------------------------------------------- resuming


async def test_a_drop_mid_stream_resumes_on_the_next_gateway_without_gap_or_duplicate(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """Gateway A drops the socket with two events in flight; events() resumes on gateway B
    from what it holds, drops B's resent duplicate, and yields every event once, in order,
    with one Resumed marker where the resume happened."""
    async def stream_then_drop(peer: Peer) -> None:
        await open_and_stream(peer, 3)
        await peer.send(delta(4), delta(5))
        peer.drop()

    gateway_a = await gateway_factory(stream_then_drop)
    gateway_b = await gateway_factory(resume_then(generation=2, then_last=8))
    client = await connect(gateway_a.url, gateway_b.url)
    events = await collect(client, [])

    marker = next(e for e in events if isinstance(e, Resumed))
    held = gateway_b.frames(0)[0]["last_received_server_event_seq"]
    assert trace(events) == [*range(1, held + 1), "resumed", *range(held + 1, 10)]
    assert held in (3, 4, 5)
    assert events[-1].type == "session.closed" and client.closed
    assert (marker.url, marker.after, marker.attempts) == (gateway_b.url, "dropped", 1)
    assert (client.resume_token, client.generation) == ("token-2", 2)
    assert gateway_b.frames(0)[0]["resume_token"] == "token-1"


@pytest.mark.parametrize("code", [1011, 1012, 1013])
async def test_a_close_with_a_retryable_code_is_resumed(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]], code: int,
) -> None:
    """A close with 1011 (store failure), 1012 (draining) or 1013 (try later) is resumed
    through the same URL (a load balancer), with nothing lost or repeated."""
    async def stream_then_close(peer: Peer) -> None:
        await open_and_stream(peer, 2)
        await peer.close(code)

    gateway = await gateway_factory(stream_then_close, resume_then(generation=2, then_last=4))
    client = await connect(gateway.url)
    events = await collect(client, [])

    assert trace(events) == [1, 2, "resumed", 3, 4, 5]
    marker = events[2]
    assert isinstance(marker, Resumed) and marker.after == f"closed {code}"
    assert gateway.frames(1)[0]["last_received_server_event_seq"] == 2


async def test_a_lost_resume_answer_is_retried_with_the_same_control_id(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """The gateway drops the connection after reading session.resume (the answer is lost):
    the retry carries the same control_id and the same token; the next resume, after a later
    drop, has a control_id of its own and the rotated token."""
    async def stream_then_drop(peer: Peer) -> None:
        await open_and_stream(peer, 2)
        peer.drop()

    async def swallow_the_resume(peer: Peer) -> None:
        await peer.expect("session.resume")
        peer.drop()

    async def resume_stream_then_drop(peer: Peer) -> None:
        await resume_then(generation=2, then_last=3, end=False)(peer)
        await peer.wait_ack(3)
        peer.drop()

    gateway = await gateway_factory(stream_then_drop, swallow_the_resume,
                                    resume_stream_then_drop,
                                    resume_then(generation=3, then_last=4, token="token-3"))
    client = await connect(gateway.url)
    events = await collect(client, [])

    requests = [gateway.frames(n)[0] for n in (1, 2, 3)]
    ids = [request["control_id"] for request in requests]
    assert ids[0] == ids[1] != ids[2]
    assert [r["attempt"] for r in requests] == [1, 2, 1]  # numbered per control_id
    assert [r["resume_token"] for r in requests] == ["token-1", "token-1", "token-2"]
    assert trace(events) == [1, 2, "resumed", 3, "resumed", 4, 5]
    markers = [e for e in events if isinstance(e, Resumed)]
    assert [m.attempts for m in markers] == [2, 1]
    assert client.resume_token == "token-3"


@pytest.mark.parametrize(("reason", "replay_from"), [("log_trimmed", 10), ("log_rewound", 2)])
async def test_resync_required_is_yielded_and_the_new_numbering_is_followed(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]], reason: str, replay_from: int,
) -> None:
    """A resume the log cannot serve: events() yields session.resync_required, then the
    events from its replay_from, even where they reuse numbers already seen (log_rewound)."""
    async def stream_then_drop(peer: Peer) -> None:
        await open_and_stream(peer, 3)
        peer.drop()

    async def resync(peer: Peer) -> None:
        await peer.expect("session.resume")
        await peer.send(
            resumed(token="token-2", generation=2, replay_from=replay_from),
            {"type": "session.resync_required", "session_id": SESSION_ID, "reason": reason,
             "replay_from": replay_from},
            delta(replay_from), delta(replay_from + 1), closed(replay_from + 2))

    gateway = await gateway_factory(stream_then_drop, resync)
    client = await connect(gateway.url)
    events = await collect(client, [])

    after = [replay_from, replay_from + 1, replay_from + 2]
    assert trace(events) == [1, 2, 3, "resumed", "session.resync_required", *after]
    assert events[4].data["reason"] == reason


@pytest.mark.parametrize("code", [
    "session_resume_expired", "invalid_resume_token", "invalid_session_resume"])
async def test_a_refused_resume_is_terminal_and_not_retried(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]], code: str,
) -> None:
    """A resume refused for good raises ResumeRefused with the gateway's code (and again on
    the next read), after one attempt only."""
    async def stream_then_drop(peer: Peer) -> None:
        await open_and_stream(peer, 1)
        peer.drop()

    async def refuse(peer: Peer) -> None:
        await peer.expect("session.resume")
        await peer.send(error(code))
        await peer.close(1008)

    gateway = await gateway_factory(stream_then_drop, refuse)
    client = await connect(gateway.url)
    events: list[RealtimeEvent] = []
    with pytest.raises(ResumeRefused) as refused:
        await collect(client, events)
    assert refused.value.code == code
    assert trace(events) == [1]
    assert len(gateway.peers) == 2, "no retry after a final refusal"
    with pytest.raises(ResumeRefused):
        await collect(client, events)
    assert DuplexClient.is_fatal_resume_error(refused.value)


@pytest.mark.parametrize(("cut", "close_code"), [("drop", None), ("close", 1013)])
async def test_retries_end_after_max_retries_with_the_last_reason(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]], cut: str,
    close_code: int | None,
) -> None:
    """Every resume attempt fails: after 1 + max_retries attempts, all with the same
    control_id, events() raises RetriesExhausted carrying the last close code."""
    async def stream_then_drop(peer: Peer) -> None:
        await open_and_stream(peer, 1)
        peer.drop()

    async def fail_the_resume(peer: Peer) -> None:
        await peer.expect("session.resume")
        if cut == "drop":
            peer.drop()
        else:
            await peer.close(1013)

    settings = ClientSettings(max_retries=3, backoff_base_s=0.001, backoff_cap_s=0.002,
                              heartbeat_interval_s=None)
    gateway = await gateway_factory(stream_then_drop, *[fail_the_resume] * 4)
    client = await connect(gateway.url, settings=settings)
    with pytest.raises(RetriesExhausted) as exhausted:
        await collect(client, [])
    assert exhausted.value.attempts == 4
    assert exhausted.value.close_code == close_code
    assert len(gateway.peers) == 5
    assert len({gateway.frames(n)[0]["control_id"] for n in range(1, 5)}) == 1


async def test_after_a_resume_exactly_the_commands_the_log_lacks_are_resent_in_order(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """Seven commands went out before the drop; the log holds up to client_seq 3: right
    after session.resume (the first frame of the new connection) come 4, 5, 6, 7, as they
    were first sent, and nothing else."""
    async def read_seven_then_drop(peer: Peer) -> None:
        await peer.expect("session.update")
        await peer.send(created())
        for _ in range(7):
            await peer.expect("input_audio_buffer.append")
        await peer.send(delta(1))
        await peer.wait_ack(1)
        peer.drop()

    async def confirm_three(peer: Peer) -> None:
        await peer.expect("session.resume")
        await peer.send(resumed(token="token-2", generation=2, last_client_seq=3,
                                replay_from=2))
        for _ in range(4):
            await peer.expect("input_audio_buffer.append")
        await peer.send(closed(2))

    gateway = await gateway_factory(read_seven_then_drop, confirm_three)
    client = await connect(gateway.url)
    for i in range(7):
        await client.append_audio(bytes([i, 0]))
    events = await collect(client, [])

    assert trace(events) == [1, "resumed", 2]
    first_sent = {f["client_seq"]: f for f in gateway.frames(0) if "client_seq" in f}
    after_resume = gateway.frames(1)
    assert after_resume[0]["type"] == "session.resume"
    resent = [f for f in after_resume if "client_seq" in f]
    assert [f["client_seq"] for f in resent] == [4, 5, 6, 7]
    assert resent == [first_sent[seq] for seq in (4, 5, 6, 7)]
    marker = events[1]
    assert isinstance(marker, Resumed) and marker.last_client_seq == 3


async def test_session_replaced_is_terminal_with_that_reason(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """Another connection took the session over: events() raises SessionReplaced (code
    session_replaced, close code 1000) and does not try to win the session back."""
    async def replace(peer: Peer) -> None:
        await open_and_stream(peer, 1)
        await peer.send({"type": "session.replaced", "session_id": SESSION_ID,
                         "lease_generation": 2})
        await peer.close(1000)

    gateway = await gateway_factory(replace)
    client = await connect(gateway.url)
    events: list[RealtimeEvent] = []
    with pytest.raises(SessionReplaced) as replaced:
        await collect(client, events)
    assert (replaced.value.code, replaced.value.close_code) == ("session_replaced", 1000)
    assert trace(events) == [1]
    assert len(gateway.peers) == 1


async def test_a_close_code_no_retry_can_help_is_terminal_with_the_error_code(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """An error then close 1008 on a live session is raised with both codes, not resumed."""
    async def refuse_mid_session(peer: Peer) -> None:
        await open_and_stream(peer, 1)
        await peer.send(error("session_lost"))
        await peer.close(1008)

    gateway = await gateway_factory(refuse_mid_session)
    client = await connect(gateway.url)
    events: list[RealtimeEvent] = []
    with pytest.raises(DuplexClientError) as ended:
        await collect(client, events)
    assert (ended.value.code, ended.value.close_code) == ("session_lost", 1008)
    assert trace(events) == [1, "error"]
    assert len(gateway.peers) == 1


# --------------------------------------------------------------------------- opening


async def refuse_busy(peer: Peer) -> None:
    """A gateway with no slot free: resource_exhausted, then close 1013."""
    await peer.expect("session.update")
    await peer.send(error("resource_exhausted"))
    await peer.close(1013)


async def test_an_open_refused_with_1013_is_retried_when_asked(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """connect(retry_open=True) opens again after resource_exhausted (close 1013)."""
    async def open_and_end(peer: Peer) -> None:
        await peer.expect("session.update")
        await peer.send(created(), delta(1), closed(2))

    gateway = await gateway_factory(refuse_busy, open_and_end)
    client = await connect(gateway.url, retry_open=True)
    assert client.session_id == SESSION_ID
    assert trace(await collect(client, [])) == [1, 2]
    assert len(gateway.peers) == 2


async def test_an_open_refusal_is_raised_at_once_by_default(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """Without retry_open, the refusal reaches the caller with its code, after one try."""
    gateway = await gateway_factory(refuse_busy)
    with pytest.raises(DuplexClientError) as refused:
        await connect(gateway.url)
    assert refused.value.code == "resource_exhausted"
    assert len(gateway.peers) == 1


# --------------------------------------------------------------------------- the rest


async def test_heartbeats_go_out_on_a_timer_while_events_runs(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """A client that sends nothing heartbeats by itself (unnumbered: nothing to resend)."""
    beats: list[dict[str, Any]] = []

    async def wait_for_heartbeats(peer: Peer) -> None:
        await peer.expect("session.update")
        await peer.send(created())
        for seq in (1, 2):
            beats.append(await peer.expect("session.heartbeat"))
            await peer.send({"type": "session.heartbeat_ack", "server_event_seq": seq})
        await peer.send(closed(3))

    settings = ClientSettings(heartbeat_interval_s=0.01)
    gateway = await gateway_factory(wait_for_heartbeats)
    client = await connect(gateway.url, settings=settings)
    events = await collect(client, [])
    assert trace(events) == [1, 2, 3]
    assert all("client_seq" not in beat for beat in beats)


async def test_aclose_ends_events_without_resuming(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """aclose() from another task ends a running events() quietly; no reconnection."""
    async def stream_until_closed(peer: Peer) -> None:
        await open_and_stream(peer, 1)
        await peer.ws.wait_closed()

    gateway = await gateway_factory(stream_until_closed)
    client = await connect(gateway.url)
    events: list[RealtimeEvent] = []
    first = asyncio.Event()

    async def read() -> None:
        async for event in client.events():
            events.append(event)
            first.set()
            await client.ack(1)

    reader = asyncio.create_task(read())
    async with asyncio.timeout(DEADLINE_S):
        await first.wait()
        await client.aclose()
        await reader
    assert trace(events) == [1]
    assert len(gateway.peers) == 1


async def test_recv_stays_low_level_and_raises_on_a_close(
    gateway_factory: Callable[..., Awaitable[ScriptedGateway]],
) -> None:
    """recv() does not resume: a 1012 close is raised as ConnectionClosed, with its code."""
    async def stream_then_close(peer: Peer) -> None:
        await open_and_stream(peer, 1)
        await peer.close(1012)

    gateway = await gateway_factory(stream_then_close)
    client = await connect(gateway.url)
    async with asyncio.timeout(DEADLINE_S):
        first = await client.recv()
        await client.ack(1)
        with pytest.raises(ConnectionClosed) as lost:
            await client.recv()
    assert first.server_event_seq == 1
    assert lost.value.rcvd is not None and lost.value.rcvd.code == 1012
    assert len(gateway.peers) == 1


# --------------------------------------------------------------------------- the session API

#: One of every command, each with an event_id to echo.
EVERY_COMMAND: tuple[ClientCommand, ...] = (
    UpdateSession({"type": "realtime", "instructions": "Be brief."}, event_id="c1"),
    AppendAudio(b"\x01\x00\x02\x00", event_id="c2"),
    CommitInput(event_id="c3"),
    ClearInput(event_id="c4"),
    CreateResponse({"instructions": "Now."}, event_id="c5"),
    CancelResponse("resp_1", event_id="c6"),
    CreateItem({"type": "message", "role": "user", "content": []}, "item_0", event_id="c7"),
    RetrieveItem("item_1", event_id="c8"),
    DeleteItem("item_1", event_id="c9"),
    TruncateItem("item_2", audio_end_ms=120, content_index=0, event_id="c10"),
    ClearOutputAudio(event_id="c11"),
    AppendText("hello", event_id="c12"),
    CancelInput(event_id="c13"),
    BargeIn(event_id="c14"),
    SignalTurn("user.typing", {"n": 1}, event_id="c15"),
    AckPlayback(640, committed_ms=320, response_id="resp_1", item_id="item_2", event_id="c16"),
    Heartbeat(event_id="c17"),
    AckEvents(0, event_id="c18"),
    CloseSession("done", event_id="c19"),
)


def test_there_is_a_command_for_every_client_event_the_gateway_parses() -> None:
    """Every client event type the codec accepts has a command class, session.resume aside
    (the client sends it itself) and the seed's aliases (a command sends the canonical name);
    a new parser without one fails here."""
    assert set(CLIENT_EVENT_ALIASES.values()) <= CLIENT_EVENT_TYPES
    expected = CLIENT_EVENT_TYPES - {"session.resume"} - set(CLIENT_EVENT_ALIASES)
    assert {type(c).type for c in EVERY_COMMAND} == expected


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
        await client.submit(Heartbeat())
        await client.submit(CommitInput())
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
