"""``DuplexClient``'s retries against scripted gateways (tests/client/scripted.py): backoff,
resuming after drops and closes, refusals, resends, opening. The client under test is the real
one, on real sockets; only the gateway's side is a script."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from duplex_client import (
    ClientSettings,
    DuplexClient,
    DuplexClientError,
    RealtimeEvent,
    Resumed,
    ResumeRefused,
    RetriesExhausted,
    SessionReplaced,
)
from tests.client.scripted import (
    DEADLINE_S,
    SESSION_ID,
    Peer,
    ScriptedGateway,
    closed,
    collect,
    connect,
    created,
    delta,
    error,
    open_and_stream,
    resume_then,
    resumed,
    trace,
)

pytestmark = pytest.mark.timeout(30)


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
