"""Fencing at the worker (DESIGN §2.3): input written under an older lease generation, or
under another store epoch, is not applied, even when it is in the input log.

The store's scripts refuse such writers already, so these tests play a writer that went around
them: the session is served through the store's own Scripts API (open, append, resume), then
an entry is written straight into the input log with XADD, claiming a token that is no longer
current. The worker is a real one, in process, on a real Redis.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.typing import EncodableT, FieldT

from contract.messages import (
    Heartbeat,
    HeartbeatAck,
    SessionClosed,
    UpdateSession,
    encode_message,
)
from inference_worker.sessions import is_current
from runtime.embedded import EmbeddedServer
from store import Lease, Scripts
from store.keys import SessionKeys, WorkerKeys
from store.logs import WriteToken
from tests.store._support import EPOCH, digest, events_of, open_session, spublish, until
from tests.worker._running import HEARTBEAT, Running, acks, heartbeat, running_worker

STALE_METRIC = "duplex_worker_stale_commands_total"
Fields = dict[FieldT, EncodableT]  # a stream entry's fields, as XADD takes them


@pytest.mark.parametrize(("token", "newest", "current"), [
    (WriteToken("e1", 1), None, True),  # nothing applied yet, nothing known
    (WriteToken("e1", 1), WriteToken("e1", 0), True),  # the first input of the session
    (WriteToken("e1", 2), WriteToken("e1", 2), True),  # the same lease again
    (WriteToken("e1", 3), WriteToken("e1", 2), True),  # a resume's new lease
    (WriteToken("e1", 1), WriteToken("e1", 2), False),  # a connection a resume replaced
    (WriteToken("e2", 5), WriteToken("e1", 2), False),  # a re-created record
    (None, WriteToken("e1", 2), False),  # no token: no lease vouches for it
    (None, None, False),
])
def test_which_tokens_are_current(token: WriteToken | None, newest: WriteToken | None,
                                  current: bool) -> None:
    """Input is current under the newest generation applied or a newer one, in the same
    epoch, and never without a token."""
    assert is_current(token, newest) is current


def stale_commands(running: Running) -> float:
    """The worker's count of refused input entries."""
    value = running.worker.metrics.registry.get_sample_value(
        STALE_METRIC, {"backend": "loopback"})
    assert value is not None, f"{STALE_METRIC} is not exported"
    return value


@pytest.fixture
async def running(redis_client: Redis) -> AsyncIterator[Running]:
    """A loopback worker with 2 slots, until the test ends."""
    async with running_worker(redis_client, slots=2) as serving:
        yield serving


async def write_around_the_script(running: Running, session_id: str, fields: Fields,
                                  notice_token: list[Any], *, pushed: bool) -> int:
    """Write one entry after the input log's end as the script would number it, but around
    the script: straight into the log with XADD under the log's fence (the script numbers on
    after it), read from there by the worker's poll or, ``pushed``, also pushed to the worker
    with a notice naming ``notice_token``, which it meets first. Returns its index."""
    keys = SessionKeys(session_id)
    rows: Any = await running.client.xrevrange(keys.input_log, count=1)
    ((top_id, _),) = rows
    fence, last = (int(part) for part in top_id.split(b"-"))
    index = last + 1
    await running.client.xadd(keys.input_log, fields, id=f"{fence}-{index}")
    if pushed:
        channel = WorkerKeys(running.worker.worker_id).input_channel
        await spublish(running.client, channel,
                       ["i", session_id, index, [fields["d"]], *notice_token])
    return index


#: A rogue entry's stored fields and the token a push of it names ([]: a notice without one).
ROGUES: dict[str, tuple[Fields, list[Any]]] = {
    "older generation": ({"d": HEARTBEAT, f"e:{EPOCH}": "1"}, [EPOCH, 1]),
    "another epoch": ({"d": HEARTBEAT, "e:epoch-of-another-record": "2"},
                      ["epoch-of-another-record", 2]),
    "no token": ({"d": HEARTBEAT}, []),
}


async def resumed_after_a_heartbeat(running: Running) -> tuple[str, Lease]:
    """A session whose first holder's heartbeat was answered, then resumed (generation 2):
    its id and the new lease."""
    opened = await open_session(running.scripts, running.worker.worker_id)
    await heartbeat(running, opened.lease, 1)
    resumed = await running.scripts.resume(
        opened.session_id, tenant=opened.lease.tenant, presented_digest=digest(opened.token),
        new_digest=digest("second"), control_id="c1")
    assert resumed.lease is not None and resumed.lease.generation == 2
    return opened.session_id, resumed.lease


@pytest.mark.parametrize("pushed", [False, True], ids=["read", "pushed"])
@pytest.mark.parametrize("rogue", list(ROGUES))
async def test_input_under_a_stale_token_is_not_applied(running: Running, rogue: str,
                                                        pushed: bool) -> None:
    """After a resume to generation 2 and input applied under it, an entry claiming
    generation 1 (or another epoch, or no token) is refused, whether the worker reads it from
    the log or gets it pushed: not applied, counted once, and the worker's position moves past
    it (it is not read again, and the input after it is applied)."""
    sid, resumed = await resumed_after_a_heartbeat(running)
    await heartbeat(running, resumed, 2)

    fields, notice_token = ROGUES[rogue]
    index = await write_around_the_script(running, sid, fields, notice_token, pushed=pushed)
    await until(lambda: stale_commands(running) >= 1, "the entry refused")
    await heartbeat(running, resumed, 3)

    async def trimmed_past_it() -> bool:
        first: Any = await running.client.xrange(SessionKeys(sid).input_log, count=1)
        return not first or int(first[0][0].split(b"-")[1]) > index

    await until(trimmed_past_it, "the worker's position past the refused entry")
    assert await acks(running, sid) == 3, "the refused heartbeat was answered"
    assert stale_commands(running) == 1
    print(f"{rogue} ({'pushed' if pushed else 'read'}): refused"
          f" {stale_commands(running):.0f} entry, applied 3 heartbeats")


def stale_pushes(running: Running) -> float:
    """The worker's count of input pushes dropped under a raised fence."""
    value = running.worker.metrics.registry.get_sample_value(
        "duplex_worker_stale_pushes_total", {"backend": "loopback"})
    assert value is not None, "duplex_worker_stale_pushes_total is not exported"
    return value


async def test_a_push_under_a_fence_a_resume_raised_is_dropped(running: Running) -> None:
    """The holder of generation 1 appends plainly after a resume took its lease: Redis
    refuses its entry, but its push (under fence 2) goes out, after the resume's notice of
    fence 4. The worker drops it, counted as a stale push (no entry was refused: there is
    none); the new holder's command, under the same index, is applied, and the session goes
    on (had the push been applied, the new command would read as a log that went back)."""
    sid, resumed = await resumed_after_a_heartbeat(running)
    stale = encode_message(Heartbeat(event_id="from-the-replaced-connection"))
    await spublish(running.client, WorkerKeys(running.worker.worker_id).input_channel,
                   ["i", sid, 2, [stale], EPOCH, 1, 2])
    await until(lambda: stale_pushes(running) >= 1, "the stale push dropped")
    await heartbeat(running, resumed, 2)
    events = [event for _, event in await events_of(running.client, sid)]
    assert sum(isinstance(event, HeartbeatAck) for event in events) == 2
    assert not any(isinstance(event, SessionClosed) for event in events)
    assert (stale_pushes(running), stale_commands(running)) == (1, 0)


@contextlib.asynccontextmanager
async def worker_off_its_channels(running: Running, url: str) -> AsyncIterator[Scripts]:
    """The worker (and whatever else connects as the default user) may not subscribe or
    publish for the block, so its subscription is cut and cannot come back; what the block
    does meanwhile goes through the scripts it gets, as another user."""
    admin = running.client
    await admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "fence-test", "on", "nopass", "~*", "&*", "+@all")
    other = Redis.from_url(url, username="fence-test", password="unused")
    channel = WorkerKeys(running.worker.worker_id).input_channel

    async def subscribers() -> int:
        answer: Any = await other.execute_command(  # type: ignore[no-untyped-call]
            "PUBSUB", "SHARDNUMSUB", channel)
        return int(answer[1])

    try:
        # Redis cuts a subscriber whose channels its user may no longer use.
        await admin.execute_command("ACL", "SETUSER", "default",  # type: ignore[no-untyped-call]
                                    "resetchannels")
        await until(lambda: subscribers_are(subscribers, 0), "the worker's subscription cut")
        yield Scripts(other)
    finally:
        await other.execute_command("ACL", "SETUSER", "default",  # type: ignore[no-untyped-call]
                                    "allchannels")
        await until(lambda: subscribers_are(subscribers, 1), "the worker subscribed again")
        await other.execute_command("ACL", "DELUSER", "fence-test")  # type: ignore[no-untyped-call]
        await other.aclose()


async def subscribers_are(count: Callable[[], Awaitable[int]], expected: int) -> bool:
    return await count() == expected


STALE_INSTRUCTIONS = "from the replaced connection"


async def test_a_stale_push_after_a_lost_fence_notice_is_not_applied(
        running: Running, redis_server: EmbeddedServer) -> None:
    """The worker's subscription is down while a resume raises the session's fence, so the
    notice of it is lost; once it subscribes again, the replaced holder's plain append pushes
    a command under the old fence (its entry refused by Redis). The worker, which may have
    missed notices, knows no fence until it read the record again: it reads the log instead
    of applying the push (the entry is not there), and the new holder's command under the
    same index is applied."""
    opened = await open_session(running.scripts, running.worker.worker_id)
    await heartbeat(running, opened.lease, 1)  # the worker knows the fence: generation 1's
    async with worker_off_its_channels(running, redis_server.url) as others:
        resumed = await others.resume(
            opened.session_id, tenant=opened.lease.tenant,
            presented_digest=digest(opened.token), new_digest=digest("second"),
            control_id="c1")
    assert resumed.lease is not None and resumed.lease.generation == 2
    stale = encode_message(UpdateSession(session={"instructions": STALE_INSTRUCTIONS}))
    await spublish(running.client, WorkerKeys(running.worker.worker_id).input_channel,
                   ["i", opened.session_id, 2, [stale], EPOCH, 1, 2])
    # Had the push been applied, the new holder's command under its index would be taken for
    # one applied already, and never answered.
    await heartbeat(running, resumed.lease, 2)
    await heartbeat(running, resumed.lease, 3)
    events = [event for _, event in await events_of(running.client, opened.session_id)]
    assert sum(isinstance(event, HeartbeatAck) for event in events) == 3
    assert not any(isinstance(event, SessionClosed) for event in events)
    assert STALE_INSTRUCTIONS not in str(events)
    assert stale_commands(running) == 0
