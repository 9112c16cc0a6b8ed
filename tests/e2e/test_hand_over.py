"""Workers replaced and lost under live sessions (docs/design/hand-over.md).

Real processes: a gateway, loopback workers, clients each talking in turns (marked audio, a
commit, a response that plays it back). A rolling restart: each worker is replaced in turn (a
new one starts, the old one gets SIGTERM, hands its sessions over at their safe points and
exits); every session survives, served by a new worker, each client sees every event once, in
order (``server_event_seq`` without a gap or a repeat), every answer is its own turn's audio
and ends once, completed, and no session ends. A SIGKILL: the lost worker's sessions are
re-placed on the live worker from their last checkpoints; an answer the kill cut short ends
once, ``failed`` ``worker_lost``, having played a prefix of its turn, and every session
talks on.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from duplex_client import DuplexClient, RealtimeEvent
from store.keys import SessionKeys, WorkerKeys, worker_of_session
from tests.e2e.helpers import (
    PUSH_TO_TALK_SESSION,
    assert_once_in_order,
    collect_until,
    marked_chunk,
    next_event,
)
from tests.e2e.stack import Proc, Stack
from tests.store._support import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SESSIONS = 20
KILLED_SESSIONS = 10
TURN_CHUNKS = 5
ENDS = ("session.closed", "session.expired")


class Talker:
    """One client talking in turns until told to stop, checking each answer."""

    def __init__(self, n: int, client: DuplexClient) -> None:
        self.n, self.client = n, client
        self.log: list[RealtimeEvent] = []
        self.turns = 0
        self.cut_short = 0  # answers that ended failed worker_lost
        self.stop = False

    async def talk(self) -> None:
        while not self.stop:
            await self.talk_once()

    async def talk_once(self) -> None:
        """One turn: audio, a commit, a response that plays it back (or is cut short)."""
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
                break
        response = event.data["response"]
        if response["status"] == "failed":  # cut short by its worker's loss
            assert response["status_details"]["error"]["code"] == "worker_lost", response
            assert b"".join(chunks).startswith(played), f"session {self.n}"
            self.cut_short += 1
        else:
            assert response["status"] == "completed", response
            assert played == b"".join(chunks), f"session {self.n}: turn {self.turns}"
        self.turns += 1


async def connected(gateway: Proc, count: int) -> list[Talker]:
    """``count`` push-to-talk clients, each opened and configured."""
    talkers = []
    for n in range(count):
        client = await DuplexClient.connect(gateway.ws_url, session=PUSH_TO_TALK_SESSION)
        talker = Talker(n, client)
        await collect_until(client, "session.updated", talker.log)
        talkers.append(talker)
    return talkers


async def test_a_rolling_restart_moves_every_session_and_loses_nothing(stack: Stack) -> None:
    gateway = stack.gateway()
    old = [stack.worker(slots=SESSIONS) for _ in range(2)]
    talkers = await connected(gateway, SESSIONS)
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
        assert talker.cut_short == 0, "a drain cuts no answer short"
        check_log(talker)
        await talker.client.close()
        await collect_until(talker.client, "session.closed", [])
        await talker.client.aclose()
    reader.close()


def check_log(talker: Talker) -> None:
    """Each event once, in order; every response ends once; nothing ended the session."""
    assert_once_in_order(talker.log, talker.turns)


async def test_a_sigkilled_worker_s_sessions_move_to_the_live_one_and_talk_on(
        stack: Stack) -> None:
    """10 sessions on a worker that is SIGKILLed mid-conversation, a second worker with room:
    all 10 continue (re-placed from their checkpoints), none ends, each response ends once."""
    gateway = stack.gateway()
    doomed = stack.worker(slots=KILLED_SESSIONS)
    talkers = await connected(gateway, KILLED_SESSIONS)
    stack.worker(slots=KILLED_SESSIONS)  # the survivor: every session opened on the other
    tasks = [asyncio.create_task(talker.talk()) for talker in talkers]
    await until(lambda: all(t.turns >= 2 for t in talkers), "two turns each", 60)
    doomed.kill()
    after = [t.turns for t in talkers]
    await until(lambda: all(t.turns >= a + 2 for t, a in zip(talkers, after, strict=True))
                or any(task.done() for task in tasks),
                "two more turns each after the kill", 60)
    for talker in talkers:
        talker.stop = True
    await asyncio.gather(*tasks)
    reader = stack.reader()
    for talker in talkers:
        session_id = talker.client.session_id
        assert session_id is not None
        owner: Any = reader.hget(SessionKeys(session_id).record, "owner")
        assert owner is not None and owner.decode() != worker_of_session(session_id)
        assert talker.cut_short <= 1, "only the answer the kill cut short ends failed"
        check_log(talker)
        await talker.client.close()
        await collect_until(talker.client, "session.closed", [])
        await talker.client.aclose()
    reader.close()


async def test_with_no_room_left_a_sigkilled_worker_s_sessions_end_worker_lost(
        stack: Stack) -> None:
    """The one other worker is full: the killed worker's sessions, checkpointed, have nowhere
    to go and end worker_lost, once; the other worker's session is untouched."""
    gateway = stack.gateway()
    doomed = stack.worker(slots=3)
    talkers = await connected(gateway, 3)
    stack.worker(slots=1)
    bystander = await DuplexClient.connect(gateway.ws_url, session=PUSH_TO_TALK_SESSION)
    await collect_until(bystander, "session.updated", [])
    # One turn each, then quiet: a checkpoint at its end.
    await asyncio.gather(*(talker.talk_once() for talker in talkers))
    reader = stack.reader()

    async def checkpointed() -> bool:
        return all(reader.hexists(SessionKeys(t.client.session_id or "").record, "ck_core")
                   for t in talkers)

    await until(checkpointed, "each session checkpointed", 30)
    doomed.kill()
    for talker in talkers:
        closed = await collect_until(talker.client, "session.closed", talker.log, timeout=20)
        assert closed.data["reason"] == "worker_lost"
        assert [e.type for e in talker.log].count("session.closed") == 1
        await talker.client.aclose()
    await bystander.heartbeat()
    await collect_until(bystander, "session.heartbeat_ack", [])
    await bystander.close()
    await collect_until(bystander, "session.closed", [])
    await bystander.aclose()
    reader.close()
