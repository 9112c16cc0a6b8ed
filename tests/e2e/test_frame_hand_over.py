"""Frame backends' workers (``duplex-gateway worker --backend fake``) drained and killed:
their sessions move with their engine slot.

Through a real gateway, with the seed's released ``DuplexClient``. A rolling restart of two
workers under talking sessions: every session moves at a pause between its words and echoes
each word once, every event once, in order, every response ended once. A SIGKILL: a session
quiet at the kill is re-placed and echoes its next word on the surviving worker; one being
echoed at the kill, its model's output past the checkpoint (which cannot be replayed), ends
once, ``worker_lost``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from duplex_client import DuplexClient, RealtimeEvent
from inference_worker.audio_frames import float_to_pcm16
from inference_worker.conversation.checkpoint import decode
from store.keys import SessionKeys, worker_of_session
from tests.e2e.helpers import PUSH_TO_TALK_SESSION, assert_once_in_order, collect_until
from tests.e2e.stack import Stack, log_dir
from tests.store._support import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SAMPLES = 1920  # one 80 ms frame of the fake's, at 24 kHz


def marked(mark: int) -> bytes:
    return float_to_pcm16(np.full(SAMPLES, 0.2 + mark / 1000, dtype=np.float32))


async def say(client: DuplexClient, marks: range, pause: int = 12) -> None:
    """A word, each frame marked, then a pause long enough for its echo to end."""
    for mark in marks:
        await client.append_audio(marked(mark))
    for _ in range(pause):
        await client.append_audio(bytes(SAMPLES * 2))


def echoed(log: list[RealtimeEvent]) -> list[bytes]:
    audio = b"".join(event.audio for event in log)
    return [audio[i:i + SAMPLES * 2] for i in range(0, len(audio), SAMPLES * 2)]


class Talker:
    """One client saying words, each marked frame by frame, until told to stop; each word
    must come back echoed, once, in its own response."""

    def __init__(self, n: int, client: DuplexClient) -> None:
        self.n, self.client = n, client
        self.log: list[RealtimeEvent] = []
        self.words = 0
        self.stop = False

    async def talk(self) -> None:
        while not self.stop:
            marks = range(self.n * 1000 + self.words * 4, self.n * 1000 + self.words * 4 + 4)
            start = len(self.log)
            await say(self.client, marks)
            done = await collect_until(self.client, "response.done", self.log, timeout=30)
            assert done.data["response"]["status"] == "completed", done.data
            assert not any(e.type in ENDS for e in self.log), f"session {self.n} ended"
            word = [marked(m) for m in marks]
            assert [f for f in echoed(self.log[start:]) if f in word] == word, (
                f"session {self.n}: word {self.words}")
            self.words += 1


ENDS = ("session.closed", "session.expired")
SESSIONS = 8


async def test_a_rolling_restart_of_fake_workers_moves_every_session_and_loses_nothing(
        stack: Stack) -> None:
    gateway = stack.gateway()
    old = [stack.worker(slots=SESSIONS, backend="fake") for _ in range(2)]
    talkers = []
    for n in range(SESSIONS):
        client = await DuplexClient.connect(gateway.ws_url, session=PUSH_TO_TALK_SESSION)
        talker = Talker(n, client)
        await collect_until(client, "session.updated", talker.log)
        talkers.append(talker)
    tasks = [asyncio.create_task(talker.talk()) for talker in talkers]
    await until(lambda: all(t.words >= 1 for t in talkers), "a word each", 60)
    for worker in old:
        stack.worker(slots=SESSIONS, backend="fake")
        code = await asyncio.to_thread(worker.terminate, 60)
        assert code == 0, "the drained worker exits cleanly"
        assert not any(task.done() for task in tasks), [t.exception() for t in tasks
                                                        if t.done()]
    after = [t.words for t in talkers]
    await until(lambda: all(t.words >= a + 1 for t, a in zip(talkers, after, strict=True))
                or any(task.done() for task in tasks), "a word each after the restart", 60)
    for talker in talkers:
        talker.stop = True
    await asyncio.gather(*tasks)
    reader = stack.reader()
    for talker in talkers:
        session_id = talker.client.session_id or ""
        owner: Any = reader.hget(SessionKeys(session_id).record, "owner")
        assert owner is not None and owner.decode() != worker_of_session(session_id), (
            "served by another worker than the one that opened it")
        assert_once_in_order(talker.log, talker.words)
        await talker.client.close()
        await collect_until(talker.client, "session.closed", [])
        await talker.client.aclose()
    reader.close()


async def test_a_killed_fake_worker_s_quiet_session_moves_and_its_talking_one_ends(
        stack: Stack) -> None:
    gateway = stack.gateway()
    doomed = stack.worker(slots=2, backend="fake")
    quiet, talking = [await DuplexClient.connect(gateway.ws_url, session=PUSH_TO_TALK_SESSION)
                      for _ in range(2)]
    logs: dict[int, list[RealtimeEvent]] = {id(quiet): [], id(talking): []}
    for client in (quiet, talking):
        await collect_until(client, "session.updated", logs[id(client)])
        await say(client, range(1, 4))
        await collect_until(client, "response.done", logs[id(client)], timeout=30)
    stack.worker(slots=2, backend="fake")  # the survivor, with room for both
    reader = stack.reader()

    def context_checkpointed(client: DuplexClient) -> bool:
        core: Any = reader.hget(SessionKeys(client.session_id or "").record, "ck_core")
        return core is not None and decode(core).model_context is not None

    await until(lambda: all(context_checkpointed(c) for c in (quiet, talking)),
                "each session checkpointed with its slot's context", 30)
    # A long word: its echo is under way, past the checkpoint, when the worker dies (short
    # enough that the input log still holds what the checkpoint needs).
    await say(talking, range(100, 120), pause=0)
    await collect_until(talking, "response.output_audio.delta", logs[id(talking)], timeout=30)
    doomed.kill()

    closed = await collect_until(talking, "session.closed", logs[id(talking)], timeout=30)
    assert closed.data["reason"] == "worker_lost"
    await talking.aclose()
    refused = f"session {talking.session_id}: cannot be taken over (a frame model's"
    await until(lambda: any(refused in path.read_text() for path in log_dir().glob("*.log")),
                "the survivor refusing to continue it past its model's output", 10)

    await say(quiet, range(10, 14))
    done = await collect_until(quiet, "response.done", logs[id(quiet)], timeout=30)
    assert done.data["response"]["status"] == "completed"
    log = logs[id(quiet)]
    assert not any(e.type in ("session.closed", "session.expired") for e in log)
    assert_once_in_order(log, 2)
    speech = [marked(m) for m in [*range(1, 4), *range(10, 14)]]
    assert [f for f in echoed(log) if f in speech] == speech, "each word echoed once"
    owner: Any = reader.hget(SessionKeys(quiet.session_id or "").record, "owner")
    assert owner.decode() != worker_of_session(quiet.session_id or "")
    await quiet.close()
    await collect_until(quiet, "session.closed", [])
    await quiet.aclose()
    reader.close()
