"""``duplex-gateway bench calls``: what one Redis call per chunk costs, against chunks per call.

The relay's Redis target (DESIGN §5: at most 20 us of Redis CPU per 20 ms chunk round trip,
both directions, with 20 ms entries) is met in ``bench relay`` only once batching carries many
sessions per call. This bench
isolates why: it runs each call shape of :mod:`duplex_gateway.bench.call_shapes` (the store's
real input script and output flush, through :class:`store.Scripts` on sessions set up for
them, and a plain ``MULTI`` append beside them) on an embedded Redis, with a subscriber on
every channel they push to, at a fixed chunk rate (``--sessions`` x 50 chunks a second, 20 ms
pcm16 24 kHz chunks) while the number of sessions per call varies, and reads Redis's own CPU
time (``INFO cpu``) per chunk. Beside them, a bare ``SPUBLISH`` of each chunk, one call per
chunk: the floor of any design that sends each chunk through Redis in its own call, scripts
or not. Then the client's side: the bench process's CPU per call of the input script through
redis-py (hiredis, on the running loop) and through the store's own connection
(``store/script_lane.py``, hiredis's reader on an asyncio protocol: what the gateway and the
worker use), one call at a time.

With ``--busy N`` every shape is measured again in the busy regime
(:mod:`duplex_gateway.bench.busy`: a load generator keeps N connections busy on the server,
its own Redis CPU measured alone and subtracted), once per ``--io-threads`` count, and printed
beside the idle figures with the commands sent, the commands run inside scripts and the writes
(client calls) per session-second.

It prints two tables, writes JSON and a plot (Redis us per chunk against sessions per call,
every shape, the per-direction half of the target drawn as a line), asserts nothing about
speed, and exits 0 (2 when it could not run, 130 when interrupted).
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

from duplex_gateway.bench.busy import (
    GENERATOR_COMMAND,
    BusyLoad,
    ServerChoice,
    add_busy_arguments,
    busy_load,
    interleaved,
    measure_alone,
    read_cpu,
    server_choices,
    server_version,
)
from duplex_gateway.bench.call_shapes import (
    BARE_PUBLISH,
    CHUNK_BYTES,
    INPUT_SCRIPT,
    SHAPES,
    Shape,
    check_appended,
    prepare_sessions,
    shape_call,
    start_reader,
)
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

__all__ = ["CallRow", "ClientRow", "CommandStats", "add_arguments", "executed_usec",
           "run_calls_bench"]

CHUNK_S: Final = 0.02
#: DESIGN §5's Redis CPU per chunk, both directions; one direction gets half.
TARGET_US_PER_CHUNK: Final = 20.0
DEFAULT_PER_CALL: Final = (1, 2, 5, 10, 20)


@dataclass(frozen=True, slots=True)
class CallRow:
    """Redis CPU per chunk for one call shape.

    Attributes:
        redis_us_per_chunk: all of Redis's CPU (``INFO cpu``): reading calls, running them,
            replies and pushes.
        script_us_per_chunk: what ``INFO commandstats`` charges the script calls (0 for the
            shapes that send no script): the commands they run plus the script's own Lua.
        commands_us_per_chunk: the part of that in the commands the script runs, by name in
            ``commands_us_per_chunk_by_name``.
        regime: ``idle`` (the bench's calls alone) or ``busy`` (a load generator beside them,
            its share taken out of ``redis_us_per_chunk`` and ``main_thread_us_per_chunk``).
        server: the server and its I/O threads (:class:`~duplex_gateway.bench.busy.ServerChoice`).
        main_thread_us_per_chunk: Redis's main thread alone (``INFO cpu``), where reported.
        redis_core_share: the server's CPU over the window, the generator's included.
        commands_sent_per_session_s: calls sent (script calls or publishes) per second of one
            session's stream (50 chunks); ``in_scripts_per_session_s``: commands the scripts
            ran; ``writes_per_session_s``: client calls, i.e. network round trips.
        reads_per_call: idle only: Redis's reads of the calls (``total_reads_processed``,
            less the bench's own and a pulling worker's) per call, about 1 when each call is
            a write of its own, as the figures assume; below 1, calls shared writes.
        generator_commands: the busy-load generator's commands over the relay's windows.
        modelled_us_per_chunk: busy only: the execution time ``INFO commandstats`` charges the
            commands sent (the script's Lua and its commands, a transaction's ``EXEC`` and what
            it carried, the publish, a pulling worker's reads; :func:`executed_usec`), plus
            one generator command's whole cost alone per round trip (a busy server's fixed
            cost of a call: read, parse, reply), per chunk. It needs no
            subtraction, so it holds where the subtraction drowns in the generator's own
            variation.
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
    regime: str = "idle"
    server: str = ""
    main_thread_us_per_chunk: float | None = None
    redis_core_share: float = 0.0
    commands_sent_per_session_s: float = 0.0
    in_scripts_per_session_s: float = 0.0
    writes_per_session_s: float = 0.0
    generator_commands: int = 0
    modelled_us_per_chunk: float | None = None
    reads_per_call: float | None = None


@dataclass(frozen=True, slots=True)
class ClientRow:
    """The bench process's CPU per call of the input script, one session, one chunk."""

    client: str
    calls: int
    client_us_per_call: float


# The bench's own commands and the busy-load generator's, not the load's.
_NOT_LOAD: Final = frozenset({"info", "config|resetstat", "ssubscribe", GENERATOR_COMMAND})


@dataclass(frozen=True, slots=True)
class CommandStats:
    """Since the last ``CONFIG RESETSTAT``: usec and calls per command, by name (Redis counts
    the commands a script runs under their own names, as if sent)."""

    usec: dict[str, float]
    calls: dict[str, int]

    @classmethod
    def of(cls, info: dict[str, Any]) -> CommandStats:
        rows = {name.removeprefix("cmdstat_"): row for name, row in info.items()
                if name.startswith("cmdstat_") and isinstance(row, dict)}
        return cls({name: float(row["usec"]) for name, row in rows.items()},
                   {name: int(row["calls"]) for name, row in rows.items()})

    def inside(self, sent: frozenset[str]) -> dict[str, float]:
        """The usec of the commands the script calls ran (all but those ``sent``)."""
        return {name: value for name, value in self.usec.items()
                if name not in sent and name not in _NOT_LOAD}

    def inside_calls(self, sent: frozenset[str]) -> int:
        """How many commands the script calls ran (all but those ``sent``)."""
        return sum(n for name, n in self.calls.items()
                   if name not in sent and name not in _NOT_LOAD)


def _xreads(info: dict[str, Any]) -> int:
    """``XREAD`` calls since the last ``CONFIG RESETSTAT``."""
    row = info.get("cmdstat_xread")
    return int(row["calls"]) if isinstance(row, dict) else 0


def executed_usec(stats: CommandStats, shape: Shape) -> float:
    """The execution time Redis charged the calls of ``shape``: a script call's holds what
    the script ran, a transaction's ``EXEC`` what it carried (:attr:`Shape.charged`)."""
    return sum(stats.usec.get(name, 0.0) for name in shape.charged)


async def _paced(callers: int, seconds: float, call: Callable[[int], Awaitable[None]],
                 period_s: float = CHUNK_S) -> int:
    """Run ``callers`` loops, each calling ``call(caller)`` every ``period_s`` for
    ``seconds`` (an absolute schedule); the number of calls made.

    The callers' schedules are spread evenly over the period, as independent sessions' clocks
    are: calls due at one instant would leave in one write on the store's own connection
    (Redis reads them at once), and the shape would be measured at several calls a write."""
    loop = asyncio.get_running_loop()
    start, made = loop.time(), [0] * callers

    async def caller(index: int) -> None:
        phase, n = start + index * period_s / callers, 0
        await asyncio.sleep(max(0.0, phase - loop.time()))
        while loop.time() < start + seconds:
            n += 1
            await call(index)
            made[index] += 1
            await asyncio.sleep(max(0.0, phase + n * period_s - loop.time()))

    await asyncio.gather(*(caller(index) for index in range(callers)))
    return sum(made)


async def _measure_shape(client: Redis, shape: Shape, sessions: int, per_call: int,
                         seconds: float, *, server: str = "",
                         busy: BusyLoad | None = None) -> CallRow:
    from store import Scripts
    from store.keys import WorkerKeys, new_worker_id

    worker_id = new_worker_id(pulls_input=shape.pulled)
    channel = WorkerKeys(worker_id).input_channel
    leases = await prepare_sessions(client, worker_id, sessions)
    reader = await start_reader(client, shape, channel, leases)
    groups = [leases[i:i + per_call] for i in range(0, sessions, per_call)]
    scripts = Scripts(client, own_connection=shape.own_connection)
    call = shape_call(client, scripts, shape, channel, groups)
    period = CHUNK_S * shape.chunks_per_call

    try:
        # Before the window, not in it: the script loaded (SCRIPT LOAD), each session's
        # first input append (its writer reads where the log stands: the bench opened none),
        # and on output each session's first three flushes (the first, on the connection it
        # made, learns no log end, store/output_appends.py; the third loads the fast script).
        # The calls of each round go at once, so redis-py's pool holds a connection for each
        # caller before the window, where calls can meet once a busy server slows them.
        for _ in range(3 if shape.output else 1):
            await asyncio.gather(*(call(group) for group in range(len(groups))))
        await client.config_resetstat()
        reads_per_call = None
        if busy is None:
            before_info = await client.info("all")
            before = read_cpu(before_info)
            began = time.monotonic()
            calls = await _paced(len(groups), seconds, call, period)
            after: dict[str, Any] = await client.info("all")
            spent = read_cpu(after).minus(before)
            # Less the INFO above (its own read) and a pulling worker's reads.
            reads = (after["total_reads_processed"] - before_info["total_reads_processed"] - 1
                     - (_xreads(after) if shape.pulled else 0))
            reads_per_call = reads / calls if calls else None
            generator, share = 0, spent.total / (time.monotonic() - began)
            floor = None
        else:
            made: list[int] = []

            async def run(window: float) -> None:
                made.append(await _paced(len(groups), window, call, period))

            async def info() -> dict[str, Any]:
                answer: dict[str, Any] = await client.info("all")
                return answer

            measured = await interleaved(info, run, busy, seconds)
            calls, after, spent = sum(made), measured.last, measured.spent
            generator, share = measured.generator_commands, measured.core_share
            floor = measured.generator.us_per_command
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await scripts.aclose()
        await client.flushall()
    # Every group holds per_call sessions, each with the shape's chunks a call.
    chunks = calls * per_call * shape.chunks_per_call
    stats = CommandStats.of(after)
    # Redis counts the commands a script runs apart from the script.
    inside = stats.inside(shape.sent) if shape.scripted else {}
    by_name = {name: usec / chunks for name, usec in sorted(inside.items())}
    executed = executed_usec(stats, shape)
    # Round trips: the calls, and a pulling worker's reads beside them.
    trips = calls + (stats.calls.get("xread", 0) if shape.pulled else 0)
    session_s = chunks * CHUNK_S  # each chunk is 20 ms of one session's stream
    return CallRow(
        shape.name, per_call, calls, chunks, spent.total / chunks * 1e6,
        spent.total / calls * 1e6,
        stats.usec.get("evalsha", 0.0) / chunks if shape.scripted else 0.0,
        sum(by_name.values()), by_name,
        regime="idle" if busy is None else "busy", server=server,
        main_thread_us_per_chunk=None if spent.main_thread is None
        else spent.main_thread / chunks * 1e6,
        redis_core_share=share,
        commands_sent_per_session_s=sum(stats.calls.get(name, 0) for name in shape.sent)
        / session_s,
        in_scripts_per_session_s=stats.inside_calls(shape.sent) / session_s
        if shape.scripted else 0.0,
        writes_per_session_s=calls / session_s,
        generator_commands=generator,
        modelled_us_per_chunk=None if floor is None else (executed + floor * trips) / chunks,
        reads_per_call=reads_per_call)


async def _measure_clients(client: Redis, calls: int) -> list[ClientRow]:
    """The input script with one session and one chunk, ``calls`` times through each of the
    store's two ways to Redis: redis-py's pool, and its own connection (what the gateway and
    the worker use, ``store/script_lane.py``)."""
    from store import Scripts
    from store.keys import new_worker_id

    [lease] = await prepare_sessions(client, new_worker_id(), 1)
    chunk = os.urandom(CHUNK_BYTES)
    rows = []
    for name, own in (("redis-py (hiredis), through Scripts", False),
                      ("the store's own connection, through Scripts", True)):
        scripts = Scripts(client, own_connection=own)
        try:
            check_appended(await scripts.append_input_many(  # connected, script loaded
                [(lease, [(None, chunk)])], max_entries=1 << 30))
            started = time.process_time()
            for _ in range(calls):
                check_appended(await scripts.append_input_many([(lease, [(None, chunk)])],
                                                                max_entries=1 << 30))
            rows.append(ClientRow(name, calls, (time.process_time() - started) / calls * 1e6))
        finally:
            await scripts.aclose()
    await client.flushall()
    return rows


async def _shapes(client: Redis, sessions: int, per_call: Sequence[int], seconds: float, *,
                  server: str, busy: BusyLoad | None = None) -> list[CallRow]:
    rows = [await _measure_shape(client, BARE_PUBLISH, sessions, 1, seconds, server=server,
                                 busy=busy)]
    for shape in SHAPES:
        for count in per_call:
            rows.append(await _measure_shape(client, shape, sessions, count, seconds,
                                             server=server, busy=busy))
    return rows


async def _busy_rows(choice: ServerChoice, args: argparse.Namespace
                     ) -> tuple[list[CallRow], dict[str, Any]]:
    """The shapes again on a fresh server kept busy by the generator, whose cost is measured
    alone first."""
    from redis.asyncio import Redis

    from runtime.embedded import start_server

    server = start_server(choice.kind, extra_args=choice.extra_args)
    client = Redis(port=server.port)
    try:
        with busy_load(server.url, server.port, args.busy) as load:
            rows = await _shapes(client, args.sessions, args.per_call, args.seconds,
                                 server=choice.label, busy=load)
            cost = await asyncio.to_thread(measure_alone, server.url, load, args.seconds)
        version: dict[str, Any] = await client.info("server")
    finally:
        await client.aclose()
        server.stop()
    return rows, {"server": choice.label, "binary": server.binary.name,
                  "version": server_version(version), "generator_alone": asdict(cost)}


async def _run(args: argparse.Namespace
               ) -> tuple[list[CallRow], list[ClientRow], dict[str, Any]]:
    from redis.asyncio import Redis

    from runtime.embedded import start_server

    server = start_server(args.server)
    client = Redis(port=server.port)
    idle = ServerChoice(args.server).label
    try:
        rows = await _shapes(client, args.sessions, args.per_call, args.seconds, server=idle)
        clients = await _measure_clients(client, args.calls)
        version: dict[str, Any] = await client.info("server")
    finally:
        await client.aclose()
        server.stop()
    busy = []
    for choice in server_choices(args.server, args.io_threads) if args.busy else []:
        more, about = await _busy_rows(choice, args)
        rows += more
        busy.append(about)
    return rows, clients, {"server": f"{server.binary.name} {server_version(version)}",
                           "busy_servers": busy}


def _format(report: dict[str, Any]) -> str:
    idle = [row for row in report["calls"] if row["regime"] == "idle"]
    lines = [f"Redis CPU per chunk, one direction ({report['config']['sessions']} sessions x 50 "
             f"chunks/s; target {TARGET_US_PER_CHUNK / 2:g} us, half of DESIGN's round trip);"
             " of it, the script calls, and the commands they ran",
             f"{'shape':<40} {'sessions/call':>13} {'us/chunk':>9} {'script':>7} "
             f"{'commands':>8} {'us/call':>8}"]
    lines += [f"{row['shape']:<40} {row['sessions_per_call']:>13} "
              f"{row['redis_us_per_chunk']:>9.1f} {row['script_us_per_chunk']:>7.1f} "
              f"{row['commands_us_per_chunk']:>8.1f} {row['redis_us_per_call']:>8.1f}"
              for row in idle]
    if report["config"]["busy"]:
        lines += ["", *_regimes_table(report)]
    lines += ["", "client CPU per call of the input script (one session, one chunk)"]
    lines += [f"{row['client']:<40} {row['client_us_per_call']:>9.1f} us"
              for row in report["clients"]]
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _regimes_table(report: dict[str, Any]) -> list[str]:
    """Idle and busy side by side: Redis us per chunk (busy: the generator's share taken out;
    main thread in brackets), and the counts per session-second, which the regime leaves
    alone."""
    servers = [about["server"] for about in report["config"]["busy_servers"]]
    busy = {(row["server"], row["shape"], row["sessions_per_call"]): row
            for row in report["calls"] if row["regime"] == "busy"}
    lines = ["Redis us per chunk, idle and busy (generator's share subtracted; [main thread]; "
             "(modelled: execution + a busy call's fixed cost)); per session-second: commands "
             "sent, run inside scripts, writes",
             f"{'shape':<40} {'per call':>8} {'idle':>7} "
             + " ".join(f"{'busy ' + name:>36}" for name in servers)
             + f" {'sent':>6} {'inside':>6} {'writes':>6}"]
    for row in report["calls"]:
        if row["regime"] != "idle":
            continue
        cells = []
        for name in servers:
            other = busy.get((name, row["shape"], row["sessions_per_call"]))
            cells.append("-" if other is None else
                         f"{_cell(other['redis_us_per_chunk'])} "
                         f"[{_cell(other['main_thread_us_per_chunk'])}] "
                         f"({_cell(other['modelled_us_per_chunk'])})")
        lines.append(f"{row['shape']:<40} {row['sessions_per_call']:>8} "
                     f"{row['redis_us_per_chunk']:>7.1f} "
                     + " ".join(f"{cell:>36}" for cell in cells)
                     + f" {row['commands_sent_per_session_s']:>6.1f}"
                     f" {row['in_scripts_per_session_s']:>6.1f}"
                     f" {row['writes_per_session_s']:>6.1f}")
    for about in report["config"]["busy_servers"]:
        alone = about["generator_alone"]
        lines.append(f"generator alone on {about['server']} ({about['binary']} "
                     f"{about['version']}): {alone['tool']}, {alone['connections']} connections, "
                     f"{alone['commands_per_s'] / 1000:.1f} k commands/s, "
                     f"{alone['us_per_command']:.2f} us each, the server at "
                     f"{alone['redis_core_share'] * 100:.0f} % of a core")
    return lines


def _plot(path: Path, rows: Sequence[CallRow]) -> Path:
    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        if row.shape == BARE_PUBLISH.name:
            continue
        name = row.shape if row.regime == "idle" else f"{row.shape}, busy {row.server}"
        series.setdefault(name, []).append((float(row.sessions_per_call),
                                            row.redis_us_per_chunk))
    floor = [row.redis_us_per_chunk for row in rows
             if row.shape == BARE_PUBLISH.name and row.regime == "idle"]
    script = series.get(INPUT_SCRIPT.name, [])
    if floor and script:
        series[BARE_PUBLISH.name] = [(script[0][0], floor[0]), (script[-1][0], floor[0])]
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
    add_busy_arguments(parser)
    parser.add_argument("--output", help=output_help("calls"))


def run_calls_bench(args: argparse.Namespace) -> int:
    """Measure, print, write JSON and the plot; 0, or 2 when it could not run, 130 when
    interrupted."""
    bad = [count for count in args.per_call if args.sessions % count]
    if bad:
        print(f"bench calls: --per-call {bad} do not divide --sessions {args.sessions}",
              file=sys.stderr)
        return 2
    if args.io_threads and not args.busy:
        print("bench calls: --io-threads needs --busy", file=sys.stderr)
        return 2
    from redis.exceptions import RedisError

    try:
        rows, clients, server = asyncio.run(_run(args))
    except KeyboardInterrupt:
        print("bench calls: interrupted; the server was stopped", file=sys.stderr)
        return 130
    except (OSError, RedisError, RuntimeError) as exc:
        print(f"bench calls: could not run: {exc}", file=sys.stderr)
        return 2
    report = {
        "config": {"sessions": args.sessions, "per_call": args.per_call,
                   "seconds": args.seconds, "calls": args.calls, "chunk_bytes": CHUNK_BYTES,
                   "busy": args.busy, "io_threads": args.io_threads or [1],
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
