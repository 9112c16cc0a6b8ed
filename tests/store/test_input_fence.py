"""The input log's write fence, kept by Redis itself: entry IDs are ``<fence>-<index>``.

The input append reads nothing of the session's record: a resume or a detachment raises the
fence with a marker entry, after which Redis refuses any XADD under an older fence, whoever
sends it; the holder numbers its own entries, and a log that lost what the holder wrote (a
failover to a replica that lacked it) is told apart from one that moved on.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from store import LeaseLost, Scripts
from store.keys import SessionKeys
from store.logs import read_input
from tests.store._support import digest, open_session, register_worker


def ids(rows: Any) -> list[str]:
    return [entry_id.decode() for entry_id, _ in rows]


async def test_the_fence_rises_with_each_detach_and_resume(
    scripts: Scripts, redis_client: Redis
) -> None:
    """The open writes the first generation's marker (2-0); commands follow under it; a
    detach raises the fence to 3 at the last index, a resume to 4 (replacing the marker
    still last); the next command is numbered on under the new fence. A holder of
    generation 1 is refused by Redis itself, even going around the script."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    log = SessionKeys(opened.session_id).input_log
    await scripts.append_input(opened.lease, [(1, b"a"), (2, b"b")], max_entries=100)
    await scripts.detach(opened.lease)
    assert ids(await redis_client.xrange(log)) == ["2-0", "2-1", "2-2", "3-2"]
    resumed = await scripts.resume(opened.session_id, tenant=opened.lease.tenant,
                                   presented_digest=digest(opened.token),
                                   new_digest=digest("t2"), control_id="c1")
    assert resumed.lease is not None and resumed.last_client_seq == 2
    appended = await scripts.append_input(resumed.lease, [(3, b"c")], max_entries=100)
    assert appended.last_index == 3
    # The detach's marker, still the last entry, was replaced by the resume's.
    assert ids(await redis_client.xrange(log)) == ["2-0", "2-1", "2-2", "4-2", "4-3"]
    assert await read_input(redis_client, opened.session_id, 0) == [
        (1, b"a"), (2, b"b"), (3, b"c")]

    with pytest.raises(LeaseLost):
        await scripts.append_input(opened.lease, [(None, b"late")], max_entries=100)
    for stale in ("2-*", "3-*"):
        with pytest.raises(ResponseError, match="equal or smaller"):
            await redis_client.xadd(log, {"d": b"around the script"}, id=stale)
    assert len(await read_input(redis_client, opened.session_id, 0)) == 3


async def test_a_log_that_lost_what_its_holder_wrote_is_told_rewound(
    scripts: Scripts, redis_client: Redis
) -> None:
    """The holder wrote up to index 3, and the log now ends at 1 (a failover to a replica
    that lacked 2 and 3): the next append appends nothing and answers the log's end, below
    what the holder wrote (the gateway ends such a session, log_rewound), and the entry Redis
    numbered is taken back."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    log = SessionKeys(opened.session_id).input_log
    await scripts.append_input(opened.lease, [(1, b"a"), (2, b"b"), (3, b"c")],
                               max_entries=100)
    # What the replica holds: the log as it stood after index 1.
    kept: Any = await redis_client.xrange(log, max="2-1")
    await redis_client.delete(log)
    for entry_id, fields in kept:
        await redis_client.xadd(log, fields, id=entry_id)
    rewound = await scripts.append_input(opened.lease, [(4, b"d")], max_entries=100)
    assert (rewound.appended, rewound.last_index) == (0, 1)
    assert await read_input(redis_client, opened.session_id, 0) == [(1, b"a")]


async def test_another_call_under_the_same_lease_numbers_on_after_it(
    scripts: Scripts, redis_client: Redis, pulls: bool
) -> None:
    """Two store clients append for the same lease (one gateway process runs one, but a
    test may run two): each numbers on after whatever the log holds, nothing is lost or
    numbered twice."""
    wid = await register_worker(scripts, pulls=pulls)
    opened = await open_session(scripts, wid)
    other = Scripts(redis_client)
    await scripts.append_input(opened.lease, [(None, b"a")], max_entries=100)
    await other.append_input(opened.lease, [(None, b"b")], max_entries=100)
    third = await scripts.append_input(opened.lease, [(None, b"c")], max_entries=100)
    assert third.last_index == 3
    assert await read_input(redis_client, opened.session_id, 0) == [
        (1, b"a"), (2, b"b"), (3, b"c")]
