"""Helpers shared by the store tests: workers, sessions, log inspection, polling on Redis time."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack  # type: ignore[import-untyped]
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from contract.messages import AudioDelta, Event, decode_message, encode_message, is_terminal
from gateway.placement import session_policy
from gateway.settings import GatewaySettings
from store import AttachmentHolder, Lease, OpenStatus, Reaped, Scripts, SessionPolicy
from store.keys import SessionKeys, WorkerKeys, new_session_id, new_worker_id
from store.logs import read_output
from store.pubsub import Subscriber
from store.pushes import Push, SessionEnded

T = TypeVar("T")

EPOCH = "epoch-1"


def make_policy(**changes: int) -> SessionPolicy:
    """The limits the default gateway settings set, with ``changes``."""
    return dataclasses.replace(session_policy(GatewaySettings()), **changes)


#: Long enough that nothing expires during a test unless the test asks for it.
LONG_POLICY = make_policy(disconnect_grace_ms=60_000, idle_ttl_ms=600_000)
POLL_DEADLINE_S = 5.0

Client = Redis | RedisCluster


def ev(n: int) -> bytes:
    """A small encoded output event, distinguishable by ``n``."""
    return encode_message(AudioDelta(response_id="r", item_id="i", output_index=0,
                                     content_index=0, audio=n.to_bytes(4, "big")))


def digest(token: str) -> str:
    """The SHA-256 hex digest the store keeps instead of a resume token."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Opened:
    """A session opened by a test: its first lease and resume token."""

    lease: Lease
    token: str

    @property
    def session_id(self) -> str:
        """The session id."""
        return self.lease.session_id


async def register_worker(
    scripts: Scripts, *, slots: int = 4, ttl_ms: int = 60_000, worker_id: str | None = None,
    models: Sequence[str] = ("loopback",), pulls: bool = False,
) -> str:
    """Register a fresh live worker serving ``models`` and return its id (``pulls``: one
    that reads its input itself, so no push goes with it)."""
    wid = worker_id or new_worker_id(pulls_input=pulls)
    beat = await scripts.worker_heartbeat(wid, slots=slots, ttl_ms=ttl_ms, register=True,
                                          drain=False, models=models)
    assert beat.state == "live"
    return wid


async def open_session(
    scripts: Scripts, worker_id: str, *, policy: SessionPolicy = LONG_POLICY,
    tenant: str = "tenant-a", session_id: str | None = None,
    holder: AttachmentHolder | None = None,
) -> Opened:
    """Open a session on ``worker_id`` (attached under ``holder``'s lease, if given); the open
    must succeed."""
    sid = session_id or new_session_id(worker_id)
    token = secrets.token_urlsafe(16)
    status = await scripts.open_session(sid, epoch=EPOCH, token_digest=digest(token),
                                        tenant=tenant, policy=policy, holder=holder)
    assert status is OpenStatus.OK, status
    return Opened(Lease(session_id=sid, epoch=EPOCH, generation=1, tenant=tenant), token)


async def events_of(client: Client, session_id: str) -> list[tuple[int, Event]]:
    """Every output entry of a session, decoded, with its server_event_seq."""
    rows = await read_output(client, session_id, 0, count=100_000)
    decoded: list[tuple[int, Event]] = []
    for seq, data in rows:
        message = decode_message(data)
        decoded.append((seq, message))  # type: ignore[arg-type]
    return decoded


async def assert_one_terminal(
    client: Client, session_id: str, kind: str, reason: str
) -> list[tuple[int, Event]]:
    """The output log holds exactly one terminal event, it is last, and it is the expected one."""
    events = await events_of(client, session_id)
    terminals = [event for _, event in events if is_terminal(event)]
    assert len(terminals) == 1, terminals
    last = events[-1][1]
    assert is_terminal(last)
    assert last.KIND == kind
    assert getattr(last, "reason", None) == reason
    assert [seq for seq, _ in events] == list(range(events[0][0], events[-1][0] + 1))
    return events


async def session_field(client: Client, session_id: str, field: str) -> str | None:
    """One field of the session record, decoded."""
    value: Any = await client.hget(SessionKeys(session_id).record, field)
    return None if value is None else value.decode()


async def worker_field(client: Client, worker_id: str, field: str) -> str | None:
    """One field of the worker record, decoded."""
    value: Any = await client.hget(WorkerKeys(worker_id).record, field)
    return None if value is None else value.decode()


async def used_slots(client: Client, worker_id: str) -> int:
    """The worker's reserved slot count."""
    return int(await worker_field(client, worker_id, "used") or 0)


async def redis_now_ms(client: Client) -> int:
    """The Redis server clock in milliseconds (the clock every script uses)."""
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def wait_redis_clock_past(client: Client, deadline_ms: int) -> None:
    """Poll the Redis clock until it is strictly past ``deadline_ms`` (millisecond waits)."""
    give_up = time.monotonic() + POLL_DEADLINE_S
    while await redis_now_ms(client) <= deadline_ms:
        assert time.monotonic() < give_up, "Redis clock did not advance"
        await asyncio.sleep(0.001)


async def poll_until(
    attempt: Callable[[], Awaitable[T]], done: Callable[[T], bool],
    *, deadline_s: float = POLL_DEADLINE_S,
) -> list[T]:
    """Re-run ``attempt`` until ``done`` holds for its answer; every answer, in order."""
    answers: list[T] = []
    give_up = time.monotonic() + deadline_s
    while True:
        answer = await attempt()
        answers.append(answer)
        if done(answer):
            return answers
        assert time.monotonic() < give_up, f"condition not reached; answers: {answers[-3:]}"
        await asyncio.sleep(0.001)


def counts(reaped: Reaped) -> tuple[str, int]:
    """A reap's worker state and how many sessions it ended."""
    return reaped.state, reaped.ended


async def until(condition: Callable[[], bool | Awaitable[bool]], what: str,
                timeout: float = 10.0) -> None:
    """Poll a sync or async predicate until it holds, failing with ``what`` after ``timeout``
    seconds (a deadline, not a sleep: it returns as soon as the condition holds)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = condition()
        if not isinstance(answer, bool):
            answer = await answer
        if answer:
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)  # pacing the poll; the condition is what is awaited


async def reap_until_lost(scripts: Scripts, worker_id: str) -> int:
    """Reap until the worker is declared lost; how many sessions the reaps ended."""
    answers = await poll_until(lambda: scripts.reap(worker_id), lambda a: a.state == "lost")
    return sum(a.ended for a in answers)


async def reap_until_ended(scripts: Scripts, worker_id: str, expected: int) -> int:
    """Reap until ``expected`` sessions ended in total; the total (never more than asked)."""
    total = 0

    async def attempt() -> int:
        nonlocal total
        total += (await scripts.reap(worker_id)).ended
        return total

    await poll_until(attempt, lambda t: t >= expected)
    return total


async def expire_heartbeat(client: Client, scripts: Scripts, worker_id: str) -> None:
    """Renew the worker with a 1 ms TTL and wait until the Redis clock passes it."""
    slots = int(await worker_field(client, worker_id, "slots") or 0)
    beat = await scripts.worker_heartbeat(worker_id, slots=slots, ttl_ms=1, register=False,
                                          drain=False)
    await wait_redis_clock_past(client, beat.alive_until_ms)


async def spublish_raw(client: Client, channel: str, data: bytes) -> int:
    """Publish bytes on a shard channel; how many subscribers the server delivered them to."""
    receivers: Any = await client.execute_command("SPUBLISH", channel, data)
    return int(receivers)


async def spublish(client: Client, channel: str, notice: list[Any]) -> int:
    """Publish a MessagePack notice; how many subscribers the server delivered it to."""
    return await spublish_raw(client, channel, msgpack.packb(notice))


#: How long a test waits for a push notice.
NOTICE_WAIT_S = 5.0


class Notices:
    """A handler that queues every push, and waits for the next one."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Push | None] = asyncio.Queue()

    def __call__(self, notice: Push | None) -> None:
        self.queue.put_nowait(notice)

    async def next(self) -> Push | None:
        """The next notice; fails the test after NOTICE_WAIT_S."""
        return await asyncio.wait_for(self.queue.get(), NOTICE_WAIT_S)

    async def next_not_none(self) -> Push:
        """The next notice that is not a reconnect marker."""
        while True:
            notice = await self.next()
            if notice is not None:
                return notice

    def assert_empty(self) -> None:
        """Nothing arrived that was not consumed."""
        assert self.queue.empty(), self.queue.get_nowait()


# A push no script sends for a real session: what a channel got before it is all it got.
SENTINEL = SessionEnded("sentinel")


async def _pushes_before_sentinel(redis_client: Redis, channel: str,
                                  queue: asyncio.Queue[Push | None]) -> list[Push | None]:
    """Every push on ``channel`` before the sentinel (Redis delivers one channel's messages in
    the order it ran their publishes, so none that came first is missed)."""
    await spublish(redis_client, channel, [b"c", b"sentinel"])
    pushes: list[Push | None] = []
    while (push := await asyncio.wait_for(queue.get(), 10)) != SENTINEL:
        pushes.append(push)
    return pushes


@contextlib.asynccontextmanager
async def listening(redis_client: Redis, channel: str
                    ) -> AsyncIterator[Callable[[], Awaitable[list[Push | None]]]]:
    """Subscribed to ``channel`` for the block; what it yields reads every push so far."""
    subscriber = Subscriber(redis_client)
    await subscriber.start()
    queue: asyncio.Queue[Push | None] = asyncio.Queue()
    try:
        await subscriber.subscribe(channel, queue.put_nowait)
        yield lambda: _pushes_before_sentinel(redis_client, channel, queue)
    finally:
        await subscriber.aclose()


async def ran(client: Redis) -> dict[str, int]:
    """How many times Redis ran each command so far."""
    stats = await client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(stat["calls"]) for name, stat in stats.items()}


async def ran_since(client: Redis, before: dict[str, int], *commands: str) -> tuple[int, ...]:
    now = await ran(client)
    return tuple(now.get(command, 0) - before.get(command, 0) for command in commands)
