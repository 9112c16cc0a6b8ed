"""The input log's cap is backpressure: APPEND_INPUT refuses what would pass it, never trims.

The worker trims the commands it applied (APPEND_OUTPUT's applied position), so the input
log's length is the session's unread backlog. A batch that would take it past the cap is
refused whole (``backlog_full``): nothing appended, nothing of the record changed, so the
client may send the same commands again once the worker caught up; the other sessions of
the same call append as usual. On a real Redis and Valkey.
"""

from __future__ import annotations

import hashlib
from typing import Any

from redis.asyncio import Redis

from store import AppendResult, Lease, OutputAppend, Scripts, lua
from store.keys import SessionKeys
from store.logs import read_input
from tests.faultproxy import FaultProxy
from tests.store._support import open_session, register_worker

CAP = 5


def cmd(text: str) -> bytes:
    """An opaque encoded input command (the store never decodes commands)."""
    return text.encode()


def outcome(result: AppendResult) -> tuple[bool, int, int, int]:
    """Refused?, appended, highest client seq, last index of the log."""
    return result.backlog_full, result.appended, result.last_client_seq, result.last_index


async def record_of(client: Redis, session_id: str) -> dict[Any, Any]:
    """The whole session record, as stored."""
    fields: dict[Any, Any] = await client.hgetall(SessionKeys(session_id).record)
    return fields


async def fill(scripts: Scripts, lease: Lease, count: int) -> AppendResult:
    """Append ``count`` commands with client seqs 1..count (they must all be taken)."""
    result = await scripts.append_input(
        lease, [(seq, cmd(str(seq))) for seq in range(1, count + 1)], max_entries=CAP)
    assert outcome(result) == (False, count, count, count)
    return result


async def test_a_batch_past_the_cap_is_refused_whole_and_nothing_is_trimmed(
    scripts: Scripts, redis_client: Redis
) -> None:
    """With 3 of 5 unread, a batch of 3 is refused whole: nothing appended, not one entry
    trimmed, the record unchanged; a batch of 2 still fits; once the worker applied (and so
    trimmed) the first 3, the refused commands are taken under their own client seqs."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    await fill(scripts, opened.lease, 3)
    before = await record_of(redis_client, sid)

    refused = await scripts.append_input(
        opened.lease, [(4, cmd("4")), (5, cmd("5")), (6, cmd("6"))], max_entries=CAP)
    assert outcome(refused) == (True, 0, 3, 3)
    assert await record_of(redis_client, sid) == before
    assert await read_input(redis_client, sid, 0) == [(i, cmd(str(i))) for i in (1, 2, 3)]

    fits = await scripts.append_input(opened.lease, [(4, cmd("4")), (5, cmd("5"))],
                                      max_entries=CAP)
    assert outcome(fits) == (False, 2, 5, 5)
    one_more = await scripts.append_input(opened.lease, [(None, cmd("x"))], max_entries=CAP)
    assert outcome(one_more) == (True, 0, 5, 5)

    (applied,) = await scripts.append_output_many([  # the worker applied 1..3
        OutputAppend(session_id=sid, events=[], input_trim_to=3, input_trim_fence=2)])
    assert applied == 0
    again = await scripts.append_input(
        opened.lease, [(6, cmd("6")), (7, cmd("7")), (None, cmd("x"))], max_entries=CAP)
    assert outcome(again) == (False, 3, 7, 8)
    # The last applied entry stays (the next append reads its index there).
    assert [i for i, _ in await read_input(redis_client, sid, 0)] == [3, 4, 5, 6, 7, 8]


async def test_resent_commands_already_taken_are_answered_at_the_cap(
    scripts: Scripts, redis_client: Redis
) -> None:
    """At the cap, a batch of commands whose client seqs were all taken already (a client
    resending after a reconnect) appends nothing new, so it is not refused: the client is
    told they were taken, which they were."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await fill(scripts, opened.lease, CAP)
    resent = await scripts.append_input(
        opened.lease, [(seq, cmd(str(seq))) for seq in range(2, CAP + 1)], max_entries=CAP)
    assert outcome(resent) == (False, 0, CAP, CAP)
    assert len(await read_input(redis_client, opened.session_id, 0)) == CAP


async def test_another_session_in_the_same_call_appends(
    scripts: Scripts, redis_client: Redis
) -> None:
    """One call for two sessions of a worker: the one at its cap is refused, the other
    appends its commands, in the same call."""
    wid = await register_worker(scripts)
    behind = await open_session(scripts, wid)
    keeping_up = await open_session(scripts, wid)
    await fill(scripts, behind.lease, CAP)
    first, second = await scripts.append_input_many(
        [(behind.lease, [(None, cmd("late"))]),
         (keeping_up.lease, [(None, cmd("a")), (1, cmd("b"))])], max_entries=CAP)
    assert isinstance(first, AppendResult) and isinstance(second, AppendResult)
    assert outcome(first) == (True, 0, CAP, CAP)
    assert outcome(second) == (False, 2, 1, 2)
    assert len(await read_input(redis_client, behind.session_id, 0)) == CAP
    assert await read_input(redis_client, keeping_up.session_id, 0) == [(1, cmd("a")),
                                                                       (2, cmd("b"))]




async def lose_next_append_reply(proxy: FaultProxy, client: Redis) -> None:
    """The next APPEND_INPUT runs, and its answer is lost with the connection: the client
    library sends the same call (same call id) again."""
    sha = await client.script_load(lua.APPEND_INPUT)
    assert sha == hashlib.sha1(lua.APPEND_INPUT.encode()).hexdigest()
    proxy.lose_reply_to(sha.encode())


async def test_a_resend_of_a_call_that_filled_the_log_gets_its_first_answer(
    scripts: Scripts, lossy: Scripts, proxy: FaultProxy, redis_client: Redis
) -> None:
    """A call that took the log to its cap, whose answer was lost, is resent: the resend
    finds its call id and answers what the first run did (taken), not full, and appends
    nothing twice."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await fill(scripts, opened.lease, CAP - 2)
    await lose_next_append_reply(proxy, redis_client)
    result = await lossy.append_input(opened.lease, [(None, cmd("y")), (None, cmd("z"))],
                                      max_entries=CAP)
    assert proxy.lost_replies == 1
    assert outcome(result) == (False, 2, CAP - 2, CAP)
    assert [c for _, c in await read_input(redis_client, opened.session_id, 0)][-2:] == [
        cmd("y"), cmd("z")]
    assert len(await read_input(redis_client, opened.session_id, 0)) == CAP


async def test_a_resend_of_a_refused_call_is_refused_again(
    scripts: Scripts, lossy: Scripts, proxy: FaultProxy, redis_client: Redis
) -> None:
    """A refused call whose answer was lost is decided afresh when resent: the worker is
    still behind, so it is refused again, and nothing was appended by either run."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await fill(scripts, opened.lease, CAP)
    before = await record_of(redis_client, opened.session_id)
    await lose_next_append_reply(proxy, redis_client)
    result = await lossy.append_input(opened.lease, [(None, cmd("late"))], max_entries=CAP)
    assert proxy.lost_replies == 1
    assert outcome(result) == (True, 0, CAP, CAP)
    assert await record_of(redis_client, opened.session_id) == before
    assert len(await read_input(redis_client, opened.session_id, 0)) == CAP


async def test_the_byte_cap_refuses_a_batch_whatever_its_count(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A few large commands reach the byte cap long before the entry cap: with the log at
    its cap's worth of unread bytes, the next batch is refused whole (nothing appended, the
    record unchanged); once the worker applied and trimmed them, the same batch is taken."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    chunk = bytes(64 * 1024)  # 64 KiB: an audio append of 0.7 s

    async def send(seq: int) -> AppendResult:
        return await scripts.append_input(opened.lease, [(seq, chunk)], max_entries=1000,
                                          max_bytes=256 * 1024)

    taken = [outcome(await send(seq)) for seq in range(1, 4)]
    assert taken == [(False, 1, seq, seq) for seq in range(1, 4)]
    before = await record_of(redis_client, sid)
    assert outcome(await send(4)) == (True, 0, 3, 3)  # 4 x 64 KiB + the log's own bytes
    assert await record_of(redis_client, sid) == before
    # The three, after the marker the open wrote (the first generation's fence).
    assert await redis_client.xlen(SessionKeys(sid).input_log) == 1 + 3
    await scripts.append_output_many([OutputAppend(session_id=sid, events=[], input_trim_to=3,
                                                   input_trim_fence=2)])
    assert outcome(await send(4)) == (False, 1, 4, 4)
