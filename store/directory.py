"""The worker directory: who is alive, and how loaded, for placement and reaping.

The directory is a hint (it lives outside any worker's hash slot): placement reads it to pick
the least-loaded worker, then the open script re-checks liveness and capacity inside the
worker's own slot, so a stale directory can cost a retry, never a wrong placement.

For the reaper it is the list of workers to watch, so an entry is only ever removed by a
reaper that found the worker lost (or its record gone): a worker never removes itself, however
it ends, so a crashed one stays listed until its sessions have ended ``worker_lost``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from contract.messages import JsonObject
from contract.models import decode_models
from store.client import store_call
from store.formats import FORMAT_FIELD, WORKER_FORMAT
from store.keys import GATEWAY_DIRECTORY, WORKER_DIRECTORY, WorkerKeys

__all__ = [
    "MAX_PROFILE_BYTES",
    "ModelFleet",
    "WorkerLoad",
    "WorkerProfile",
    "announce_worker",
    "decode_profile",
    "fleet_models",
    "forget_worker",
    "list_workers",
    "listed_workers",
    "live_worker_count",
    "models_of_fleet",
    "server_time_ms",
    "sessions_of_worker",
    "unlist_gateway",
    "worker_loads",
]

# Placement looks at workers whose heartbeat deadline is at most this old (one that lapsed a
# moment ago may be beating again). The reaper must see every listed worker: listed_workers.
_LINGER_MS = 60_000

# A worker record's format, as a pipelined HMGET returns it.
_WORKER_FORMAT = WORKER_FORMAT.encode()


#: The largest profile a worker may publish: it is read with every placement's worker loads
#: and copied into every session record it opens, so it must stay small (one is about 1 KiB).
MAX_PROFILE_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerProfile:
    """What every new session on one worker starts with, published once when it registers.

    The worker owns the session object; the gateway announces it in ``session.created``
    before the worker has seen the session, so the worker says up front what it will be.
    Decoded profiles are shared between callers (see :func:`decode_profile`): read them,
    never mutate them.

    Attributes:
        session: the effective GA session object of a new session, without its ``id``.
        capabilities: what sessions on this worker's backend can do (the seed's
            ``DuplexCapabilities``).
    """

    session: JsonObject
    capabilities: JsonObject

    def encode(self) -> str:
        """The profile as the worker record holds it: one JSON text.

        Raises:
            ValueError: it is over :data:`MAX_PROFILE_BYTES`, or not JSON.
        """
        text = json.dumps({"session": self.session, "capabilities": self.capabilities},
                          separators=(",", ":"), allow_nan=False)
        size = len(text.encode())
        if size > MAX_PROFILE_BYTES:
            raise ValueError(f"the worker profile (its default session and capabilities) is"
                             f" {size} bytes, over the limit of {MAX_PROFILE_BYTES}")
        return text


# Workers of one backend publish the same profile, so placement, which reads every worker's
# on every open, decodes each distinct one once (keyed by its bytes).
@functools.lru_cache(maxsize=64)
def decode_profile(raw: bytes | None) -> WorkerProfile | None:
    """A worker record's profile field, decoded (shared: never mutate the result).

    None when there is none (its worker published no profile) or it is not a profile (only
    our workers write it: callers then fall back as for none).
    """
    if not raw:
        return None
    try:
        decoded = json.loads(raw)
    except ValueError:  # UnicodeDecodeError included
        return None
    if not isinstance(decoded, dict):
        return None
    session, capabilities = decoded.get("session"), decoded.get("capabilities")
    if not isinstance(session, dict) or not isinstance(capabilities, dict):
        return None
    return WorkerProfile(session=session, capabilities=capabilities)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerLoad:
    """One worker as placement sees it, with the profile its new sessions start with (None:
    it published none), the model names it serves (its own first: ``contract/models.py``), when
    it registered and until when its last heartbeat holds (Redis clock, ms; 0 unknown)."""

    worker_id: str
    state: str
    slots: int
    used: int
    profile: WorkerProfile | None = None
    models: tuple[str, ...] = ()
    since_ms: int = 0
    alive_until_ms: int = 0

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


async def unlist_gateway(client: Redis | RedisCluster, gateway_id: str) -> None:
    """Drop a gateway that stops from the gateway directory, so that the other reapers take
    its share of the workers at their next pass, not once its listing runs out."""
    with store_call("ZREM gateway directory"):
        await client.zrem(GATEWAY_DIRECTORY, gateway_id)


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


async def fleet_models(client: Redis | RedisCluster) -> dict[str, ModelFleet]:
    """The model names the fleet serves now, with their capacity (:func:`models_of_fleet`):
    what ``GET /v1/models`` and ``/readyz?detail=1`` show. One read of every listed worker's
    record: for operators and clients asking, not for every probe."""
    now_ms = await server_time_ms(client)
    return models_of_fleet(await worker_loads(client, await list_workers(client, now_ms)),
                           now_ms)


async def worker_loads(client: Redis | RedisCluster, worker_ids: list[str]) -> list[WorkerLoad]:
    """Load and profile of each worker, least loaded (most free slots) first; lost ones left
    out."""
    loads: list[WorkerLoad] = []
    with store_call("reading worker loads"):
        # One pipeline: on a Cluster redis-py splits it by node.
        async with client.pipeline(transaction=False) as pipe:
            for worker_id in worker_ids:
                pipe.hmget(WorkerKeys(worker_id).record, "state", "slots", "used", "profile",
                           "models", "since_ms", "alive_until", FORMAT_FIELD)
            rows = await pipe.execute()
    for worker_id, row in zip(worker_ids, rows, strict=True):
        state, slots, used, profile, models, since, alive_until, record_format = row
        # A record of another format is not read (the open script refuses it too).
        if state is None or state == b"lost" or record_format != _WORKER_FORMAT:
            continue
        loads.append(WorkerLoad(worker_id=worker_id, state=state.decode(),
                                slots=int(slots or 0), used=int(used or 0),
                                profile=decode_profile(profile), models=decode_models(models),
                                since_ms=int(since or 0), alive_until_ms=int(alive_until or 0)))
    loads.sort(key=lambda load: -load.free)
    return loads


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelFleet:
    """One model name as the fleet serves it now.

    Attributes:
        name: the model name.
        workers: workers listing it whose heartbeat holds (live, busy or draining).
        admitting: those of them that take new sessions (state ``live``).
        slots: slots of every such worker; used: sessions placed on them.
        free: free slots of the admitting workers: what new sessions of this model can take.
        capabilities: what its sessions can do (the profile of a worker serving it; None
            when none published one). Shared with the decoded profile: never mutate it.
        since_ms: when the longest-registered such worker registered (Redis clock, ms; 0
            unknown).
        root: the first name of the longest-registered such worker: ``name`` itself unless
            ``name`` is an alias.
    """

    name: str
    workers: int
    admitting: int
    slots: int
    used: int
    free: int
    capabilities: JsonObject | None
    since_ms: int
    root: str


def models_of_fleet(loads: Iterable[WorkerLoad], now_ms: int) -> dict[str, ModelFleet]:
    """Every model name the given workers serve while their heartbeat holds at ``now_ms``
    (Redis clock), with their capacity, sorted by name.

    A worker serving several names (aliases) counts under each: its slots are shared by
    all of them.
    """
    grouped: dict[str, list[WorkerLoad]] = {}
    for load in loads:
        if load.alive_until_ms < now_ms:
            continue  # lapsed: a reaper will declare it lost
        for name in load.models:
            grouped.setdefault(name, []).append(load)
    fleet: dict[str, ModelFleet] = {}
    for name in sorted(grouped):
        serving = grouped[name]
        admitting = [load for load in serving if load.state == "live"]
        profiled = next((load.profile for load in serving if load.profile is not None), None)
        # Unknown registration times (0) sort last.
        oldest = min(serving, key=lambda load: (load.since_ms == 0, load.since_ms))
        fleet[name] = ModelFleet(
            name=name, workers=len(serving), admitting=len(admitting),
            slots=sum(load.slots for load in serving), used=sum(load.used for load in serving),
            free=sum(load.free for load in admitting),
            capabilities=None if profiled is None else profiled.capabilities,
            since_ms=oldest.since_ms, root=oldest.models[0])
    return fleet


async def server_time_ms(client: Redis | RedisCluster) -> int:
    """Redis's clock in ms: the one clock every deadline in the store is measured on."""
    with store_call("TIME"):
        answer: Any = await client.time()
    if isinstance(answer, dict):  # a Cluster answers per node; any node will do
        answer = next(iter(answer.values()))
    seconds, micros = answer
    return int(seconds) * 1000 + int(micros) // 1000
