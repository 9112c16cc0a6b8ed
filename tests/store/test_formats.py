"""Record formats and close reasons: what the scripts write is what Python knows."""

from __future__ import annotations

from importlib import resources

import pytest
from redis.asyncio import Redis

from contract.reasons import CloseReason
from store import (
    AbandonStatus,
    CloseStatus,
    DetachStatus,
    Gone,
    ResumeStatus,
    Scripts,
    SessionGone,
    TrimStatus,
)
from store.formats import FORMAT_FIELD, SESSION_FORMAT, WORKER_FORMAT
from store.keys import SessionKeys, WorkerKeys
from store.logs import session_start
from store.lua import reasons_written
from tests.store._support import (
    digest,
    make_policy,
    open_session,
    redis_now_ms,
    register_worker,
    session_field,
    wait_redis_clock_past,
    worker_field,
)

pytestmark = pytest.mark.timeout(30)


def test_every_reason_the_lua_writes_is_a_member() -> None:
    """The scripts name the reasons they write as ``REASON.<value>``, each a CloseReason
    member (the loader refuses any other), and quote none of them as a bare literal."""
    written = reasons_written()
    assert {CloseReason.WORKER_LOST, CloseReason.DISCONNECT_GRACE_EXPIRED,
            CloseReason.IDLE_TTL_EXPIRED, CloseReason.OPEN_ABANDONED} <= written
    assert written <= {reason.value for reason in CloseReason}
    for entry in resources.files("store.lua").iterdir():
        if entry.name.endswith(".lua"):
            text = entry.read_text(encoding="utf-8")
            quoted = [reason for reason in CloseReason if f"'{reason.value}'" in text]
            assert quoted == [], f"{entry.name} quotes {quoted}: write REASON.<value>"


async def test_records_carry_their_format(scripts: Scripts, redis_client: Redis) -> None:
    """A registration writes the worker record's format, an open the session record's."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    assert await worker_field(redis_client, wid, FORMAT_FIELD) == WORKER_FORMAT
    assert await session_field(redis_client, opened.session_id, FORMAT_FIELD) == SESSION_FORMAT


@pytest.mark.parametrize("stored", [None, "0"])
async def test_a_session_record_of_another_format_is_refused(
    scripts: Scripts, redis_client: Redis, stored: str | None,
) -> None:
    """A session record without this code's format, or with another number, is not read:
    every script answers ``other_format`` and changes nothing, and a reaper that finds it due
    leaves it as it is (it is not this code's to end)."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid, policy=make_policy(idle_ttl_ms=1))
    lease, keys = opened.lease, SessionKeys(opened.session_id)
    if stored is None:
        await redis_client.hdel(keys.record, FORMAT_FIELD)
    else:
        await redis_client.hset(keys.record, FORMAT_FIELD, stored)
    before = await redis_client.hgetall(keys.record)

    resumed = await scripts.resume(opened.session_id, tenant=lease.tenant,
                                   presented_digest=digest(opened.token),
                                   new_digest=digest("t2"), control_id="c")
    assert (resumed.status, resumed.lease) == (ResumeStatus.OTHER_FORMAT, None)
    assert await scripts.detach(lease) is DetachStatus.OTHER_FORMAT
    assert await scripts.trim_output(lease, 0) is TrimStatus.OTHER_FORMAT
    # The append reads the input log alone: one written by other code (format 1 numbered
    # its entries '<index>-0') is not under this generation's fence, and the refusal then
    # reads the record.
    await redis_client.delete(keys.input_log)
    await redis_client.xadd(keys.input_log, {"d": b"c"}, id="1-0")
    with pytest.raises(SessionGone) as appended:
        await scripts.append_input(lease, [(1, b"c")], max_entries=10)
    assert appended.value.status is Gone.OTHER_FORMAT
    # A worker reads the record once, when it adopts the session (its output appends read
    # none), and leaves this one alone.
    start = await session_start(redis_client, opened.session_id)
    assert start is not None and start.other_format
    assert await scripts.close_session(opened.session_id,
                                       CloseReason.CLIENT_CLOSE) is CloseStatus.OTHER_FORMAT
    assert await scripts.abandon_open(opened.session_id) is AbandonStatus.OTHER_FORMAT

    await wait_redis_clock_past(redis_client, await redis_now_ms(redis_client) + 5)
    reaped = await scripts.reap(wid)
    assert reaped.ended == 0
    assert await redis_client.hgetall(keys.record) == before
    assert await redis_client.zscore(WorkerKeys(wid).deadlines, opened.session_id) is None
