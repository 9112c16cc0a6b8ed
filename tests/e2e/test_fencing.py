"""Fenced writes across paused processes (DESIGN §2.3, §2.9): a worker or a gateway stopped
with SIGSTOP long enough to lose what it held, then continued with SIGCONT, writes nothing.

The processes are real (tests/e2e/stack.py); what each one tried once it ran again is read off
Redis's own command stream (MONITOR), and what landed off the logs and the clients' events.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import websockets
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from contract import messages as msg
from duplex_client import DuplexClient
from store import lua
from store.keys import WORKER_DIRECTORY, SessionKeys, WorkerKeys, worker_of_session
from tests.e2e.helpers import STREAM_SESSION, chunk_index, collect_until, marked_chunk
from tests.e2e.stack import Proc, Stack
from tests.gateway.strict import validate_server_event
from tests.store._support import assert_one_terminal, events_of, until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

#: A turn that plays back for longer than the worker stays stopped: when it runs again, its
#: runner has audio due, so it tries to write at once.
TURN_SESSION = {"type": "realtime", "audio": {"input": {"turn_detection": None}},
                "extra_body": {"loopback_mode": "turn", "auto_response": True}}
TURN_AUDIO = bytes(6 * 48_000)  # 6 s of pcm16 at 24 kHz
SESSIONS = 2


def script_sha(source: str) -> str:
    """The SHA1 that EVALSHA names a script by (what redis-py sends)."""
    return hashlib.sha1(source.encode()).hexdigest()


class CommandLog:
    """Every command Redis runs while this records (MONITOR), as argument lists."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    def script_calls(self, source: str, *, naming: Callable[[list[str]], bool]) -> int:
        """How many EVALSHA calls of ``source`` were recorded for which ``naming`` holds."""
        sha = script_sha(source)
        return sum(1 for command in self.commands
                   if command[:2] == ["EVALSHA", sha] and naming(command))


@asynccontextmanager
async def recording(url: str) -> AsyncIterator[CommandLog]:
    """Record every command Redis runs until the block ends."""
    log = CommandLog()
    client = Redis.from_url(url)
    try:
        async with client.monitor() as monitor:
            async def collect() -> None:
                while True:
                    info = await monitor.next_command()
                    log.commands.append(str(info["command"]).split(" "))

            task = asyncio.create_task(collect())
            try:
                yield log
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    finally:
        await client.aclose()


def directory(stack: Stack) -> set[bytes]:
    """The worker ids in the worker directory now."""
    reader = SyncRedis.from_url(stack.redis.url)
    try:
        members: Any = reader.zrange(WORKER_DIRECTORY, 0, -1)
        return set(members)
    finally:
        reader.close()


async def turn_playing(url: str) -> DuplexClient:
    """A turn-mode session whose response is playing back (its first audio arrived)."""
    client = await DuplexClient.connect(url, session=TURN_SESSION)
    await collect_until(client, "session.updated", [])
    await client.append_audio(TURN_AUDIO)
    await client.commit()
    await collect_until(client, "response.output_audio.delta", [])
    return client


@pytest.mark.logs_errors
async def test_a_worker_stopped_past_its_ttl_writes_nothing_and_rejoins(stack: Stack) -> None:
    """SIGSTOP a worker mid-response until the reaper declares it lost (its sessions end
    worker_lost), then SIGCONT it: the output logs still end with their one session.closed
    worker_lost (whatever it tried was refused), and it rejoins under a new worker id that
    serves a session opened afterwards."""
    gateway = stack.gateway()
    worker = stack.worker(slots=4)
    clients = [await turn_playing(gateway.ws_url) for _ in range(SESSIONS)]
    session_ids = [c.session_id for c in clients if c.session_id is not None]
    old_id = worker_of_session(session_ids[0])
    before = directory(stack)
    redis = Redis.from_url(stack.redis.url)
    try:
        worker.process.send_signal(signal.SIGSTOP)
        try:
            for client in clients:
                closed = await collect_until(client, "session.closed", [], timeout=20)
                assert closed.data["reason"] == "worker_lost"
            lengths = [len(await events_of(redis, sid)) for sid in session_ids]
            async with recording(stack.redis.url) as commands:
                worker.process.send_signal(signal.SIGCONT)
                await until(lambda: len(directory(stack) - before) > 0, "the worker rejoining",
                            timeout=20)
                (new_id,) = (i.decode() for i in directory(stack) - before)
                fresh = await DuplexClient.connect(gateway.ws_url, session=STREAM_SESSION)
                await collect_until(fresh, "session.updated", [])
                await fresh.append_audio(marked_chunk(9, 0))
                echo = await collect_until(fresh, "response.output_audio.delta", [])
        finally:
            worker.process.send_signal(signal.SIGCONT)  # a running process ignores it
        assert chunk_index(echo.audio) == 0
        assert fresh.session_id is not None and worker_of_session(fresh.session_id) == new_id
        assert new_id != old_id
        for sid, length in zip(session_ids, lengths, strict=True):
            await assert_one_terminal(redis, sid, "session.closed", "worker_lost")
            assert len(await events_of(redis, sid)) == length, "written after the terminal"
        old_record = WorkerKeys(old_id).record
        outputs = commands.script_calls(lua.APPEND_OUTPUT, naming=lambda c: old_record in c)
        beats = commands.script_calls(lua.WORKER_HEARTBEAT, naming=lambda c: old_record in c)
        print(f"after SIGCONT the worker tried {outputs} output writes and {beats} heartbeats"
              f" as {old_id}, all refused (fenced); output logs stayed at {lengths} events;"
              f" fencing lines in its log: {worker.output().count('was declared lost')}")
        assert outputs + beats >= 1, "the stopped worker tried no write at all"
        await fresh.aclose()
    finally:
        for client in clients:
            await client.aclose()
        await redis.aclose()


async def input_end(reader: Redis, session_id: str) -> int:
    """The input log's last index (entry IDs are ``<fence>-<index>``; trims keep the last)."""
    top: Any = await reader.xrevrange(SessionKeys(session_id).input_log, count=1)
    return int(top[0][0].split(b"-")[1]) if top else 0


class RawSession:
    """A bare websocket client of one gateway: JSON frames, nothing buffered or resent (so a
    command sent here lands through this connection or not at all)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.last_seq = 0

    @classmethod
    async def connect(cls, url: str, first: dict[str, Any], answer: str) -> RawSession:
        """Connect and send ``first``; read until the ``answer`` event."""
        raw = cls(await websockets.connect(url, max_size=None))
        await raw.send(first)
        await raw.until(answer)
        return raw

    async def send(self, frame: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(frame))

    async def append(self, session: int, index: int) -> None:
        """Send one marked 20 ms chunk."""
        audio = base64.b64encode(marked_chunk(session, index)).decode()
        await self.send({"type": "input_audio_buffer.append", "audio": audio})

    async def recv(self) -> dict[str, Any]:
        """The next event, strictly validated; its seq is remembered."""
        event: dict[str, Any] = json.loads(await asyncio.wait_for(self.ws.recv(), 10))
        validate_server_event(event)
        self.events.append(event)
        self.last_seq = max(self.last_seq, int(event.get("server_event_seq") or 0))
        return event

    async def until(self, kind: str) -> dict[str, Any]:
        """Read until an event of type ``kind``; returns it."""
        while (event := await self.recv())["type"] != kind:
            pass
        return event

    def echoed(self) -> list[int]:
        """The chunk indices echoed to this connection, in order."""
        return [chunk_index(base64.b64decode(e["delta"])) for e in self.events
                if e["type"] == "response.output_audio.delta"]

    async def echoes(self, count: int) -> None:
        """Read until ``count`` echoes in total arrived here."""
        while len(self.echoed()) < count:
            await self.recv()

    async def until_closed(self) -> list[str]:
        """Read until the gateway closes the connection; the types of what came first."""
        kinds = []
        with pytest.raises(ConnectionClosed):
            while True:
                kinds.append((await self.recv())["type"])
        return kinds


def appends_under(session_id: str, generation: int) -> Callable[[list[str]], bool]:
    """Whether an APPEND_INPUT call appends to ``session_id`` under ``generation`` (its
    arguments per session: session id, epoch, generation, ...)."""
    def naming(command: list[str]) -> bool:
        return any(arg == session_id and command[i + 2:i + 3] == [str(generation)]
                   for i, arg in enumerate(command))
    return naming


async def stop_gateway(gateway: Proc) -> None:
    """SIGTERM, and wait until it exited (all its writes sent and answered)."""
    await asyncio.to_thread(gateway.terminate)


async def test_a_stopped_gateway_whose_client_resumed_elsewhere_lands_nothing(
    stack: Stack,
) -> None:
    """SIGSTOP gateway A, send commands to A's socket (they wait in the socket buffers), resume
    the session through gateway B and stream there, then SIGCONT A: A reads the commands and
    tries to append them under the old generation; the script refuses them (stale). The input
    log holds only the commands appended before the stop and B's, and the worker echoed none
    of A's late ones."""
    gateway_a, gateway_b = stack.gateway(), stack.gateway()
    stack.worker()
    on_a = await RawSession.connect(gateway_a.ws_url, {"type": "session.update",
                                                       "session": STREAM_SESSION},
                                    "session.updated")
    created = on_a.events[0]
    assert created["type"] == "session.created"
    session_id, token = created["session_id"], created["resume_token"]
    for index in range(3):
        await on_a.append(0, index)
    await on_a.echoes(3)
    reader = Redis.from_url(stack.redis.url)
    appended_before = await input_end(reader, session_id)
    late = list(range(100, 105))
    gateway_a.process.send_signal(signal.SIGSTOP)
    try:
        for index in late:  # A reads none of these until it runs again
            await on_a.append(0, index)
        on_b = await RawSession.connect(gateway_b.ws_url, {
            "type": "session.resume", "session_id": session_id, "resume_token": token,
            "last_received_server_event_seq": on_a.last_seq}, "session.resumed")
        for index in range(200, 205):
            await on_b.append(0, index)
        await on_b.echoes(5)
        async with recording(stack.redis.url) as commands:
            gateway_a.process.send_signal(signal.SIGCONT)
            seen_on_a = await on_a.until_closed()
            await stop_gateway(gateway_a)
    finally:
        gateway_a.process.send_signal(signal.SIGCONT)  # a running (or ended) one ignores it
    stale = commands.script_calls(lua.APPEND_INPUT, naming=appends_under(session_id, 1))
    await on_b.append(0, 205)
    await on_b.echoes(6)
    assert on_b.echoed() == list(range(200, 206)), "echoes on B: B's commands only"
    assert on_a.echoed() == [0, 1, 2]
    assert "session.replaced" in seen_on_a
    try:
        appended = await input_end(reader, session_id)
        logged = [e for _, e in await events_of(reader, session_id)]
    finally:
        await reader.aclose()
    # The output log may be trimmed from the front (delivered events); what it holds must not
    # contain an echo of a late command.
    echoed_in_log = [chunk_index(e.audio) for e in logged if isinstance(e, msg.AudioDelta)]
    assert not set(echoed_in_log) & set(late), echoed_in_log
    assert appended - appended_before == 6, (
        f"input log: {appended - appended_before} commands after the stop, not B's 6")
    print(f"gateway A, continued, tried {stale} appends under generation 1, refused (stale);"
          f" the input log holds {appended} commands: {appended_before} from before the stop,"
          f" {appended - appended_before} from B; A sent its client {seen_on_a}")
    await on_a.ws.close()
    await on_b.ws.close()

