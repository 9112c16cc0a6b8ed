"""A real worker's checkpoints in the store (``inference_worker/checkpoints.py``).

A loopback worker, in process on a real Redis, checkpoints its sessions at safe points: the
record then holds a state another core restores, the input position and event it reflects,
and the input log keeps what an adopter reads back (the input buffer's audio). A hold past
its bound is overtaken by the trim (forfeit: the session can no longer be adopted, its client
is never refused), and once another worker took a session over the worker writes nothing
more for it and stops serving it, without ending it.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from redis.asyncio import Redis

from contract import messages as msg
from contract.messages import decode_command, decode_message, encode_message
from inference_worker.backends.registry import loopback_core
from inference_worker.conversation.checkpoint import decode
from inference_worker.worker import Worker
from store.checkpoints import AdoptStatus
from store.keys import SessionKeys, new_worker_id
from tests.store._support import EPOCH, events_of, open_session, until
from tests.worker._running import Running, acks, heartbeat, running_worker

pytestmark = pytest.mark.timeout(30)

#: 20 ms of silence: the default (turn mode) loopback buffers it and answers nothing.
AUDIO = bytes(960)
CHUNK = encode_message(msg.AppendAudio(audio=AUDIO))
INTERVAL_S = 0.2


async def checkpoint_of(client: Redis, session_id: str) -> dict[str, Any]:
    fields: dict[Any, Any] = await client.hgetall(SessionKeys(session_id).record)
    return {name.decode()[3:]: value for name, value in fields.items()
            if name.startswith(b"ck_")}


def sample(worker: Worker, name: str, **labels: str) -> float:
    value = worker.metrics.registry.get_sample_value(name, {"backend": "loopback", **labels})
    return value or 0.0


async def checkpointed_at(running: Running, session_id: str, seq: int) -> dict[str, Any]:
    """Wait for the session's checkpoint of event ``seq``; its fields."""
    found: dict[str, Any] = {}

    async def written() -> bool:
        found.update(await checkpoint_of(running.client, session_id))
        return found.get("seq") == str(seq).encode()

    await until(written, f"the checkpoint at event {seq}")
    return found


async def test_a_checkpoint_restores_a_core_from_what_the_log_keeps(redis_client: Redis) -> None:
    """After an answered heartbeat the record holds a checkpoint of that event, with nothing
    to read back. After 48 chunks buffered (960 ms: whole frames of either turn detector, so
    it is between frames, a safe point) and another answer, the next one keeps the input log
    from the first chunk: the adopter's read-back (the appends from there to the
    checkpoint's position, decoded) is the buffer, and a fresh core restores from it."""
    async with running_worker(redis_client, slots=2,
                              checkpoint_interval_s=INTERVAL_S) as running:
        opened = await open_session(running.scripts, running.worker.worker_id)
        sid = opened.session_id
        await heartbeat(running, opened.lease, 1)
        first = await checkpointed_at(running, sid, 1)
        assert (first["epoch"], first["in"], first["keep"]) == (b"1", b"2-1", b"2-1")
        assert decode(first["core"]).buffer.size == 0

        await running.scripts.append_input(opened.lease, [(None, CHUNK)] * 48,
                                           max_entries=1000)
        await heartbeat(running, opened.lease, 2)
        second = await checkpointed_at(running, sid, 2)
        assert (second["in"], second["keep"]) == (b"2-50", b"2-2")
        state = decode(second["core"])
        assert state.buffer.size == 48 * len(AUDIO)
        entries: Any = await redis_client.xrange(SessionKeys(sid).input_log, "2-2", "2-50")
        heard = b"".join(command.audio for _, fields in entries
                         if isinstance(command := decode_command(fields[b"d"]),
                                       msg.AppendAudio))
        assert heard == AUDIO * 48
        twin = loopback_core("sess_twin")
        twin.restore(state, heard[len(heard) - state.buffer.size:])
        assert twin.checkpoint() == state
        assert sample(running.worker, "duplex_worker_checkpoints_total",
                      outcome="written") >= 2
        assert sample(running.worker, "duplex_worker_checkpoint_bytes_count") >= 2


async def test_a_hold_past_its_bound_is_overtaken_and_the_checkpoint_forfeit(
        redis_client: Redis) -> None:
    """With a hold of 64 entries, 200 chunks buffered after a checkpoint: the trim overtakes
    it (one forfeit, counted), the log keeps only what the worker has not applied, no new
    checkpoint can be taken while the buffer's first entry is gone, and an adoption from the
    old one is refused: its input is gone."""
    async with running_worker(redis_client, slots=2, checkpoint_interval_s=INTERVAL_S,
                              checkpoint_hold_entries=64) as running:
        opened = await open_session(running.scripts, running.worker.worker_id)
        sid = opened.session_id
        await heartbeat(running, opened.lease, 1)
        await checkpointed_at(running, sid, 1)
        for _ in range(2):
            await running.scripts.append_input(opened.lease, [(None, CHUNK)] * 100,
                                               max_entries=1000)
        await heartbeat(running, opened.lease, 2)

        async def trimmed() -> bool:
            return int(await redis_client.xlen(SessionKeys(sid).input_log)) < 100

        await until(trimmed, "the input log trimmed past the checkpoint")
        assert sample(running.worker, "duplex_worker_checkpoint_forfeits_total") == 1
        await until(lambda: sample(running.worker, "duplex_worker_checkpoints_total",
                                   outcome="input_gone") >= 1, "a checkpoint refused")
        assert (await checkpoint_of(redis_client, sid))["seq"] == b"1"
        taken = await running.scripts.adopt_session(sid, replaces_epoch=1,
                                                    adopter=new_worker_id())
        assert taken.status is AdoptStatus.INPUT_GONE


async def test_a_session_taken_over_is_let_go_without_an_end(redis_client: Redis) -> None:
    """Another worker adopts a session from its checkpoint: the worker's next answer is
    refused (moved), it stops serving the session and does not take it back from its session
    set, and nothing ends the session: no terminal event, the record open."""
    async with running_worker(redis_client, slots=2,
                              checkpoint_interval_s=INTERVAL_S) as running:
        opened = await open_session(running.scripts, running.worker.worker_id)
        sid = opened.session_id
        await heartbeat(running, opened.lease, 1)
        await checkpointed_at(running, sid, 1)
        taken = await running.scripts.adopt_session(sid, replaces_epoch=1,
                                                    adopter=new_worker_id(), checkpoint_seq=1)
        assert taken.status is AdoptStatus.OK
        await running.scripts.append_input(opened.lease, [(None, CHUNK)], max_entries=1000)
        await running.scripts.append_input(opened.lease, [(None, encode_message(
            msg.Heartbeat()))], max_entries=1000)
        await until(lambda: sid not in running.worker.session_ids, "the session let go")
        other = await open_session(running.scripts, running.worker.worker_id)
        await heartbeat(running, other.lease, 1)  # a few safety polls later
        assert sid not in running.worker.session_ids
        assert await acks(running, sid) == 1
        assert not any(msg.is_terminal(event) for _, event in await events_of(redis_client, sid))
        assert await redis_client.hget(SessionKeys(sid).record, "state") != b"closed"


async def test_the_poll_reads_past_a_long_hold(redis_client: Redis) -> None:
    """700 chunks buffered after a checkpoint are held in the log (the buffer's audio, under
    a hold of 1024 entries, a quarter of the session's input bound); a heartbeat then
    written around the scripts (no push) is still found by the safety poll, which reads
    after what was applied, not from the log's start."""
    async with running_worker(redis_client, slots=2, checkpoint_interval_s=INTERVAL_S,
                              checkpoint_hold_entries=1024,
                              checkpoint_hold_bytes=4 << 20) as running:
        opened = await open_session(running.scripts, running.worker.worker_id)
        sid = opened.session_id
        await heartbeat(running, opened.lease, 1)
        for _ in range(7):
            await running.scripts.append_input(opened.lease, [(None, CHUNK)] * 100,
                                               max_entries=2000)
        await redis_client.xadd(SessionKeys(sid).input_log,
                                {"d": encode_message(msg.Heartbeat()), f"e:{EPOCH}": "1"},
                                id="2-702")

        async def answered() -> bool:
            return await acks(running, sid) == 2

        await until(answered, "the unpushed heartbeat answered")
        # Applied, all of it, and held: the buffer's entries were not trimmed.
        assert int(await redis_client.xlen(SessionKeys(sid).input_log)) > 700


async def test_each_answer_of_a_client_that_never_pauses_is_checkpointed(
        redis_client: Redis) -> None:
    """A client whose next turn follows each answer at once (sent the moment its
    response.done reaches the output log, before the worker's next pass over its sessions)
    leaves a safe point only between the answer's write and its next commands: the checkpoint
    is taken at the write that ends the answer, so every answer's end is checkpointed, the
    last one's at its event."""
    turns = 6
    manual = encode_message(msg.UpdateSession(
        session={"audio": {"input": {"turn_detection": None}}}))
    turn = [encode_message(msg.AppendAudio(audio=bytes(4800))),
            encode_message(msg.CommitInput()), encode_message(msg.CreateResponse())]
    async with running_worker(redis_client, slots=2, checkpoint_interval_s=60.0) as running:
        opened = await open_session(running.scripts, running.worker.worker_id)
        sid = opened.session_id
        log, last = SessionKeys(sid).output_log, "0-0"
        done: list[int] = []  # the seq of each response.done
        await running.scripts.append_input(opened.lease, [(None, c) for c in [manual, *turn]],
                                           max_entries=1000)
        deadline = time.monotonic() + 10.0
        while len(done) < turns:
            assert time.monotonic() < deadline, f"{len(done)} of {turns} answers in 10 s"
            read: Any = await redis_client.xread({log: last}, block=200)
            for entry_id, fields in read[0][1] if read else []:
                last = entry_id
                if isinstance(decode_message(fields[b"d"]), msg.ResponseDone):
                    done.append(int(entry_id.split(b"-")[0]))
                    if len(done) < turns:
                        await running.scripts.append_input(
                            opened.lease, [(None, c) for c in turn], max_entries=1000)
        # the write that ends an answer carries its rate_limits.updated too, the last event
        last_seq = (await events_of(redis_client, sid))[-1][0]
        assert last_seq > done[-1]
        await checkpointed_at(running, sid, last_seq)
        assert sample(running.worker, "duplex_worker_checkpoints_total",
                      outcome="written") == turns
