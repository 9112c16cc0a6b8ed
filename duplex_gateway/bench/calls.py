"""``duplex-gateway bench calls``: what one Redis call per chunk costs, against chunks per call.

The relay's Redis targets (DESIGN §5: at most 30 us of Redis CPU per chunk, both directions)
are met in ``bench relay`` only once batching carries many sessions per call. This bench
isolates why: it runs the store's real input script (``APPEND_INPUT``, through
:meth:`store.Scripts.append_input_many`, on records set up for it) on an embedded Redis, with
one subscriber on the worker channel as a worker would have, at a fixed chunk rate
(``--sessions`` x 50 chunks a second, 20 ms pcm16 24 kHz chunks) while the number of sessions
per call varies, and reads Redis's own CPU time (``INFO cpu``) per chunk. Beside it, a bare
``SPUBLISH`` of each chunk, one call per chunk: the floor of any design that sends each chunk
through Redis in its own call, scripts or not. Then the client's side: the bench process's CPU
per call of the same script through redis-py (hiredis, on the running loop) and through the
store's own connection (``store/script_lane.py``, hiredis's reader on an asyncio protocol: what
the gateway and the worker use), one call at a time.

It prints two tables, writes JSON and a plot (Redis us per chunk against sessions per call,
the per-direction half of the target drawn as a line), asserts nothing about speed, and exits
0 (2 when it could not run, 130 when interrupted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from duplex_gateway.bench.kit import (
    output_help,
    output_path,
    positive_float,
    positive_int,
    positive_int_list,
)
from duplex_gateway.bench.svgplot import Chart, write_chart

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from store import Lease

__all__ = ["CallRow", "ClientRow", "add_arguments", "run_calls_bench"]

CHUNK_S: Final = 0.02
CHUNK_BYTES: Final = 960  # 20 ms of pcm16 at 24 kHz
#: DESIGN §5's Redis CPU per chunk, both directions; one direction gets half.
TARGET_US_PER_CHUNK: Final = 30.0
DEFAULT_PER_CALL: Final = (1, 2, 5, 10, 20)
_INPUT_SCRIPT: Final = "project input script (APPEND_INPUT)"
_BARE_PUBLISH: Final = "bare SPUBLISH, one per chunk"
_EPOCH, _TENANT = "bench", "bench"


@dataclass(frozen=True, slots=True)
class CallRow:
    """Redis CPU per chunk for one call shape.

    Attributes:
        redis_us_per_chunk: all of Redis's CPU (``INFO cpu``): reading calls, running them,
            replies and pushes.
        script_us_per_chunk: what ``INFO commandstats`` charges the script calls (0 for the
            bare publish): the commands they run plus the script's own Lua.
        commands_us_per_chunk: the part of that in the commands the script runs, by name in
            ``commands_us_per_chunk_by_name``.
    """

    shape: str
    sessions_per_call: int
    calls: int
    chunks: int
    redis_us_per_chunk: float
    redis_us_per_call: float
    script_us_per_chunk: float
    commands_us_per_chunk: float
    commands_us_per_chunk_by_name: dict[str, float]


@dataclass(frozen=True, slots=True)
class ClientRow:
    """The bench process's CPU per call of the input script, one session, one chunk."""

    client: str
    calls: int
    client_us_per_call: float


async def _redis_cpu_s(client: Redis) -> float:
    info: dict[str, Any] = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


# The bench's own commands, not the load's.
_NOT_LOAD: Final = frozenset({"info", "config|resetstat", "ssubscribe"})


async def _script_usec(client: Redis) -> tuple[float, dict[str, float]]:
    """Since the last ``CONFIG RESETSTAT``: the usec charged to EVALSHA, and to each command
    that scripts ran (Redis counts those under their own names, as if sent)."""
    stats: dict[str, Any] = await client.info("commandstats")
    usec = {name.removeprefix("cmdstat_"): float(row["usec"]) for name, row in stats.items()}
    inside = {name: value for name, value in usec.items()
              if name != "evalsha" and name not in _NOT_LOAD}
    return usec.get("evalsha", 0.0), inside


async def _sessions(client: Redis, worker_id: str, count: int) -> list[Lease]:
    """``count`` attached session records of ``worker_id``, as the open script leaves them
    (the fields the input script reads), and their leases."""
    from store import Lease
    from store.formats import FORMAT_FIELD, SESSION_FORMAT
    from store.keys import SessionKeys, new_session_id

    leases: list[Lease] = []
    for _ in range(count):
        session_id = new_session_id(worker_id)
        await client.hset(SessionKeys(session_id).record, mapping={
            FORMAT_FIELD: SESSION_FORMAT, "state": "attached", "epoch": _EPOCH, "gen": 1,
            "tenant": _TENANT, "in_n": 0, "in_done": 0, "cseq": 0})
        leases.append(Lease(session_id=session_id, epoch=_EPOCH, generation=1, tenant=_TENANT))
    return leases


async def _paced(callers: int, seconds: float, call: Callable[[int], Awaitable[None]]) -> int:
    """Run ``callers`` loops, each calling ``call(caller)`` every chunk period for
    ``seconds`` (an absolute schedule); the number of calls made."""
    loop = asyncio.get_running_loop()
    start, made = loop.time(), [0] * callers

    async def caller(index: int) -> None:
        n = 0
        while loop.time() < start + seconds:
            n += 1
            await call(index)
            made[index] += 1
            await asyncio.sleep(max(0.0, start + n * CHUNK_S - loop.time()))

    await asyncio.gather(*(caller(index) for index in range(callers)))
    return sum(made)


async def _measure_shape(client: Redis, shape: str, sessions: int, per_call: int,
                         seconds: float) -> CallRow:
    from store import Scripts
    from store.keys import WorkerKeys, new_worker_id

    worker_id = new_worker_id()
    channel = WorkerKeys(worker_id).input_channel
    subscriber = client.pubsub()
    await subscriber.ssubscribe(channel)

    async def drain() -> None:  # the worker's side of every push
        while True:
            await subscriber.get_message(timeout=1.0)

    reader = asyncio.create_task(drain())
    leases = await _sessions(client, worker_id, sessions)
    scripts, chunk = Scripts(client), os.urandom(CHUNK_BYTES)
    groups = [leases[i:i + per_call] for i in range(0, sessions, per_call)]

    async def call(caller: int) -> None:
        if shape == _BARE_PUBLISH:
            await client.spublish(channel, chunk)
            return
        _check_appended(await scripts.append_input_many(
            [(lease, [(None, chunk)]) for lease in groups[caller]], max_entries=1 << 30))

    try:
        await call(0)  # the script is loaded (SCRIPT LOAD) before the window, not in it
        await client.config_resetstat()
        before = await _redis_cpu_s(client)
        calls = await _paced(len(groups), seconds, call)
        used_s = await _redis_cpu_s(client) - before
        script_usec, inside = await _script_usec(client)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await subscriber.aclose()
        await client.flushall()
    chunks = calls * per_call  # every group holds per_call sessions, one chunk each
    if shape == _BARE_PUBLISH:
        inside = {}  # its SPUBLISH is the command sent, no script ran
    by_name = {name: usec / chunks for name, usec in sorted(inside.items())}
    return CallRow(shape, per_call, calls, chunks, used_s / chunks * 1e6, used_s / calls * 1e6,
                   script_usec / chunks, sum(by_name.values()), by_name)


def _check_appended(outcomes: Sequence[object]) -> None:
    """Every session of the call appended its chunk: a refusal would measure a cheaper path."""
    from store import AppendResult

    if not all(isinstance(o, AppendResult) and o.appended == 1 for o in outcomes):
        raise RuntimeError(f"the input script refused the bench's sessions: {outcomes}")


async def _measure_clients(client: Redis, calls: int) -> list[ClientRow]:
    """The input script with one session and one chunk, ``calls`` times through each of the
    store's two ways to Redis: redis-py's pool, and its own connection (what the gateway and
    the worker use, ``store/script_lane.py``)."""
    from store import Scripts
    from store.keys import new_worker_id

    [lease] = await _sessions(client, new_worker_id(), 1)
    chunk = os.urandom(CHUNK_BYTES)
    rows = []
    for name, own in (("redis-py (hiredis), through Scripts", False),
                      ("the store's own connection, through Scripts", True)):
        scripts = Scripts(client, own_connection=own)
        try:
            _check_appended(await scripts.append_input_many(  # connected, script loaded
                [(lease, [(None, chunk)])], max_entries=1 << 30))
            started = time.process_time()
            for _ in range(calls):
                _check_appended(await scripts.append_input_many([(lease, [(None, chunk)])],
                                                                max_entries=1 << 30))
            rows.append(ClientRow(name, calls, (time.process_time() - started) / calls * 1e6))
        finally:
            await scripts.aclose()
    await client.flushall()
    return rows


async def _run(sessions: int, per_call: Sequence[int], seconds: float, calls: int
               ) -> tuple[list[CallRow], list[ClientRow], dict[str, Any]]:
    from redis.asyncio import Redis

    from runtime.embedded import start_server

    server = start_server("auto")
    client = Redis(port=server.port)
    try:
        rows = [await _measure_shape(client, _BARE_PUBLISH, sessions, 1, seconds)]
        for count in per_call:
            rows.append(await _measure_shape(client, _INPUT_SCRIPT, sessions, count, seconds))
        clients = await _measure_clients(client, calls)
        version: dict[str, Any] = await client.info("server")
    finally:
        await client.aclose()
        server.stop()
    return rows, clients, {"server": f"{server.binary.name} {version.get('redis_version')}"}


def _format(report: dict[str, Any]) -> str:
    lines = [f"Redis CPU per chunk, one direction ({report['config']['sessions']} sessions x 50 "
             f"chunks/s; target {TARGET_US_PER_CHUNK / 2:g} us, half of DESIGN's round trip);"
             " of it, the script calls, and the commands they ran",
             f"{'shape':<40} {'sessions/call':>13} {'us/chunk':>9} {'script':>7} "
             f"{'commands':>8} {'us/call':>8}"]
    lines += [f"{row['shape']:<40} {row['sessions_per_call']:>13} "
              f"{row['redis_us_per_chunk']:>9.1f} {row['script_us_per_chunk']:>7.1f} "
              f"{row['commands_us_per_chunk']:>8.1f} {row['redis_us_per_call']:>8.1f}"
              for row in report["calls"]]
    lines += ["", "client CPU per call of the input script (one session, one chunk)"]
    lines += [f"{row['client']:<40} {row['client_us_per_call']:>9.1f} us"
              for row in report["clients"]]
    return "\n".join(lines)


def _plot(path: Path, rows: Sequence[CallRow]) -> Path:
    script = [(row.sessions_per_call, row.redis_us_per_chunk) for row in rows
              if row.shape == _INPUT_SCRIPT]
    floor = [row.redis_us_per_chunk for row in rows if row.shape == _BARE_PUBLISH]
    series: dict[str, list[tuple[float, float]]] = {_INPUT_SCRIPT: [(float(x), y)
                                                                    for x, y in script]}
    if floor and script:
        series[_BARE_PUBLISH] = [(float(script[0][0]), floor[0]), (float(script[-1][0]),
                                                                   floor[0])]
    return write_chart(path, Chart(
        title="Redis CPU per chunk against sessions per call", x_label="sessions per call",
        y_label="Redis us per chunk, one direction", series=series, integer_x=True,
        reference=(TARGET_US_PER_CHUNK / 2, "target, per direction")))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``bench calls``."""
    parser.add_argument("--sessions", type=positive_int, default=20,
                        help="sessions streaming at once, 50 chunks a second each "
                             "(default: %(default)s)")
    parser.add_argument("--per-call", type=positive_int_list, default=list(DEFAULT_PER_CALL),
                        help="sessions per script call to measure, a comma list of divisors "
                             "of --sessions (default: %(default)s)")
    parser.add_argument("--seconds", type=positive_float, default=5.0,
                        help="length of each measurement (default: %(default)s)")
    parser.add_argument("--calls", type=positive_int, default=3000,
                        help="calls per client for the client-side table (default: "
                             "%(default)s)")
    parser.add_argument("--output", help=output_help("calls"))


def run_calls_bench(args: argparse.Namespace) -> int:
    """Measure, print, write JSON and the plot; 0, or 2 when it could not run, 130 when
    interrupted."""
    bad = [count for count in args.per_call if args.sessions % count]
    if bad:
        print(f"bench calls: --per-call {bad} do not divide --sessions {args.sessions}",
              file=sys.stderr)
        return 2
    from redis.exceptions import RedisError

    try:
        rows, clients, server = asyncio.run(_run(args.sessions, args.per_call, args.seconds,
                                                 args.calls))
    except KeyboardInterrupt:
        print("bench calls: interrupted; the server was stopped", file=sys.stderr)
        return 130
    except (OSError, RedisError) as exc:
        print(f"bench calls: could not run: {exc}", file=sys.stderr)
        return 2
    report = {
        "config": {"sessions": args.sessions, "per_call": args.per_call,
                   "seconds": args.seconds, "calls": args.calls, "chunk_bytes": CHUNK_BYTES,
                   "machine": platform.platform(), "cpus": os.cpu_count(), **server},
        "target_us_per_chunk_per_direction": TARGET_US_PER_CHUNK / 2,
        "calls": [asdict(row) for row in rows],
        "clients": [asdict(row) for row in clients],
    }
    path = output_path(args.output, "calls")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    plot = _plot(path.with_suffix(".svg"), rows)
    print(_format(report))
    print(f"results: {path} (plot: {plot})")
    return 0
