"""Gateways and workers as real processes on a real 3-master Redis Cluster (``redis+cluster://``).

The same promises as on one node, now with a session's keys on one master, the worker
directory and the tenants' keys on others, and sharded pub/sub: a turn plays back; a gateway
or a worker SIGKILLed, a lapsed attachment lease, racing resumes and the resharding of a live
session's slot lose, duplicate and reorder nothing. Every test counts both directions.

Last, on a cluster with replicas: the store's subscriptions follow their slot through
failovers, whether the old master was demoted or died; a live stream survives a failover of
its master with nothing lost; and when a master dies with writes its replica lacked, its
sessions are told (resync, then the end) while the other masters' sessions stream on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from redis import Redis as SyncRedis
from redis.asyncio.cluster import RedisCluster
from redis.cluster import RedisCluster as SyncRedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisError
from websockets.exceptions import ConnectionClosed

from duplex_client import DuplexClient, DuplexClientError, RealtimeEvent
from store import create_client
from store.keys import SessionKeys, WorkerKeys, new_session_id, new_worker_id, worker_of_session
from store.pubsub import Subscriber
from store.pushes import LeaseMoved, Push
from tests.cluster import Cluster, start_cluster, wait_until
from tests.e2e.conftest import FAST_ENV
from tests.e2e.helpers import (
    PUSH_TO_TALK_SESSION,
    STREAM_SESSION,
    chunk_index,
    collect_until,
    drain_echoes,
    marked_chunk,
    next_event,
)
from tests.e2e.stack import Proc, Stack
from tests.replication import wait_for_replica
from tests.store._support import assert_one_terminal, spublish, until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

#: The safety reads of both logs made rarer than any wait of these tests: a push that never
#: arrives (a subscription lost on some node, say) stalls the test instead of hiding behind
#: a poll.
PUSHES_ONLY_ENV = {
    "DUPLEX_GATEWAY_LOG_POLL_INTERVAL_S": "60",
    "DUPLEX_GATEWAY_INPUT_POLL_INTERVAL_S": "60",
}

#: The refusals a resume that lost a race may get: the winner rotated the token it presented,
#: or won the lease while this one was placing its own.
LOST_RACE_CODES = frozenset({"invalid_resume_token", "session_resume_conflict"})


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Three redis-server primaries in one cluster, shared by the module's tests."""
    running = start_cluster(masters=3)
    yield running
    running.stop()


@pytest.fixture
def cluster_stack(cluster: Cluster) -> Iterator[Stack]:
    """An empty stack whose processes are given the cluster's URL, on emptied primaries."""
    cluster.flushall()
    running = Stack(redis=cluster.masters[0], env=dict(FAST_ENV), redis_url=cluster.url)
    yield running
    running.stop()


@pytest.fixture
async def store(cluster_stack: Stack) -> AsyncIterator[RedisCluster]:
    """The test's own Cluster client (the store's factory, as the processes use)."""
    client = create_client(cluster_stack.url)
    assert isinstance(client, RedisCluster)
    yield client
    await client.aclose()


@dataclass(frozen=True, slots=True)
class Faults:
    """What went wrong in one session's events, by kind; all zero when nothing did."""

    lost: int
    duplicated: int
    reordered: int


def faults(numbers: list[int], expected: list[int]) -> Faults:
    """Compare what arrived, in arrival order, with what should have, in order."""
    counts = Counter(numbers)
    return Faults(
        lost=sum(1 for n in expected if n not in counts),
        duplicated=sum(count - 1 for count in counts.values() if count > 1),
        reordered=sum(1 for earlier, later in itertools.pairwise(numbers) if later < earlier),
    )


NO_FAULTS = Faults(lost=0, duplicated=0, reordered=0)


def event_faults(log: list[RealtimeEvent]) -> Faults:
    """Faults in the server_event_seq numbering of a session's events: 1, 2, 3, ..."""
    seqs = [e.server_event_seq for e in log if e.server_event_seq is not None]
    return faults(seqs, list(range(1, max(seqs, default=0) + 1)))


def echo_faults(log: list[RealtimeEvent], sent: int) -> Faults:
    """Faults in the echoes of the marked chunks 0 .. sent-1 (the upstream direction)."""
    echoed = [chunk_index(e.audio) for e in log if e.type == "response.output_audio.delta"]
    return faults(echoed, list(range(sent)))


async def stream_session(gateway: Proc) -> tuple[DuplexClient, list[RealtimeEvent]]:
    """A stream-mode session opened on ``gateway``, read up to its session.updated."""
    client = await DuplexClient.connect(gateway.ws_url, session=STREAM_SESSION)
    log: list[RealtimeEvent] = []
    await collect_until(client, "session.updated", log)
    return client, log


async def close_and_collect(client: DuplexClient, log: list[RealtimeEvent]) -> None:
    """End the session and read its events up to the terminal one."""
    await client.close()
    await collect_until(client, "session.closed", log)
    await client.aclose()


async def test_a_turn_plays_back_on_a_cluster(cluster_stack: Stack) -> None:
    """Turn mode on a Cluster: append, commit, response.create; response.done completes and
    the audio played back is the audio sent, every event numbered 1, 2, 3, ..."""
    gateway = cluster_stack.gateway()
    cluster_stack.worker(slots=2)
    sent = b"".join(marked_chunk(0, index) for index in range(10))
    client = await DuplexClient.connect(gateway.ws_url, session=PUSH_TO_TALK_SESSION)
    log: list[RealtimeEvent] = []
    await collect_until(client, "session.updated", log)
    await client.append_audio(sent)
    await client.commit()
    await client.create_response()
    done = await collect_until(client, "response.done", log)
    await close_and_collect(client, log)

    assert done.data["response"]["status"] == "completed"
    played = b"".join(e.audio for e in log if e.type == "response.output_audio.delta")
    assert played == sent
    assert event_faults(log) == NO_FAULTS
    assert [e.type for e in log].count("session.closed") == 1 and log[-1].type == "session.closed"


KILL_SESSIONS = 20
KILL_CHUNKS = 40


async def stream_across_a_gateway_kill(
    n: int, client: DuplexClient, log: list[RealtimeEvent], doomed: Proc, survivor: Proc,
    killed: asyncio.Event,
) -> None:
    """Send marked chunks (session 0 SIGKILLs ``doomed`` half way, echoes in flight), then
    read every echo, resuming through ``survivor`` when the connection drops."""
    for i in range(KILL_CHUNKS):
        if i == KILL_CHUNKS // 2:
            if n == 0:
                doomed.kill()
                killed.set()
            await killed.wait()  # every session sends its second half to a dead gateway
        await client.append_audio(marked_chunk(n, i))
        await asyncio.sleep(0.005)  # pacing the sender, not waiting for a condition
    echoes = sum(e.type == "response.output_audio.delta" for e in log)
    while echoes < KILL_CHUNKS:
        try:
            event = await next_event(client)
        except ConnectionClosed:  # not a read timeout: a stall must fail the test
            await client.resume(survivor.ws_url)
            continue
        log.append(event)
        echoes += event.type == "response.output_audio.delta"


async def test_gateway_sigkill_with_20_streams_resumes_every_session(
    cluster_stack: Stack,
) -> None:
    """20 stream-mode sessions on gateway A; A is SIGKILLed mid-stream. Every session resumes
    once through gateway B: 0 lost, 0 duplicated, 0 reordered, events and echoes both."""
    cluster_stack.env.update(PUSHES_ONLY_ENV)
    doomed, survivor = cluster_stack.gateway(), cluster_stack.gateway()
    cluster_stack.worker(slots=KILL_SESSIONS // 2)
    cluster_stack.worker(slots=KILL_SESSIONS // 2)  # two workers: more than one hash slot
    opened = [await stream_session(doomed) for _ in range(KILL_SESSIONS)]
    killed = asyncio.Event()
    await asyncio.gather(*(stream_across_a_gateway_kill(n, client, log, doomed, survivor, killed)
                           for n, (client, log) in enumerate(opened)))
    for n, (client, log) in enumerate(opened):
        assert client.generation == 2, f"session {n} resumed once, on gateway B"
        await close_and_collect(client, log)
        assert (n, event_faults(log)) == (n, NO_FAULTS)
        assert (n, echo_faults(log, KILL_CHUNKS)) == (n, NO_FAULTS)
        assert log[-1].type == "session.closed" and log[-1].data["reason"] == "client_close"


async def test_worker_sigkill_closes_every_session_worker_lost_once(
    cluster_stack: Stack, store: RedisCluster,
) -> None:
    """A worker with streaming sessions is SIGKILLed: each session gets exactly one
    session.closed worker_lost, last, after everything echoed before the kill; the dead
    worker's record says lost with no slot in use."""
    gateway = cluster_stack.gateway()
    worker = cluster_stack.worker(slots=4)
    opened = [await stream_session(gateway) for _ in range(4)]
    for n, (client, log) in enumerate(opened):
        for i in range(5):
            await client.append_audio(marked_chunk(n, i))
        await drain_echoes(client, log, 5)
    worker.kill()
    for n, (client, log) in enumerate(opened):
        closed = await collect_until(client, "session.closed", log, timeout=20)
        assert closed.data["reason"] == "worker_lost"
        with pytest.raises(ConnectionClosed):  # closed 1000 after its one terminal event
            log.append(await next_event(client))
        await client.aclose()
        assert [e.type for e in log].count("session.closed") == 1
        assert (n, event_faults(log)) == (n, NO_FAULTS)
        assert (n, echo_faults(log, 5)) == (n, NO_FAULTS)
    session_id = opened[0][0].session_id
    assert session_id is not None
    record = WorkerKeys(worker_of_session(session_id)).record

    async def released() -> bool:
        fields: Any = await store.hmget(record, "state", "used")
        return list(fields) == [b"lost", b"0"]

    await until(released, "the lost worker's slots to be released")


LEASE_S = 1.0
GRACE_S = 2.0
TEN_SECONDS = bytes(480_000)  # 10 s of pcm16 at 24 kHz: the model talks for 10 s


async def test_a_killed_gateways_session_is_detached_then_expires(
    cluster_stack: Stack, store: RedisCluster,
) -> None:
    """Gateway A is SIGKILLed while its session's model speaks and the client never comes
    back: B's reaper detaches the session once A's attachment lease lapses, the grace then
    expires it with exactly one terminal event, and its worker's only slot is free again."""
    cluster_stack.env["DUPLEX_GATEWAY_ATTACH_LEASE_S"] = str(LEASE_S)
    cluster_stack.env["DUPLEX_GATEWAY_DISCONNECT_GRACE_S"] = str(GRACE_S)
    doomed, survivor = cluster_stack.gateway(), cluster_stack.gateway()
    cluster_stack.worker(slots=1)
    client = await DuplexClient.connect(doomed.ws_url, session=PUSH_TO_TALK_SESSION)
    session_id = client.session_id
    assert session_id is not None
    log: list[RealtimeEvent] = []
    await collect_until(client, "session.updated", log)
    await client.append_audio(TEN_SECONDS)
    await client.commit()
    await client.create_response()
    await collect_until(client, "response.output_audio.delta", log)
    doomed.kill()

    async def state() -> list[bytes | None]:
        fields: Any = await store.hmget(SessionKeys(session_id).record, "state", "reason")
        return list(fields)

    async def detached() -> bool:
        return (await state())[0] == b"detached"

    async def expired() -> bool:
        return await state() == [b"closed", b"disconnect_grace_expired"]

    await until(detached, "the lapsed lease to detach the session", timeout=10)
    await until(expired, "the grace to expire", timeout=10)
    # One terminal event, last, in a log numbered without a gap (its delivered head may be
    # trimmed already); what the client read before the kill came once, in order.
    await assert_one_terminal(store, session_id, "session.expired", "disconnect_grace_expired")
    assert event_faults(log) == NO_FAULTS
    fresh = await DuplexClient.connect(survivor.ws_url)  # the one slot takes a new session
    assert fresh.session_id not in (None, session_id)
    await fresh.aclose()
    await client.drop_connection()


RACING_SESSIONS = 20
RACE_ROUNDS = 10  # 20 sessions x 10 rounds = 200 races


@dataclass
class Holder:
    """The connection that holds a racing session, and everything it has been told."""

    client: DuplexClient
    log: list[RealtimeEvent]


def contender(holder: DuplexClient, url: str) -> DuplexClient:
    """A second client for the same session, holding the same token and position (the same
    user on a new network, say)."""
    other = DuplexClient(url)
    other.session_id, other.resume_token = holder.session_id, holder.resume_token
    other.last_seq = holder.last_seq
    return other


async def race_resumes(n: int, holder: Holder, round_no: int, urls: tuple[str, str]) -> Holder:
    """Two contenders resume the session at once, one through each gateway. Exactly one
    wins; the loser is refused; the old holder is told session.replaced and closed; the
    winner gets every event after the old holder's position and an echo of a new chunk."""
    contenders = [contender(holder.client, url) for url in urls]
    answers = await asyncio.gather(*(c.resume() for c in contenders), return_exceptions=True)
    won = [c for c, a in zip(contenders, answers, strict=True) if not isinstance(a, Exception)]
    refused = [a for a in answers if isinstance(a, Exception)]
    assert len(won) == 1, f"session {n} round {round_no}: {answers}"
    assert all(isinstance(a, DuplexClientError) and a.code in LOST_RACE_CODES
               for a in refused), f"session {n} round {round_no}: {refused}"
    replaced = await next_event(holder.client)
    assert replaced.type == "session.replaced", replaced
    with pytest.raises(ConnectionClosed) as closed:
        await next_event(holder.client)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
    await holder.client.aclose()
    winner = Holder(won[0], holder.log)
    await winner.client.append_audio(marked_chunk(n, round_no))
    await drain_echoes(winner.client, winner.log, round_no + 1)
    return winner


async def race_a_session(n: int, holder: Holder, urls: tuple[str, str]) -> Holder:
    """Every round of races on one session, one after another."""
    for round_no in range(1, RACE_ROUNDS + 1):
        holder = await race_resumes(n, holder, round_no, urls)
    return holder


async def test_200_racing_resumes_through_two_gateways_have_one_winner_each(
    cluster_stack: Stack,
) -> None:
    """20 sessions, 10 rounds each: two clients resume the same session at the same moment
    through gateways A and B. Each race has exactly one winner, the loser is refused, the old
    connection is replaced, and across all rounds each session's events and echoes arrive
    once, in order."""
    cluster_stack.env.update(PUSHES_ONLY_ENV)
    gateways = (cluster_stack.gateway(), cluster_stack.gateway())
    cluster_stack.worker(slots=RACING_SESSIONS)
    urls = (gateways[0].ws_url, gateways[1].ws_url)
    holders = []
    for n in range(RACING_SESSIONS):
        client, log = await stream_session(gateways[n % 2])
        await client.append_audio(marked_chunk(n, 0))
        await drain_echoes(client, log, 1)
        holders.append(Holder(client, log))
    finals = await asyncio.gather(*(race_a_session(n, holder, urls)
                                    for n, holder in enumerate(holders)))
    for n, final in enumerate(finals):
        assert final.client.generation == 1 + RACE_ROUNDS
        await close_and_collect(final.client, final.log)
        assert (n, event_faults(final.log)) == (n, NO_FAULTS)
        assert (n, echo_faults(final.log, RACE_ROUNDS + 1)) == (n, NO_FAULTS)


LIVE_SESSIONS = 4
CHUNK_S = 0.02  # real time: one 20 ms chunk every 20 ms
ECHOES_BEFORE = 10
CHUNKS_AFTER = 25


@dataclass
class Stream:
    """One session streaming across a change of the Cluster: its client, its events, what it
    sent, and how many chunks it sends in all (known once the change is done)."""

    client: DuplexClient
    log: list[RealtimeEvent]
    sent: int = 0
    total: int | None = None
    #: Where to resume after a close with 1011 (a store call failed); None: never.
    resume_url: str | None = None
    resumes: int = 0

    def echoes(self) -> int:
        """How many audio echoes arrived so far."""
        return sum(e.type == "response.output_audio.delta" for e in self.log)


async def send_until_after(n: int, stream: Stream, changed: asyncio.Event) -> None:
    """Real-time marked chunks; CHUNKS_AFTER more once the change is done."""
    while stream.total is None or stream.sent < stream.total:
        await stream.client.append_audio(marked_chunk(n, stream.sent))
        stream.sent += 1
        if changed.is_set() and stream.total is None:
            stream.total = stream.sent + CHUNKS_AFTER
        await asyncio.sleep(CHUNK_S)  # pacing the sender, not waiting for a condition


async def read_every_echo(stream: Stream) -> None:
    """Read until every chunk the sender will send is echoed; on one connection throughout,
    unless the stream may resume after a 1011."""
    while stream.total is None or stream.echoes() < stream.total:
        try:
            stream.log.append(await next_event(stream.client))
        except ConnectionClosed as closed:
            if stream.resume_url is None or closed.rcvd is None or closed.rcvd.code != 1011:
                raise
            stream.resumes += 1
            await stream.client.resume(stream.resume_url)


async def stream_across(streams: list[Stream], change: Callable[[], None]) -> None:
    """Stream both ways on every session; once each has ECHOES_BEFORE echoes, run ``change``
    (blocking, so on a thread) beside the streams, which go on for CHUNKS_AFTER chunks after
    it."""
    changed = asyncio.Event()

    async def change_mid_stream() -> None:
        await until(lambda: all(s.echoes() >= ECHOES_BEFORE for s in streams),
                    "echoes before the change")
        await asyncio.to_thread(change)
        changed.set()

    await asyncio.gather(change_mid_stream(),
                         *(send_until_after(n, s, changed) for n, s in enumerate(streams)),
                         *(read_every_echo(s) for s in streams))


async def assert_streams_intact(streams: list[Stream]) -> None:
    """Each session kept its one connection (or resumed where its stream allows); closing
    it ends it; 0 lost, 0 duplicated, 0 reordered, events and echoes."""
    for n, stream in enumerate(streams):
        assert stream.client.generation == 1 + stream.resumes, f"session {n}: one connection"
        await close_and_collect(stream.client, stream.log)
        assert stream.log[-1].data["reason"] == "client_close"
        assert (n, event_faults(stream.log)) == (n, NO_FAULTS)
        assert (n, echo_faults(stream.log, stream.sent)) == (n, NO_FAULTS)


async def open_streams(stack: Stack, *, resumable: bool = False) -> tuple[list[Stream], int]:
    """LIVE_SESSIONS stream-mode sessions on one gateway and one worker, and the hash slot
    they share (their worker's). ``resumable``: each resumes on that gateway after a 1011."""
    gateway = stack.gateway()
    stack.worker(slots=LIVE_SESSIONS)
    resume_url = gateway.ws_url if resumable else None
    streams = [Stream(*await stream_session(gateway), resume_url=resume_url)
               for _ in range(LIVE_SESSIONS)]
    session_id = streams[0].client.session_id
    assert session_id is not None
    return streams, key_slot(SessionKeys(session_id).record.encode())


async def test_a_live_stream_survives_the_resharding_of_its_slot(
    cluster: Cluster, cluster_stack: Stack,
) -> None:
    """Sessions stream both ways in real time while their slot (their worker's) moves to
    another master: IMPORTING / MIGRATING, MIGRATE of every key, SETSLOT NODE everywhere.
    Pushes follow the slot (the logs' safety reads are a minute apart), the scripts run on
    the new master, and nothing is lost, duplicated or reordered, events or echoes."""
    cluster_stack.env.update(PUSHES_ONLY_ENV)
    streams, slot = await open_streams(cluster_stack)
    source = cluster.port_serving(slot)
    target = next(port for port in cluster.primary_ports() if port != source)
    await stream_across(streams, lambda: cluster.migrate_slot(slot, source, target))
    assert cluster.port_serving(slot) == target
    await assert_streams_intact(streams)


@pytest.fixture
def replicated() -> Iterator[tuple[Cluster, Stack]]:
    """A cluster of three primaries with a replica each (its own: a failover swaps roles) and
    an empty stack on it."""
    running = start_cluster(masters=3, replicas_per_master=1)
    # A heartbeat TTL of 2.5 s, not the suite's 1 s: a master's death stalls the Cluster
    # clients of every process for a moment while they learn the new slot map, and once in
    # some 25 runs (six sessions per worker) a busy worker on a healthy master missed a 1 s
    # TTL. The dead master's own workers are kept by the reapers' outage rule whatever the
    # TTL.
    env = {**FAST_ENV, "DUPLEX_GATEWAY_HEARTBEAT_TTL_S": "2.5"}
    stack = Stack(redis=running.masters[0], env=env, redis_url=running.url)
    yield running, stack
    stack.stop()
    running.stop()


@pytest.fixture
async def subscriber(replicated: tuple[Cluster, Stack],
                     ) -> AsyncIterator[tuple[Cluster, RedisCluster, Subscriber]]:
    """The store's Subscriber and a Cluster client, on the replicated cluster."""
    cluster, _ = replicated
    client = create_client(cluster.url)
    assert isinstance(client, RedisCluster)
    subscribing = Subscriber(client)
    yield cluster, client, subscribing
    await subscribing.aclose()
    await client.aclose()


async def publish_when_served(client: RedisCluster, channel: str, notice: list[Any]) -> None:
    """SPUBLISH ``notice`` until a subscriber gets it: the Cluster may still be failing over."""
    deadline = time.monotonic() + 20
    while True:
        with contextlib.suppress(RedisError, OSError):
            if await spublish(client, channel, notice) >= 1:
                return
        assert time.monotonic() < deadline, f"no subscriber got the push on {channel}"
        await asyncio.sleep(0.05)  # pacing the retries; the condition is what is awaited


def channels_on_every_primary(cluster: Cluster) -> dict[int, str]:
    """A session output channel for each primary, by the port of the primary serving it."""
    channels: dict[int, str] = {}
    while len(channels) < len(cluster.masters):
        channel = SessionKeys(new_session_id(new_worker_id())).output_channel
        channels.setdefault(cluster.port_serving(key_slot(channel.encode())), channel)
    return channels


async def test_subscriptions_follow_their_slots_through_failovers(
    subscriber: tuple[Cluster, RedisCluster, Subscriber],
) -> None:
    """Each master in turn, serving a subscribed channel, fails over to its replica: the
    demoted master drops the subscription, and the Subscriber subscribes on the promoted
    replica (not on the demoted master that a stale slot map may still name), tells the
    channel's handler to read the log (None), and the next push arrives."""
    cluster, client, subscribing = subscriber
    channels = channels_on_every_primary(cluster)
    queues: dict[int, asyncio.Queue[Push | None]] = {port: asyncio.Queue() for port in channels}
    for port, channel in channels.items():
        await subscribing.subscribe(channel, queues[port].put_nowait)
    for port, channel in channels.items():
        await asyncio.to_thread(cluster.fail_over, cluster.replica_of(port))
        assert await asyncio.wait_for(queues[port].get(), 10) is None, "dropped: read the log"
        await publish_when_served(client, channel, ["r", port])
        assert await asyncio.wait_for(queues[port].get(), 10) == LeaseMoved(port)


async def test_subscriptions_follow_their_slot_when_its_master_dies(
    subscriber: tuple[Cluster, RedisCluster, Subscriber],
) -> None:
    """The master serving a subscribed channel is SIGKILLed and the Cluster promotes its
    replica: a dead node says no SUNSUBSCRIBE, yet the Subscriber moves the channel to the
    promoted replica (instead of reconnecting to the dead address forever), tells its handler
    to read the log (None), and the next push arrives."""
    cluster, client, subscribing = subscriber
    primary, channel = next(iter(channels_on_every_primary(cluster).items()))
    queue: asyncio.Queue[Push | None] = asyncio.Queue()
    await subscribing.subscribe(channel, queue.put_nowait)
    replica = cluster.replica_of(primary)
    cluster.node(primary).process.kill()
    await asyncio.to_thread(wait_until, lambda: cluster.is_primary(replica),
                            "the Cluster to promote the replica")
    assert await asyncio.wait_for(queue.get(), 20) is None, "moved: read the log"
    await publish_when_served(client, channel, ["r", 1])
    assert await asyncio.wait_for(queue.get(), 10) == LeaseMoved(1)


async def test_a_live_stream_survives_a_failover_of_its_master(
    replicated: tuple[Cluster, Stack],
) -> None:
    """Sessions stream both ways in real time while the master serving their slot hands over
    to its replica (``CLUSTER FAILOVER``, as for maintenance): the scripts follow the slot to
    the promoted replica, the pushes are subscribed again there, and on the one connection
    each session had nothing is lost, duplicated or reordered, events or echoes."""
    cluster, stack = replicated
    stack.env.update(PUSHES_ONLY_ENV)
    streams, slot = await open_streams(stack)
    master = cluster.port_serving(slot)
    replica = cluster.replica_of(master)
    await stream_across(streams, lambda: cluster.fail_over(replica))
    assert cluster.port_serving(slot) == replica
    await assert_streams_intact(streams)


@dataclass
class Group:
    """Sessions opened on one worker, and the port of the master serving their slot."""

    master: int
    streams: list[Stream]


async def groups_on_two_masters(cluster: Cluster, stack: Stack, gateway: Proc) -> list[Group]:
    """Two sessions per worker, a worker at a time (each full before the next starts), until
    the sessions sit on two masters at least: the first group's master is the one to kill."""
    groups: list[Group] = []
    while len({g.master for g in groups}) < 2:
        assert len(groups) < 8, "every worker hashed to the same master"
        stack.worker(slots=2)
        streams = [Stream(*await stream_session(gateway)) for _ in range(2)]
        session_id = streams[0].client.session_id
        assert session_id is not None
        slot = key_slot(SessionKeys(session_id).record.encode())
        groups.append(Group(cluster.port_serving(slot), streams))
    return groups


async def stream_once_admitted(gateway: Proc) -> Stream:
    """A new stream-mode session, opened as a client does after an outage: an open refused
    ``resource_exhausted`` ("retry later": the promoted replica holds the workers'
    heartbeats as they were before the outage until each beats again) is tried again, within
    a deadline."""
    opened: list[Stream] = []

    async def opens() -> bool:
        try:
            opened.append(Stream(*await stream_session(gateway)))
        except DuplexClientError as exc:
            if exc.code != "resource_exhausted":
                raise
        return bool(opened)

    await until(opens, "a worker to admit a new session", timeout=20)
    return opened[0]


async def echo_chunks(n: int, stream: Stream, count: int) -> None:
    """Send ``count`` more marked chunks and read events until each is echoed."""
    for _ in range(count):
        await stream.client.append_audio(marked_chunk(n, stream.sent))
        stream.sent += 1
    await drain_echoes(stream.client, stream.log, stream.sent)


async def until_told(n: int, stream: Stream, live_port: int) -> None:
    """Read with the client's own resumes until the session's terminal event, appending a
    marked chunk every 50 ms meanwhile (so the gateway tries the store); a stall fails,
    saying where the session and the client stood."""
    async def keep_sending() -> None:
        while True:
            await stream.client.append_audio(marked_chunk(n, stream.sent))
            stream.sent += 1
            await asyncio.sleep(0.05)  # pacing the sender, not waiting for a condition

    sender = asyncio.create_task(keep_sending())
    try:
        async with asyncio.timeout(40):
            async for event in stream.client.events():
                stream.log.append(event)
    except TimeoutError as exc:
        session_id = stream.client.session_id or ""
        with SyncRedisCluster(host="127.0.0.1", port=live_port) as reader:  # not the dead one
            record: Any = reader.hmget(SessionKeys(session_id).record,
                                       ["state", "reason", "gen", "out_seq", "gw"])
        seen = [(e.type, e.server_event_seq, e.data.get("replay_from"))
                for e in stream.log[-6:]]
        raise AssertionError(
            f"session {n} ({session_id}) never told: client at seq {stream.client.last_seq},"
            f" generation {stream.client.generation}; record {record}; last events {seen}"
        ) from exc
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)


@pytest.mark.logs_errors
async def test_a_dead_master_ends_or_rewinds_its_sessions_never_silently(
    replicated: tuple[Cluster, Stack], capsys: pytest.CaptureFixture[str],
) -> None:
    """The master serving some sessions' slot is SIGKILLed while its replica lags, so writes
    it acknowledged (echoed chunks) exist nowhere else, and the Cluster promotes the replica.
    Each session on that slot is told, through the client's own resumes past the failover:
    session.resync_required log_rewound, then session.closed log_rewound, never a silent gap,
    and never worker_lost (the outage is seen per slot: the worker gets a TTL to beat again).
    The sessions on the other masters lose, duplicate and reorder nothing, on one connection,
    and a new session streams on the promoted replica."""
    cluster, stack = replicated
    gateway = stack.gateway()
    groups = await groups_on_two_masters(cluster, stack, gateway)
    victim = groups[0].master
    hit = [s for g in groups if g.master == victim for s in g.streams]
    spared = [s for g in groups if g.master != victim for s in g.streams]
    everyone = hit + spared
    await asyncio.gather(*(echo_chunks(n, s, 5) for n, s in enumerate(everyone)))
    replica = cluster.replica_of(victim)
    wait_for_replica(victim)
    with SyncRedis(port=victim) as master:
        # The replica stops, and the master drops its link: what follows is on the master only.
        cluster.node(replica).process.send_signal(signal.SIGSTOP)
        assert master.execute_command(
            "CLIENT", "KILL", "TYPE", "replica") == 1
    await asyncio.gather(*(echo_chunks(n, s, 10) for n, s in enumerate(hit)))
    delivered = [s.client.last_seq for s in hit]
    cluster.node(victim).process.kill()
    cluster.node(replica).process.send_signal(signal.SIGCONT)

    spared_after = [n + len(hit) for n in range(len(spared))]
    await asyncio.gather(
        asyncio.to_thread(wait_until, lambda: cluster.is_primary(replica),
                          "the Cluster to promote the replica"),
        *(until_told(n, s, replica) for n, s in enumerate(hit)),
        *(echo_chunks(n, s, 10) for n, s in zip(spared_after, spared, strict=True)))
    for n, s in zip(spared_after, spared, strict=True):
        await echo_chunks(n, s, 10)  # and on, once the replica serves

    for n, stream in enumerate(hit):
        kinds = [(e.type, e.data.get("reason")) for e in stream.log
                 if e.type in ("session.resync_required", "session.closed", "session.expired")]
        # Resynced first (once on the live connection, or once more after a resume), then
        # the one terminal event, last.
        *resyncs, terminal = kinds
        assert resyncs and set(resyncs) == {("session.resync_required", "log_rewound")}, (n, kinds)
        assert terminal == ("session.closed", "log_rewound") == (
            stream.log[-1].type, stream.log[-1].data["reason"]), (n, kinds)
        resync = next(e for e in stream.log if e.type == "session.resync_required")
        assert resync.data["replay_from"] <= delivered[n], "it names the rewound position"
    for n, stream in zip(spared_after, spared, strict=True):
        assert stream.client.generation == 1, f"session {n}: one connection"
        await close_and_collect(stream.client, stream.log)
        assert stream.log[-1].data["reason"] == "client_close"
        assert (n, event_faults(stream.log)) == (n, NO_FAULTS)
        assert (n, echo_faults(stream.log, stream.sent)) == (n, NO_FAULTS)
    fresh = await stream_once_admitted(gateway)
    await echo_chunks(0, fresh, 3)
    await close_and_collect(fresh.client, fresh.log)
    assert event_faults(fresh.log) == NO_FAULTS
    with capsys.disabled():
        print(f"\nmaster failover, lossy: {len(hit)} sessions rewound and ended log_rewound, "
              f"{len(spared)} on other masters intact (0 lost, 0 duplicated, 0 reordered)")
