"""A write whose reply is lost after Redis ran it: the client library resends it, once applied.

redis-py resends a command after a connection error (store/client.py sets the policy), and a
connection can break after Redis executed a script but before its answer came back. Each test
lets a real server run one script through :class:`FaultProxy`, drops the answer with the
connection, and checks that the resend changed nothing a second time.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
from typing import Any

import pytest
from redis.asyncio import Redis

from contract.reasons import CloseReason
from runtime.embedded import EmbeddedServer
from store import OpenStatus, ResumeStatus, Scripts, lua
from store.errors import raise_if_cancelled
from store.keys import new_session_id
from store.logs import read_input, read_output
from store.scripts import _new_call_id
from tests.faultproxy import FaultProxy
from tests.store._support import (
    EPOCH,
    LONG_POLICY,
    assert_one_terminal,
    digest,
    ev,
    expire_heartbeat,
    open_session,
    register_worker,
    session_field,
    used_slots,
)


async def lose_reply_to(proxy: FaultProxy, client: Redis, source: str) -> None:
    """Arm ``proxy`` for the next run of the script ``source``.

    The script is loaded first: otherwise the first EVALSHA is answered NOSCRIPT, unrun, and
    that answer would be the one lost.
    """
    sha = await client.script_load(source)
    assert sha == hashlib.sha1(source.encode()).hexdigest()
    proxy.lose_reply_to(sha.encode())




async def test_output_append_is_stored_once(
    scripts: Scripts, lossy: Scripts, proxy: FaultProxy, redis_client: Redis
) -> None:
    """The worker's numbered events survive a lost reply without a duplicate."""
    wid = await register_worker(scripts)
    sid = (await open_session(scripts, wid)).session_id
    await lose_reply_to(proxy, redis_client, lua.APPEND_OUTPUT)
    assert await lossy.append_output(sid, [ev(1), ev(2), ev(3)], first_seq=1) == 1
    assert proxy.lost_replies == 1
    assert await read_output(redis_client, sid, 0) == [(1, ev(1)), (2, ev(2)), (3, ev(3))]


async def test_output_append_with_close_ends_once(
    scripts: Scripts, lossy: Scripts, proxy: FaultProxy, redis_client: Redis
) -> None:
    """Events then the terminal event, once, and the slot is released once."""
    wid = await register_worker(scripts)
    sid = (await open_session(scripts, wid)).session_id
    await open_session(scripts, wid)  # a second session keeps one slot used
    await lose_reply_to(proxy, redis_client, lua.APPEND_OUTPUT)
    try:
        await lossy.append_output(sid, [ev(1)], first_seq=1, close_reason="client_close")
    except Exception as exc:  # the resend finds the session closed by the first run
        assert getattr(exc, "status", None) == "closed", exc
    assert proxy.lost_replies == 1
    rows = await assert_one_terminal(redis_client, sid, "session.closed", "client_close")
    assert [seq for seq, _ in rows] == [1, 2]
    assert await used_slots(redis_client, wid) == 1


async def test_input_append_without_client_seq_is_stored_once(
    scripts: Scripts, lossy: Scripts, proxy: FaultProxy, redis_client: Redis
) -> None:
    """Commands with no client seq (SDK clients) are not appended twice by a resend."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    await lose_reply_to(proxy, redis_client, lua.APPEND_INPUT)
    result = await lossy.append_input(opened.lease, [(None, b"a"), (None, b"b"), (7, b"c")],
                                      max_entries=100)
    assert proxy.lost_replies == 1
    assert (result.appended, result.last_client_seq, result.last_index) == (3, 7, 3)
    assert await read_input(redis_client, opened.session_id, 0) == [(1, b"a"), (2, b"b"),
                                                                    (3, b"c")]
    # The next call, a new call id, appends as usual.
    assert (await lossy.append_input(opened.lease, [(None, b"d")], max_entries=100)
            ).last_index == 4
    assert len(await read_input(redis_client, opened.session_id, 0)) == 4


async def test_open_answers_ok_again_and_takes_one_slot(
    scripts: Scripts, lossy: Scripts, proxy: FaultProxy, redis_client: Redis
) -> None:
    """The resent open is recognised by its token digest: ok, not 'exists'; one slot."""
    wid = await register_worker(scripts, slots=2)
    sid = new_session_id(wid)
    token_digest = digest(secrets.token_urlsafe(16))
    await lose_reply_to(proxy, redis_client, lua.OPEN_SESSION)
    status = await lossy.open_session(sid, epoch=EPOCH, token_digest=token_digest,
                                      tenant="t", policy=LONG_POLICY)
    assert proxy.lost_replies == 1
    assert status is OpenStatus.OK
    assert await used_slots(redis_client, wid) == 1
    other = digest(secrets.token_urlsafe(16))
    assert await scripts.open_session(sid, epoch=EPOCH, token_digest=other, tenant="t",
                                      policy=LONG_POLICY) is OpenStatus.EXISTS


async def test_resume_bumps_the_generation_once(
    scripts: Scripts, lossy: Scripts, proxy: FaultProxy, redis_client: Redis
) -> None:
    """The resend carries the same control id, so the answer is the first one."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    fresh = digest(secrets.token_urlsafe(16))
    await lose_reply_to(proxy, redis_client, lua.RESUME)
    result = await lossy.resume(opened.session_id, tenant="tenant-a",
                                presented_digest=digest(opened.token),
                                new_digest=fresh, control_id="ctl-1")
    assert proxy.lost_replies == 1
    assert result.status is ResumeStatus.OK
    assert result.lease is not None and result.lease.generation == 2
    assert await session_field(redis_client, opened.session_id, "gen") == "2"


async def test_close_writes_one_terminal(
    scripts: Scripts, lossy: Scripts, proxy: FaultProxy, redis_client: Redis
) -> None:
    """A resent close finds the session closed and writes nothing more."""
    wid = await register_worker(scripts)
    sid = (await open_session(scripts, wid)).session_id
    await lose_reply_to(proxy, redis_client, lua.CLOSE_SESSION)
    await lossy.close_session(sid, CloseReason.CLIENT_CLOSE)
    assert proxy.lost_replies == 1
    await assert_one_terminal(redis_client, sid, "session.closed", "client_close")
    assert await used_slots(redis_client, wid) == 0


async def test_reaping_a_lost_worker_ends_each_session_once(
    scripts: Scripts, lossy: Scripts, proxy: FaultProxy, redis_client: Redis
) -> None:
    """A resent REAP_SESSIONS finds the lost worker's sessions closed: one worker_lost each,
    and every slot released once."""
    wid = await register_worker(scripts, slots=8)
    opened = [(await open_session(scripts, wid)).session_id for _ in range(3)]
    await expire_heartbeat(redis_client, scripts, wid)
    await lose_reply_to(proxy, redis_client, lua.REAP_SESSIONS)
    reaped = await lossy.reap(wid)
    assert proxy.lost_replies == 1
    assert reaped.state == "lost"  # its count is the resend's: the first run ended them
    for sid in opened:
        await assert_one_terminal(redis_client, sid, "session.closed", "worker_lost")
    assert await used_slots(redis_client, wid) == 0


def test_call_ids_differ_across_calls_and_forked_processes() -> None:
    """A call id is never reused: per call a counter, per process (forks too) a random part."""
    first, second = _new_call_id(), _new_call_id()
    assert first != second and first.split(".")[0] == second.split(".")[0]
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.write(writer, _new_call_id().encode())
        os._exit(0)
    os.close(writer)
    forked = os.read(reader, 100).decode()
    os.close(reader)
    os.waitpid(child, 0)
    assert forked.split(".")[0] != first.split(".")[0]


async def test_a_swallowed_cancellation_is_raised_again() -> None:
    """A task whose cancellation was swallowed (as redis-py can, mid-command) still ends at
    the next store call's check; a task not being cancelled passes it."""
    reached: list[str] = []

    async def loop() -> None:
        raise_if_cancelled()  # not cancelling: nothing happens
        reached.append("checked")
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            reached.append("swallowed")
        raise_if_cancelled()
        reached.append("ran on")  # never

    task = asyncio.create_task(loop())
    while not reached:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert reached == ["checked", "swallowed"]


class _ClosedUnderACommand(Redis):
    """redis-py as it fails when a disconnect races a command's connect or write: the error
    escapes as an AttributeError, not its ConnectionError (redis-py issues 3546, 4287). Here
    the first EVALSHA fails that way before reaching Redis, as the race does."""

    raced = False

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if args[0] == "EVALSHA" and not self.raced:
            self.raced = True
            raise AttributeError("'NoneType' object has no attribute 'writelines'")
        return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


async def test_a_connection_closed_under_redis_py_is_resent_not_a_crash(
    scripts: Scripts, redis_server: EmbeddedServer, redis_client: Redis
) -> None:
    """The race crashed a worker's heartbeat loop in a Cluster failover: it is a broken
    connection, and the call is sent again."""
    racy = _ClosedUnderACommand(port=redis_server.port)
    try:
        wid = await register_worker(scripts)
        sid = (await open_session(scripts, wid)).session_id
        assert await Scripts(racy).append_output(sid, [ev(1)], first_seq=1) == 1
        assert racy.raced
        assert await read_output(redis_client, sid, 0) == [(1, ev(1))]
    finally:
        await racy.aclose()
