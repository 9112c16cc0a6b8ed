"""A read-only census of the store: every listed worker and the sessions placed on it.

What ``duplex-gateway status`` prints. It only reads, and stays bounded and Cluster-safe: the
directory names the workers; each worker's keys share its hash tag, so one worker is read at a
time, its record in one command, its session set with SSCAN a batch at a time and each batch's
session records with one pipeline of HMGETs (one node on a Cluster). Only counters are kept,
never the session ids, so a worker with many sessions costs rounds, not memory.

Closed sessions are not counted: a closed session leaves its worker's set, and its record,
kept for the replay retention, is indexed nowhere (counting them would take a SCAN of the
whole keyspace).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from contract.models import decode_models
from store.answers import WorkerState
from store.client import store_call
from store.directory import listed_workers, server_time_ms
from store.formats import FORMAT_FIELD, WORKER_FORMAT
from store.keys import SessionKeys, WorkerKeys

__all__ = [
    "IDLE_TICKS",
    "NO_ENGINE",
    "SCAN_BATCH",
    "Census",
    "ModelCensus",
    "SessionCounts",
    "TickTime",
    "WorkerCensus",
    "decode_tick",
    "encode_tick",
    "take_census",
    "worker_state",
]

#: Session ids asked per SSCAN round (a hint to Redis), and so records per pipeline.
SCAN_BATCH = 500

#: What a worker record's ``tick_p99_ms`` holds for an engine with too few recent ticks to take
#: a p99 of (an idle engine forgets its tick times); a number is the p99 in ms, '' no engine.
IDLE_TICKS = "idle"

# The worker record's fields the census reads, in this order.
_WORKER_FIELDS = ("state", "slots", "used", "alive_until", "ttl_ms", "backend", "tick_p99_ms",
                  "models", FORMAT_FIELD)
# The worker states in which a worker serves its sessions; ``live`` ones also take new ones.
_SERVING = frozenset({"live", "busy", "draining"})
# And each session record's.
_SESSION_FIELDS = ("state", "tenant", "gw")


@dataclass(frozen=True, slots=True, kw_only=True)
class TickTime:
    """What a worker's heartbeat said about its engine's tick time.

    Attributes:
        engine: whether the worker steps a frame engine (None: unknown, its record is gone
            or of another format).
        p99_ms: the rolling p99 tick time in ms (None: no engine, or too few recent ticks).
    """

    engine: bool | None
    p99_ms: float | None


#: A worker without a frame engine (the loopback): it has no tick time.
NO_ENGINE = TickTime(engine=False, p99_ms=None)


def encode_tick(tick: TickTime) -> str:
    """``tick`` as a heartbeat sends it (see store/lua/worker_heartbeat.lua)."""
    if not tick.engine:
        return ""
    return IDLE_TICKS if tick.p99_ms is None else f"{tick.p99_ms:.3f}"


def decode_tick(raw: bytes | None) -> TickTime:
    """A worker record's ``tick_p99_ms`` field, decoded (anything unreadable counts as
    unknown: only workers write it)."""
    if raw is None:
        return TickTime(engine=None, p99_ms=None)
    text = raw.decode(errors="replace")
    if text == "":
        return TickTime(engine=False, p99_ms=None)
    if text == IDLE_TICKS:
        return TickTime(engine=True, p99_ms=None)
    try:
        return TickTime(engine=True, p99_ms=float(text))
    except ValueError:
        return TickTime(engine=None, p99_ms=None)


def worker_state(stored: str | None, alive_until_ms: int, now_ms: int,
                 record_format: str = WORKER_FORMAT) -> str:
    """A worker's state as an operator needs it: the record's (live, busy, draining, lost),
    ``expired`` once its heartbeat deadline passed but no reaper declared it lost yet,
    ``gone`` when the directory lists it but its record is missing, or ``other_format`` when
    its record is of another format (nothing else of it is read)."""
    if stored is None:
        return "gone"
    if record_format != WORKER_FORMAT:
        return WorkerState.OTHER_FORMAT
    if stored != "lost" and alive_until_ms < now_ms:
        return "expired"
    return stored


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionCounts:
    """Sessions counted three ways (each a name -> count mapping, sorted by name).

    Attributes:
        by_state: attached, detached (and closed for one that ended as it was read).
        by_tenant: the record's tenant: ``anonymous`` without API keys, else a digest of
            the key the session counts against.
        by_gateway: the gateway id an attached session's connection is held by (a detached
            one is held by none, and is not counted here).
    """

    by_state: Mapping[str, int] = field(default_factory=dict)
    by_tenant: Mapping[str, int] = field(default_factory=dict)
    by_gateway: Mapping[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Every session counted."""
        return sum(self.by_state.values())

    @staticmethod
    def merged(parts: Sequence[SessionCounts]) -> SessionCounts:
        """The sum of several counts (one per worker)."""
        state: Counter[str] = Counter()
        tenant: Counter[str] = Counter()
        gateway: Counter[str] = Counter()
        for part in parts:
            state.update(part.by_state)
            tenant.update(part.by_tenant)
            gateway.update(part.by_gateway)
        return SessionCounts(by_state=_sorted(state), by_tenant=_sorted(tenant),
                             by_gateway=_sorted(gateway))


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerCensus:
    """One listed worker.

    Attributes:
        worker_id: its id.
        state: see :func:`worker_state`.
        backend: the backend it serves (None: its registration did not say).
        models: the model names it serves, its own first (none: its registration did not
            say).
        slots: the sessions it serves at most; used: the sessions placed on it.
        tick: its engine's tick time, as its last heartbeat said.
        heartbeat_age_ms: how long ago (Redis clock) it last beat (None: no record).
        sessions: the sessions placed on it and not closed.
    """

    worker_id: str
    state: str
    backend: str | None
    models: tuple[str, ...]
    slots: int
    used: int
    tick: TickTime
    heartbeat_age_ms: int | None
    sessions: SessionCounts


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCensus:
    """One model name across the workers that serve it now (live, busy or draining; a worker
    serving several names counts under each, its slots shared by them).

    Attributes:
        workers: such workers; admitting: those of them that take new sessions (``live``).
        slots: their slots; used: the sessions placed on them.
        free: the free slots of the admitting ones: what new sessions of the model can take.
    """

    workers: int
    admitting: int
    slots: int
    used: int
    free: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Census:
    """Every listed worker (by id) and their sessions, at ``now_ms`` on Redis's clock."""

    now_ms: int
    workers: tuple[WorkerCensus, ...]

    @property
    def sessions(self) -> SessionCounts:
        """The sessions of every worker together."""
        return SessionCounts.merged([worker.sessions for worker in self.workers])

    @property
    def models(self) -> dict[str, ModelCensus]:
        """Every model name a serving worker serves, sorted by name."""
        serving: dict[str, list[WorkerCensus]] = {}
        for worker in self.workers:
            if worker.state in _SERVING:
                for name in worker.models:
                    serving.setdefault(name, []).append(worker)
        return {name: ModelCensus(
            workers=len(group), admitting=sum(w.state == "live" for w in group),
            slots=sum(w.slots for w in group), used=sum(w.used for w in group),
            free=sum(max(0, w.slots - w.used) for w in group if w.state == "live"))
            for name, group in sorted(serving.items())}


async def take_census(client: Redis | RedisCluster, *,
                      batch: int = SCAN_BATCH) -> Census:
    """Read every worker in the directory, and its sessions, one worker at a time.

    Raises:
        StoreUnavailable: Redis did not answer (or refused a read).
    """
    now_ms = await server_time_ms(client)
    worker_ids = sorted(await listed_workers(client))
    workers = [await _worker_census(client, worker_id, now_ms, batch)
               for worker_id in worker_ids]
    return Census(now_ms=now_ms, workers=tuple(workers))


async def _worker_census(client: Redis | RedisCluster, worker_id: str, now_ms: int,
                         batch: int) -> WorkerCensus:
    keys = WorkerKeys(worker_id)
    with store_call(f"HMGET {keys.record}"):
        fields: Any = await client.hmget(keys.record, list(_WORKER_FIELDS))
    state, slots, used, alive_until, ttl_ms, backend, tick, models, record_format = fields
    stored_state = None if state is None else state.decode()
    if state is not None and _text(record_format or b"") != WORKER_FORMAT:
        # Another format's fields may mean something else: none of them is shown.
        return WorkerCensus(
            worker_id=worker_id, state=WorkerState.OTHER_FORMAT, backend=None, models=(),
            slots=0, used=0, tick=decode_tick(None), heartbeat_age_ms=None,
            sessions=SessionCounts())
    alive_until_ms = int(alive_until or 0)
    age = None if state is None else now_ms - (alive_until_ms - int(ttl_ms or 0))
    return WorkerCensus(
        worker_id=worker_id,
        state=worker_state(stored_state, alive_until_ms, now_ms),
        backend=backend.decode() if backend else None, models=decode_models(models),
        slots=int(slots or 0), used=int(used or 0), tick=decode_tick(tick),
        heartbeat_age_ms=None if age is None else max(0, age),
        sessions=await _sessions_of(client, keys, batch))


async def _sessions_of(client: Redis | RedisCluster, keys: WorkerKeys,
                       batch: int) -> SessionCounts:
    """Count one worker's sessions: SSCAN its set, HMGET each batch's records in a pipeline."""
    state: Counter[str] = Counter()
    tenant: Counter[str] = Counter()
    gateway: Counter[str] = Counter()
    cursor: int = 0
    while True:
        with store_call(f"SSCAN {keys.sessions}"):
            cursor, members = await client.sscan(keys.sessions, cursor, count=batch)
        for row in await _session_rows(client, [_text(m) for m in members]):
            session_state, session_tenant, held_by = row
            if session_state is None:  # ended and expired while we read: no longer a session
                continue
            state[session_state] += 1
            if session_tenant:
                tenant[session_tenant] += 1
            if session_state == "attached" and held_by:
                gateway[held_by] += 1
        if int(cursor) == 0:
            return SessionCounts(by_state=_sorted(state), by_tenant=_sorted(tenant),
                                 by_gateway=_sorted(gateway))


async def _session_rows(client: Redis | RedisCluster,
                        session_ids: list[str]) -> list[tuple[str | None, ...]]:
    """State, tenant and holding gateway of each session (None where its record is gone)."""
    if not session_ids:
        return []
    with store_call("reading session records"):
        # One worker's sessions share its slot: on a Cluster this pipeline goes to one node.
        async with client.pipeline(transaction=False) as pipe:
            for session_id in session_ids:
                pipe.hmget(SessionKeys(session_id).record, list(_SESSION_FIELDS))
            rows: Any = await pipe.execute()
    return [tuple(None if value is None else _text(value) for value in row) for row in rows]


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _sorted(counts: Counter[str]) -> dict[str, int]:
    return {name: counts[name] for name in sorted(counts)}
