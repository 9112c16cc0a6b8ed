"""Reading the two per-session logs back (replay on resume, gap fill after a lost push)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from store.client import REDIS_ERRORS
from store.errors import StoreUnavailable, raise_if_cancelled
from store.keys import SessionKeys

__all__ = [
    "InputEntry",
    "LogEnds",
    "SessionStart",
    "WriteToken",
    "log_ends",
    "read_input",
    "read_input_entries",
    "read_output",
    "session_start",
]

# An input entry's fencing token is the field named this prefix plus the epoch, whose value is
# the generation (store/lua/append_input.lua: a field name costs nothing per entry).
_EPOCH_FIELD_PREFIX = b"e:"
# Entries an input log may hold ahead of what a reader has not applied: the applied ones
# before the worker's next trim (TRIM_EVERY in store/lua/prelude.lua) and a few fence markers.
_APPLIED_KEPT = 32


@dataclass(frozen=True, slots=True)
class WriteToken:
    """The fencing token an input entry was written under: the (store epoch, generation) of
    the lease that appended it (DESIGN §2.2)."""

    epoch: str
    generation: int


@dataclass(frozen=True, slots=True)
class InputEntry:
    """One input log entry: its index, the encoded command, the token it was written under
    (None: the entry carries none, so no lease vouches for it), and the write fence of its
    ID (``<fence>-<index>``, ``store/lua/prelude.lua``), which its trim names."""

    index: int
    payload: bytes
    token: WriteToken | None
    fence: int = 0


def _token_of(fields: dict[bytes, bytes]) -> WriteToken | None:
    """The fencing token stored with an input entry's fields, or None (none, or malformed)."""
    for name, value in fields.items():
        if name.startswith(_EPOCH_FIELD_PREFIX):
            try:
                return WriteToken(name[len(_EPOCH_FIELD_PREFIX):].decode(), int(value))
            except ValueError:  # not UTF-8, or not a number: no token to trust
                return None
    return None


async def _read(
    client: Redis | RedisCluster, key: str, after: int, count: int
) -> list[tuple[int, dict[bytes, bytes]]]:
    # Entry ids are "<index>-0", so an exclusive range start is the last index delivered.
    try:
        rows: Any = await client.xrange(key, min=f"({after}-0", max="+", count=count)
    except REDIS_ERRORS as exc:
        raise_if_cancelled()
        raise StoreUnavailable(f"XRANGE {key} failed: {exc}") from exc
    raise_if_cancelled()
    return [(int(entry_id.split(b"-", 1)[0]), fields) for entry_id, fields in rows]


async def read_output(
    client: Redis | RedisCluster, session_id: str, after_seq: int, count: int = 512
) -> list[tuple[int, bytes]]:
    """Output entries with ``server_event_seq > after_seq``, oldest first, at most ``count``."""
    rows = await _read(client, SessionKeys(session_id).output_log, after_seq, count)
    return [(seq, fields[b"d"]) for seq, fields in rows]


async def read_input_entries(
    client: Redis | RedisCluster, session_id: str, after_index: int, count: int = 512
) -> list[InputEntry]:
    """Input entries with index > ``after_index``, oldest first, at most ``count``, each with
    the fencing token it was written under (what the worker checks before applying it).

    Entry IDs are ``<fence>-<index>``, so the log is read from its start: it holds what the
    worker has not applied and at most a few entries it has (its trim keeps the last). The
    markers that raised the fence carry no command and are left out.
    """
    key = SessionKeys(session_id).input_log
    try:
        rows: Any = await client.xrange(key, min="-", max="+", count=count + _APPLIED_KEPT)
    except REDIS_ERRORS as exc:
        raise_if_cancelled()
        raise StoreUnavailable(f"XRANGE {key} failed: {exc}") from exc
    raise_if_cancelled()
    entries = []
    for entry_id, fields in rows:
        fence, index = (int(part) for part in entry_id.split(b"-", 1))
        payload = fields.get(b"d")
        if index > after_index and payload is not None:
            entries.append(InputEntry(index, payload, _token_of(fields), fence))
    return entries[:count]


async def read_input(
    client: Redis | RedisCluster, session_id: str, after_index: int, count: int = 512
) -> list[tuple[int, bytes]]:
    """Input entries with index > ``after_index``, oldest first, at most ``count``, as
    (index, command) pairs (:func:`read_input_entries` adds their tokens)."""
    entries = await read_input_entries(client, session_id, after_index, count)
    return [(entry.index, entry.payload) for entry in entries]


@dataclass(frozen=True, slots=True)
class LogEnds:
    """The last index of each log (0: nothing was ever appended, or the session is gone), and
    whether the input log exists (it does from the session's open to its end)."""

    last_input: int
    last_output: int
    input_log_exists: bool


async def log_ends(client: Redis | RedisCluster, session_id: str) -> LogEnds:
    """Where the two logs end: the input log's last entry (trims keep it) and the output
    log's number in the session record (trimming does not move it).

    A quiet reader compares them with its own position: a log that ends before what it
    already read went back (a failover lost acknowledged writes).
    """
    keys = SessionKeys(session_id)
    try:
        top: Any = await client.xrevrange(keys.input_log, max="+", min="-", count=1)
        out_seq: Any = await client.hget(keys.record, "out_seq")
    except REDIS_ERRORS as exc:
        raise StoreUnavailable(f"reading the ends of {session_id}'s logs failed: {exc}") from exc
    last_input = int(top[0][0].split(b"-", 1)[1]) if top else 0
    return LogEnds(last_input, int(out_seq or 0), input_log_exists=bool(top))


@dataclass(frozen=True, slots=True)
class SessionStart:
    """What a worker adopting a session reads of its record.

    Attributes:
        epoch: the record's store epoch (a record re-created after a failover lost it has
            another epoch than the one it had).
        model: the ``model`` its ``session.created`` announced (the name the client opened
            it with); None when the record holds no announced session.
        closed: the session ended; a late push or poll must not bring it back to life.
    """

    epoch: str
    model: str | None
    closed: bool = False


async def session_start(client: Redis | RedisCluster, session_id: str) -> SessionStart | None:
    """The epoch, announced model and end of the session's record (None: no record)."""
    key = SessionKeys(session_id).record
    try:
        fields: Any = await client.hmget(key, ["epoch", "session", "state"])
        epoch, session, state = fields
    except REDIS_ERRORS as exc:
        raise_if_cancelled()
        raise StoreUnavailable(f"HMGET {key} failed: {exc}") from exc
    raise_if_cancelled()
    if epoch is None:
        return None
    return SessionStart(epoch=epoch.decode(), model=_announced_model(session),
                        closed=state == b"closed")


def _announced_model(raw: Any) -> str | None:
    """The ``model`` of a record's stored session object (None: none, or not readable: the
    worker then names the session its own way)."""
    if raw is None:
        return None
    try:
        session = json.loads(raw)
    except ValueError:
        return None
    model = session.get("model") if isinstance(session, dict) else None
    return model if isinstance(model, str) and model else None
