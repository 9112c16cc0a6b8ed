"""A draining Moshi worker hands its session over with its slot's context
(``inference_worker/backends/moshi_context.py`` behind ``inference_worker/hand_over.py``).

Two real workers of a tiny random Moshi, in process on a real Redis, their engines on the
real clock. The tiny model talks without pause, so its session is at a safe point only once
its client cancelled the answer (the rest of the model's turn muted): there it is checkpointed
with its step records, and the drain moves it. The adopter's slot is rebuilt from them (its
sampling seed and position the records' own) and steps on as the session sends more audio:
every event once, in order, and no end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from redis.asyncio import Redis

from contract import messages as msg
from contract.messages import encode_message
from inference_worker.backends.moshi import MoshiBackend
from inference_worker.backends.moshi_context import RecordShape, StepRecord, decode_record
from inference_worker.conversation.checkpoint import decode
from store.keys import SessionKeys
from tests.store._support import events_of, open_session, until
from tests.worker._running import Running, running_worker
from tests.worker.moshi_fixtures import audio, write_tiny
from tests.worker.test_hand_over import drained_to, send

pytestmark = pytest.mark.timeout(120)


def appends(seed: int, frames: int) -> list[bytes]:
    return [encode_message(msg.AppendAudio(audio=np.round(frame * 32767).astype("<i2").tobytes()))
            for frame in audio(seed, frames)]


def moshi_of(running: Running) -> MoshiBackend:
    engine = running.worker.engine
    assert engine is not None and isinstance(engine.backend, MoshiBackend)
    return engine.backend


async def test_a_drained_moshi_session_goes_on_from_its_slots_records(
        redis_client: Redis, tmp_path: Path) -> None:
    model: dict[str, Any] = {"backend": "moshi", "model_path": str(write_tiny(tmp_path / "m")),
                             "checkpoint_interval_s": 0.2}
    async with running_worker(redis_client, slots=2, **model) as adopter:
        async with running_worker(redis_client, slots=2, drain_timeout_s=10.0,
                                  **model) as draining:
            # the adopter's own session draws its first seed, as the moved one did at home
            own = await open_session(adopter.scripts, adopter.worker.worker_id)
            await send(adopter, own.lease, *appends(3, 2))
            await until(lambda: 0 in moshi_of(adopter)._slot_seeds, "the adopter's own slot")
            opened = await open_session(draining.scripts, draining.worker.worker_id)
            sid, record = opened.session_id, SessionKeys(opened.session_id).record
            await send(draining, opened.lease, *appends(1, 20))

            async def answering() -> bool:
                return any(isinstance(e, msg.ResponseCreated)
                           for _, e in await events_of(redis_client, sid))
            await until(answering, "the model's answer")
            await send(draining, opened.lease, encode_message(msg.CancelResponse()))
            context: list[bytes] = []

            async def checkpointed() -> bool:
                core = await redis_client.hget(record, "ck_core")
                state = decode(core) if isinstance(core, bytes) else None
                context[:] = (state.model_context or ()) if state is not None else ()
                return bool(context)
            await until(checkpointed, "a checkpoint carrying the slot's records")
            newest = decode_record(context[-1], RecordShape(codebooks=8, ring_size=3,
                                                            samples=1920))
            assert isinstance(newest, StepRecord), "the newest record is kept whole"
            await drained_to(draining, adopter, sid, "moved")
        backend = moshi_of(adopter)
        slot = 1  # beside the adopter's own session
        await until(lambda: slot in backend._slot_seeds, "the moved session's slot opened")
        # Rebuilt, not opened afresh: its seed is each worker's first draw (a fresh open would
        # have had the adopter's second), and it goes on from the records' place.
        assert backend._slot_seeds[slot] == newest.seed == backend._slot_seeds[0]
        await until(lambda: int(backend._offsets[slot]) >= newest.offset, "rebuilt")
        at = int(backend._offsets[slot])
        await send(adopter, opened.lease, *appends(2, 10))
        await until(lambda: int(backend._offsets[slot]) >= at + 10, "the moved slot stepping")
        logged = await events_of(redis_client, sid)
        assert [seq for seq, _ in logged] == list(range(1, len(logged) + 1))
        assert not any(msg.is_terminal(event) for _, event in logged)
        assert adopter.worker.metrics.registry.get_sample_value(
            "duplex_worker_take_overs_total", {"backend": "moshi", "outcome": "taken"}) == 1
