"""A frame backend's worker reads its sessions' input itself after each engine tick: no input
push reaches it, and the once-a-second poll is not what applies the input."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from contract import messages as msg
from contract.messages import encode_message
from inference_worker.backends.fake import FakeBackend, FakeOptions
from inference_worker.settings import WorkerSettings
from inference_worker.worker import Worker
from store import Scripts
from store.keys import (
    SessionKeys,
    WorkerKeys,
    new_session_id,
    new_worker_id,
    worker_pulls_input,
)
from store.pubsub import Subscriber
from store.pushes import InputBatch, InputPushed, Push, SessionEnded
from tests.store._support import Opened, events_of, open_session, spublish, until

pytestmark = pytest.mark.timeout(30)

AUDIBLE = b"\x00\x10" * 1920  # 80 ms, loud


def frame_worker(redis_client: Redis) -> Worker:
    """A fake-backend worker (20 ms frames, one slot) whose once-a-second poll never comes."""
    settings = WorkerSettings(backend="fake", slots=1, heartbeat_interval_s=0.2,
                              heartbeat_ttl_s=5.0, drain_timeout_s=1.0,
                              input_poll_interval_s=3600.0)
    return Worker(settings, redis_client,
                  backend=FakeBackend(max_slots=1, options=FakeOptions(frame_ms=20)))


async def adopted_session(worker: Worker, scripts: Scripts, redis_client: Redis) -> Opened:
    """A session opened on the running ``worker`` once it registered, and adopted by it."""
    async def registered() -> bool:
        return bool(await redis_client.exists(WorkerKeys(worker.worker_id).record))

    await until(registered, "registration")
    opened = await open_session(scripts, worker.worker_id)
    await until(lambda: worker.session_ids == [opened.session_id], "the session adopted")
    return opened


async def test_a_frame_worker_pulls_its_input_and_gets_no_push(redis_client: Redis) -> None:
    """A fake-backend worker (20 ms frames) whose poll never comes: its id says it pulls,
    audio appended after it adopted the session comes back echoed, twice, and its channel
    carried no input push."""
    worker = frame_worker(redis_client)
    assert worker_pulls_input(worker.worker_id)
    channel = WorkerKeys(worker.worker_id).input_channel
    pushes: asyncio.Queue[Push | None] = asyncio.Queue()
    subscriber = Subscriber(redis_client)
    await subscriber.start()
    await subscriber.subscribe(channel, pushes.put_nowait)
    task = asyncio.create_task(worker.run())
    scripts = Scripts(redis_client)
    try:
        opened = await adopted_session(worker, scripts, redis_client)
        for turn in (1, 2):
            await scripts.append_input(
                opened.lease, [(turn, encode_message(msg.AppendAudio(audio=AUDIBLE)))],
                max_entries=1000)

            async def echoed(turn: int = turn) -> bool:
                audio = b"".join(e.audio for _, e in await events_of(
                    redis_client, opened.session_id) if isinstance(e, msg.AudioDelta))
                return audio.count(AUDIBLE[:64]) >= turn and len(audio) >= turn * len(AUDIBLE)

            await until(echoed, f"audio of turn {turn} echoed")
        # The end of a session that never was: the worker forgets nothing, and what the
        # channel carried before it is all it carried.
        sentinel = new_session_id(worker.worker_id)
        await spublish(redis_client, channel, [b"c", sentinel.encode()])
        received = []
        while (push := await asyncio.wait_for(pushes.get(), 10)) != SessionEnded(sentinel):
            received.append(push)
        assert not [push for push in received if isinstance(push, InputPushed | InputBatch)]
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
        await subscriber.aclose()
        await scripts.aclose()


async def test_a_frame_worker_applies_a_packed_entry_command_by_command(
        redis_client: Redis) -> None:
    """A gateway on the store's own connection packs a call's commands in one entry: the
    worker takes each in order under its own index (four 20 ms chunks of one 80 ms turn, two
    turns of distinct audio), and its echo is the audio in order."""
    worker = frame_worker(redis_client)
    task = asyncio.create_task(worker.run())
    scripts = Scripts(redis_client, own_connection=True)
    chunks = [bytes([0x10 + n, 0x20]) * 480 for n in range(8)]  # 20 ms each, distinct
    try:
        opened = await adopted_session(worker, scripts, redis_client)
        for turn in (0, 1):
            taken = await scripts.append_input(opened.lease, [
                (4 * turn + n + 1, encode_message(msg.AppendAudio(audio=chunks[4 * turn + n])))
                for n in range(4)], max_entries=1000)
            assert (taken.appended, taken.last_index) == (4, 4 * turn + 4)
        # The log's last entry, which the worker's trims keep: the second turn, packed.
        top: Any = await redis_client.xrevrange(SessionKeys(opened.session_id).input_log,
                                                count=1)
        assert [(entry_id, fields[b"k"]) for entry_id, fields in top] == [(b"2-8", b"4")]

        async def echoed() -> bool:
            audio = b"".join(e.audio for _, e in await events_of(
                redis_client, opened.session_id) if isinstance(e, msg.AudioDelta))
            return len(audio) >= sum(map(len, chunks))

        await until(echoed, "all eight chunks echoed")
        audio = b"".join(e.audio for _, e in await events_of(redis_client, opened.session_id)
                         if isinstance(e, msg.AudioDelta))
        assert audio[:sum(map(len, chunks))] == b"".join(chunks)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
        await scripts.aclose()


def test_a_worker_without_frames_refuses_an_id_that_pulls(redis_client: Redis) -> None:
    """The loopback plays its sessions back without an engine clock: an id that tells the
    gateways to push it nothing would leave its input unread, so it is refused."""
    with pytest.raises(ValueError, match="pulls its input"):
        Worker(WorkerSettings(backend="loopback"), redis_client,
               worker_id=new_worker_id(pulls_input=True))
