"""Resume through another gateway: nothing lost, nothing duplicated, old gateway fenced."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import pytest
from redis import Redis
from websockets.exceptions import ConnectionClosed

from duplex_client import DuplexClient, RealtimeEvent
from store.keys import SessionKeys
from tests.e2e.helpers import (
    STREAM_SESSION,
    chunk_index,
    collect_until,
    drain_echoes,
    marked_chunk,
    next_event,
    streaming_session,
)
from tests.e2e.stack import Stack, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def assert_exactly_once(events: list[RealtimeEvent]) -> None:
    """Sequenced events are 1, 2, 3, ... with no gap, duplicate or reordering."""
    seqs = [e.server_event_seq for e in events if e.server_event_seq is not None]
    assert seqs == list(range(1, len(seqs) + 1)), seqs


async def test_cut_mid_response_resume_on_other_gateway(stack: Stack) -> None:
    """A cut connection resumes through gateway B and gets every event exactly once."""
    gateway_a, gateway_b = stack.gateway(), stack.gateway()
    stack.worker()
    client = await DuplexClient.connect(gateway_a.ws_url, session=STREAM_SESSION)
    events: list[RealtimeEvent] = []
    await collect_until(client, "session.updated", events)
    for i in range(40):
        await client.append_audio(marked_chunk(0, i))
    await drain_echoes(client, events, 10)
    # The network fails: the client can't tell which of its later sends arrived.
    await client.drop_connection()
    for i in range(40, 60):
        await client.append_audio(marked_chunk(0, i))  # buffered for resend
    resumed = await client.resume(gateway_b.ws_url)
    validate = resumed.data
    assert validate["lease_generation"] == 2
    await drain_echoes(client, events, 60)
    await client.commit()
    await collect_until(client, "response.done", events)
    await client.close()
    await collect_until(client, "session.closed", events)
    await client.aclose()

    assert_exactly_once(events)
    echoed = [chunk_index(e.audio) for e in events if e.type == "response.output_audio.delta"]
    assert echoed == list(range(60)), "every chunk echoed once, in order"


async def test_replaced_connection_is_fenced(stack: Stack) -> None:
    """A resume elsewhere replaces the old connection; its lease can no longer write."""
    gateway_a, gateway_b = stack.gateway(), stack.gateway()
    stack.worker()
    first = await DuplexClient.connect(gateway_a.ws_url, session=STREAM_SESSION)
    await collect_until(first, "session.updated", [])
    # A second client holding the same token resumes while the first socket is still open
    # (a half-open connection the first gateway has not noticed).
    second = DuplexClient(gateway_b.ws_url)
    second.session_id, second.resume_token = first.session_id, first.resume_token
    second.last_seq = first.last_seq
    await second.resume()
    # The first connection writes after the lease moved: gateway A must be refused by Redis.
    await first.append_audio(marked_chunk(1, 99))

    replaced = await next_event(first)
    assert replaced.type == "session.replaced"
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(first.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000

    # Gateway A's detach for generation 1 was refused: the session stays attached to B, and
    # the chunk A tried to append after the resume never reached the input log.
    assert first.session_id is not None
    redis = Redis.from_url(stack.redis.url)
    record = redis.hgetall(SessionKeys(first.session_id).record)
    assert record[b"state"] == b"attached" and record[b"gen"] == b"2"
    input_log: Any = redis.xrange(SessionKeys(first.session_id).input_log)
    assert all(marked_chunk(1, 99) not in fields.get(b"d", b"") for _, fields in input_log)
    redis.close()

    await second.append_audio(marked_chunk(1, 7))
    event = await next_event(second)
    while event.type != "response.output_audio.delta":
        event = await next_event(second)
    assert chunk_index(event.audio) == 7
    await first.aclose()
    await second.aclose()


async def streamed_session(
    stack: Stack, *, marker: int
) -> tuple[DuplexClient, list[RealtimeEvent], str]:
    """A gateway and worker, a stream-mode session that echoed 5 chunks, its output log key."""
    gateway = stack.gateway()
    stack.worker()
    client = await DuplexClient.connect(gateway.ws_url, session=STREAM_SESSION)
    events: list[RealtimeEvent] = []
    await collect_until(client, "session.updated", events)
    for i in range(5):
        await client.append_audio(marked_chunk(marker, i))
    await drain_echoes(client, events, 5)
    assert client.session_id is not None
    return client, events, SessionKeys(client.session_id).output_log


async def test_acknowledged_events_are_trimmed(stack: Stack) -> None:
    """session.event_ack trims the log (on the gateway's next timer tick); a resume from
    before the ack gets resync_required."""
    stack.env["DUPLEX_GATEWAY_DELIVERED_RETENTION_S"] = "0"  # only the ack may trim
    client, _, out_log = await streamed_session(stack, marker=2)
    redis = Redis.from_url(stack.redis.url)
    before = redis.xlen(out_log)
    await client.ack()
    wait_for(lambda: redis.xlen(out_log) < before, "acknowledged events trimmed")
    redis.close()
    # A client that lost everything it was sent asks for seq 0: the gap is announced.
    client.last_seq = 0
    await client.resume()
    notice = await next_event(client)
    assert notice.type == "session.resync_required"
    await client.aclose()


async def test_delivered_events_are_trimmed_after_the_retention(stack: Stack) -> None:
    """Without acks (SDK clients), events delivered longer ago than the retention are trimmed."""
    stack.env["DUPLEX_GATEWAY_DELIVERED_RETENTION_S"] = "0.3"
    client, _, out_log = await streamed_session(stack, marker=3)
    redis = Redis.from_url(stack.redis.url)
    delivered = client.last_seq
    # The last entry stays (it numbers the session's next event), whatever was delivered.
    wait_for(lambda: not redis.xrange(out_log, "-", f"{delivered - 1}-0"),
             "delivered events trimmed")
    redis.close()
    client.last_seq = 0
    await client.resume()
    assert (await next_event(client)).type == "session.resync_required"
    await client.aclose()


async def test_two_racing_resumes_exactly_one_wins(stack: Stack) -> None:
    """Two resumes with the same token race through two gateways: one wins, one is refused,
    and the winner still gets every event exactly once."""
    gateway_a, gateway_b = stack.gateway(), stack.gateway()
    stack.worker()
    owner = await DuplexClient.connect(gateway_a.ws_url, session=STREAM_SESSION)
    events: list[RealtimeEvent] = []
    await collect_until(owner, "session.updated", events)
    await owner.drop_connection()
    racers = []
    for url in (gateway_a.ws_url, gateway_b.ws_url):
        racer = DuplexClient(url)
        racer.session_id, racer.resume_token = owner.session_id, owner.resume_token
        racer.last_seq = owner.last_seq
        racers.append(racer)
    outcomes = await asyncio.gather(*(r.resume() for r in racers), return_exceptions=True)
    won = [r for r, o in zip(racers, outcomes, strict=True) if not isinstance(o, Exception)]
    lost = [o for o in outcomes if isinstance(o, Exception)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert getattr(lost[0], "code", None) == "invalid_resume_token"
    winner = won[0]
    await winner.append_audio(marked_chunk(4, 0))
    await drain_echoes(winner, events, 1)
    assert_exactly_once(events)
    for racer in racers:
        await racer.aclose()


@pytest.mark.logs_errors
async def test_an_input_log_that_went_back_ends_the_session(stack: Stack) -> None:
    """Redis assigns an input index the gateway saw assigned before (a failover lost commands
    the worker never read): the gateway ends the session log_rewound, loudly."""
    stack.env["DUPLEX_GATEWAY_HEARTBEAT_TTL_S"] = "30"  # the worker is paused meanwhile
    gateway = stack.gateway()
    worker = stack.worker()
    client, events = await streaming_session(gateway.ws_url, 5)
    # Only the gateway can notice now: the worker is paused.
    worker.process.send_signal(signal.SIGSTOP)
    try:
        assert client.session_id is not None
        keys = SessionKeys(client.session_id)
        redis = Redis.from_url(stack.redis.url)
        # What a replica that lagged would hold: the input log up to index 2.
        rows: Any = redis.xrange(keys.input_log)
        kept = [(entry_id, fields) for entry_id, fields in rows
                if int(entry_id.split(b"-")[1]) <= 2]
        redis.delete(keys.input_log)
        for entry_id, fields in kept:
            redis.xadd(keys.input_log, fields, id=entry_id)
        redis.close()
        await client.append_audio(marked_chunk(0, 5))
        closed = await collect_until(client, "session.closed", events)
        assert closed.data["reason"] == "log_rewound"
    finally:
        worker.process.send_signal(signal.SIGCONT)
    await client.aclose()
