"""A draining worker hands its sessions over (``inference_worker/hand_over.py``).

Two real loopback workers, in process on a real Redis. A session is opened on each; both get
the same commands, and the first worker drains mid-way: its session moves to the other worker
at a safe point, without an end, and goes on there. Moved equals unmoved: the two output logs
hold the same events under the same numbers (the loopback is deterministic), the moved one's
answer plays back the audio buffered before the move, read back from the input log, and the
input sent while it moved, replayed there. The slots follow the session: the home's is freed,
the adopter's held until the session ends. With no worker to take it, a drained session ends
as it did before hand-overs.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from redis.asyncio import Redis

from contract import messages as msg
from contract.messages import Event, encode_message
from store import Lease
from store.checkpoints import AdoptStatus, ReserveStatus
from store.keys import SessionKeys, WorkerKeys
from tests.store._support import events_of, open_session, until, used_slots
from tests.worker._running import Running, running_worker

pytestmark = pytest.mark.timeout(60)

#: 20 ms of a quiet tone: audio a playback must reproduce byte for byte.
CHUNK = b"".join(int(800 * math.sin(n / 7)).to_bytes(2, "little", signed=True)
                 for n in range(480))
MANUAL = encode_message(msg.UpdateSession(session={"audio": {"input": {"turn_detection": None}}}))


async def send(running: Running, lease: Lease, *commands: bytes) -> None:
    await running.scripts.append_input(lease, [(None, command) for command in commands],
                                       max_entries=1000)


async def events(client: Redis, session_id: str) -> list[tuple[int, Event]]:
    return await events_of(client, session_id)


async def answered(client: Redis, session_id: str, count: int) -> None:
    async def done() -> bool:
        return sum(isinstance(event, msg.ResponseDone)
                   for _, event in await events(client, session_id)) >= count

    await until(done, f"{count} responses done", timeout=20.0)


async def drained_to(draining: Running, adopter: Running, session_id: str,
                     outcome: str) -> None:
    """Drain ``draining`` until ``adopter`` took ``session_id`` over, handed over with
    ``outcome`` (a ``duplex_worker_hand_overs_total`` outcome, counted once)."""
    draining.worker.stop()
    await until(lambda: session_id in adopter.worker.session_ids, "the session taken over")
    backend = draining.worker.settings.backend
    assert draining.worker.metrics.registry.get_sample_value(
        "duplex_worker_hand_overs_total", {"backend": backend, "outcome": outcome}) == 1


async def test_a_drained_session_goes_on_at_another_worker_as_if_unmoved(
        redis_client: Redis) -> None:
    async with running_worker(redis_client, slots=4, checkpoint_interval_s=0.2) as adopter:
        async with running_worker(redis_client, slots=4, checkpoint_interval_s=0.2,
                                  drain_timeout_s=10.0) as draining:
            moved = await open_session(draining.scripts, draining.worker.worker_id)
            unmoved = await open_session(adopter.scripts, adopter.worker.worker_id)
            both = ((draining, moved.lease), (adopter, unmoved.lease))
            for running, lease in both:
                await send(running, lease, MANUAL, encode_message(msg.Heartbeat()),
                           *[encode_message(msg.AppendAudio(audio=CHUNK))] * 25)
            await until(lambda: redis_client.hexists(SessionKeys(moved.session_id).record,
                                                     "ck_core"), "a first checkpoint")
            draining.worker.stop()
            for running, lease in both:  # while it is being handed over: replayed there
                await send(running, lease, *[encode_message(msg.AppendAudio(audio=CHUNK))] * 10)
            await until(lambda: moved.session_id in adopter.worker.session_ids,
                        "the session taken over")
        home = draining.worker.worker_id
        record: Any = await redis_client.hgetall(SessionKeys(moved.session_id).record)
        assert (record[b"owner"].decode(), record[b"owner_epoch"]) == (
            adopter.worker.worker_id, b"2")
        assert await redis_client.sismember(WorkerKeys(home).moved, moved.session_id)
        assert await used_slots(redis_client, home) == 0
        assert await used_slots(redis_client, adopter.worker.worker_id) == 2

        for running, lease in ((adopter, moved.lease), (adopter, unmoved.lease)):
            await send(running, lease, *[encode_message(msg.AppendAudio(audio=CHUNK))] * 15,
                       encode_message(msg.CommitInput()), encode_message(msg.CreateResponse()),
                       encode_message(msg.Heartbeat()))
        for lease in (moved.lease, unmoved.lease):
            await answered(redis_client, lease.session_id, 1)
        moved_events = await events(redis_client, moved.session_id)
        unmoved_events = await events(redis_client, unmoved.session_id)
        assert [(seq, encode_message(event).replace(moved.session_id.encode(),
                                                    unmoved.session_id.encode()))
                for seq, event in moved_events] == [
            (seq, encode_message(event)) for seq, event in unmoved_events]
        assert [seq for seq, _ in moved_events] == list(range(1, len(moved_events) + 1))
        assert not any(msg.is_terminal(event) for _, event in moved_events)
        played = b"".join(event.audio for _, event in moved_events
                          if isinstance(event, msg.AudioDelta))
        assert played == CHUNK * 50, "the answer plays back what was buffered, moved or not"

        await send(adopter, moved.lease, encode_message(msg.CloseSession(reason="done")))

        async def slot_let_go() -> bool:
            return await used_slots(redis_client, adopter.worker.worker_id) == 1

        await until(slot_let_go, "the adopter's slot let go at the session's end")
        assert not await redis_client.sismember(WorkerKeys(home).moved, moved.session_id)


async def test_with_no_worker_to_take_it_a_drained_session_ends_as_before(
        redis_client: Redis) -> None:
    """The only worker of the model drains: no slot to reserve anywhere, so the session is
    not handed over (counted no_room) and ends worker_shutdown at the drain's timeout, once."""
    async with running_worker(redis_client, slots=2, checkpoint_interval_s=0.2,
                              drain_timeout_s=0.5) as alone:
        opened = await open_session(alone.scripts, alone.worker.worker_id)
        await send(alone, opened.lease, MANUAL, encode_message(msg.Heartbeat()))

        async def acked() -> bool:
            return any(isinstance(event, msg.HeartbeatAck)
                       for _, event in await events(redis_client, opened.session_id))

        await until(acked, "the heartbeat answered")
        alone.worker.stop()

        async def ended() -> bool:
            return any(msg.is_terminal(event)
                       for _, event in await events(redis_client, opened.session_id))

        await until(ended, "the session ended")
        metrics = alone.worker.metrics.registry
        assert metrics.get_sample_value("duplex_worker_hand_overs_total",
                                        {"backend": "loopback", "outcome": "no_room"}) == 1
    terminals = [event for _, event in await events(redis_client, opened.session_id)
                 if msg.is_terminal(event)]
    assert [getattr(event, "reason", None) for event in terminals] == ["worker_shutdown"]


async def test_a_session_that_never_pauses_moves_late_from_its_last_checkpoint(
        redis_client: Redis) -> None:
    """A stream-mode echo (a response that never pauses) has no safe point in the drain's
    time: a second before the deadline it moves from its last checkpoint (outcome late), the
    adopter replays what came after it against what was written, the echo playing ends once
    (failed, worker_lost), and the session echoes on at the adopter, each event once, in
    order, no terminal event."""
    stream = encode_message(msg.UpdateSession(session={
        "audio": {"input": {"turn_detection": None}},
        "extra_body": {"loopback_mode": "stream"}}))
    async with running_worker(redis_client, slots=4, checkpoint_interval_s=0.2) as adopter:
        async with running_worker(redis_client, slots=4, checkpoint_interval_s=0.2,
                                  drain_timeout_s=1.5) as draining:
            opened = await open_session(draining.scripts, draining.worker.worker_id)
            await send(draining, opened.lease, stream, encode_message(msg.Heartbeat()))
            await until(lambda: redis_client.hexists(SessionKeys(opened.session_id).record,
                                                     "ck_core"), "a first checkpoint")
            await send(draining, opened.lease,
                       *[encode_message(msg.AppendAudio(audio=CHUNK))] * 5)

            async def echoing() -> bool:
                return any(isinstance(event, msg.AudioDelta)
                           for _, event in await events(redis_client, opened.session_id))

            await until(echoing, "the echo playing")
            await drained_to(draining, adopter, opened.session_id, "late")
        await send(adopter, opened.lease, *[encode_message(msg.AppendAudio(audio=CHUNK))] * 3,
                   encode_message(msg.Heartbeat()))

        async def acked_twice() -> bool:
            return sum(isinstance(event, msg.HeartbeatAck)
                       for _, event in await events(redis_client, opened.session_id)) == 2

        await until(acked_twice, "the adopter answering")
        logged = await events(redis_client, opened.session_id)
        assert [seq for seq, _ in logged] == list(range(1, len(logged) + 1))
        assert not any(msg.is_terminal(event) for _, event in logged)
        created = [e.response["id"] for _, e in logged if isinstance(e, msg.ResponseCreated)]
        done = [(e.response["id"], e.response["status"]) for _, e in logged
                if isinstance(e, msg.ResponseDone)]
        assert len(created) == len(set(created)) and [rid for rid, _ in done] == created[
            :len(done)], "every response ends once, in order"
        assert done[0][1] == "failed", "the echo playing at the move is cut short"
        cut = next(n for n, (_, e) in enumerate(logged) if isinstance(e, msg.ResponseDone))
        echoed = b"".join(e.audio for _, e in logged[cut:] if isinstance(e, msg.AudioDelta))
        assert echoed == CHUNK * 3, "what came after is echoed at the adopter, once"
        assert adopter.worker.metrics.registry.get_sample_value(
            "duplex_worker_take_overs_total",
            {"backend": "loopback", "outcome": "reconciled"}) == 1


async def test_a_notice_and_a_poll_taking_a_session_over_at_once_restore_it_once(
        redis_client: Redis) -> None:
    """Two take-overs of one session at once (its notice and the adopter's poll) share one
    restore: served once, counted once, both answered with the same session; a third after
    them finds it served."""
    async with running_worker(redis_client, slots=4, checkpoint_interval_s=0.2,
                              input_poll_interval_s=30.0) as adopter:
        async with running_worker(redis_client, slots=4, checkpoint_interval_s=0.2) as home:
            opened = await open_session(home.scripts, home.worker.worker_id)
            await send(home, opened.lease, MANUAL, encode_message(msg.Heartbeat()))
            record = SessionKeys(opened.session_id).record
            await until(lambda: redis_client.hexists(record, "ck_core"), "a checkpoint")
            seq = int(await redis_client.hget(record, "ck_seq") or 0)
            assert await adopter.scripts.reserve_slot(
                adopter.worker.worker_id, opened.session_id) is ReserveStatus.OK
            moved = await adopter.scripts.adopt_session(
                opened.session_id, replaces_epoch=1, adopter=adopter.worker.worker_id,
                checkpoint_seq=seq)
            assert moved.status is AdoptStatus.OK
            hand_over = adopter.worker._hand_over  # no notice was sent: the test is both
            first, second = await asyncio.gather(hand_over.take_over(opened.session_id),
                                                 hand_over.take_over(opened.session_id))
            assert first is not None and first is second
            assert await hand_over.take_over(opened.session_id) is first
            assert adopter.worker.metrics.registry.get_sample_value(
                "duplex_worker_take_overs_total",
                {"backend": "loopback", "outcome": "taken"}) == 1
            await send(adopter, opened.lease, encode_message(msg.Heartbeat()))

            async def answered_there() -> bool:
                return sum(isinstance(e, msg.HeartbeatAck)
                           for _, e in await events(redis_client, opened.session_id)) == 2

            await until(answered_there, "the adopter answering, once")
