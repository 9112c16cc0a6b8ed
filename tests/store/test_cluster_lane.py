"""store.cluster_lane: scripts on a real Cluster over the store's own connections, one per node.

The store's Cluster contract (``tests/store/test_cluster.py``) runs through this lane too; here:
what the lane itself promises while a slot moves between nodes under its calls (ASK while the
slot migrates, MOVED once it has, with no call lost or run twice) and after a node's master
fails over to its replica.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis import Redis as SyncRedis
from redis.asyncio.cluster import RedisCluster

from store import Scripts, StoreUnavailable, create_client
from store.cluster_lane import ClusterLane
from store.keys import SessionKeys, new_worker_id
from store.logs import read_input
from store.script_lane import RouteChanged
from tests.cluster import Cluster, start_cluster, wait_until
from tests.store._support import open_session, register_worker

#: One call appended to a list: what ran, and how often, is the list.
PUSH = "return redis.call('RPUSH', KEYS[1], ARGV[1])"
PUSH_SHA = hashlib.sha1(PUSH.encode()).hexdigest()
KEY = "{cluster-lane}:calls"
WAIT_S = 10.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Three primaries, each with a replica to fail over to."""
    running = start_cluster(masters=3, replicas_per_master=1)
    yield running
    running.stop()


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[RedisCluster]:
    made = create_client(cluster.url)
    assert isinstance(made, RedisCluster)
    await made.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield made
    await made.aclose()


@pytest.fixture
async def lane(client: RedisCluster) -> AsyncIterator[ClusterLane]:
    made = ClusterLane(client)
    yield made
    await made.aclose()


def node_command(port: int, *command: Any) -> Any:
    with SyncRedis(port=port) as node:
        return node.execute_command(*command)


async def push(lane: ClusterLane, call: str, kind: str = "script") -> int:
    """Append ``call`` by a script, or by a plain RPUSH in a MULTI (``kind``)."""
    if kind == "script":
        return int(await lane.evalsha(PUSH_SHA, PUSH, [KEY], [call]))
    (length,) = await lane.transaction(KEY, [["RPUSH", KEY, call]])
    return int(length)


@pytest.mark.parametrize("kind", ["script", "transaction"])
async def test_calls_follow_ask_while_a_slot_migrates_then_moved(
    cluster: Cluster, client: RedisCluster, lane: ClusterLane, kind: str,
) -> None:
    """While the slot migrates, a call whose key has left gets ASK and runs on the importing
    node after ASKING (a script's first there: NOSCRIPT, then EVAL after ASKING again; a
    MULTI's: ASKING before it holds until its EXEC), the map untouched; once the slot is the
    target's, the first call's MOVED updates the map and the rest go straight there. Every
    call ran exactly once."""
    slot = client.keyslot(KEY)
    source = cluster.port_serving(slot)
    target = next(port for port in cluster.primary_ports() if port != source)
    ids = {port: cluster.node_id(port) for port in (source, target)}
    calls = [f"call-{n}" for n in range(12)]
    await asyncio.to_thread(node_command, target, "SCRIPT", "FLUSH")

    for call in calls[:3]:
        await push(lane, call, kind)
    assert lane.redirections == {"moved": 0, "ask": 0}
    refreshes = lane.refreshes

    await asyncio.to_thread(node_command, target, "CLUSTER", "SETSLOT", slot, "IMPORTING",
                            ids[source])
    await asyncio.to_thread(node_command, source, "CLUSTER", "SETSLOT", slot, "MIGRATING",
                            ids[target])
    await push(lane, calls[3], kind)  # the key is still on the source: it runs there
    assert lane.redirections == {"moved": 0, "ask": 0}
    await asyncio.to_thread(node_command, source, "MIGRATE", "127.0.0.1", target, "", 0, 5000,
                            "KEYS", KEY)
    for call in calls[4:8]:
        await push(lane, call, kind)
    # Each call went to the source first (the map unchanged), which sent it on.
    assert lane.redirections == {"moved": 0, "ask": 4}
    assert lane.refreshes == refreshes

    for port in cluster.primary_ports():
        await asyncio.to_thread(node_command, port, "CLUSTER", "SETSLOT", slot, "NODE",
                                ids[target])
    for call in calls[8:]:
        await push(lane, call, kind)
    assert lane.redirections == {"moved": 1, "ask": 4}
    assert await client.lrange(KEY, 0, -1) == [call.encode() for call in calls]
    assert await asyncio.to_thread(node_command, target, "LLEN", KEY) == len(calls)


@pytest.mark.parametrize("pulls", [False, True], ids=["pushed worker", "pulling worker"])
async def test_session_calls_carry_on_while_their_slot_moves_back_and_forth(
    cluster: Cluster, client: RedisCluster, pulls: bool,
) -> None:
    """Sessions append input while their worker's slot is resharded between nodes, four
    times: every chunk lands once, in order; a call that met TRYAGAIN past the store's
    resends (the slot half moved) is sent again by its caller, and stored once all the same.
    The appends are plain MULTIs (store/input_appends.py; a pulling worker's packed, a pushed
    worker's with its push), redirected the same way."""
    scripts = Scripts(client, own_connection=True)
    try:
        worker = await register_worker(scripts, worker_id=new_worker_id(pulls_input=pulls),
                                       slots=8)
        opened = [await open_session(scripts, worker) for _ in range(4)]
        slot = client.keyslot(SessionKeys(opened[0].session_id).record)
        moving = asyncio.Event()
        progress = asyncio.Event()
        chunks = 0

        async def stream(index: int) -> None:
            nonlocal chunks
            seq = 0
            while moving.is_set() or seq < 5:
                seq += 1
                for _ in range(20):
                    try:
                        await scripts.append_input(opened[index].lease, [(seq, b"%d" % seq)],
                                                   max_entries=100_000)
                        break
                    except StoreUnavailable:
                        continue
                else:
                    raise AssertionError(f"chunk {seq} never landed")
                chunks += 1
                progress.set()

        async def reshard() -> None:
            moving.set()
            try:
                for _ in range(4):
                    source = await asyncio.to_thread(cluster.port_serving, slot)
                    primaries = await asyncio.to_thread(cluster.primary_ports)
                    target = next(port for port in primaries if port != source)
                    await asyncio.to_thread(cluster.migrate_slot, slot, source, target)
                    goal = chunks + 8  # calls run on the slot's new node before it moves on
                    async with asyncio.timeout(WAIT_S):
                        while chunks < goal:
                            progress.clear()
                            await progress.wait()
            finally:
                moving.clear()

        await asyncio.gather(reshard(), *(stream(n) for n in range(len(opened))))
        stored = 0
        for session in opened:
            entries = await read_input(client, session.session_id, 0, count=100_000)
            assert [data for _, data in entries] == [b"%d" % seq
                                                     for seq in range(1, len(entries) + 1)]
            stored += len(entries)
        assert stored == chunks
        lane = scripts._lane
        assert isinstance(lane, ClusterLane)
        assert lane.redirections["moved"] >= 4  # the map follows each move by a MOVED
        # The appends went as plain MULTIs (a few by the script: a resend after TRYAGAIN).
        assert lane.calls["transaction"] > chunks // 2
    finally:
        await scripts.aclose()


async def test_calls_carry_on_after_a_failover(cluster: Cluster, client: RedisCluster,
                                               lane: ClusterLane) -> None:
    """The master serving the key hands over to its replica: the lane's calls reach the
    promoted node (MOVED from the demoted one, or a refresh after its connection ended),
    and the lane's route changes move, so a worker's next output append reads its logs'
    ends again (store/output_appends.py): the promoted node may lack what was answered."""
    slot = client.keyslot(KEY)
    before = cluster.port_serving(slot)
    assert await push(lane, "before") == 1
    routes = lane.route_changes
    replica = cluster.replica_of(before)
    await asyncio.to_thread(cluster.fail_over, replica)
    await asyncio.to_thread(wait_until, lambda: cluster.port_serving(slot) == replica,
                            "the replica to serve the slot")
    # The demoted master answers MOVED (its connection stays up): no call fails.
    for attempt in range(2, 6):
        assert await push(lane, f"after-{attempt}") == attempt
    assert lane.redirections["moved"] == 1
    assert lane.route_changes > routes
    assert await asyncio.to_thread(node_command, replica, "LLEN", KEY) == 5


async def test_a_call_for_a_route_goes_only_while_it_stands(cluster: Cluster,
                                                             client: RedisCluster,
                                                             lane: ClusterLane) -> None:
    """A script call for the route the lane stood at is sent; once a connection was made
    since (another node's first call), one for the older route is refused unsent
    (store/output_appends.py sends the fast output flush so)."""
    assert await push(lane, "first") == 1
    routes = lane.route_changes
    assert int(await lane.evalsha(PUSH_SHA, PUSH, [KEY], ["on the route"], route=routes)) == 2
    other = next(f"{{other-{n}}}:calls" for n in range(1000)
                 if client.keyslot(f"{{other-{n}}}:calls") != client.keyslot(KEY)
                 and cluster.port_serving(client.keyslot(f"{{other-{n}}}:calls"))
                 != cluster.port_serving(client.keyslot(KEY)))
    await lane.evalsha(PUSH_SHA, PUSH, [other], ["elsewhere"])  # a new node's connection
    assert lane.route_changes > routes
    with pytest.raises(RouteChanged):
        await lane.evalsha(PUSH_SHA, PUSH, [KEY], ["off the route"], route=routes)
    assert await push(lane, "last") == 3
