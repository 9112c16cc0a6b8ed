"""The store on a real 3-node Redis Cluster: every script is single-slot, pub/sub is sharded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster

from contract.messages import SessionClosed, encode_message
from contract.reasons import CloseReason
from store import (
    AttachmentHolder,
    LeaseLost,
    OpenStatus,
    OutputAppend,
    ResumeStatus,
    Scripts,
    create_client,
)
from store.census import TickTime, take_census
from store.directory import WorkerProfile, announce_worker, list_workers, worker_loads
from store.keys import (
    SessionKeys,
    WorkerKeys,
    new_gateway_id,
    new_session_id,
    new_worker_id,
    tenant_sessions,
)
from store.logs import InputPosition, pull_input, read_input, read_output
from store.pubsub import Subscriber
from store.pushes import OutputPushed, Push
from tests.cluster import Cluster, start_cluster
from tests.store._support import (
    EPOCH,
    assert_one_terminal,
    digest,
    ev,
    expire_heartbeat,
    make_policy,
    open_session,
    reap_until_ended,
    reap_until_lost,
    redis_now_ms,
    register_worker,
    used_slots,
)
from tests.store.conftest import CONNECTIONS

NODES = 3


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Three redis-server primaries joined into one cluster, all reporting cluster_state:ok."""
    running = start_cluster(masters=NODES)
    yield running
    running.stop()


@pytest.fixture
async def cluster_client(cluster: Cluster) -> AsyncIterator[RedisCluster]:
    """A cluster client (from the store's own factory) on a flushed cluster."""
    client = create_client(cluster.url)
    assert isinstance(client, RedisCluster)
    await client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    await client.aclose()


@pytest.fixture(params=CONNECTIONS)
async def scripts(cluster_client: RedisCluster, request: pytest.FixtureRequest,
                  ) -> AsyncIterator[Scripts]:
    """The store's scripts on the Cluster: through redis-py's cluster client, and through the
    store's own connections, one per node (``store/cluster_lane.py``)."""
    registered = Scripts(cluster_client, own_connection=request.param == "own")
    yield registered
    await registered.aclose()


def node_of(client: RedisCluster, key: str) -> str:
    """The name of the primary that serves ``key``."""
    node: Any = client.get_node_from_key(key)
    return str(node.name)


async def workers_on_every_node(client: RedisCluster, scripts: Scripts, *,
                                pulls_input: bool = False) -> dict[str, str]:
    """Register fresh workers until every node serves at least one; worker id -> node."""
    placed: dict[str, str] = {}
    for _ in range(200):
        wid = new_worker_id(pulls_input=pulls_input)
        node = node_of(client, WorkerKeys(wid).record)
        if node in placed.values():
            continue
        slot: Any = await client.execute_command("CLUSTER KEYSLOT", WorkerKeys(wid).record)
        assert int(slot) == client.keyslot(WorkerKeys(wid).record)
        await register_worker(scripts, worker_id=wid, slots=4)
        placed[wid] = node
        if len(placed) == NODES:
            return placed
    raise AssertionError(f"worker ids never covered every node: {placed}")


async def test_every_key_of_a_session_shares_one_slot(cluster_client: RedisCluster) -> None:
    """A session's keys, its worker's keys and both channels hash to the worker's slot."""
    wid = new_worker_id()
    keys = SessionKeys(new_session_id(wid))
    names = [keys.record, keys.input_log, keys.output_log, keys.output_channel, keys.abandoned,
             keys.worker.record, keys.worker.sessions, keys.worker.deadlines,
             keys.worker.input_channel, keys.worker.ended]
    assert {cluster_client.keyslot(name) for name in names} == {
        cluster_client.keyslot(keys.worker.record)}


async def test_session_lifecycle_on_every_node(
    cluster_client: RedisCluster, scripts: Scripts,
) -> None:
    """open/append/resume/detach/append_output/reap/close succeed on each node (no CROSSSLOT)."""
    workers = await workers_on_every_node(cluster_client, scripts)
    assert len(set(workers.values())) == NODES
    for wid in workers:
        opened = await open_session(scripts, wid, policy=make_policy(disconnect_grace_ms=0))
        sid = opened.session_id
        appended = await scripts.append_input(opened.lease, [(1, b"a"), (2, b"b")],
                                              max_entries=100)
        assert appended.appended == 2
        assert await read_input(cluster_client, sid, 0) == [(1, b"a"), (2, b"b")]
        assert await scripts.append_output(sid, [ev(1), ev(2)]) == 1
        resumed = await scripts.resume(sid, tenant="tenant-a",
                                       presented_digest=digest(opened.token),
                                       new_digest=digest("t2"), control_id="c1")
        assert resumed.status is ResumeStatus.OK and resumed.lease is not None
        assert (resumed.last_client_seq, resumed.last_server_event_seq) == (2, 2)
        with pytest.raises(LeaseLost):
            await scripts.append_input(opened.lease, [(3, b"c")], max_entries=100)
        assert await scripts.detach(opened.lease) == "stale"
        assert await scripts.detach(resumed.lease) == "ok"
        assert await scripts.append_output(sid, [ev(3)]) == 3
        assert await reap_until_ended(scripts, wid, 1) == 1
        await assert_one_terminal(cluster_client, sid, "session.expired",
                                  "disconnect_grace_expired")
        assert [seq for seq, _ in await read_output(cluster_client, sid, 0)] == [1, 2, 3, 4]

        closing = await open_session(scripts, wid)
        assert await scripts.close_session(closing.session_id, CloseReason.CLIENT_CLOSE) == "ok"
        assert await scripts.close_session(closing.session_id, CloseReason.CLIENT_CLOSE) == "closed"
        abandoned = new_session_id(wid)
        assert await scripts.abandon_open(abandoned) == "tombstoned"
        status = await scripts.open_session(abandoned, epoch=EPOCH, token_digest=digest("t"),
                                            tenant="t", policy=make_policy())
        assert status is OpenStatus.ABANDONED
        assert await used_slots(cluster_client, wid) == 0


async def test_a_pulling_worker_reads_all_its_sessions_in_one_xread_on_every_node(
    cluster_client: RedisCluster, scripts: Scripts,
) -> None:
    """A worker's input logs share its slot, so one XREAD of all of them is no CROSSSLOT on
    any node, and each session's entries come back past the position it names."""
    workers = await workers_on_every_node(cluster_client, scripts, pulls_input=True)
    for wid in workers:
        opened = [await open_session(scripts, wid) for _ in range(3)]
        for n, session in enumerate(opened):
            await scripts.append_input(session.lease, [(1, b"a%d" % n), (2, b"b%d" % n)],
                                       max_entries=100)
        pulled = await pull_input(cluster_client, {
            session.session_id: InputPosition(2, n) for n, session in enumerate(opened)})
        assert {sid: [entry.payload for entry in entries] for sid, entries in pulled.items()
                } == {opened[0].session_id: [b"a0", b"b0"], opened[1].session_id: [b"b1"]}


async def test_worker_lost_on_every_node(cluster_client: RedisCluster, scripts: Scripts) -> None:
    """The reaper declares workers lost on each node and ends their sessions once."""
    workers = await workers_on_every_node(cluster_client, scripts)
    sessions = {wid: [await open_session(scripts, wid) for _ in range(2)] for wid in workers}
    for wid in workers:
        await expire_heartbeat(cluster_client, scripts, wid)
    ended = await asyncio.gather(*(reap_until_lost(scripts, wid) for wid in workers))
    assert ended == [2] * NODES
    for wid, opened in sessions.items():
        assert await used_slots(cluster_client, wid) == 0
        for o in opened:
            await assert_one_terminal(cluster_client, o.session_id, "session.closed",
                                      "worker_lost")


async def test_directory_spans_nodes(cluster_client: RedisCluster, scripts: Scripts) -> None:
    """The worker directory and worker_loads read workers served by different nodes."""
    workers = await workers_on_every_node(cluster_client, scripts)
    busy = next(iter(workers))
    await open_session(scripts, busy)
    now = await redis_now_ms(cluster_client)
    for wid in workers:
        await announce_worker(cluster_client, wid, now + 60_000)
    listed = await list_workers(cluster_client, now)
    assert sorted(listed) == sorted(workers)
    loads = await worker_loads(cluster_client, listed)
    assert {load.worker_id: load.used for load in loads} == {w: int(w == busy) for w in workers}
    assert loads[-1].worker_id == busy
    assert all(load.slots == 4 and load.state == "live" for load in loads)


async def test_profiles_and_session_objects_on_every_node(
    cluster_client: RedisCluster, scripts: Scripts,
) -> None:
    """On each node a registration publishes the worker's profile, placement's pipelined read
    decodes every one, the open stores the session object, an output write replaces it, and
    a resume hands back the newest (all single-slot: no CROSSSLOT)."""
    workers = await workers_on_every_node(cluster_client, scripts)
    profiles = {wid: WorkerProfile(session={"type": "realtime", "model": wid},
                                   capabilities={"chunk_period_ms": 80}) for wid in workers}
    for wid, profile in profiles.items():
        await scripts.worker_heartbeat(wid, slots=4, ttl_ms=60_000, register=True, drain=False,
                                       profile=profile)
    loads = await worker_loads(cluster_client, list(workers))
    assert {load.worker_id: load.profile for load in loads} == profiles
    for wid, profile in profiles.items():
        sid = new_session_id(wid)
        created = {**profile.session, "id": sid}
        assert await scripts.open_session(
            sid, epoch=EPOCH, token_digest=digest("t"), tenant="tenant-a",
            policy=make_policy(), session=created,
            capabilities=profile.capabilities) is OpenStatus.OK
        updated = {**created, "instructions": "Be brief."}
        assert await scripts.append_output_many([OutputAppend(
            session_id=sid, events=[ev(1)], first_seq=1, session=updated)]) == [1]
        resumed = await scripts.resume(sid, tenant="tenant-a", presented_digest=digest("t"),
                                       new_digest=digest("t2"), control_id="c1")
        assert resumed.status is ResumeStatus.OK
        assert (resumed.session, resumed.capabilities) == (updated, profile.capabilities)


async def test_output_notice_through_sharded_pubsub(
    cluster_client: RedisCluster, scripts: Scripts,
) -> None:
    """The subscriber receives output and worker notices from sessions on every node."""
    workers = await workers_on_every_node(cluster_client, scripts)
    sub = Subscriber(cluster_client)
    await sub.start()
    try:
        queues: dict[str, asyncio.Queue[Push | None]] = {}
        opened = {}
        for wid in workers:
            opened[wid] = await open_session(scripts, wid)
            queue: asyncio.Queue[Push | None] = asyncio.Queue()
            queues[wid] = queue
            await sub.subscribe(SessionKeys(opened[wid].session_id).output_channel,
                                queue.put_nowait)
        for wid, o in opened.items():
            await scripts.append_output(o.session_id, [wid.encode()])
            await scripts.close_session(o.session_id, CloseReason.CLIENT_CLOSE)
        terminal = encode_message(SessionClosed(reason="client_close"))
        for wid, queue in queues.items():
            first = await asyncio.wait_for(queue.get(), 10)
            assert first == OutputPushed(1, [wid.encode()])
            assert await asyncio.wait_for(queue.get(), 10) == OutputPushed(2, [terminal])
    finally:
        await sub.aclose()


async def test_cluster_push_latency_is_not_bounded_by_the_poll_timeout(
    cluster_client: RedisCluster, scripts: Scripts,
) -> None:
    """A push from any node reaches an idle subscriber well within the 1 s poll timeout."""
    workers = await workers_on_every_node(cluster_client, scripts)
    sub = Subscriber(cluster_client)
    await sub.start()
    try:
        queue: asyncio.Queue[Push | None] = asyncio.Queue()
        sessions = []
        for wid in list(workers)[:2]:  # two nodes show it; more only cost time
            opened = await open_session(scripts, wid)
            sessions.append(opened.session_id)
            await sub.subscribe(SessionKeys(opened.session_id).output_channel, queue.put_nowait)
        # Against the reader's round-robin order, so a push waits on the other node's poll.
        for sid in reversed(sessions):
            await scripts.append_output(sid, [ev(1)])
            await asyncio.wait_for(queue.get(), 0.25)
    finally:
        await sub.aclose()


# Last in the module: it changes which node serves a slot for the tests after it.
async def test_subscription_follows_its_slot_to_another_node(
    cluster: Cluster, cluster_client: RedisCluster, scripts: Scripts,
) -> None:
    """Resharding moves a session's slot: the subscriber is told to re-read (None), then
    gets pushes from the slot's new node; the session's scripts carry on there."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    sub = Subscriber(cluster_client)
    await sub.start()
    try:
        queue: asyncio.Queue[Push | None] = asyncio.Queue()
        await sub.subscribe(SessionKeys(sid).output_channel, queue.put_nowait)
        assert await scripts.append_output(sid, [ev(1)], first_seq=1) == 1
        assert await asyncio.wait_for(queue.get(), 10) == OutputPushed(1, [ev(1)])

        slot = cluster_client.keyslot(SessionKeys(sid).record)
        source = int(str(node_of(cluster_client, SessionKeys(sid).record)).rsplit(":", 1)[1])
        target = next(n.port for n in cluster.masters if n.port != source)
        await asyncio.to_thread(cluster.migrate_slot, slot, source, target)

        assert await asyncio.wait_for(queue.get(), 10) is None  # moved: read the log
        assert await scripts.append_output(sid, [ev(2)], first_seq=2) == 2
        assert await asyncio.wait_for(queue.get(), 10) == OutputPushed(2, [ev(2)])
        assert [seq for seq, _ in await read_output(cluster_client, sid, 0)] == [1, 2]
        assert int(node_of(cluster_client, SessionKeys(sid).record).rsplit(":", 1)[1]) == target
    finally:
        await sub.aclose()


async def test_tenant_places_of_ended_sessions_are_released_across_nodes(
    cluster_client: RedisCluster, scripts: Scripts,
) -> None:
    """Sessions of tenants whose keys live on different nodes end on every node; one reap per
    worker hands them back and one pipelined release frees every place (no CROSSSLOT)."""
    workers = await workers_on_every_node(cluster_client, scripts)
    tenants = [f"tenant-{n}" for n in range(12)]
    assert len({node_of(cluster_client, tenant_sessions(t)) for t in tenants}) > 1
    for i, wid in enumerate(workers):
        for tenant in tenants[i::NODES]:
            opened = await open_session(scripts, wid, tenant=tenant)
            assert await scripts.reserve_tenant_slot(tenant, opened.session_id, cap=2,
                                                     lease_ms=60_000)
            await scripts.close_session(opened.session_id, CloseReason.CLIENT_CLOSE)
    released = [item for wid in workers for item in (await scripts.reap(wid)).released]
    assert sorted(item.tenant for item in released) == sorted(tenants)
    await scripts.release_tenant_slots(released)
    for tenant in tenants:
        assert await cluster_client.zcard(tenant_sessions(tenant)) == 0
    assert await scripts.count_tenant_open(tenants[0], limit=1, window_ms=60_000) == 0


# ------------------------------------------------------------------------------ the census
# Each worker's keys are read on the node that serves its hash tag, so workers spread over
# every node are all counted (no CROSSSLOT).

HOUR_MS = 3_600_000


def worker_ids_on_every_node(client: RedisCluster) -> list[str]:
    """Fresh worker ids, one whose keys live on each primary."""
    by_node: dict[str, str] = {}
    for _ in range(500):
        worker_id = new_worker_id()
        node: Any = client.get_node_from_key(WorkerKeys(worker_id).record)
        by_node.setdefault(str(node.name), worker_id)
        if len(by_node) == NODES:
            return sorted(by_node.values())
    raise AssertionError(f"worker ids never covered every node: {by_node}")


async def test_census_reads_workers_on_every_node(
    cluster_client: RedisCluster, scripts: Scripts,
) -> None:
    """A worker on each node, each with sessions of its own count (one detached), read in
    small SSCAN batches: every worker, backend and session is counted where it is."""
    holder = AttachmentHolder(gateway_id=new_gateway_id(), lease_ms=HOUR_MS)
    worker_ids = worker_ids_on_every_node(cluster_client)
    for count, worker_id in enumerate(worker_ids, start=2):
        beat = await scripts.worker_heartbeat(worker_id, slots=8, ttl_ms=HOUR_MS,
                                              register=True, drain=False, backend="fake",
                                              tick=TickTime(engine=True, p99_ms=float(count)))
        await announce_worker(cluster_client, worker_id, beat.alive_until_ms)
        opened = [await open_session(scripts, worker_id, tenant="t-a", holder=holder)
                  for _ in range(count)]
        assert await scripts.detach(opened[0].lease) == "ok"

    census = await take_census(cluster_client, batch=2)
    assert [worker.worker_id for worker in census.workers] == worker_ids
    for count, worker in enumerate(census.workers, start=2):
        assert (worker.state, worker.backend, worker.used) == ("live", "fake", count)
        assert worker.tick == TickTime(engine=True, p99_ms=float(count))
        assert dict(worker.sessions.by_state) == {"attached": count - 1, "detached": 1}
    total = sum(range(2, 2 + NODES))
    assert dict(census.sessions.by_state) == {"attached": total - NODES, "detached": NODES}
    assert dict(census.sessions.by_tenant) == {"t-a": total}
    assert dict(census.sessions.by_gateway) == {holder.gateway_id: total - NODES}
