"""Reading the two per-session logs back (replay on resume, gap fill after a lost push)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack  # type: ignore[import-untyped]
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.typing import KeyT, StreamIdT

from store.client import REDIS_ERRORS, store_call
from store.errors import StoreUnavailable, raise_if_cancelled
from store.formats import FORMAT_FIELD, SESSION_FORMAT
from store.keys import SessionKeys

__all__ = [
    "INPUT_TRIM_EVERY",
    "PACKED_FIELD",
    "InputEntry",
    "InputPosition",
    "LogEnds",
    "SessionStart",
    "WriteToken",
    "log_ends",
    "pack_commands",
    "pull_input",
    "read_input",
    "read_input_entries",
    "read_input_range",
    "read_output",
    "session_start",
]

_log = logging.getLogger(__name__)

# An input entry's fencing token is the field named this prefix plus the epoch, whose value is
# the generation (store/lua/append_input.lua: a field name costs nothing per entry).
_EPOCH_FIELD_PREFIX = b"e:"
#: The field of an input entry that holds several commands (``store/input_appends.py``): how
#: many its ``d`` packs (a MessagePack array), numbered up to the index of its ID. An entry
#: without it holds one command, its ``d`` that command.
PACKED_FIELD = "k"
_PACKED = PACKED_FIELD.encode()
#: A worker trims a session's input log to what it applied at least every this many commands
#: (and at once when the session goes quiet), so the log holds fewer applied entries than this.
INPUT_TRIM_EVERY = 16
# Entries an input log may hold ahead of what a reader has not applied: the applied ones
# before the worker's next trim and a few fence markers.
_APPLIED_KEPT = 2 * INPUT_TRIM_EVERY


@dataclass(frozen=True, slots=True)
class WriteToken:
    """The fencing token an input entry was written under: the (store epoch, generation) of
    the lease that appended it (DESIGN §2.2)."""

    epoch: str
    generation: int


@dataclass(frozen=True, slots=True)
class InputPosition:
    """Where a reader stands in an input log: the ID ``<fence>-<index>`` of the last entry it
    read (``0-0``: none)."""

    fence: int
    index: int


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
    client: Redis | RedisCluster, session_id: str, after_index: int, count: int = 512, *,
    after_fence: int = 0,
) -> list[InputEntry]:
    """Input entries with index > ``after_index``, oldest first, at most ``count``, each with
    the fencing token it was written under (what the worker checks before applying it).

    Entry IDs are ``<fence>-<index>`` and only grow (a fence marker takes the index of the
    entry before it, under a higher fence), so with the fence of entry ``after_index``
    (``after_fence``) the read starts right after it, however much applied input the log
    still holds (a checkpoint's, docs/design/hand-over.md); without it (0), from the log's
    start, reading up to a trim's worth of applied entries more. The markers that raised the
    fence carry no command and are left out.
    """
    key = SessionKeys(session_id).input_log
    start, extra = (f"({after_fence}-{after_index}", 0) if after_fence else ("-", _APPLIED_KEPT)
    try:
        rows: Any = await client.xrange(key, min=start, max="+", count=count + extra)
    except REDIS_ERRORS as exc:
        raise_if_cancelled()
        raise StoreUnavailable(f"XRANGE {key} failed: {exc}") from exc
    raise_if_cancelled()
    entries = [entry for entry_id, fields in rows
               for entry in _input_entries(entry_id, fields) if entry.index > after_index]
    return entries[:count]


async def read_input_range(client: Redis | RedisCluster, session_id: str, first: str,
                           last: str) -> list[InputEntry]:
    """The input entries from ID ``first`` to ``last`` (both ``<fence>-<index>``, both
    included), oldest first: what a worker taking a session over reads back of what its
    checkpoint applied (the input buffer's audio). A packed entry's commands before
    ``first``'s index are left out."""
    key = SessionKeys(session_id).input_log
    first_index = int(first.rsplit("-", 1)[1])
    with store_call(f"XRANGE {key}"):
        rows: Any = await client.xrange(key, min=first, max=last)
    return [entry for entry_id, fields in rows
            for entry in _input_entries(entry_id, fields) if entry.index >= first_index]


def pack_commands(payloads: Sequence[bytes]) -> bytes:
    """Several commands as one input entry's ``d`` (with :data:`PACKED_FIELD` their count)."""
    packed: bytes = msgpack.packb(list(payloads), use_bin_type=True)
    return packed


def _input_entries(entry_id: bytes, fields: dict[bytes, bytes]) -> list[InputEntry]:
    """The commands entry ``entry_id`` holds, one or several (none for a fence marker)."""
    fence, index = (int(part) for part in entry_id.split(b"-", 1))
    payload = fields.get(b"d")
    if payload is None:
        return []
    token, count = _token_of(fields), fields.get(_PACKED)
    if count is None:
        return [InputEntry(index, payload, token, fence)]
    try:
        commands = msgpack.unpackb(payload, raw=True)
        b"".join(commands)  # bytes, every one
        if len(commands) != int(count) or not commands:
            raise ValueError(f"{len(commands)} commands where {count!r} were packed")
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        # Only this code packs entries: a malformed one is taken as one command that no lease
        # vouches for, refused where it is applied; the indices it skips then read as a log
        # that went back, and the session ends (log_rewound), never silently short.
        _log.error("input entry %r of %s packs no commands: %r", entry_id, fence, exc)
        return [InputEntry(index, payload, None, fence)]
    first = index - len(commands) + 1
    return [InputEntry(first + offset, command, token, fence)
            for offset, command in enumerate(commands)]


async def pull_input(
    client: Redis | RedisCluster, after: Mapping[str, InputPosition], count: int = 256
) -> dict[str, list[InputEntry]]:
    """The input entries of several sessions of ONE worker (one hash slot) after the entry
    each names, oldest first, at most ``count`` a session, in one non-blocking ``XREAD``: a
    worker that reads its logs on its own clock (:func:`store.keys.worker_pulls_input`).

    Entry IDs only grow (a fence marker takes the index of the entry before it, under a
    higher fence), so what follows a position is what was written after it. The markers are
    left out; a log that is gone (its session ended) gives nothing.
    """
    if not after:
        return {}
    streams: dict[KeyT, StreamIdT] = {
        SessionKeys(session_id).input_log: f"{position.fence}-{position.index}"
        for session_id, position in after.items()}
    try:
        rows: Any = await client.xread(streams, count=count)
    except REDIS_ERRORS as exc:
        raise_if_cancelled()
        raise StoreUnavailable(f"XREAD of {len(streams)} input logs failed: {exc}") from exc
    raise_if_cancelled()
    by_key = {key: session_id for session_id, key in zip(after, streams, strict=True)}
    pulled: dict[str, list[InputEntry]] = {}
    for key, entries in rows or []:  # [key, entries] per log with new entries (RESP2)
        session_id = by_key[key.decode()]
        # A packed entry may hold commands at or before the position (read already).
        after_index = after[session_id].index
        found = [entry for entry_id, fields in entries
                 for entry in _input_entries(entry_id, fields) if entry.index > after_index]
        if found:
            pulled[session_id] = found
    return pulled



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
    """Where the two logs end: each log's last entry (trims keep it).

    A quiet reader compares them with its own position: a log that ends before what it
    already read went back (a failover lost acknowledged writes).
    """
    keys = SessionKeys(session_id)
    try:
        top_in: Any = await client.xrevrange(keys.input_log, max="+", min="-", count=1)
        top_out: Any = await client.xrevrange(keys.output_log, max="+", min="-", count=1)
    except REDIS_ERRORS as exc:
        raise StoreUnavailable(f"reading the ends of {session_id}'s logs failed: {exc}") from exc
    last_input = int(top_in[0][0].split(b"-", 1)[1]) if top_in else 0
    last_output = int(top_out[0][0].split(b"-", 1)[0]) if top_out else 0
    return LogEnds(last_input, last_output, input_log_exists=bool(top_in))


@dataclass(frozen=True, slots=True)
class SessionStart:
    """What a worker adopting a session reads of its record.

    Attributes:
        epoch: the record's store epoch (a record re-created after a failover lost it has
            another epoch than the one it had).
        model: the ``model`` its ``session.created`` announced (the name the client opened
            it with); None when the record holds no announced session.
        output_log_max_entries: the bound of its output log, which each append names.
        closed: the session ended; a late push or poll must not bring it back to life.
        other_format: the record is of another format (``store/formats.py``): written by
            other code, whose worker serves it; nothing else of it was read.
        input_fence: the input log's write fence now (``store/lua/prelude.lua``): 2g while
            generation g is attached, 2g + 1 once it detached.
        owner: the worker that serves it (None: a record written before owners were, served
            by the worker that opened it); another worker than the reader's took it over.
        owner_epoch: the owner epoch that worker serves it under; every write names it.
        input_log_max_entries: the gateway's bound on its input log's entries (0: the record
            does not say).
        input_log_max_bytes: the same in bytes (0: no bound, or the record does not say).
    """

    epoch: str
    model: str | None
    output_log_max_entries: int = 0
    closed: bool = False
    other_format: bool = False
    input_fence: int = 0
    owner: str | None = None
    owner_epoch: int = 1
    input_log_max_entries: int = 0
    input_log_max_bytes: int = 0


async def session_start(client: Redis | RedisCluster, session_id: str) -> SessionStart | None:
    """The epoch, announced model, output bound, input fence, owner and end of the session's
    record (None: no record)."""
    key = SessionKeys(session_id).record
    try:
        fields: Any = await client.hmget(key, ["epoch", "session", "state", "out_max",
                                               FORMAT_FIELD, "gen", "owner", "owner_epoch",
                                               "in_max", "in_max_bytes"])
        (epoch, session, state, out_max, version, generation, owner, owner_epoch, in_max,
         in_max_bytes) = fields
    except REDIS_ERRORS as exc:
        raise_if_cancelled()
        raise StoreUnavailable(f"HMGET {key} failed: {exc}") from exc
    raise_if_cancelled()
    if epoch is None:
        return None
    if version != SESSION_FORMAT.encode():
        return SessionStart(epoch="", model=None, other_format=True)
    return SessionStart(epoch=epoch.decode(), model=_announced_model(session),
                        output_log_max_entries=int(out_max), closed=state == b"closed",
                        input_fence=2 * int(generation or 0) + (state == b"detached"),
                        owner=None if owner is None else owner.decode(),
                        owner_epoch=int(owner_epoch or 1), input_log_max_entries=int(in_max or 0),
                        input_log_max_bytes=int(in_max_bytes or 0))


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
