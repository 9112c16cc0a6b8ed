"""Input entries carry the fencing token (store epoch, generation) of the lease that wrote
them, so the worker can check it again before applying (DESIGN §2.3)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from contract.messages import AppendAudio, Heartbeat, encode_message
from store import Scripts
from store.keys import SessionKeys
from store.logs import InputEntry, WriteToken, read_input, read_input_entries
from tests.store._support import EPOCH, digest, open_session, register_worker

#: What the token and the highest client seq ('h') may cost per entry in Redis's memory, at
#: most (DESIGN §5: the relay is the hot path). Stored as a field name, the epoch costs nothing
#: per entry; the generation and the seq a byte or two each, and the allocator rounds.
MAX_TOKEN_BYTES_PER_ENTRY = 12
ENTRIES = 1000


async def test_entries_carry_the_token_they_were_written_under(
    scripts: Scripts, redis_client: Redis
) -> None:
    """Entries appended before a resume carry generation 1, those after it generation 2, all
    under the record's epoch; read_input still gives (index, command) pairs."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    sid = opened.session_id
    await scripts.append_input(opened.lease, [(1, b"a"), (None, b"b")], max_entries=100)
    resumed = await scripts.resume(sid, tenant="tenant-a", presented_digest=digest(opened.token),
                                   new_digest=digest("t2"), control_id="c1")
    assert resumed.lease is not None and resumed.lease.generation == 2
    await scripts.append_input(resumed.lease, [(2, b"c")], max_entries=100)
    first, second = WriteToken(EPOCH, 1), WriteToken(EPOCH, 2)
    assert await read_input_entries(redis_client, sid, 0) == [
        InputEntry(1, b"a", first, fence=2), InputEntry(2, b"b", first, fence=2),
        InputEntry(3, b"c", second, fence=4)]
    assert await read_input_entries(redis_client, sid, 2) == [
        InputEntry(3, b"c", second, fence=4)]
    assert await read_input(redis_client, sid, 0) == [(1, b"a"), (2, b"b"), (3, b"c")]


async def test_an_entry_without_a_token_reads_back_without_one(
    scripts: Scripts, redis_client: Redis
) -> None:
    """An entry written around the script, with no token or a malformed one, reads back with
    token None (nothing vouches for it), never with a made-up one."""
    wid = await register_worker(scripts)
    opened = await open_session(scripts, wid)
    log = SessionKeys(opened.session_id).input_log
    await redis_client.xadd(log, {"d": b"bare"}, id="2-1")
    await redis_client.xadd(log, {"d": b"odd", f"e:{EPOCH}": "not-a-number"}, id="2-2")
    await redis_client.xadd(log, {"d": b"odd", b"e:\xff": "3"}, id="2-3")
    entries = await read_input_entries(redis_client, opened.session_id, 0)
    assert [(entry.payload, entry.token) for entry in entries] == [
        (b"bare", None), (b"odd", None), (b"odd", None)]


async def memory_per_entry(redis_client: Redis, key: str) -> float:
    """The memory one entry of the stream at ``key`` takes, on average."""
    used: Any = await redis_client.memory_usage(key, samples=0)
    return int(used) / ENTRIES


async def test_the_token_costs_a_few_bytes_per_entry(
    scripts: Scripts, redis_client: Redis
) -> None:
    """An input log written by the script takes at most a few bytes per entry more than the
    same commands stored without a token, for audio chunks and for small commands alike."""
    wid = await register_worker(scripts)
    commands = {"audio": encode_message(AppendAudio(audio=bytes(960))),
                "small": encode_message(Heartbeat())}
    for kind, command in commands.items():
        opened = await open_session(scripts, wid)
        for _ in range(ENTRIES // 100):
            await scripts.append_input(opened.lease, [(None, command)] * 100,
                                       max_entries=10 * ENTRIES)
        bare = f"bare:{kind}"
        for index in range(1, ENTRIES + 1):
            await redis_client.xadd(bare, {"d": command}, id=f"{index}-0")
        tokened = await memory_per_entry(redis_client, SessionKeys(opened.session_id).input_log)
        untokened = await memory_per_entry(redis_client, bare)
        print(f"{kind}: {untokened:.1f} bytes per entry bare, {tokened:.1f} with the token")
        assert tokened - untokened <= MAX_TOKEN_BYTES_PER_ENTRY, (kind, tokened, untokened)
