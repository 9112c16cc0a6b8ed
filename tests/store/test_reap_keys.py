"""The reaper's two scripts name every key they touch in KEYS (Redis's rule for scripts, which a
Cluster relies on), a pass with nothing to do stays one call, and a reaper that stops between
the two leaves its work to the next one (DESIGN §2.6, §2.8)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis.asyncio import Redis

from store import AttachmentHolder, Scripts, lua
from store.keys import WorkerKeys, session_keys
from tests.store._support import (
    assert_one_terminal,
    expire_heartbeat,
    make_policy,
    open_session,
    register_worker,
    session_field,
    until,
    used_slots,
    wait_redis_clock_past,
)

pytestmark = pytest.mark.timeout(30)

A = AttachmentHolder(gateway_id="g0000000000aa", lease_ms=60_000)
_MARK = "reap-keys-test-done"


@dataclass
class Commands:
    """What Redis ran while recording: each command's words, and whether a script ran it."""

    lines: list[tuple[str, list[str]]] = field(default_factory=list)

    def script_calls(self) -> list[list[str]]:
        """The EVALSHA and EVAL commands sent."""
        return [words for kind, words in self.lines
                if kind != "lua" and words[0].upper() in ("EVALSHA", "EVAL")]

    def touched_keys(self) -> set[str]:
        """Every key the scripts touched."""
        return {w for kind, words in self.lines if kind == "lua" for w in words[1:]
                if w.startswith("dg:")}

    def undeclared_keys(self) -> list[str]:
        """Every key a script touched that its call did not pass in KEYS."""
        declared: set[str] = set()
        missing = []
        for kind, words in self.lines:
            if kind != "lua" and words[0].upper() in ("EVALSHA", "EVAL"):
                declared = set(words[3:3 + int(words[2])])
            elif kind == "lua":
                missing += [w for w in words[1:] if w.startswith("dg:") and w not in declared]
        return missing


@asynccontextmanager
async def recording(client: Redis) -> AsyncIterator[Commands]:
    """Record every command Redis runs (MONITOR) until the block ends."""
    log = Commands()
    async with client.monitor() as monitor:
        async def collect() -> None:
            while True:
                info: dict[str, Any] = await monitor.next_command()
                log.lines.append((str(info["client_type"]), str(info["command"]).split(" ")))

        task = asyncio.create_task(collect())
        try:
            yield log
            # Every command sent before this one is recorded once this one is.
            await client.echo(_MARK)
            await until(lambda: any(_MARK in words for _, words in log.lines), "marker seen")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def warm(scripts: Scripts) -> None:
    """Load both reap scripts, so that what is recorded is one EVALSHA per call."""
    wid = await register_worker(scripts)
    await open_session(scripts, wid, policy=make_policy(idle_ttl_ms=0))
    await scripts.reap(wid)


async def test_every_key_the_reaper_touches_is_in_keys(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A reap that ends a lost worker's sessions, detaches a lapsed gateway's and expires due
    ones touches only keys its calls named."""
    await warm(scripts)
    live = await register_worker(scripts, slots=8)
    attached = await open_session(scripts, live, holder=A)
    grace = await open_session(scripts, live, policy=make_policy(disconnect_grace_ms=0))
    await scripts.detach(grace.lease)
    idle = await open_session(scripts, live, policy=make_policy(idle_ttl_ms=0))
    short = AttachmentHolder(gateway_id=A.gateway_id, lease_ms=1)
    await wait_redis_clock_past(redis_client,
                                (await scripts.renew_attachment_lease(live, short)).until_ms)
    lost = await register_worker(scripts, slots=8)
    lost_sessions = [await open_session(scripts, lost) for _ in range(3)]
    await expire_heartbeat(redis_client, scripts, lost)
    async with recording(redis_client) as commands:
        detached = await scripts.reap(live, lease_ms=1)
        ended = await scripts.reap(lost)
    assert (detached.detached, detached.ended) == (1, 2)
    assert (ended.state, ended.ended) == ("lost", 3)
    assert await session_field(redis_client, attached.session_id, "state") == "detached"
    await assert_one_terminal(redis_client, grace.session_id, "session.expired",
                              "disconnect_grace_expired")
    await assert_one_terminal(redis_client, idle.session_id, "session.expired",
                              "idle_ttl_expired")
    for o in lost_sessions:
        await assert_one_terminal(redis_client, o.session_id, "session.closed", "worker_lost")
    assert {WorkerKeys(lost).record, *(session_keys(o.session_id).record
                                       for o in lost_sessions)} <= commands.touched_keys()
    assert commands.undeclared_keys() == []
    assert len(commands.script_calls()) == 4, "one REAP and one REAP_SESSIONS per worker"


async def test_a_pass_with_nothing_to_do_is_one_call(
    scripts: Scripts, redis_client: Redis
) -> None:
    """A live worker with nothing due and no lapsed gateway: only REAP runs."""
    await warm(scripts)
    wid = await register_worker(scripts, slots=8)
    for _ in range(3):
        await open_session(scripts, wid, holder=A)
    async with recording(redis_client) as commands:
        reaped = await scripts.reap(wid)
    assert (reaped.state, reaped.ended, reaped.detached) == ("live", 0, 0)
    assert len(commands.script_calls()) == 1


async def test_sessions_left_by_a_reaper_that_stopped_are_ended_by_the_next(
    scripts: Scripts, redis_client: Redis
) -> None:
    """REAP declared the worker lost, and its reaper stopped before ending the sessions: the
    next reap ends each once, hands every ended session back for tenant release and clears
    the lost worker's sets."""
    wid = await register_worker(scripts, slots=8)
    opened = [await open_session(scripts, wid) for _ in range(3)]
    await expire_heartbeat(redis_client, scripts, wid)
    w = WorkerKeys(wid)
    keys = [*w.ending, w.adopted]
    first: Any = await redis_client.eval(lua.REAP, len(keys), *keys, 100, 500, 1000, 60_000)
    assert first[0] == b"lost" and len(first[1]) == 3
    reaped = await scripts.reap(wid)
    assert (reaped.state, reaped.ended) == ("lost", 3)
    assert sorted(e.session_id for e in reaped.released) == sorted(o.session_id
                                                                   for o in opened)
    for o in opened:
        await assert_one_terminal(redis_client, o.session_id, "session.closed", "worker_lost")
    assert await used_slots(redis_client, wid) == 0
    assert await redis_client.exists(w.sessions, w.deadlines, w.gateways, w.held, w.ended) == 0
    again = await scripts.reap(wid)
    assert (again.state, again.ended, again.released) == ("lost", 0, ())


async def test_reap_sessions_sent_twice_changes_nothing(
    scripts: Scripts, redis_client: Redis
) -> None:
    """The second run of one REAP_SESSIONS call (a lost reply, resent) finds its sessions
    expired already: no second terminal event, no second detach."""
    wid = await register_worker(scripts, slots=8)
    due = await open_session(scripts, wid, policy=make_policy(idle_ttl_ms=0))
    attached = await open_session(scripts, wid, holder=A)
    short = AttachmentHolder(gateway_id=A.gateway_id, lease_ms=1)
    renewal = await scripts.renew_attachment_lease(wid, short)
    await wait_redis_clock_past(redis_client, renewal.until_ms)
    w = WorkerKeys(wid)
    keys = list(w.ending)
    args: list[Any] = [b"lost", b"grace", b"idle", 1000, 1]
    for action, session_id, gateway_id in (("due", due.session_id, ""),
                                           ("detach", attached.session_id, A.gateway_id)):
        k = session_keys(session_id)
        keys += [k.record, k.input_log, k.output_log, k.output_channel]
        args += [action, session_id, gateway_id]
    runs: list[Any] = [await redis_client.eval(lua.REAP_SESSIONS, len(keys), *keys, *args)
                       for _ in range(2)]
    assert [run[:2] for run in runs] == [[1, 1], [0, 0]]
    assert await session_field(redis_client, attached.session_id, "state") == "detached"
    assert await session_field(redis_client, due.session_id, "state") == "closed"
    assert await redis_client.zscore(w.gateways, A.gateway_id) is None
