"""Reading the two per-session logs back (replay on resume, gap fill after a lost push)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from store.errors import StoreUnavailable, raise_if_cancelled
from store.keys import SessionKeys

__all__ = ["LogEnds", "log_ends", "read_input", "read_output"]


async def _read(
    client: Redis | RedisCluster, key: str, after: int, count: int
) -> list[tuple[int, bytes]]:
    # Entry ids are "<index>-0", so an exclusive range start is the last index delivered.
    try:
        rows: Any = await client.xrange(key, min=f"({after}-0", max="+", count=count)
    except RedisError as exc:
        raise_if_cancelled()
        raise StoreUnavailable(f"XRANGE {key} failed: {exc}") from exc
    raise_if_cancelled()
    return [(int(entry_id.split(b"-", 1)[0]), fields[b"d"]) for entry_id, fields in rows]


async def read_output(
    client: Redis | RedisCluster, session_id: str, after_seq: int, count: int = 512
) -> list[tuple[int, bytes]]:
    """Output entries with ``server_event_seq > after_seq``, oldest first, at most ``count``."""
    return await _read(client, SessionKeys(session_id).output_log, after_seq, count)


async def read_input(
    client: Redis | RedisCluster, session_id: str, after_index: int, count: int = 512
) -> list[tuple[int, bytes]]:
    """Input entries with index > ``after_index``, oldest first, at most ``count``."""
    return await _read(client, SessionKeys(session_id).input_log, after_index, count)


@dataclass(frozen=True, slots=True)
class LogEnds:
    """The last index of each log (0: nothing was ever appended, or the session is gone)."""

    last_input: int
    last_output: int


async def log_ends(client: Redis | RedisCluster, session_id: str) -> LogEnds:
    """Where the two logs end, from the session record (trimming does not move these).

    A quiet reader compares them with its own position: a log that ends before what it
    already read went back (a failover lost acknowledged writes).
    """
    key = SessionKeys(session_id).record
    try:
        fields: Any = await client.hmget(key, ["in_n", "out_seq"])
    except RedisError as exc:
        raise StoreUnavailable(f"HMGET {key} failed: {exc}") from exc
    return LogEnds(int(fields[0] or 0), int(fields[1] or 0))
