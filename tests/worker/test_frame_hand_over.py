"""A draining frame backend's worker hands its sessions over with their engine slots
(``inference_worker/hand_over.py``, ``inference_worker/slot_context.py``).

Two real fake-echo workers, in process on a real Redis, their engines on the real clock. A
session speaks a word, pauses, and its worker drains: the session moves at a safe point with
its slot's context, and its next word is echoed by the other worker. Every event once, in
order, no terminal event, each response ends once, each word echoed once.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import pytest
from redis.asyncio import Redis

from contract import messages as msg
from contract.messages import encode_message
from inference_worker.audio_frames import float_to_pcm16
from inference_worker.backends.fake import FakeBackend, FakeOptions
from inference_worker.conversation.checkpoint import decode
from inference_worker.engine import Engine, SlotResume
from inference_worker.hand_over import UnreplayableTail, slot_resume
from store.keys import SessionKeys
from tests.store._support import open_session, until
from tests.worker._running import running_worker
from tests.worker.test_frame_continuation import Run
from tests.worker.test_hand_over import answered, drained_to, events, send

pytestmark = pytest.mark.timeout(60)

SAMPLES = 1920  # one 80 ms frame at 24 kHz
MANUAL = encode_message(msg.UpdateSession(session={"audio": {"input": {"turn_detection": None}}}))


def marked(mark: int) -> bytes:
    return float_to_pcm16(np.full(SAMPLES, 0.2 + mark / 1000, dtype=np.float32))


def word(marks: range) -> list[bytes]:
    """A word's frames, then a pause long enough for its echo to end."""
    return [encode_message(msg.AppendAudio(audio=marked(m))) for m in marks] + [
        encode_message(msg.AppendAudio(audio=bytes(SAMPLES * 2)))] * 12


async def test_a_drained_frame_session_goes_on_at_another_worker(redis_client: Redis) -> None:
    fake: dict[str, Any] = {"backend": "fake", "checkpoint_interval_s": 0.2}
    async with running_worker(redis_client, slots=2, **fake) as adopter:
        async with running_worker(redis_client, slots=2, drain_timeout_s=10.0,
                                  **fake) as draining:
            opened = await open_session(draining.scripts, draining.worker.worker_id)
            await send(draining, opened.lease, MANUAL, *word(range(1, 4)))
            await answered(redis_client, opened.session_id, 1)
            record = SessionKeys(opened.session_id).record

            async def checkpointed_quiet() -> bool:
                # A checkpoint after the pause: the slot's context is the pause's echo.
                core = await redis_client.hget(record, "ck_core")
                return isinstance(core, bytes) and decode(core).model_context is not None
            await until(checkpointed_quiet, "a checkpoint carrying the slot's context")
            await drained_to(draining, adopter, opened.session_id, "moved")
        await send(adopter, opened.lease, *word(range(10, 14)))
        await answered(redis_client, opened.session_id, 2)
        assert adopter.worker.metrics.registry.get_sample_value(
            "duplex_worker_take_overs_total", {"backend": "fake", "outcome": "taken"}) == 1
        logged = await events(redis_client, opened.session_id)
        assert [seq for seq, _ in logged] == list(range(1, len(logged) + 1))
        assert not any(msg.is_terminal(event) for _, event in logged)
        created = [e.response["id"] for _, e in logged if isinstance(e, msg.ResponseCreated)]
        done = [e.response["id"] for _, e in logged if isinstance(e, msg.ResponseDone)]
        assert created == done == sorted(set(created), key=created.index), "each ends once"
        audio = b"".join(e.audio for _, e in logged if isinstance(e, msg.AudioDelta))
        frames = [audio[i:i + SAMPLES * 2] for i in range(0, len(audio), SAMPLES * 2)]
        speech = [marked(m) for m in [*range(1, 4), *range(10, 14)]]
        assert [f for f in frames if f in speech] == speech, "each word echoed once, in order"


async def checkpointed_past(client: Redis, record: str, seq: int) -> bool:
    return int(await client.hget(record, "ck_seq") or 0) >= seq


async def test_a_session_ahead_of_its_slot_is_checkpointed_at_each_answer_s_end(
        redis_client: Redis) -> None:
    """Each word is sent with its pause at once and the next one as soon as the echo ends,
    so the slot always holds input it has not stepped: each answer's end is still a
    checkpoint, its slot's unstepped input counted and kept in the log for the read-back
    (none refused for want of it, none forfeit)."""
    async with running_worker(redis_client, slots=2, backend="fake",
                              checkpoint_interval_s=10.0) as running:
        opened = await open_session(running.scripts, running.worker.worker_id)
        await send(running, opened.lease, MANUAL)
        for n in range(4):
            await send(running, opened.lease, *word(range(n * 10, n * 10 + 4)))
            await answered(redis_client, opened.session_id, n + 1)
            done = [seq for seq, event in await events(redis_client, opened.session_id)
                    if isinstance(event, msg.ResponseDone)][-1]
            record = SessionKeys(opened.session_id).record
            await until(functools.partial(checkpointed_past, redis_client, record, done),
                        "a checkpoint at the answer's end")
            core = await redis_client.hget(record, "ck_core")
            assert isinstance(core, bytes)
            assert decode(core).model_unconsumed > 0, "written with the pause still queued"
        registry = running.worker.metrics.registry

        def checkpoints(outcome: str) -> float | None:
            return registry.get_sample_value("duplex_worker_checkpoints_total",
                                             {"backend": "fake", "outcome": outcome})

        assert (checkpoints("input_gone"), registry.get_sample_value(
            "duplex_worker_checkpoint_forfeits_total", {"backend": "fake"})) == (0, 0)
        assert (checkpoints("written") or 0) >= 4


def test_a_frame_session_with_events_past_its_checkpoint_is_not_continued() -> None:
    """After a loss, what a frame model said past the checkpoint cannot be replayed: the
    adopter refuses to continue on a guess (the session ends ``worker_lost``); so does one
    whose checkpoint has no slot context, or whose backend cannot continue a slot."""
    run = Run(FakeOptions())
    for index in range(3):
        run.tick(index, bytes(SAMPLES * 2), None)
    state = run.checkpoint()
    assert state is not None
    engine = Engine(FakeBackend(max_slots=1))
    assert slot_resume(state, engine, 0) == SlotResume(
        context=state.model_context or (), epoch=0, input_frames=3)
    with pytest.raises(UnreplayableTail, match="2 events past its checkpoint"):
        slot_resume(state, engine, 2)
    with pytest.raises(ValueError, match="carries no model context"):
        slot_resume(dataclasses.replace(state, model_context=None), engine, 0)
    engine.spec = dataclasses.replace(engine.spec, context_steps=0)
    with pytest.raises(ValueError, match="cannot continue a slot"):
        slot_resume(state, engine, 0)
