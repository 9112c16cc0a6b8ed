"""A resume storm at full capacity (DESIGN §2.7, §5): every slot of the worker taken and the
tenant at its cap, the gateway serving them SIGKILLed mid-response, and every client resuming
at once through the other gateway on a ``?model=`` connection, as the openai SDK connects:
raw websockets and the SDK itself. A resume never needs a free slot or a tenant place: every
session resumes, no ``error`` comes before ``session.resumed`` (nor after), and every event is
delivered once, in order, the audio whole."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from openai import AsyncOpenAI
from redis import Redis
from redis.cluster import RedisCluster
from websockets.asyncio.client import connect

from gateway.auth import tenant_of_key
from store.keys import WorkerKeys, tenant_sessions, worker_of_session
from tests.cluster import Cluster, start_cluster
from tests.e2e.conftest import FAST_ENV
from tests.e2e.helpers import PUSH_TO_TALK_SESSION
from tests.e2e.stack import Proc, Stack
from tests.gateway.strict import validate_server_event

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SESSIONS = 6
KEY = "sk-storm"
PCM = bytes(range(256)) * 75  # 0.4 s of audio: the loopback plays it back over 10 deltas


@dataclass
class Seen:
    """What one client received of its session."""

    session_id: str = ""
    token: str = ""
    seqs: list[int] = field(default_factory=list)
    audio: bytearray = field(default_factory=bytearray)
    errors: list[dict[str, Any]] = field(default_factory=list)

    def take(self, event: dict[str, Any]) -> bool:
        """Record one server event; True once the response is done."""
        validate_server_event(event)
        if event["type"] == "error":
            self.errors.append(event)
        if "server_event_seq" in event:
            self.seqs.append(event["server_event_seq"])
        if event["type"] == "response.output_audio.delta":
            self.audio += base64.b64decode(event["delta"])
        return bool(event["type"] == "response.done")


class _Json:
    """The two kinds of connection, read and written as JSON alike."""

    def __init__(self, recv: Any, send: Any) -> None:
        self.recv, self.send = recv, send

    async def event(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(await asyncio.wait_for(self.recv(), 15))
        return data


@asynccontextmanager
async def raw(gateway: Proc) -> AsyncIterator[_Json]:
    async with connect(f"{gateway.ws_url}?model=loopback",
                       additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        yield _Json(ws.recv, lambda event: ws.send(json.dumps(event)))


@asynccontextmanager
async def sdk(gateway: Proc) -> AsyncIterator[_Json]:
    client = AsyncOpenAI(api_key=KEY, base_url=gateway.http_url + "/v1", max_retries=0,
                         websocket_base_url=gateway.ws_url.removesuffix("/realtime"))
    async with client, client.realtime.connect(model="loopback") as conn:
        yield _Json(conn.recv_bytes, conn.send)


async def open_and_start(gateway: Proc, seen: Seen) -> None:
    """Open a session, start a response and read until its first audio."""
    async with raw(gateway) as conn:
        await conn.send({"type": "session.update", "session": PUSH_TO_TALK_SESSION})
        created = await conn.event()
        assert created["type"] == "session.created", created
        seen.session_id, seen.token = created["session_id"], created["resume_token"]
        await conn.send({"type": "input_audio_buffer.append",
                         "audio": base64.b64encode(PCM).decode()})
        await conn.send({"type": "input_audio_buffer.commit"})
        await conn.send({"type": "response.create"})
        while not seen.audio:
            assert not seen.take(await conn.event())
        # Held open until the gateway dies under it.
        await asyncio.Event().wait()


async def resume(gateway: Proc, seen: Seen, *, through_sdk: bool) -> None:
    """Resume at once, as a client whose gateway died does, then read to response.done."""
    opener = sdk if through_sdk else raw
    async with opener(gateway) as conn:
        await conn.send({"type": "session.resume", "session_id": seen.session_id,
                         "resume_token": seen.token,
                         "last_received_server_event_seq": seen.seqs[-1]})
        resumed = await conn.event()
        assert resumed["type"] == "session.resumed", resumed
        assert resumed["replay_from"] == seen.seqs[-1] + 1
        while not seen.take(await conn.event()):
            pass


async def storm(stack: Stack, reader: Redis | RedisCluster) -> None:
    a, b = stack.gateway(), stack.gateway()
    stack.worker(slots=SESSIONS)
    seen = [Seen() for _ in range(SESSIONS)]
    holders = [asyncio.create_task(open_and_start(a, s)) for s in seen]
    while not all(s.audio for s in seen):
        done = [task for task in holders if task.done()]
        for task in done:
            task.result()  # an open that failed fails the test here
        await asyncio.sleep(0.02)  # polling the clients' progress, not a process
    session_ids = [s.session_id for s in seen]
    worker = WorkerKeys(worker_of_session(session_ids[0])).record
    assert int(reader.hget(worker, "used") or 0) == SESSIONS, "every slot is taken"
    a.kill()  # mid-response: the rest of each answer lands in the logs meanwhile
    for task in holders:
        task.cancel()
    await asyncio.gather(*holders, return_exceptions=True)
    await asyncio.gather(*(resume(b, s, through_sdk=n % 2 == 1) for n, s in enumerate(seen)))
    for s in seen:
        assert s.errors == [], s.errors
        assert s.seqs == list(range(1, s.seqs[-1] + 1)), s.seqs  # none lost, none twice
        assert bytes(s.audio) == PCM
    assert int(reader.hget(worker, "used") or 0) == SESSIONS, "no slot leaked or freed"
    assert reader.zcard(tenant_sessions(tenant_of_key(KEY))) == SESSIONS, "the tenant's places"


def storm_env(url_open_delay_s: str) -> dict[str, str]:
    return {**FAST_ENV, "DUPLEX_GATEWAY_API_KEYS": KEY,
            "DUPLEX_GATEWAY_TENANT_MAX_SESSIONS": str(SESSIONS),
            "DUPLEX_GATEWAY_URL_OPEN_DELAY_S": url_open_delay_s}


@pytest.mark.parametrize("url_open_delay_s", ["0", "0.2"])
async def test_a_resume_storm_at_full_capacity_loses_nothing(
    stack: Stack, url_open_delay_s: str,
) -> None:
    """On one node. With no quiet period every ?model= connection opens a session at once,
    which finds no room: that refusal is held, and the resume goes on."""
    stack.env.update(storm_env(url_open_delay_s))
    reader = Redis.from_url(stack.redis.url)
    try:
        await storm(stack, reader)
    finally:
        reader.close()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    running = start_cluster(masters=3)
    yield running
    running.stop()


async def test_a_resume_storm_on_a_cluster_loses_nothing(cluster: Cluster) -> None:
    """The same on a 3-master Cluster: the worker, its sessions and the tenant's places on
    different masters."""
    stack = Stack(redis=cluster.masters[0], env=storm_env("0"), redis_url=cluster.url)
    reader = stack.reader()
    try:
        await storm(stack, reader)
    finally:
        stack.stop()
        reader.close()
