"""The worker and the length of a session's input log.

The log holds what the worker has not applied, and the gateway refuses input once it is at
``INPUT_LOG_MAX_ENTRIES`` (``input_backpressure``). So the worker must never spin on a log
whose unread commands are gone (it ends that session, once), and must trim what it applied
even when a session produces no output for a long while. The worker is a real one, in
process, on a real Redis; the gone commands are played by writing the entries after them
straight into the log, around the scripts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from contract import messages as msg
from contract.messages import encode_message
from contract.reasons import CloseReason
from store.keys import SessionKeys, WorkerKeys
from tests.store._support import (
    EPOCH,
    assert_one_terminal,
    events_of,
    open_session,
    spublish,
    until,
)
from tests.store.test_reap_keys import recording
from tests.worker._running import HEARTBEAT, Running, acks, heartbeat, running_worker

#: The input log's write fence under the first generation (store/lua/prelude.lua).
FENCE = 2
#: 20 ms of silence: the default (turn mode) loopback buffers it and answers nothing.
CHUNK = encode_message(msg.AppendAudio(audio=bytes(960)))


@pytest.fixture
async def running(redis_client: Redis) -> AsyncIterator[Running]:
    """A loopback worker with 4 slots, until the test ends."""
    async with running_worker(redis_client, slots=4) as serving:
        yield serving


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
                                  id=f"{FENCE}-{index}")
    if pushed:
        channel = WorkerKeys(running.worker.worker_id).input_channel
        notice: list[Any] = ["i", session_id, first, [HEARTBEAT] * kept, EPOCH, 1, FENCE]
        await spublish(running.client, channel, notice)


@pytest.mark.logs_errors
@pytest.mark.parametrize("pushed", [False, True], ids=["read", "pushed"])
async def test_a_trimmed_input_range_ends_the_session_once(running: Running,
                                                           pushed: bool) -> None:
    """Commands 1-5 of a session are gone from its input log before the worker read them,
    6-8 are there (read by the safety poll, or pushed too): the worker ends that session
    once, ``session.closed`` ``log_rewound`` (the store lost input), and stops serving it,
    instead of reading the same range again forever; none of 6-8 is applied (the session's
    state would miss 1-5), and another session on the same worker is served on."""
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
                              "log_rewound")
    await until(lambda: victim.session_id not in running.worker.session_ids,
                "the worker stopped serving it")
    assert await acks(running, victim.session_id) == 0
    await heartbeat(running, other.lease, 2)
    await heartbeat(running, other.lease, 3)  # a few safety polls later: still served
    await assert_one_terminal(running.client, victim.session_id, "session.closed",
                              "log_rewound")


async def test_applied_input_is_trimmed_while_a_session_answers_nothing(
        redis_client: Redis) -> None:
    """A turn-mode session buffers 300 appended chunks and answers none of them: the worker
    still trims what it applied from the input log past what its checkpoints may hold (64
    entries here: the buffer's audio, which an adopter would read back), so the gateway's
    cap on unread input does not refuse a client whose worker keeps up."""
    async with running_worker(redis_client, slots=4, checkpoint_hold_entries=64) as running:
        await _trimmed_while_answering_nothing(running)


async def _trimmed_while_answering_nothing(running: Running) -> None:
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


async def test_a_late_push_for_a_closed_session_does_not_bring_it_back(running: Running) -> None:
    """A push that names a session which ended before the worker looked (a stale notice, a
    push that crossed its close) takes no slot: the worker reads the record, finds it closed
    and leaves it, and the session's log keeps its one terminal event."""
    other = await open_session(running.scripts, running.worker.worker_id)
    gone = await open_session(running.scripts, running.worker.worker_id)
    await heartbeat(running, other.lease, 1)
    await until(lambda: gone.session_id in running.worker.session_ids, "the session adopted")
    await running.scripts.close_session(gone.session_id, CloseReason.CLIENT_CLOSE)
    await until(lambda: gone.session_id not in running.worker.session_ids, "the close heard")

    channel = WorkerKeys(running.worker.worker_id).input_channel
    async with recording(running.client) as commands:
        await spublish(running.client, channel,
                       ["i", gone.session_id, 1, [HEARTBEAT], EPOCH, 1])
        # Notices are handled in order: once the next one is answered, the late push was
        # handled, and anything the worker had for the closed session flushed with it.
        await heartbeat(running, other.lease, 2)
    record = SessionKeys(gone.session_id).record
    assert [call for call in commands.script_calls() if record in call] == []
    assert gone.session_id not in running.worker.session_ids
    assert await acks(running, gone.session_id) == 0
    await assert_one_terminal(running.client, gone.session_id, "session.closed", "client_close")


async def test_an_input_log_deleted_by_the_sessions_end_is_no_rewind(running: Running) -> None:
    """The session's end deletes its input log; a quiet-session check that reads the log's end
    before the worker hears of the end finds no log, which is a session that ended, not a log
    that went back: the worker neither logs lost writes nor ends the session log_rewound."""
    opened = await open_session(running.scripts, running.worker.worker_id)
    sid = opened.session_id
    await heartbeat(running, opened.lease, 1)
    await running.client.delete(SessionKeys(sid).input_log)  # as the end does, first
    # Two passes: the first finds the session pushed, the second quiet, so it checks the end.
    for _ in range(2):
        await running.worker._discover()
    assert sid in running.worker.session_ids, "the session was not ended log_rewound"
    assert await acks(running, sid) == 1
