"""store.pubsub.Subscriber: confirmed sharded subscriptions, decoded pushes, self-healing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from contract.follower import LogFollower
from contract.messages import SessionClosed, encode_message
from contract.reasons import CloseReason
from runtime.embedded import EmbeddedServer
from store import Scripts
from store.keys import SessionKeys, WorkerKeys
from store.logs import WriteToken, read_output
from store.pubsub import Subscriber
from store.pushes import (
    InputPushed,
    LeaseMoved,
    OutputPushed,
    Push,
    SessionEnded,
    SessionPlaced,
)
from tests.store._support import (
    EPOCH,
    Client,
    Notices,
    digest,
    expire_heartbeat,
    open_session,
    poll_until,
    reap_until_lost,
    register_worker,
    spublish,
    spublish_raw,
)

WAIT_S = 5.0


async def shard_subscribers(client: Client, channel: str) -> int:
    """How many connections the server counts on a shard channel."""
    answer: Any = await client.execute_command("PUBSUB", "SHARDNUMSUB", channel)
    return int(answer[1])


@pytest.fixture
async def subscriber(redis_client: Redis) -> AsyncIterator[Subscriber]:
    """A started subscriber on the per-test client."""
    sub = Subscriber(redis_client)
    await sub.start()
    yield sub
    await sub.aclose()


async def test_subscribe_is_confirmed_before_returning(
    subscriber: Subscriber, redis_client: Redis
) -> None:
    """Once subscribe returns, the server counts the subscription and delivers to it."""
    handlers = [Notices() for _ in range(3)]
    for i, handler in enumerate(handlers):
        channel = f"dg:{{t{i}}}:chan"
        await subscriber.subscribe(channel, handler)
        assert await shard_subscribers(redis_client, channel) == 1
        assert await spublish(redis_client, channel, ["e", i, ["x"]]) == 1
    for i, handler in enumerate(handlers):
        assert await handler.next() == OutputPushed(i, [b"x"])
        handler.assert_empty()


async def test_output_notices_carry_first_seq_and_payloads(
    subscriber: Subscriber, redis_client: Redis, scripts: Scripts
) -> None:
    """append_output pushes ('e', first seq, payloads); a close pushes the terminal last."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    notices = Notices()
    await subscriber.subscribe(SessionKeys(opened.session_id).output_channel, notices)
    await scripts.append_output(opened.session_id, [b"a", b"b"])
    assert await notices.next() == OutputPushed(1, [b"a", b"b"])
    await scripts.append_output(opened.session_id, [b"c"], close_reason="client_close")
    assert await notices.next() == OutputPushed(3, [b"c"])
    assert await notices.next() == OutputPushed(
        4, [encode_message(SessionClosed(reason="client_close"))])
    notices.assert_empty()


async def test_replaced_notice_after_resume(
    subscriber: Subscriber, redis_client: Redis, scripts: Scripts
) -> None:
    """A resume tells the old connection ('r', new generation); a refused one says nothing."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    notices = Notices()
    await subscriber.subscribe(SessionKeys(opened.session_id).output_channel, notices)
    await scripts.resume(opened.session_id, tenant="tenant-a", presented_digest=digest("wrong"),
                         new_digest=digest("t2"), control_id="c0")
    await scripts.resume(opened.session_id, tenant="tenant-a",
                         presented_digest=digest(opened.token),
                         new_digest=digest("t2"), control_id="c1")
    assert await notices.next() == LeaseMoved(2)
    await scripts.append_output(opened.session_id, [b"z"])
    assert await notices.next() == OutputPushed(1, [b"z"])
    notices.assert_empty()


async def test_worker_notices_open_input_close(
    subscriber: Subscriber, redis_client: Redis, scripts: Scripts
) -> None:
    """The worker channel gets 'o' on open, 'i' per new input (not for duplicates) with the
    fencing token the entries were written under, 'c'."""
    wid = await register_worker(scripts)
    notices = Notices()
    await subscriber.subscribe(WorkerKeys(wid).input_channel, notices)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    assert await notices.next() == SessionPlaced(sid)
    await scripts.append_input(opened.lease, [(1, b"a"), (2, b"b")], max_entries=100)
    assert await notices.next() == InputPushed(sid, 1, [b"a", b"b"],
                                                 WriteToken(EPOCH, 1), fence=2)
    await scripts.append_input(opened.lease, [(1, b"a"), (2, b"b")], max_entries=100)
    await scripts.append_input(opened.lease, [(2, b"b"), (3, b"c"), (None, b"d")],
                               max_entries=100)
    assert await notices.next() == InputPushed(sid, 3, [b"c", b"d"],
                                                 WriteToken(EPOCH, 1), fence=2)
    await scripts.close_session(opened.session_id, CloseReason.CLIENT_CLOSE)
    assert await notices.next() == SessionEnded(sid)
    notices.assert_empty()


async def test_worker_lost_pushes_close_notices(
    subscriber: Subscriber, redis_client: Redis, scripts: Scripts
) -> None:
    """The reaper that declares a worker lost pushes one 'c' per session it ends."""
    wid = await register_worker(scripts)
    opened = [await open_session(scripts, wid) for _ in range(3)]
    notices = Notices()
    outputs = Notices()
    await subscriber.subscribe(WorkerKeys(wid).input_channel, notices)
    await subscriber.subscribe(SessionKeys(opened[0].session_id).output_channel, outputs)
    await expire_heartbeat(redis_client, scripts, wid)
    await reap_until_lost(scripts, wid)
    closed = {n.session_id for n in [await notices.next() for _ in opened]
              if isinstance(n, SessionEnded)}
    assert closed == {o.session_id for o in opened}
    assert await outputs.next() == OutputPushed(
        1, [encode_message(SessionClosed(reason="worker_lost"))])


async def test_pushes_and_log_reads_feed_a_follower(
    subscriber: Subscriber, redis_client: Redis, scripts: Scripts
) -> None:
    """A consumer that subscribes late reads the gap from the log and then follows pushes."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    await scripts.append_output(sid, [b"1", b"2", b"3"])  # before anyone listened
    notices = Notices()
    await subscriber.subscribe(SessionKeys(sid).output_channel, notices)
    follower = LogFollower()
    delivered: list[tuple[int, bytes]] = []
    await scripts.append_output(sid, [b"4", b"5"])
    await scripts.append_output(sid, [b"6"])
    while len(delivered) < 6:
        notice = await notices.next_not_none()
        assert isinstance(notice, OutputPushed)
        fresh, gap = follower.offer(notice.first_seq, notice.payloads)
        if gap:
            rows = await read_output(redis_client, sid, follower.next_index - 1)
            fresh, gap = follower.offer(rows[0][0], [data for _, data in rows])
            assert not gap
        delivered += fresh
    assert delivered == [(i, str(i).encode()) for i in range(1, 7)]


async def test_unsubscribe_stops_delivery(
    subscriber: Subscriber, redis_client: Redis
) -> None:
    """After unsubscribe the handler gets nothing and the server drops the subscription."""
    gone, kept = Notices(), Notices()
    await subscriber.subscribe("dg:{a}:chan", gone)
    await subscriber.subscribe("dg:{b}:chan", kept)
    await subscriber.unsubscribe("dg:{a}:chan")
    await spublish(redis_client, "dg:{a}:chan", ["e", 1, ["late"]])
    await spublish(redis_client, "dg:{b}:chan", ["e", 1, ["marker"]])
    # Both pushes travel on one connection in order: once the marker is here, "late" was seen.
    assert await kept.next() == OutputPushed(1, [b"marker"])
    gone.assert_empty()
    await poll_until(lambda: shard_subscribers(redis_client, "dg:{a}:chan"), lambda n: n == 0)
    await subscriber.unsubscribe("dg:{a}:chan")  # twice is fine
    await subscriber.unsubscribe("dg:{never}:chan")
    await subscriber.subscribe("dg:{a}:chan", gone)  # and back again
    assert await spublish(redis_client, "dg:{a}:chan", ["e", 1, ["again"]]) == 1
    assert await gone.next() == OutputPushed(1, [b"again"])


async def test_subscribe_right_after_unsubscribe_is_confirmed_at_once(
    subscriber: Subscriber, redis_client: Redis
) -> None:
    """The answer to our own SUNSUBSCRIBE, arriving after the channel was subscribed again
    (a session resumed on the same gateway), is not taken for Redis dropping the channel."""
    for round_ in range(20):
        notices = Notices()
        await subscriber.subscribe("dg:{a}:chan", notices)
        await subscriber.unsubscribe("dg:{a}:chan")
        again = Notices()
        # Well under the 5 s confirmation timeout that a lost confirmation would cost.
        await asyncio.wait_for(subscriber.subscribe("dg:{a}:chan", again), 1.0)
        assert await spublish(redis_client, "dg:{a}:chan", ["r", round_]) == 1
        assert await again.next() == LeaseMoved(round_)
        await subscriber.unsubscribe("dg:{a}:chan")
        again.assert_empty()
        notices.assert_empty()


async def test_a_late_unsubscribe_of_the_old_owner_keeps_the_new_subscription(
    subscriber: Subscriber, redis_client: Redis
) -> None:
    """A connection that ends after a newer one on the same process subscribed its channel
    (a quick resume through the same gateway) unsubscribes its own handler only: the newer
    one keeps getting pushes."""
    old, new = Notices(), Notices()
    await subscriber.subscribe("dg:{a}:chan", old)
    await subscriber.subscribe("dg:{a}:chan", new)
    await subscriber.unsubscribe("dg:{a}:chan", old)
    assert await spublish(redis_client, "dg:{a}:chan", ["e", 1, ["live"]]) == 1
    assert await new.next() == OutputPushed(1, [b"live"])
    old.assert_empty()
    await subscriber.unsubscribe("dg:{a}:chan", new)  # the owner's own unsubscribe works
    await poll_until(lambda: shard_subscribers(redis_client, "dg:{a}:chan"), lambda n: n == 0)


async def test_every_handler_of_a_channel_gets_each_push(
    subscriber: Subscriber, redis_client: Redis
) -> None:
    """Two handlers on one channel (an old and a new connection of one session on the same
    gateway) both get every push, over one subscription on the server."""
    first, second = Notices(), Notices()
    await subscriber.subscribe("dg:{a}:chan", first)
    await subscriber.subscribe("dg:{a}:chan", second)
    assert await shard_subscribers(redis_client, "dg:{a}:chan") == 1
    assert await spublish(redis_client, "dg:{a}:chan", ["r", 2]) == 1
    assert await first.next() == LeaseMoved(2)
    assert await second.next() == LeaseMoved(2)
    assert await spublish(redis_client, "dg:{a}:chan", ["e", 1, []]) == 1
    assert await first.next() == OutputPushed(1, [])
    assert await second.next() == OutputPushed(1, [])
    first.assert_empty()
    second.assert_empty()


async def test_removing_one_handler_keeps_the_others(
    subscriber: Subscriber, redis_client: Redis
) -> None:
    """unsubscribe(channel, handler) stops that handler alone; the channel stays subscribed on
    the server for the handlers left."""
    gone, kept = Notices(), Notices()
    await subscriber.subscribe("dg:{a}:chan", gone)
    await subscriber.subscribe("dg:{a}:chan", kept)
    await subscriber.unsubscribe("dg:{a}:chan", gone)
    await subscriber.unsubscribe("dg:{a}:chan", gone)  # twice is fine
    assert await shard_subscribers(redis_client, "dg:{a}:chan") == 1
    assert await spublish(redis_client, "dg:{a}:chan", ["e", 1, ["live"]]) == 1
    assert await kept.next() == OutputPushed(1, [b"live"])
    gone.assert_empty()
    kept.assert_empty()


async def test_the_last_handler_leaving_unsubscribes_on_the_server(
    subscriber: Subscriber, redis_client: Redis
) -> None:
    """Only when the last handler of a channel leaves does the server drop the subscription;
    subscribing again afterwards works."""
    first, second = Notices(), Notices()
    await subscriber.subscribe("dg:{a}:chan", first)
    await subscriber.subscribe("dg:{a}:chan", second)
    await subscriber.unsubscribe("dg:{a}:chan", second)
    await subscriber.unsubscribe("dg:{a}:chan", first)
    await poll_until(lambda: shard_subscribers(redis_client, "dg:{a}:chan"), lambda n: n == 0)
    assert await spublish(redis_client, "dg:{a}:chan", ["e", 1, ["late"]]) == 0
    again = Notices()
    await subscriber.subscribe("dg:{a}:chan", again)
    assert await spublish(redis_client, "dg:{a}:chan", ["e", 1, ["again"]]) == 1
    assert await again.next() == OutputPushed(1, [b"again"])
    first.assert_empty()
    second.assert_empty()


async def test_unsubscribe_without_a_handler_removes_every_handler(
    subscriber: Subscriber, redis_client: Redis
) -> None:
    """unsubscribe(channel) with no handler stops the channel for all its handlers."""
    first, second = Notices(), Notices()
    await subscriber.subscribe("dg:{a}:chan", first)
    await subscriber.subscribe("dg:{a}:chan", second)
    await subscriber.unsubscribe("dg:{a}:chan")
    await poll_until(lambda: shard_subscribers(redis_client, "dg:{a}:chan"), lambda n: n == 0)
    await subscriber.unsubscribe("dg:{a}:chan", first)  # nothing left to remove: a no-op
    first.assert_empty()
    second.assert_empty()


async def test_a_handler_joining_a_pending_subscription_returns_once_it_is_confirmed(
    subscriber: Subscriber, redis_client: Redis
) -> None:
    """A second subscribe while the first one's confirmation is on its way returns only once
    Redis confirmed the channel, so the very next push reaches both, and neither gets a
    spurious None."""
    first, second = Notices(), Notices()
    pending = asyncio.create_task(subscriber.subscribe("dg:{a}:chan", first))
    await asyncio.sleep(0)  # one loop turn: the first subscribe sends its SSUBSCRIBE
    assert not pending.done()
    await subscriber.subscribe("dg:{a}:chan", second)
    assert await spublish(redis_client, "dg:{a}:chan", ["e", 1, ["x"]]) == 1
    await pending
    assert await first.next() == OutputPushed(1, [b"x"])
    assert await second.next() == OutputPushed(1, [b"x"])
    first.assert_empty()
    second.assert_empty()


@pytest.mark.logs_errors
async def test_a_failing_handler_does_not_starve_the_others_on_its_channel(
    subscriber: Subscriber, redis_client: Redis
) -> None:
    """A handler that raises loses its push alone: the channel's other handler still gets it."""

    def explode(notice: Push | None) -> None:
        raise RuntimeError(f"handler bug on {notice!r}")

    notices = Notices()
    await subscriber.subscribe("dg:{a}:chan", explode)
    await subscriber.subscribe("dg:{a}:chan", notices)
    assert await spublish(redis_client, "dg:{a}:chan", ["e", 1, ["fine"]]) == 1
    assert await notices.next() == OutputPushed(1, [b"fine"])
    notices.assert_empty()


async def test_unsubscribe_last_channel_then_subscribe_again(
    subscriber: Subscriber, redis_client: Redis
) -> None:
    """With no subscription left the reader idles, and a new subscribe wakes it."""
    first = Notices()
    await subscriber.subscribe("dg:{a}:chan", first)
    await subscriber.unsubscribe("dg:{a}:chan")
    second = Notices()
    await subscriber.subscribe("dg:{c}:chan", second)
    assert await spublish(redis_client, "dg:{c}:chan", ["e", 1, ["hi"]]) == 1
    assert await second.next() == OutputPushed(1, [b"hi"])
    first.assert_empty()


async def test_restart_resubscribes_and_signals_none(own_server: EmbeddedServer) -> None:
    """After a Redis restart the subscriber re-subscribes by itself, says None, then delivers."""
    client = Redis.from_url(own_server.url)
    sub = Subscriber(client)
    await sub.start()
    try:
        scripts = Scripts(client)
        wid = await register_worker(scripts)
        channel = WorkerKeys(wid).input_channel
        notices, other = Notices(), Notices()
        await sub.subscribe(channel, notices)
        await sub.subscribe("dg:{other}:chan", other)
        await open_session(scripts, wid)
        assert isinstance(await notices.next(), SessionPlaced)

        await asyncio.to_thread(own_server.restart)

        assert await notices.next() is None
        assert await other.next() is None
        # The restart dropped every key: start over on a fresh connection.
        fresh = Redis.from_url(own_server.url)
        try:
            # None means "re-subscribed and confirmed": the very next push is delivered.
            assert await shard_subscribers(fresh, channel) == 1
            scripts = Scripts(fresh)
            await register_worker(scripts, worker_id=wid)
            opened = await open_session(scripts, wid)
            assert await notices.next() == SessionPlaced(opened.session_id)
            assert await spublish(fresh, "dg:{other}:chan", ["e", 1, ["still here"]]) == 1
            assert await other.next() == OutputPushed(1, [b"still here"])
        finally:
            await fresh.aclose()
    finally:
        await sub.aclose()
        await client.aclose()


async def test_restart_tells_every_handler_of_a_channel(own_server: EmbeddedServer) -> None:
    """After a Redis restart each handler of a shared channel gets None once the channel is
    subscribed again, and then every push."""
    client = Redis.from_url(own_server.url)
    sub = Subscriber(client)
    await sub.start()
    try:
        first, second = Notices(), Notices()
        await sub.subscribe("dg:{a}:chan", first)
        await sub.subscribe("dg:{a}:chan", second)
        await asyncio.to_thread(own_server.restart)
        assert await first.next() is None
        assert await second.next() is None
        fresh = Redis.from_url(own_server.url)
        try:
            assert await shard_subscribers(fresh, "dg:{a}:chan") == 1
            assert await spublish(fresh, "dg:{a}:chan", ["e", 1, ["back"]]) == 1
            assert await first.next() == OutputPushed(1, [b"back"])
            assert await second.next() == OutputPushed(1, [b"back"])
        finally:
            await fresh.aclose()
        first.assert_empty()
        second.assert_empty()
    finally:
        await sub.aclose()
        await client.aclose()


@pytest.mark.logs_errors
async def test_bad_push_or_failing_handler_does_not_stop_delivery(
    subscriber: Subscriber, redis_client: Redis
) -> None:
    """An undecodable push and a handler that raises are dropped; later pushes still arrive."""
    notices = Notices()

    def explode(notice: Push | None) -> None:
        raise RuntimeError(f"handler bug on {notice!r}")

    await subscriber.subscribe("dg:{a}:chan", notices)
    await subscriber.subscribe("dg:{b}:chan", explode)
    await spublish_raw(redis_client, "dg:{a}:chan", b"\x01\x02")  # two objects
    await spublish_raw(redis_client, "dg:{a}:chan", b"\xc1")  # never valid
    await spublish(redis_client, "dg:{b}:chan", ["e", 1, ["boom"]])
    await spublish(redis_client, "dg:{a}:chan", ["e", 1, ["fine"]])
    # Each push that is no script's reaches the handler as "read the log".
    assert [await notices.next() for _ in range(2)] == [None, None]
    assert await notices.next() == OutputPushed(1, [b"fine"])
    notices.assert_empty()


async def test_subscribe_while_redis_is_down_heals_later(own_server: EmbeddedServer) -> None:
    """A subscribe that cannot reach Redis is retried by the reader; None marks the recovery."""
    client = Redis.from_url(own_server.url)
    sub = Subscriber(client)
    await sub.start()
    try:
        own_server.stop()
        notices = Notices()
        await sub.subscribe("dg:{a}:chan", notices)
        notices.assert_empty()
        await asyncio.to_thread(own_server.restart)
        assert await notices.next() is None
        fresh = Redis.from_url(own_server.url)
        try:
            assert await spublish(fresh, "dg:{a}:chan", ["e", 1, ["back"]]) == 1
            assert await notices.next() == OutputPushed(1, [b"back"])
        finally:
            await fresh.aclose()
    finally:
        await sub.aclose()
        await client.aclose()
