"""The call shapes ``bench calls`` measures: each call carries one chunk (or, on output, one
event) of every session in its group, as a gateway's or a worker's call would.

- the bare ``SPUBLISH``: the floor of any design that sends each chunk through Redis in its
  own call;
- the store's input script (``APPEND_INPUT``) and output flush (``APPEND_OUTPUT``), through
  :class:`store.Scripts`, on sessions set up as the open script leaves them; the input script
  also to a worker that pulls its input (no push; the worker's one ``XREAD`` of all its
  sessions per 80 ms tick runs beside it, as a frame backend's worker reads);
- the store's plain input append (``store/input_appends.py``): a ``MULTI`` of the XADDs the
  script would run, on the store's own connection, what a gateway sends (the script is then
  its slow path): to a pushed worker with its push, to a pulling worker once with a chunk a
  call and once with 80 ms (four chunks) a call, packed in one entry a session;
- a plain ``MULTI {XADD ...; SPUBLISH}`` of the same entries under the same fence: the study's
  script-free input append, without the backlog bound, the lost-reply resend or the notice
  the script packs (the reference the input script is weighed against).
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from store import Lease, Scripts

__all__ = [
    "BARE_PUBLISH",
    "INPUT_SCRIPT",
    "OUTPUT_FLUSH",
    "PLAIN_INPUT",
    "PULLED_INPUT",
    "PULLED_PACKED_INPUT",
    "PULLED_PLAIN_INPUT",
    "PUSHED_PLAIN_INPUT",
    "SHAPES",
    "Shape",
    "check_appended",
    "prepare_sessions",
    "shape_call",
    "start_reader",
]

CHUNK_BYTES: Final = 960  # 20 ms of pcm16 at 24 kHz
#: The output log bound each flush names: the gateway's default (``output_log_max_entries``).
OUTPUT_LOG_MAX_ENTRIES: Final = 4096
_EPOCH, _TENANT = "bench", "bench"


@dataclass(frozen=True, slots=True)
class Shape:
    """One way of sending a chunk per session.

    Attributes:
        name: as the tables print it.
        sent: the commands (``INFO commandstats`` names) a call sends.
        scripted: whether the call is a script, whose commands Redis counts apart.
        output: whether it writes the output direction (subscribers on the sessions'
            output channels) rather than the input (one subscriber on the worker channel).
        pulled: the input goes to a worker that reads its logs on its own clock.
        own_connection: sent through :class:`store.Scripts` on the store's own connection
            (``store/script_lane.py``) rather than redis-py's.
        chunks_per_call: the chunks each session's part of a call carries (a call every
            that many chunk periods): more than one, a frame backend's 80 ms of input in
            one packed entry.
        carried: of ``sent``, the commands a ``MULTI`` carries: Redis runs them at the
            ``EXEC`` and charges their time to it as well as to their own names, so a call's
            execution counts them once, in the ``EXEC``.
    """

    name: str
    sent: frozenset[str]
    scripted: bool
    output: bool = False
    pulled: bool = False
    own_connection: bool = False
    chunks_per_call: int = 1
    carried: frozenset[str] = frozenset()

    @property
    def charged(self) -> frozenset[str]:
        """The commands whose ``INFO commandstats`` time is the calls' execution: what was
        sent, less what a transaction carried (counted in its ``EXEC``)."""
        return self.sent - self.carried


BARE_PUBLISH: Final = Shape("bare SPUBLISH, one per chunk", frozenset({"spublish"}), False)
INPUT_SCRIPT: Final = Shape("project input script (APPEND_INPUT)", frozenset({"evalsha"}),
                            True)
PULLED_INPUT: Final = Shape("project input script, pulling worker",
                            frozenset({"evalsha", "xread"}), True, pulled=True)
PUSHED_PLAIN_INPUT: Final = Shape("project plain input (MULTI {XADD; SPUBLISH}), pushed worker",
                                  frozenset({"multi", "xadd", "spublish", "exec"}), False,
                                  own_connection=True, carried=frozenset({"xadd", "spublish"}))
PULLED_PLAIN_INPUT: Final = Shape("project plain input (MULTI {XADD}), pulling worker",
                                  frozenset({"multi", "xadd", "exec", "xread"}), False,
                                  pulled=True, own_connection=True,
                                  carried=frozenset({"xadd"}))
PULLED_PACKED_INPUT: Final = Shape("project plain input, pulling worker, 80 ms a call",
                                   frozenset({"multi", "xadd", "exec", "xread"}), False,
                                   pulled=True, own_connection=True, chunks_per_call=4,
                                   carried=frozenset({"xadd"}))
PLAIN_INPUT: Final = Shape("plain MULTI {XADD; SPUBLISH} input",
                           frozenset({"multi", "xadd", "spublish", "exec"}), False,
                           carried=frozenset({"xadd", "spublish"}))
OUTPUT_FLUSH: Final = Shape("project output flush, full script (APPEND_OUTPUT)",
                            frozenset({"evalsha"}), True, output=True)
KNOWN_OUTPUT_FLUSH: Final = Shape("project output flush, log ends known (FLUSH_OUTPUT)",
                                  frozenset({"evalsha"}), True, output=True,
                                  own_connection=True)
FRAME_OUTPUT_FLUSH: Final = Shape("project output flush, log ends known, 80 ms a call",
                                  frozenset({"evalsha"}), True, output=True,
                                  own_connection=True, chunks_per_call=4)
#: Measured at every sessions-per-call split, in this order, after the bare publish.
SHAPES: Final = (INPUT_SCRIPT, PUSHED_PLAIN_INPUT, PULLED_INPUT, PULLED_PLAIN_INPUT,
                 PULLED_PACKED_INPUT, PLAIN_INPUT, OUTPUT_FLUSH, KNOWN_OUTPUT_FLUSH,
                 FRAME_OUTPUT_FLUSH)
#: A frame backend's tick, the pulling worker's clock.
TICK_S: Final = 0.08


async def prepare_sessions(client: Redis, worker_id: str, count: int) -> list[Lease]:
    """``count`` attached sessions of ``worker_id`` as the open script leaves them (the
    record; the input log with the first generation's fence marker, which the input script
    reads; the output log, empty), and their leases; the worker's record says it is live
    (the output flush reads that)."""
    from store import Lease
    from store.formats import FORMAT_FIELD, SESSION_FORMAT, WORKER_FORMAT
    from store.keys import SessionKeys, WorkerKeys, new_session_id

    await client.hset(WorkerKeys(worker_id).record,
                      mapping={FORMAT_FIELD: WORKER_FORMAT, "state": "live"})
    leases: list[Lease] = []
    for _ in range(count):
        session_id = new_session_id(worker_id)
        keys = SessionKeys(session_id)
        await client.hset(keys.record, mapping={
            FORMAT_FIELD: SESSION_FORMAT, "state": "attached", "epoch": _EPOCH, "gen": 1,
            "tenant": _TENANT})
        await client.xadd(keys.input_log, {"f": 2, "h": 0, f"e:{_EPOCH}": 0}, id="2-0")
        await client.xadd(keys.output_log, {"x": ""}, id="0-1")
        await client.xdel(keys.output_log, "0-1")
        leases.append(Lease(session_id=session_id, epoch=_EPOCH, generation=1, tenant=_TENANT))
    return leases


def shape_call(client: Redis, scripts: Scripts, shape: Shape, channel: str,
               groups: Sequence[Sequence[Lease]]) -> Callable[[int], Awaitable[None]]:
    """The call of ``shape`` for one group (by its index), through ``scripts`` where the
    shape is the store's (on its own connection when ``shape.own_connection``), each raising
    if Redis refused anything: a refusal would measure a cheaper path."""
    chunk = os.urandom(CHUNK_BYTES)
    if shape == BARE_PUBLISH:
        async def publish(group: int) -> None:
            await client.spublish(channel, chunk)
        return publish
    if shape in (INPUT_SCRIPT, PUSHED_PLAIN_INPUT, PULLED_INPUT, PULLED_PLAIN_INPUT,
                 PULLED_PACKED_INPUT):
        chunks = [(None, chunk)] * shape.chunks_per_call

        async def append(group: int) -> None:
            check_appended(await scripts.append_input_many(
                [(lease, chunks) for lease in groups[group]], max_entries=1 << 30),
                shape.chunks_per_call)
        return append
    if shape == PLAIN_INPUT:
        return _plain_input(client, channel, groups, chunk)
    if shape in (OUTPUT_FLUSH, KNOWN_OUTPUT_FLUSH, FRAME_OUTPUT_FLUSH):
        return _output_flush(scripts, groups, chunk * shape.chunks_per_call,
                             known=shape.own_connection)
    raise ValueError(f"no such shape: {shape.name}")


def _plain_input(client: Redis, channel: str, groups: Sequence[Sequence[Lease]],
                 chunk: bytes) -> Callable[[int], Awaitable[None]]:
    from store.keys import SessionKeys

    async def append(group: int) -> None:
        pipe = client.pipeline(transaction=True)
        for lease in groups[group]:
            pipe.xadd(SessionKeys(lease.session_id).input_log,
                      {"d": chunk, "h": 0, f"e:{lease.epoch}": lease.generation},
                      id=f"{2 * lease.generation}-*", nomkstream=True)
        pipe.spublish(channel, chunk)
        answers = await pipe.execute()
        if any(answer is None for answer in answers[:-1]):
            raise RuntimeError(f"a plain append found no input log: {answers}")
    return append


def _output_flush(scripts: Scripts, groups: Sequence[Sequence[Lease]], chunk: bytes, *,
                  known: bool) -> Callable[[int], Awaitable[None]]:
    """A worker's flush of one event a session, ``known``: with the log ends it learnt from
    its last flush, as the worker passes them (the fast script's path after the first)."""
    from store import OutputAppend

    event = (b'{"type":"response.output_audio.delta","delta":"'
             + base64.b64encode(chunk) + b'"}')
    next_seq = {lease.session_id: 1 for group in groups for lease in group}
    known_at: dict[str, int | None] = {}

    async def flush(group: int) -> None:
        batch = [OutputAppend(session_id=lease.session_id, events=[event],
                              first_seq=next_seq[lease.session_id],
                              output_log_max_entries=OUTPUT_LOG_MAX_ENTRIES,
                              top_known_at=known_at.get(lease.session_id))
                 for lease in groups[group]]
        routes = scripts.route_changes
        answers = await scripts.append_output_many(batch)
        for item, answer in zip(batch, answers, strict=True):
            if answer != item.first_seq:
                raise RuntimeError(f"the output flush refused the bench's session: {answer}")
            next_seq[item.session_id] += 1
            if known and scripts.route_changes == routes:
                known_at[item.session_id] = routes
    return flush


async def start_reader(client: Redis, shape: Shape, channel: str, leases: Sequence[Lease]
                       ) -> asyncio.Task[None]:
    """What reads the shape's writes until cancelled, subscribed before it returns: the
    worker (its channel's pushes, or one pull of every session per tick), or on output each
    session's gateway."""
    from store.keys import SessionKeys
    from store.logs import InputPosition, pull_input

    if shape.pulled:
        positions = {lease.session_id: InputPosition(0, 0) for lease in leases}

        async def pull() -> None:
            while True:
                for session_id, entries in (await pull_input(client, positions)).items():
                    positions[session_id] = InputPosition(entries[-1].fence,
                                                          entries[-1].index)
                await asyncio.sleep(TICK_S)
        return asyncio.create_task(pull())
    subscriber = client.pubsub()
    await subscriber.ssubscribe(*([SessionKeys(lease.session_id).output_channel
                                   for lease in leases] if shape.output else [channel]))

    async def drain() -> None:
        try:
            while True:
                await subscriber.get_message(timeout=1.0)
        finally:
            await subscriber.aclose()
    return asyncio.create_task(drain())


def check_appended(outcomes: Sequence[object], chunks: int = 1) -> None:
    """Every session of the call appended its ``chunks``."""
    from store import AppendResult

    if not all(isinstance(o, AppendResult) and o.appended == chunks for o in outcomes):
        raise RuntimeError(f"the input script refused the bench's sessions: {outcomes}")
