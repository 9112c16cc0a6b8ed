"""A pulling worker's input appends without the script: plain XADDs in one MULTI.

On the store's own connection (``store/script_lane.py``) a session whose worker reads its input
itself is appended by its writer with the XADDs the input script would run, in one MULTI per
batch (``store/input_appends.py``). Redis keeps the fences: a stale writer's XADD is refused
(its fence is below the marker), a closed session's too (``NOMKSTREAM``); the script is the
slow path that says why, counts a log its writer cannot bound, and settles a lost reply. Each
test counts what Redis ran (``INFO commandstats``), so the path taken is shown, not assumed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from contract.reasons import CloseReason
from store import AppendResult, LeaseLost, Scripts, SessionGone, StoreUnavailable, create_client
from store.errors import Gone
from store.keys import SessionKeys, WorkerKeys
from store.logs import WriteToken, read_input
from store.pubsub import Subscriber
from store.pushes import FenceRaised, InputPushed, Push, SessionEnded, SessionPlaced
from tests.faultproxy import FaultProxy
from tests.store._support import (
    EPOCH,
    digest,
    open_session,
    ran,
    ran_since,
    register_worker,
    spublish,
)

pytestmark = pytest.mark.timeout(30)

CAP = 5


async def test_a_batch_goes_as_one_multi_one_entry_a_session_and_dedups_by_client_seq(
    own: Scripts, redis_client: Redis
) -> None:
    """Two sessions of a pulling worker in one call: one MULTI, one XADD a session (its two
    commands packed in one entry, numbered up to its last command's index), no script; a
    resend of commands already taken appends only the new one, and a batch with nothing new
    sends nothing. Read back, every command has its own index. A pushed worker's session
    appends one entry a command, and its push, in the MULTI."""
    wid = await register_worker(own, pulls=True)
    first, second = [await open_session(own, wid) for _ in range(2)]
    before = await ran(redis_client)
    outcomes = await own.append_input_many(
        [(first.lease, [(1, b"a"), (2, b"b")]), (second.lease, [(None, b"c")])],
        max_entries=100)
    assert outcomes == [AppendResult(appended=2, last_client_seq=2, last_index=2),
                        AppendResult(appended=1, last_client_seq=0, last_index=1)]
    assert await ran_since(redis_client, before, "evalsha", "multi", "exec", "xadd") == (
        0, 1, 1, 2)

    again = await own.append_input(first.lease, [(2, b"b"), (3, b"d")], max_entries=100)
    assert again == AppendResult(appended=1, last_client_seq=3, last_index=3)
    nothing = await own.append_input(first.lease, [(3, b"d")], max_entries=100)
    assert nothing == AppendResult(appended=0, last_client_seq=3, last_index=3)
    assert await ran_since(redis_client, before, "evalsha", "exec", "xadd") == (0, 2, 3)
    rows: Any = await redis_client.xrange(SessionKeys(first.session_id).input_log)
    assert [(entry_id, fields.get(b"k")) for entry_id, fields in rows] == [
        (b"2-0", None), (b"2-2", b"2"), (b"2-3", None)]
    assert await read_input(redis_client, first.session_id, 0) == [
        (1, b"a"), (2, b"b"), (3, b"d")]
    assert await read_input(redis_client, first.session_id, 1) == [(2, b"b"), (3, b"d")]
    assert await read_input(redis_client, second.session_id, 0) == [(1, b"c")]

    pushed = await open_session(own, await register_worker(own))
    before = await ran(redis_client)
    await own.append_input(pushed.lease, [(1, b"a"), (2, b"b")], max_entries=100)
    assert await ran_since(redis_client, before, "evalsha", "exec", "xadd", "spublish") == (
        0, 1, 2, 1)
    assert await redis_client.xlen(SessionKeys(pushed.session_id).input_log) == 3


async def test_a_resume_numbers_on_after_a_packed_entry(
    own: Scripts, redis_client: Redis
) -> None:
    """The resume reads the highest client seq and the last index from a packed entry, the
    new holder dedups a resend against them and appends on, packed again."""
    wid = await register_worker(own, pulls=True)
    opened = await open_session(own, wid)
    await own.append_input(opened.lease, [(1, b"a"), (2, b"b"), (3, b"c")], max_entries=100)
    other = Scripts(redis_client, own_connection=True)
    try:
        resumed = await other.resume(opened.session_id, tenant=opened.lease.tenant,
                                     presented_digest=digest(opened.token),
                                     new_digest=digest("t2"), control_id="c1")
        assert resumed.lease is not None and resumed.last_client_seq == 3
        first = await other.append_input(resumed.lease, [(3, b"c"), (4, b"d")],
                                         max_entries=100)
        assert first == AppendResult(appended=1, last_client_seq=4, last_index=4)
        second = await other.append_input(resumed.lease, [(5, b"e"), (6, b"f")],
                                          max_entries=100)
        assert second == AppendResult(appended=2, last_client_seq=6, last_index=6)
    finally:
        await other.aclose()
    rows: Any = await redis_client.xrange(SessionKeys(opened.session_id).input_log)
    assert [entry_id for entry_id, _ in rows] == [b"2-0", b"2-3", b"4-3", b"4-4", b"4-6"]
    assert await read_input(redis_client, opened.session_id, 0) == [
        (1, b"a"), (2, b"b"), (3, b"c"), (4, b"d"), (5, b"e"), (6, b"f")]


async def test_a_stale_writer_is_refused_by_redis_and_told_its_lease_is_lost(
    own: Scripts, redis_client: Redis
) -> None:
    """Writer A holds generation 1 and knows its log; another gateway resumes the session
    (generation 2, the fence raised). A's next plain append is sent, Redis refuses its XADD
    (equal or smaller), and the script tells A why: LeaseLost. Nothing of A's lands after the
    marker; the new holder appends on under its fence, plainly from its second call."""
    wid = await register_worker(own, pulls=True)
    opened = await open_session(own, wid)
    await own.append_input(opened.lease, [(1, b"a")], max_entries=100)
    other = Scripts(redis_client, own_connection=True)
    try:
        resumed = await other.resume(opened.session_id, tenant=opened.lease.tenant,
                                     presented_digest=digest(opened.token),
                                     new_digest=digest("t2"), control_id="c1")
        assert resumed.lease is not None
        before = await ran(redis_client)
        with pytest.raises(LeaseLost):
            await own.append_input(opened.lease, [(2, b"late")], max_entries=100)
        assert await ran_since(redis_client, before, "exec", "evalsha") == (1, 1)
        for seq in (2, 3):
            await other.append_input(resumed.lease, [(seq, b"new%d" % seq)], max_entries=100)
        # The resume does not say how many entries the log holds: its first append is the
        # script's, which counts them; the next is plain.
        assert await ran_since(redis_client, before, "exec", "evalsha") == (2, 2)
    finally:
        await other.aclose()
    rows: Any = await redis_client.xrange(SessionKeys(opened.session_id).input_log)
    assert [entry_id for entry_id, _ in rows] == [b"2-0", b"2-1", b"4-1", b"4-2", b"4-3"]
    assert await read_input(redis_client, opened.session_id, 0) == [
        (1, b"a"), (2, b"new2"), (3, b"new3")]


async def test_a_closed_session_refuses_a_plain_append(own: Scripts, redis_client: Redis) -> None:
    """The session closed under its writer: the XADD finds no log (NOMKSTREAM), none is
    created, and the writer is told the session is over."""
    wid = await register_worker(own, pulls=True)
    opened = await open_session(own, wid)
    await own.append_input(opened.lease, [(1, b"a")], max_entries=100)
    await own.close_session(opened.session_id, CloseReason.CLIENT_CLOSE)
    before = await ran(redis_client)
    with pytest.raises(SessionGone) as gone:
        await own.append_input(opened.lease, [(2, b"b")], max_entries=100)
    assert gone.value.status is Gone.CLOSED
    assert await ran_since(redis_client, before, "exec") == (1,)
    assert not await redis_client.exists(SessionKeys(opened.session_id).input_log)


async def test_near_the_cap_the_script_counts_and_refuses(
    own: Scripts, redis_client: Redis
) -> None:
    """Nobody reads the log: appends go plain while the writer's bound (the entries it
    appended since the log was counted) keeps them under the cap; the one that might pass it
    goes to the script, which counts and refuses it (backlog_full, nothing appended). Once
    the worker trimmed what it applied, the script counts again and takes it, and the next
    append is plain."""
    wid = await register_worker(own, pulls=True)
    opened = await open_session(own, wid)
    before = await ran(redis_client)
    for seq in range(1, CAP + 1):
        taken = await own.append_input(opened.lease, [(seq, b"%d" % seq)], max_entries=CAP)
        assert taken.appended == 1
    assert await ran_since(redis_client, before, "exec", "evalsha") == (CAP, 0)
    refused = await own.append_input(opened.lease, [(6, b"6")], max_entries=CAP)
    assert refused.backlog_full and refused.appended == 0
    assert await ran_since(redis_client, before, "exec", "evalsha") == (CAP, 1)
    log = SessionKeys(opened.session_id).input_log
    assert await redis_client.xlen(log) == 1 + CAP  # the marker and the unread commands

    # The worker applied 1..3 and trimmed them, keeping the last it applied.
    await redis_client.xtrim(log, minid="2-3", approximate=False)
    for seq in (6, 7):
        taken = await own.append_input(opened.lease, [(seq, b"%d" % seq)], max_entries=CAP)
        assert taken.appended == 1
    assert await ran_since(redis_client, before, "exec", "evalsha") == (CAP + 1, 2)
    assert [index for index, _ in await read_input(redis_client, opened.session_id, 3)] == [
        4, 5, 6, 7]


async def test_the_cap_counts_entries_and_a_packed_one_counts_once(
    own: Scripts, redis_client: Redis
) -> None:
    """INPUT_LOG_MAX_ENTRIES bounds the log's unread entries: five appends of two commands
    each are five packed entries under a cap of five; the sixth is refused by the script
    (its count, then two more commands, would pass it), nothing of it appended."""
    wid = await register_worker(own, pulls=True)
    opened = await open_session(own, wid)
    for call in range(CAP):
        taken = await own.append_input(
            opened.lease, [(2 * call + 1, b"x"), (2 * call + 2, b"y")], max_entries=CAP)
        assert taken.appended == 2
    before = await ran(redis_client)
    refused = await own.append_input(opened.lease, [(11, b"x"), (12, b"y")], max_entries=CAP)
    assert refused.backlog_full and refused.last_index == 2 * CAP
    assert await ran_since(redis_client, before, "exec", "evalsha") == (0, 1)
    assert len(await read_input(redis_client, opened.session_id, 0)) == 2 * CAP


async def lose_after(client: Redis, log: str, last_kept: str) -> None:
    """The log as a replica that lacked what followed ``last_kept`` holds it."""
    kept: Any = await client.xrange(log, max=last_kept)
    await client.delete(log)
    for entry_id, fields in kept:
        await client.xadd(log, fields, id=entry_id)


async def test_a_log_that_lost_what_its_writer_wrote_is_told_rewound(
    own: Scripts, redis_client: Redis
) -> None:
    """The log ends below what the writer wrote (a failover to a replica that lacked it):
    Redis numbers a plain XADD too low, so the writer takes it back and answers the log's
    end (the gateway ends such a session, log_rewound), as the script does. A packed entry
    is numbered by the writer instead: it lands, and the indices missing before it are what
    its worker reads (a worker that had not applied them ends the session, log_rewound)."""
    wid = await register_worker(own, pulls=True)
    opened = await open_session(own, wid)
    log = SessionKeys(opened.session_id).input_log
    for seq, command in enumerate((b"a", b"b", b"c"), 1):
        await own.append_input(opened.lease, [(seq, command)], max_entries=100)
    await lose_after(redis_client, log, "2-1")
    before = await ran(redis_client)
    rewound = await own.append_input(opened.lease, [(4, b"d")], max_entries=100)
    assert (rewound.appended, rewound.last_index) == (0, 1)
    assert await ran_since(redis_client, before, "exec", "xdel", "evalsha") == (2, 1, 0)
    assert await read_input(redis_client, opened.session_id, 0) == [(1, b"a")]

    packing = await open_session(own, wid)
    log = SessionKeys(packing.session_id).input_log
    for seq, command in enumerate((b"a", b"b"), 1):
        await own.append_input(packing.lease, [(seq, command)], max_entries=100)
    await lose_after(redis_client, log, "2-1")
    packed = await own.append_input(packing.lease, [(3, b"c"), (4, b"d")], max_entries=100)
    assert (packed.appended, packed.last_index) == (2, 4)
    # Index 2 is missing before the packed entry: its worker, at 2, sees the gap.
    assert await read_input(redis_client, packing.session_id, 1) == [(3, b"c"), (4, b"d")]


async def test_a_lost_reply_is_settled_by_the_script_once(
    proxy: FaultProxy, redis_client: Redis
) -> None:
    """The MULTI ran and its reply was lost with the connection: the writer cannot know
    whether it landed, so the script, sent as a resend, reads the log's end, finds the call's
    id on its entry and answers as the MULTI would have. Every command is stored once,
    those without a client seq too."""
    client = create_client(proxy.url)
    lossy = Scripts(client, own_connection=True)
    try:
        wid = await register_worker(lossy, pulls=True)
        opened = await open_session(lossy, wid)
        proxy.lose_reply_to(b"MULTI")
        result = await lossy.append_input(opened.lease, [(None, b"a"), (1, b"b")],
                                          max_entries=100)  # one packed entry
        assert proxy.lost_replies == 1
        assert result == AppendResult(appended=2, last_client_seq=1, last_index=2)
        assert await read_input(redis_client, opened.session_id, 0) == [(1, b"a"), (2, b"b")]
        # Not known after the resend: the next append is the script's, the one after plain.
        before = await ran(redis_client)
        for seq in (2, 3):
            await lossy.append_input(opened.lease, [(seq, b"%d" % seq)], max_entries=100)
        assert await ran_since(redis_client, before, "exec", "evalsha") == (1, 1)
    finally:
        await lossy.aclose()
        await client.aclose()


async def test_a_full_redis_refuses_a_plain_append_whole(
    own: Scripts, redis_client: Redis
) -> None:
    """Redis out of memory refuses the MULTI's XADD as it is queued, so nothing of it runs
    (EXECABORT); the script, sent after it, is refused too, and the caller gets a store
    outage. With room again the same commands land once, plainly."""
    wid = await register_worker(own, pulls=True)
    opened = await open_session(own, wid)
    await own.append_input(opened.lease, [(1, b"a")], max_entries=100)
    used = int((await redis_client.info("memory"))["used_memory"])
    await redis_client.config_set("maxmemory", max(1, used - 1024 * 1024))
    try:
        with pytest.raises(StoreUnavailable):
            await own.append_input(opened.lease, [(2, b"b"), (3, b"c")], max_entries=100)
    finally:
        await redis_client.config_set("maxmemory", 0)
    assert await read_input(redis_client, opened.session_id, 0) == [(1, b"a")]
    before = await ran(redis_client)
    taken = await own.append_input(opened.lease, [(2, b"b"), (3, b"c")], max_entries=100)
    assert (taken.appended, taken.last_index) == (2, 3)
    assert await read_input(redis_client, opened.session_id, 0) == [
        (1, b"a"), (2, b"b"), (3, b"c")]
    assert await ran_since(redis_client, before, "exec", "evalsha") == (1, 0)


async def test_a_stale_writers_push_comes_after_the_notice_of_its_fence(
    own: Scripts, redis_client: Redis
) -> None:
    """A pushed worker's session: the holder of generation 1 appends plainly (entry and push
    in one MULTI); a resume raises the fence and tells the worker (FenceRaised); the old
    holder's next append is refused by Redis, yet its push goes out, after the notice, under
    the old fence: the order the worker's check relies on (inference_worker/input_fences.py).
    The new holder's push comes under the new fence, and the log holds none of the stale
    commands."""
    wid = await register_worker(own)
    channel = WorkerKeys(wid).input_channel
    subscriber = Subscriber(redis_client)
    await subscriber.start()
    queue: asyncio.Queue[Push | None] = asyncio.Queue()
    other = Scripts(redis_client, own_connection=True)
    try:
        await subscriber.subscribe(channel, queue.put_nowait)
        opened = await open_session(own, wid)
        sid = opened.session_id
        await own.append_input(opened.lease, [(1, b"a")], max_entries=100)
        resumed = await other.resume(sid, tenant=opened.lease.tenant,
                                     presented_digest=digest(opened.token),
                                     new_digest=digest("t2"), control_id="c1")
        assert resumed.lease is not None
        with pytest.raises(LeaseLost):
            await own.append_input(opened.lease, [(2, b"late")], max_entries=100)
        await other.append_input(resumed.lease, [(2, b"b")], max_entries=100)
        await other.append_input(resumed.lease, [(3, b"c")], max_entries=100)
        await spublish(redis_client, channel, [b"c", b"sentinel"])
        pushes: list[Push | None] = []
        while (push := await asyncio.wait_for(queue.get(), 10)) != SessionEnded("sentinel"):
            pushes.append(push)
    finally:
        await other.aclose()
        await subscriber.aclose()
    token_1, token_2 = WriteToken(EPOCH, 1), WriteToken(EPOCH, 2)
    assert [push for push in pushes if not isinstance(push, SessionPlaced)] == [
        InputPushed(sid, 1, [b"a"], token_1, 2), FenceRaised(sid, 4),
        InputPushed(sid, 2, [b"late"], token_1, 2),
        InputPushed(sid, 2, [b"b"], token_2, 4), InputPushed(sid, 3, [b"c"], token_2, 4)]
    assert await read_input(redis_client, sid, 0) == [(1, b"a"), (2, b"b"), (3, b"c")]
