"""The worker directory: who is alive, and how loaded, for placement and reaping.

The directory is a hint (it lives outside any worker's hash slot): placement reads it to pick
the least-loaded worker, then the open script re-checks liveness and capacity inside the
worker's own slot, so a stale directory can cost a retry, never a wrong placement.

For the reaper it is the list of workers to watch, so an entry is only ever removed by a
reaper that found the worker lost (or its record gone): a worker never removes itself, however
it ends, so a crashed one stays listed until its sessions have ended ``worker_lost``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from store.client import store_call
from store.keys import WORKER_DIRECTORY, WorkerKeys

__all__ = [
    "WorkerLoad",
    "announce_worker",
    "forget_worker",
    "list_workers",
    "listed_workers",
    "live_worker_count",
    "server_time_ms",
    "sessions_of_worker",
    "worker_loads",
]

# Placement looks at workers whose heartbeat deadline is at most this old (one that lapsed a
# moment ago may be beating again). The reaper must see every listed worker: listed_workers.
_LINGER_MS = 60_000


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerLoad:
    """One worker as placement sees it."""

    worker_id: str
    state: str
    slots: int
    used: int

    @property
    def free(self) -> int:
        """Free slots (never negative)."""
        return max(0, self.slots - self.used)


async def announce_worker(
    client: Redis | RedisCluster, worker_id: str, alive_until_ms: int
) -> None:
    """List the worker in the directory until its heartbeat deadline."""
    with store_call("ZADD directory"):
        await client.zadd(WORKER_DIRECTORY, {worker_id: alive_until_ms})


async def forget_worker(client: Redis | RedisCluster, worker_id: str) -> None:
    """Remove a worker from the directory, once a reap reported it lost or unknown."""
    with store_call("ZREM directory"):
        await client.zrem(WORKER_DIRECTORY, worker_id)


async def sessions_of_worker(client: Redis | RedisCluster, worker_id: str) -> list[str]:
    """The ids of the sessions placed on a worker and not ended yet."""
    key = WorkerKeys(worker_id).sessions
    with store_call(f"SMEMBERS {key}"):
        members: Any = await client.smembers(key)
    return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)


async def list_workers(client: Redis | RedisCluster, now_ms: int) -> list[str]:
    """The workers placement may consider: those that heartbeat within the last minute."""
    with store_call("ZRANGEBYSCORE directory"):
        members: Any = await client.zrangebyscore(WORKER_DIRECTORY, now_ms - _LINGER_MS, "+inf")
    return [m.decode() for m in members]


async def listed_workers(client: Redis | RedisCluster) -> list[str]:
    """Every worker in the directory, however long ago it last beat: what the reaper visits.

    A worker that died while no reaper could run (every gateway down, or Redis unreachable
    for longer than placement's linger) is still here, so it is still declared lost.
    """
    with store_call("ZRANGE directory"):
        members: Any = await client.zrange(WORKER_DIRECTORY, 0, -1)
    return [m.decode() for m in members]


async def live_worker_count(client: Redis | RedisCluster) -> int:
    """How many listed workers' heartbeat deadlines are still ahead on Redis's clock.

    What readiness asks on every probe, so it stays cheap: TIME and one ZCOUNT. A worker
    that beats but admits no one (draining, busy) still counts: placement may wait for it.
    """
    now_ms = await server_time_ms(client)
    with store_call("ZCOUNT directory"):
        count: Any = await client.zcount(WORKER_DIRECTORY, now_ms, "+inf")
    return int(count)


async def worker_loads(client: Redis | RedisCluster, worker_ids: list[str]) -> list[WorkerLoad]:
    """Load of each worker, least loaded (most free slots) first; lost ones left out."""
    loads: list[WorkerLoad] = []
    with store_call("reading worker loads"):
        # One pipeline: on a Cluster redis-py splits it by node.
        async with client.pipeline(transaction=False) as pipe:
            for worker_id in worker_ids:
                pipe.hmget(WorkerKeys(worker_id).record, "state", "slots", "used")
            rows = await pipe.execute()
    for worker_id, (state, slots, used) in zip(worker_ids, rows, strict=True):
        if state is None or state == b"lost":
            continue
        loads.append(WorkerLoad(worker_id=worker_id, state=state.decode(),
                                slots=int(slots or 0), used=int(used or 0)))
    loads.sort(key=lambda load: -load.free)
    return loads


async def server_time_ms(client: Redis | RedisCluster) -> int:
    """Redis's clock in ms: the one clock every deadline in the store is measured on."""
    with store_call("TIME"):
        answer: Any = await client.time()
    if isinstance(answer, dict):  # a Cluster answers per node; any node will do
        answer = next(iter(answer.values()))
    seconds, micros = answer
    return int(seconds) * 1000 + int(micros) // 1000
