"""The worker and the length of a session's input log.

The log holds what the worker has not applied, and the gateway refuses input once it is at
``INPUT_LOG_MAX_ENTRIES`` (``input_backpressure``). So the worker must never spin on a log
whose unread commands are gone (it ends that session, once), and must trim what it applied
even when a session produces no output for a long while. The worker is a real one, in
process, on a real Redis; the gone commands are played by writing the entries after them
straight into the log, around the scripts.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Redis

from inference_worker.settings import WorkerSettings
from inference_worker.worker import Worker
from store import Lease, Scripts, messages as msg
from store.keys import SessionKeys, WorkerKeys
from store.messages import encode_message
from tests.store._support import (
    EPOCH,
    assert_one_terminal,
    events_of,
    open_session,
    spublish,
    until,
)

HEARTBEAT = encode_message(msg.Heartbeat())
#: 20 ms of silence: the default (turn mode) loopback buffers it and answers nothing.
CHUNK = encode_message(msg.AppendAudio(audio=bytes(960)))


@dataclass
class Running:
    """A loopback worker serving on a task, and the store it serves from."""

    worker: Worker
    scripts: Scripts
    client: Redis


@pytest.fixture
async def running(redis_client: Redis) -> AsyncIterator[Running]:
    """A loopback worker whose safety poll reads the input logs often (entries written around
    the scripts push no notice), until the test ends."""
    settings = WorkerSettings(backend="loopback", slots=4, heartbeat_interval_s=0.2,
                              heartbeat_ttl_s=5.0, input_poll_interval_s=0.05,
                              drain_timeout_s=0.1)
    worker = Worker(settings, redis_client)
    task = asyncio.create_task(worker.run())

    async def registered() -> bool:
        return bool(await redis_client.exists(WorkerKeys(worker.worker_id).record))

    await until(registered, "registration")
    yield Running(worker, Scripts(redis_client), redis_client)
    worker.stop()
    await asyncio.wait_for(task, 10)


async def acks(running: Running, session_id: str) -> int:
    """How many heartbeats the worker answered in the session's output log."""
    return sum(isinstance(event, msg.HeartbeatAck)
               for _, event in await events_of(running.client, session_id))


async def heartbeat(running: Running, lease: Lease, want_acks: int) -> None:
    """Append a heartbeat through the script under ``lease``; wait for its answer."""
    await running.scripts.append_input(lease, [(None, HEARTBEAT)], max_entries=1000)

    async def answered() -> bool:
        return await acks(running, lease.session_id) >= want_acks

    await until(answered, f"heartbeat answer {want_acks}")


async def write_after_a_hole(running: Running, session_id: str, *, gone: int, kept: int,
                             pushed: bool) -> None:
    """Number ``gone + kept`` heartbeats in the session's record but store only the last
    ``kept`` of them, under the session's current token: the first ``gone`` were trimmed
    before the worker read them. ``pushed``: also push the kept ones to the worker, as the
    script would."""
    keys = SessionKeys(session_id)
    first = gone + 1
    for index in range(first, first + kept):
        await running.client.xadd(keys.input_log, {"d": HEARTBEAT, f"e:{EPOCH}": "1"},
                                  id=f"{index}-0")
    await running.client.hset(keys.record, "in_n", gone + kept)
    if pushed:
        channel = WorkerKeys(running.worker.worker_id).input_channel
        notice: list[Any] = ["i", session_id, first, [HEARTBEAT] * kept, EPOCH, 1]
        await spublish(running.client, channel, notice)


@pytest.mark.parametrize("pushed", [False, True], ids=["read", "pushed"])
async def test_a_trimmed_input_range_ends_the_session_once(running: Running,
                                                           pushed: bool) -> None:
    """Commands 1-5 of a session are gone from its input log before the worker read them,
    6-8 are there (read by the safety poll, or pushed too): the worker ends that session
    once, ``session.closed`` ``internal_error``, and stops serving it, instead of reading
    the same range again forever; none of 6-8 is applied (the session's state would miss
    1-5), and another session on the same worker is served on."""
    victim = await open_session(running.scripts, running.worker.worker_id)
    other = await open_session(running.scripts, running.worker.worker_id)
    await heartbeat(running, other.lease, 1)
    await until(lambda: victim.session_id in running.worker.session_ids, "the victim adopted")

    await write_after_a_hole(running, victim.session_id, gone=5, kept=3, pushed=pushed)

    async def ended() -> bool:
        return any(msg.is_terminal(event)
                   for _, event in await events_of(running.client, victim.session_id))

    await until(ended, "the session with the trimmed range ended")
    await assert_one_terminal(running.client, victim.session_id, "session.closed",
                              "internal_error")
    await until(lambda: victim.session_id not in running.worker.session_ids,
                "the worker stopped serving it")
    assert await acks(running, victim.session_id) == 0
    await heartbeat(running, other.lease, 2)
    await heartbeat(running, other.lease, 3)  # a few safety polls later: still served
    await assert_one_terminal(running.client, victim.session_id, "session.closed",
                              "internal_error")


async def test_applied_input_is_trimmed_while_a_session_answers_nothing(
        running: Running) -> None:
    """A turn-mode session buffers 300 appended chunks and answers none of them: the worker
    still trims what it applied from the input log, so the gateway's cap on unread input
    does not refuse a client whose worker keeps up."""
    opened = await open_session(running.scripts, running.worker.worker_id)
    sid = opened.session_id
    await heartbeat(running, opened.lease, 1)
    for _ in range(3):
        await running.scripts.append_input(opened.lease, [(None, CHUNK)] * 100,
                                           max_entries=1000)

    async def trimmed() -> bool:
        return int(await running.client.xlen(SessionKeys(sid).input_log)) < 100

    await until(trimmed, "the applied chunks trimmed from the input log")
    assert await acks(running, sid) == 1, "the chunks were answered"
    await heartbeat(running, opened.lease, 2)  # the session is served on
