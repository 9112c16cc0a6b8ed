"""The worker's output append without reading each log's end, when it knows where it is.

A session whose last append was answered on connections the store has kept since goes to the
fast script (``store/lua/flush_output.lua``): one XADD an event and one push, nothing read of
the session. Redis refuses what may not land (an event stored already, a session that ended,
a log that is gone) and the full script, sent next, says why. A connection made since (a
failover could have lost what was answered) sends every session to the full script, which
reads the log's end and finds a rewound log. Each test counts what Redis ran (``INFO
commandstats``), so the path taken is shown, not assumed.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from contract.reasons import CloseReason
from store import (
    Mismatch,
    OutputAppend,
    OutputMismatch,
    Scripts,
    SessionGone,
    WorkerFenced,
    create_client,
)
from store.errors import Gone
from store.keys import SessionKeys, WorkerKeys
from store.pushes import OutputPushed
from store.script_lane import ScriptLane
from tests.faultproxy import FaultProxy
from tests.store._support import (
    ev,
    events_of,
    listening,
    open_session,
    ran,
    ran_since,
    register_worker,
    until,
)

pytestmark = pytest.mark.timeout(30)

BOUND = 1000


def part(session_id: str, first: int, events: list[bytes], known: int | None,
         **changes: object) -> OutputAppend:
    return OutputAppend(session_id=session_id, events=events, first_seq=first,
                        output_log_max_entries=BOUND, top_known_at=known, **changes)  # type: ignore[arg-type]


def described(outcome: int | SessionGone | OutputMismatch) -> object:
    """An outcome as a value a test can compare (errors are not equal to their likes)."""
    if isinstance(outcome, SessionGone):
        return ("gone", outcome.session_id, outcome.status)
    if isinstance(outcome, OutputMismatch):
        return ("mismatch", outcome.session_id, outcome.status, outcome.first_seq,
                outcome.last_seq)
    return outcome


async def test_a_known_log_end_is_not_read_and_only_what_landed_is_pushed(
    own: Scripts, redis_client: Redis
) -> None:
    """Two sessions' first appends, their logs' ends not known: the full script, which reads
    each (XREVRANGE). Their next, at the same route changes: the fast script, one call, one
    XADD an event, one push a session, no read of a log or a session record (no session was
    taken over from this worker: no owner epoch is read); the trim named goes too. The
    pushes and the logs hold every event once, in order."""
    wid = await register_worker(own)
    first, second = [(await open_session(own, wid)).session_id for _ in range(2)]
    routes = own.route_changes
    assert routes is not None
    before = await ran(redis_client)
    assert await own.append_output_many([part(first, 1, [ev(1)], None),
                                         part(second, 1, [ev(1)], None)]) == [1, 1]
    assert await ran_since(redis_client, before, "evalsha", "xrevrange") == (1, 2)
    assert own.route_changes == routes

    async with listening(redis_client, SessionKeys(first).output_channel) as heard:
        before = await ran(redis_client)
        outcomes = await own.append_output_many([
            part(first, 2, [ev(2), ev(3)], routes),
            part(second, 2, [ev(2)], routes, input_trim_to=1, input_trim_fence=2)])
        assert outcomes == [2, 2]
        assert await ran_since(redis_client, before, "evalsha", "xrevrange", "xadd",
                               "spublish", "hmget", "xtrim", "hget") == (1, 0, 3, 2, 1, 1, 0)
        assert await heard() == [OutputPushed(2, [ev(2), ev(3)])]
    assert [seq for seq, _ in await events_of(redis_client, first)] == [1, 2, 3]
    assert [seq for seq, _ in await events_of(redis_client, second)] == [1, 2]


async def test_what_redis_refuses_goes_to_the_full_script_which_says_why(
    own: Scripts, redis_client: Redis
) -> None:
    """At known ends, in one call: a resend of events stored already (their reply lost), a
    session that ended (its terminal moved the log's last ID past any), a session whose log
    is gone, and a session that lands. The fast script writes the last; the full script,
    sent next for the other three, stores nothing twice, answers the resend as landed and
    the others gone; no push goes out for what was refused, and the terminal stays last."""
    wid = await register_worker(own)
    resent, ended, gone, fresh = [(await open_session(own, wid)).session_id for _ in range(4)]
    routes = own.route_changes
    for sid in (resent, ended, gone, fresh):
        assert await own.append_output_many([part(sid, 1, [ev(1)], None)]) == [1]
    assert await own.append_output_many([part(resent, 2, [ev(2)], routes)]) == [2]
    await own.close_session(ended, CloseReason.CLIENT_CLOSE)
    await redis_client.delete(SessionKeys(gone).output_log)

    async with listening(redis_client, SessionKeys(resent).output_channel) as heard:
        before = await ran(redis_client)
        outcomes = await own.append_output_many([
            part(resent, 2, [ev(2), ev(3)], routes), part(ended, 2, [ev(2)], routes),
            part(gone, 2, [ev(2)], routes), part(fresh, 2, [ev(2)], routes)])
        assert [described(outcome) for outcome in outcomes] == [
            2, ("gone", ended, Gone.CLOSED), ("gone", gone, Gone.UNKNOWN), 2]
        # The fast call, then the full one for three sessions: each reads its log's end.
        assert await ran_since(redis_client, before, "evalsha", "xrevrange") == (2, 3)
        # The resend's new event, pushed by the full script alone.
        assert await heard() == [OutputPushed(3, [ev(3)])]
    assert [seq for seq, _ in await events_of(redis_client, resent)] == [1, 2, 3]
    assert [seq for seq, _ in await events_of(redis_client, fresh)] == [1, 2]
    ended_events = await events_of(redis_client, ended)
    assert [seq for seq, _ in ended_events] == [1, 2]
    assert ended_events[-1][1].KIND == "session.closed"


async def test_a_lost_worker_is_refused_whole(own: Scripts, redis_client: Redis) -> None:
    """A worker declared lost writes nothing through the fast script either."""
    wid = await register_worker(own)
    sid = (await open_session(own, wid)).session_id
    routes = own.route_changes
    assert await own.append_output_many([part(sid, 1, [ev(1)], None)]) == [1]
    await redis_client.hset(WorkerKeys(wid).record, "state", "lost")
    with pytest.raises(WorkerFenced):
        await own.append_output_many([part(sid, 2, [ev(2)], routes)])
    assert [seq for seq, _ in await events_of(redis_client, sid)] == [1]


@pytest.mark.parametrize("reconnected_by", ["another call", "the append itself"])
async def test_a_new_connection_reads_the_log_end_again_and_finds_it_rewound(
    proxy: FaultProxy, redis_client: Redis, reconnected_by: str
) -> None:
    """The log lost its last events behind the worker's back (as a failover to a replica
    that lagged would), and the store's connection was made again (as every such failover
    makes it), by another call or by the append itself once its connection was seen to
    close: the fast script is not sent on the new connection, and the full one reads the
    log's end and finds the gap instead of writing past it."""
    client = create_client(proxy.url)
    scripts = Scripts(client, own_connection=True)
    try:
        wid = await register_worker(scripts)
        sid = (await open_session(scripts, wid)).session_id
        assert await scripts.append_output_many([part(sid, 1, [ev(1), ev(2), ev(3)],
                                                      None)]) == [1]
        known = scripts.route_changes
        log = SessionKeys(sid).output_log
        # What a replica that lagged by two events would hold: the log up to the first.
        rows: Any = await redis_client.xrange(log, "1-0", "1-0")
        await redis_client.delete(log)
        await redis_client.xadd(log, rows[0][1], id="1-0")
        proxy.cut()
        proxy.restore()
        if reconnected_by == "another call":
            await register_worker(scripts)
        else:
            lane = scripts._lane
            assert isinstance(lane, ScriptLane)

            def closed() -> bool:
                connection = lane._connection
                return connection is None or connection.closed.done()
            await until(closed, "the lane to see its connection closed")
        outcome = await scripts.append_output_many([part(sid, 4, [ev(4)], known)])
        assert scripts.route_changes != known
        assert [described(one) for one in outcome] == [("mismatch", sid, Mismatch.GAP, 4, 1)]
        assert [seq for seq, _ in await events_of(redis_client, sid)] == [1]
    finally:
        await scripts.aclose()
        await client.aclose()
