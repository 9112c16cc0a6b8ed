"""A rolling restart of the workers under live sessions (docs/design/hand-over.md).

Real processes: a gateway, two loopback workers, 20 clients each talking in turns (marked
audio, a commit, a response that plays it back). Each worker is replaced in turn: a new one
starts, the old one gets SIGTERM, hands its sessions over at their safe points and exits.
Every session survives, served by a new worker; each client sees every event once, in order
(``server_event_seq`` without a gap or a repeat), every answer is its own turn's audio and
ends once, completed, and no session ends.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from duplex_client import DuplexClient, RealtimeEvent
from store.keys import SessionKeys, WorkerKeys, worker_of_session
from tests.e2e.helpers import PUSH_TO_TALK_SESSION, collect_until, marked_chunk, next_event
from tests.e2e.stack import Stack
from tests.store._support import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SESSIONS = 20
TURN_CHUNKS = 5
ENDS = ("session.closed", "session.expired")


class Talker:
    """One client talking in turns until told to stop, checking each answer."""

    def __init__(self, n: int, client: DuplexClient) -> None:
        self.n, self.client = n, client
        self.log: list[RealtimeEvent] = []
        self.turns = 0
        self.stop = False

    async def talk(self) -> None:
        while not self.stop:
            chunks = [marked_chunk(self.n, self.turns * TURN_CHUNKS + i)
                      for i in range(TURN_CHUNKS)]
            for chunk in chunks:
                await self.client.append_audio(chunk)
            await self.client.commit()
            await self.client.create_response()
            played = b""
            while True:
                event = await next_event(self.client, timeout=30)
                self.log.append(event)
                assert event.type not in ENDS, f"session {self.n} ended: {event.data}"
                played += event.audio
                if event.type == "response.done":
                    assert event.data["response"]["status"] == "completed", event.data
                    break
            assert played == b"".join(chunks), f"session {self.n}: turn {self.turns}"
            self.turns += 1


async def test_a_rolling_restart_moves_every_session_and_loses_nothing(stack: Stack) -> None:
    gateway = stack.gateway()
    old = [stack.worker(slots=SESSIONS) for _ in range(2)]
    talkers = []
    for n in range(SESSIONS):
        client = await DuplexClient.connect(gateway.ws_url, session=PUSH_TO_TALK_SESSION)
        talker = Talker(n, client)
        await collect_until(client, "session.updated", talker.log)
        talkers.append(talker)
    tasks = [asyncio.create_task(talker.talk()) for talker in talkers]
    await until(lambda: all(t.turns >= 2 for t in talkers), "two turns each", 60)
    for worker in old:
        stack.worker(slots=SESSIONS)
        code = await asyncio.to_thread(worker.terminate, 60)
        assert code == 0, "the drained worker exits cleanly"
        assert not any(task.done() for task in tasks), [t.exception() for t in tasks
                                                        if t.done()]
    reader = stack.reader()
    homes = {worker_of_session(t.client.session_id or "") for t in talkers}

    async def homes_lost() -> bool:
        return all(reader.hget(WorkerKeys(home).record, "state") == b"lost" for home in homes)

    # The old workers' heartbeats lapse: their slots go on holding the moved sessions' keys,
    # and the new owners' writes there are fenced by owner epoch alone.
    await until(homes_lost, "the drained workers declared lost", 30)
    after = [t.turns for t in talkers]
    await until(lambda: all(t.turns >= a + 2 for t, a in zip(talkers, after, strict=True)),
                "two more turns each after the restart", 60)
    for talker in talkers:
        talker.stop = True
    await asyncio.gather(*tasks)

    for talker in talkers:
        session_id = talker.client.session_id
        assert session_id is not None
        owner: Any = reader.hget(SessionKeys(session_id).record, "owner")
        assert owner is not None and owner.decode() != worker_of_session(session_id), (
            "served by another worker than the one that opened it")
        seqs = [e.server_event_seq for e in talker.log if e.server_event_seq is not None]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "each event once, in order"
        done = [e.response_id for e in talker.log if e.type == "response.done"]
        assert len(done) == len(set(done)) == talker.turns, "every response ends once"
        await talker.client.close()
        await collect_until(talker.client, "session.closed", [])
        await talker.client.aclose()
    reader.close()
