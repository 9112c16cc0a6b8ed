"""``duplex-gateway bench relay``: relay latency and CPU of the gateway against a bare echo.

One run, two phases with the same load, side by side in one run (an overhead measured against
a baseline from another run or another machine would mean little):

* **echo**: a bare websocket echo (:mod:`duplex_gateway._echo`, the gateway's own server stack
  with nothing in between) sends every frame back as is;
* **gateway**: an embedded Redis, one gateway and one loopback worker in stream mode, which
  sends every appended chunk back as a ``response.output_audio.delta`` with the same bytes.

Each of N sessions streams 20 ms pcm16 chunks (960 bytes at 24 kHz, base64 in
``input_audio_buffer.append``) in real time on an absolute clock for S seconds. Sessions start
over the first second (the ramp); the first second of each phase is warm-up and left out of
every statistic. The first 8 bytes of each chunk carry (session, chunk) so each returned
chunk is matched to its send time: round trip = receive time - send time, both taken in the
client process on the system-wide monotonic clock. The load runs in client processes
(:func:`_default_clients`), started with ``spawn``.

Per phase: round-trip percentiles, chunks sent/received/lost, CPU seconds of every server
process per relayed chunk (``/proc/<pid>/stat``, or psutil when installed), read at the end of
warm-up and once every chunk is back; for the gateway phase also Redis commands per
session-second (``INFO``). Numbers go to a plain-text table and a JSON file (by default
``bench-results/relay-<UTC time>.json``), and the round-trip CDFs to an SVG plot next to it.

The table compares four figures with the project's design targets (:data:`TARGETS_NOTE`):
at most 2 ms of latency added per direction (4 ms per round trip, p99) over the bare echo,
gateway CPU per chunk at most twice the echo's, at most 30 Redis commands sent per
session-second, and at most 256 KiB of Redis memory per streaming session. Each is ``met`` or
``MISSED`` for this run, on this machine, at this load: a finding, not a failure.

The benchmark asserts nothing about speed: it exits 0 when it ran and every chunk came back,
1 when chunks were lost (or came back corrupt, duplicated or to the wrong session), 2 when it
could not run and 130 when interrupted. Every process it started is stopped on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import importlib
import json
import math
import multiprocessing
import os
import platform
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from types import FrameType
from typing import Any, Final

from duplex_gateway.svgplot import Chart, cdf, write_chart

__all__ = ["distribution", "run_relay_bench", "start_http_server", "start_worker"]

CHUNK_S: Final = 0.020
#: 20 ms of pcm16 mono at 24 kHz.
CHUNK_BYTES: Final = 960
WARMUP_S: Final = 1.0
RAMP_S: Final = 1.0
#: After the last send, returned chunks are awaited this long; later ones count as lost.
DRAIN_S: Final = 5.0
#: Sessions one client process drives. Measured: a client process spends 100-150 us of CPU
#: per chunk (send plus receive, mostly the loopback send syscall), so 100 sessions (5,000
#: chunks/s) keep it at 0.5-0.75 of a core, with room to stay on its clock.
SESSIONS_PER_CLIENT: Final = 100
# The project's design targets for the relay, at up to 200 real-time sessions on one machine.
TARGET_ADDED_RTT_P99_MS: Final = 4.0  # 2 ms per direction, and a round trip is two
TARGET_CPU_RATIO: Final = 2.0  # gateway CPU per chunk, as a multiple of the bare echo's
TARGET_REDIS_PER_SESSION_S: Final = 30.0  # commands sent per second of one streaming session
#: Redis memory per attached, streaming session, steady state.
TARGET_SESSION_MEMORY_KIB: Final = 256.0
#: Printed under the table: what the target column is and what its verdicts mean.
TARGETS_NOTE: Final = (
    "target: the project's design targets for the relay, at up to 200 real-time sessions on one "
    "machine.\n"
    "  met: this run's figure is within its target. MISSED: above it, on this machine at this\n"
    "  load (a finding, not a failure: the exit status reports lost chunks only). n/a: not\n"
    "  measured, or the run lost chunks, so its figures are not comparable.")

_OPEN_TIMEOUT_S: Final = 10.0
_START_TIMEOUT_S: Final = 30.0
_STOP_TIMEOUT_S: Final = 10.0
_MARK: Final = struct.Struct("<II")
# Random, not silent: permessage-deflate is negotiated, and real audio compresses poorly.
_FILL: Final = random.Random(20).randbytes(CHUNK_BYTES - _MARK.size)
_SESSION_UPDATE: Final = json.dumps(
    {"type": "session.update",
     "session": {"type": "realtime", "extra_body": {"loopback_mode": "stream"}}})
_CLOSE: Final = json.dumps({"type": "session.close"})
_MAX_ERRORS: Final = 5
_LAG_WARNING_MS: Final = 10.0
_BUSY_WARNING: Final = 0.85
_OTHER_WARNING_CPUS: Final = 0.5
# Read commands that the gateway and worker send themselves as well as from scripts.
_ALSO_DIRECT: Final = frozenset({"xrange", "smembers", "zrangebyscore"})


class BenchError(Exception):
    """The benchmark could not run (a process did not start, a client failed)."""


# ============================================================================ arguments and paths
# Shared by every bench command: argparse types that refuse nonsense with argparse's own
# one-line error (exit status 2), and the default place results go.

#: Where results go unless ``--output`` says otherwise, relative to the working directory.
RESULTS_DIR: Final = Path("bench-results")


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < low:
        bound = "0 or more" if low == 0 else f"at least {low}"
        raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text!r}")
    return value


def positive_int_list(text: str) -> list[int]:
    """An argparse type: ``"8,1,2"`` -> ``[1, 2, 8]`` (sorted, unique, each >= 1)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected whole numbers >= 1 separated by commas, "
                                         f"got {text!r}")
    values = set()
    for part in parts:
        try:
            values.add(positive_int(part))
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{exc} (in {text!r}; expected whole numbers "
                                             ">= 1 separated by commas)") from None
    return sorted(values)


def _utc_stamp(now: datetime.datetime) -> str:
    return now.astimezone(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")


def default_output(name: str, *, now: datetime.datetime | None = None,
                   folder: Path = RESULTS_DIR) -> Path:
    """``bench-results/<name>-<UTC stamp>.json``, a file no earlier run wrote.

    Each run keeps its own results: a second run within the same second gets ``-2`` (and so
    on) instead of overwriting the first.
    """
    stem = f"{name}-{_utc_stamp(now or datetime.datetime.now(datetime.UTC))}"
    path = folder / f"{stem}.json"
    suffix = 2
    while path.exists():
        path = folder / f"{stem}-{suffix}.json"
        suffix += 1
    return path


def output_path(output: str | os.PathLike[str] | None, name: str) -> Path:
    """``--output`` when given, else :func:`default_output` of ``name``."""
    return Path(output) if output else default_output(name)


def output_help(name: str, *, plot: str = "its plot next to it; ") -> str:
    """The help text of a bench's ``--output``, naming its default path."""
    return (f"JSON file to write ({plot}its folder is created); default: "
            f"{RESULTS_DIR}/{name}-<UTC time>.json, e.g. {name}-20260101T120000Z.json")


def _relay_seconds(text: str) -> float:
    value = positive_float(text)
    if value <= WARMUP_S + CHUNK_S:
        raise argparse.ArgumentTypeError(f"must be more than {WARMUP_S:g} (the warm-up, left "
                                         f"out of every figure), got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``bench relay``."""
    parser.add_argument("--sessions", type=positive_int, default=50,
                        help="concurrent real-time sessions in each phase (default: %(default)s)")
    parser.add_argument("--seconds", type=_relay_seconds, default=10.0,
                        help="length of each phase in seconds, the first one warm-up "
                             "(default: %(default)s)")
    parser.add_argument("--output", help=output_help("relay"))


# ============================================================================ frames


def _audio(session: int, chunk: int) -> bytes:
    """The chunk's pcm16 bytes: its marker, then the shared fill."""
    return _MARK.pack(session, chunk) + _FILL


def _append_frame(session: int, chunk: int) -> str:
    """The ``input_audio_buffer.append`` text frame of one chunk (client_seq from 1)."""
    b64 = base64.b64encode(_audio(session, chunk)).decode("ascii")
    return ('{"type":"input_audio_buffer.append","audio":"' + b64
            + '","client_seq":' + str(chunk + 1) + "}")


def _returned_audio(data: dict[str, Any]) -> str | None:
    """The base64 audio a returned frame carries: a gateway delta or an echoed append."""
    kind = data.get("type")
    if kind == "response.output_audio.delta":
        return data.get("delta")
    if kind == "input_audio_buffer.append":
        return data.get("audio")
    return None


# ============================================================================ client side


@dataclass(frozen=True, slots=True, kw_only=True)
class _ClientSpec:
    """What one client process drives."""

    url: str
    mode: str  # "echo" or "gateway"
    indices: tuple[int, ...]
    sessions: int
    seconds: float
    compression: bool


@dataclass(slots=True)
class _SessionLog:
    """What one session saw; times are ``time.monotonic()`` seconds."""

    index: int
    open_s: float | None = None
    sent: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)  # send time minus due time
    received: dict[int, float] = field(default_factory=dict)
    duplicates: int = 0
    corrupt: int = 0
    misrouted: int = 0
    disconnected: bool = False
    errors: list[str] = field(default_factory=list)

    def error(self, text: str) -> None:
        """Keep the first few errors."""
        if len(self.errors) < _MAX_ERRORS:
            self.errors.append(text[:300])


class _LoadSession:
    """One streaming session: connect, stream on an absolute clock, await the returns."""

    def __init__(self, index: int, spec: _ClientSpec, t0: float) -> None:
        self.log = _SessionLog(index)
        self._spec = spec
        self._start = t0 + RAMP_S * index / spec.sessions
        # Send phases spread evenly over the 20 ms period, as independent clients' would be;
        # the ramp alone would line every session up on the same phase (bursts).
        self._phase = t0 + CHUNK_S * index / spec.sessions
        self._end = t0 + spec.seconds
        self._ws: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._outstanding = 0
        self._sending = True
        self._settled = asyncio.Event()  # every sent chunk is back, or the reader ended

    async def run(self) -> None:
        """Open, stream until the common end time, then wait for the last returns."""
        await _sleep_until(self._start)
        try:
            await self._open()
        except Exception as exc:  # any failure to open is a result, not a crash
            self.log.error(f"open: {exc!r}")
            return
        self._reader = asyncio.create_task(self._read())
        await self._stream()
        self._sending = False
        if self._outstanding > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), self._end + DRAIN_S
                                       - time.monotonic())

    async def _open(self) -> None:
        from websockets.asyncio.client import connect

        began = time.monotonic()
        self._ws = await connect(self._spec.url, max_size=None, open_timeout=_OPEN_TIMEOUT_S,
                                 compression="deflate" if self._spec.compression else None)
        await self._ws.send(_SESSION_UPDATE)
        # The gateway answers session.created, then the worker's session.updated (stream
        # mode is on); the echo returns the update itself.
        wanted = "session.updated" if self._spec.mode == "gateway" else "session.update"
        while True:
            raw = await asyncio.wait_for(self._ws.recv(), _OPEN_TIMEOUT_S)
            data = json.loads(raw)
            if data.get("type") == wanted:
                break
            if data.get("type") == "error":
                raise BenchError(f"open refused: {raw}")
        self.log.open_s = time.monotonic() - began

    async def _stream(self) -> None:
        from websockets.exceptions import ConnectionClosed

        late = max(0.0, time.monotonic() - self._phase)
        begin = self._phase + math.ceil(late / CHUNK_S) * CHUNK_S  # next slot of this phase
        chunk = 0
        while (due := begin + chunk * CHUNK_S) < self._end:
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            frame = _append_frame(self.log.index, chunk)
            sent = time.monotonic()
            self.log.sent.append(sent)
            self.log.lag.append(sent - due)
            self._outstanding += 1
            try:
                await self._ws.send(frame)
            except ConnectionClosed as exc:
                self.log.error(f"send: {exc!r}")
                return
            chunk += 1

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in self._ws:
                self._on_frame(message, time.monotonic())
        except ConnectionClosed as exc:
            if self._sending or self._outstanding:
                self.log.error(f"recv: {exc!r}")
        self.log.disconnected = self._sending or self._outstanding > 0
        self._settled.set()

    def _on_frame(self, message: str | bytes, now: float) -> None:
        try:
            data = json.loads(message)
            b64 = _returned_audio(data)
            audio = base64.b64decode(b64) if b64 is not None else None
            session, chunk = _MARK.unpack_from(audio) if audio is not None else (0, 0)
        except (ValueError, TypeError, AttributeError, struct.error) as exc:
            self.log.corrupt += 1  # not JSON, or audio that is not ours
            self.log.error(f"bad frame: {exc!r}")
            return
        if audio is None:
            if data.get("type") == "error":
                self.log.error(json.dumps(data.get("error")))
            return
        if session != self.log.index or chunk >= len(self.log.sent):
            self.log.misrouted += 1
        elif chunk in self.log.received:
            self.log.duplicates += 1
        else:
            self.log.received[chunk] = now
            self.log.corrupt += audio[_MARK.size:] != _FILL
            self._outstanding -= 1
            if self._outstanding == 0 and not self._sending:
                self._settled.set()

    async def close(self) -> None:
        """End the session (``session.close`` on the gateway) and close the socket."""
        if self._ws is None:
            return
        self._sending = False
        self._outstanding = 0
        with contextlib.suppress(Exception):
            if self._spec.mode == "gateway":
                await self._ws.send(_CLOSE)
                if self._reader is not None:
                    # The gateway closes the socket after session.closed.
                    await asyncio.wait_for(asyncio.shield(self._reader), 3.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._ws.close(), 3.0)
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)


async def _sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def _drive(conn: Connection, spec: _ClientSpec, t0: float) -> None:
    """Run every session of this process, report their logs, close when told to."""
    sessions = [_LoadSession(index, spec, t0) for index in spec.indices]
    await asyncio.gather(*(session.run() for session in sessions))
    conn.send([session.log for session in sessions])
    # Sessions stay open until the parent has read the CPU counters: closing costs CPU too.
    await asyncio.to_thread(conn.recv)
    await asyncio.gather(*(session.close() for session in sessions))


def _client_main(conn: Connection, spec: _ClientSpec) -> None:
    """Entry point of one client process: handshake the start time, then drive."""
    with contextlib.suppress(KeyboardInterrupt, EOFError, BrokenPipeError):
        conn.send("ready")
        t0: float = conn.recv()
        asyncio.run(_drive(conn, spec, t0))


# ============================================================================ processes


@dataclass(slots=True)
class _Server:
    """One server process the bench started; ``pid`` is what its CPU is read from."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path | None = None

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid


def _child_env() -> dict[str, str]:
    """The environment of started servers: defaults, not the caller's DUPLEX_GATEWAY_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPLEX_GATEWAY_")}
    env["DUPLEX_GATEWAY_DRAIN_TIMEOUT_S"] = "1"  # the worker: no one will take over
    return env


def _spawn(name: str, module_args: list[str], log_dir: Path) -> _Server:
    log_path = log_dir / f"relay-{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", *module_args], env=_child_env(), stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)  # Ctrl-C reaches the bench, which stops them in order
    return _Server(name, process, log_path)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after :data:`_STOP_TIMEOUT_S`."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _wait_until(ready: Callable[[], bool], server: _Server, what: str) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not ready():
        if server.process.poll() is not None:
            raise BenchError(f"{server.name} exited with {server.process.returncode} "
                             f"at start; see {server.log_path}")
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        time.sleep(0.05)  # polling a child's readiness; there is no event to wait on


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def start_http_server(stack: contextlib.ExitStack, name: str, module_args: list[str],
                       port: int, log_dir: Path) -> _Server:
    server = _spawn(name, module_args, log_dir)
    stack.callback(_stop, server.process)
    _wait_until(lambda: _http_ok(f"http://127.0.0.1:{port}/readyz"), server, f"{name} ready")
    return server


def start_worker(stack: contextlib.ExitStack, redis_url: str, slots: int,
                  log_dir: Path) -> _Server:
    from redis import Redis

    from store.keys import WORKER_DIRECTORY

    server = _spawn("worker", ["duplex_gateway", "--log-level", "warning", "worker",
                               "--redis-url", redis_url, "--backend", "loopback",
                               "--slots", str(slots)], log_dir)
    stack.callback(_stop, server.process)
    client = Redis.from_url(redis_url)
    try:
        _wait_until(lambda: bool(client.zcard(WORKER_DIRECTORY)), server, "worker registration")
    finally:
        client.close()
    return server


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so every ``finally`` stops what it started."""
    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ============================================================================ measuring


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (psutil if installed, else /proc), or None."""
    try:
        psutil: Any = importlib.import_module("psutil")
    except ImportError:
        psutil = None
    try:
        if psutil is not None:
            times = psutil.Process(pid).cpu_times()
            return float(times.user + times.system)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except Exception:  # gone, or no /proc: unknown, not fatal
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / os.sysconf("SC_CLK_TCK")


def _cpu_snapshot(pids: dict[str, int]) -> dict[str, float | None]:
    return {name: _cpu_seconds(pid) for name, pid in pids.items()}


def _machine_ticks() -> tuple[int, int] | None:
    """(busy, total) CPU ticks of the whole machine since boot, from /proc/stat."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    ticks = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def _machine_report(before: tuple[int, int] | None,
                    after: tuple[int, int] | None) -> dict[str, float] | None:
    """Busy CPUs of the whole machine over the window (kernel and other processes too)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    share = (after[0] - before[0]) / (after[1] - before[1])
    return {"busy_share": share, "busy_cpus": share * (os.cpu_count() or 1)}


class _RedisProbe:
    """Reads Redis command counters over one connection, opened before the window."""

    def __init__(self, url: str | None) -> None:
        from redis import Redis

        self._client = Redis.from_url(url) if url is not None else None
        if self._client is not None:
            self._client.ping()  # connect now: the handshake's commands stay out of the window

    def counters(self) -> dict[str, int] | None:
        """``total_commands_processed`` and calls per command (one ``INFO all`` command)."""
        if self._client is None:
            return None
        info: dict[str, Any] = self._client.info("all")
        counters = {"total": int(info["total_commands_processed"])}
        for key, value in info.items():
            if key.startswith("cmdstat_") and isinstance(value, dict):
                counters[key[len("cmdstat_"):]] = int(value["calls"])
        return counters

    def session_memory(self) -> dict[str, float] | None:
        """Redis memory of every session's keys (record and logs), per session.

        Read while the sessions are still attached, after they streamed the whole run.
        """
        if self._client is None:
            return None
        per_session: dict[bytes, int] = {}
        for key in self._client.scan_iter(match="dg:*:s:*", count=1000):
            session = key.rsplit(b":", 1)[0]
            usage = self._client.memory_usage(key, samples=0)
            per_session[session] = per_session.get(session, 0) + int(usage or 0)
        if not per_session:
            return None
        sizes = sorted(per_session.values())
        return {"sessions": len(sizes), "mean_kib": sum(sizes) / len(sizes) / 1024,
                "max_kib": sizes[-1] / 1024}

    def close(self) -> None:
        """Close the connection."""
        if self._client is not None:
            self._client.close()


@dataclass(slots=True)
class _Window:
    """Counters read at the end of warm-up and once every chunk is back."""

    cpu_before: dict[str, float | None]
    redis_before: dict[str, int] | None
    cpu_after: dict[str, float | None] = field(default_factory=dict)
    redis_after: dict[str, int] | None = None
    machine_before: tuple[int, int] | None = None
    machine_after: tuple[int, int] | None = None
    session_memory: dict[str, float] | None = None
    wall_s: float = 0.0


def _percentile(ordered: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted values; None when there are none."""
    if not ordered:
        return None
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def distribution(values_s: Sequence[float]) -> dict[str, float | None]:
    """p50/p90/p99/max/mean of seconds, in milliseconds."""
    ordered = sorted(v * 1000 for v in values_s)
    mean = sum(ordered) / len(ordered) if ordered else None
    return {"p50": _percentile(ordered, 0.50), "p90": _percentile(ordered, 0.90),
            "p99": _percentile(ordered, 0.99), "max": ordered[-1] if ordered else None,
            "mean": mean}


def _round_trips(logs: Sequence[_SessionLog], since: float) -> tuple[list[float], int]:
    """Round trips (s) of the chunks sent at or after ``since``, and how many were sent."""
    trips: list[float] = []
    measured = 0
    for log in logs:
        for chunk, sent in enumerate(log.sent):
            if sent < since:
                continue
            measured += 1
            received = log.received.get(chunk)
            if received is not None:
                trips.append(received - sent)
    return trips, measured


def _chunk_counts(logs: Sequence[_SessionLog], measured: int, returned: int) -> dict[str, int]:
    sent = sum(len(log.sent) for log in logs)
    received = sum(len(log.received) for log in logs)
    return {
        "sent": sent, "received": received, "lost": sent - received,
        "measured_sent": measured, "measured_received": returned,
        "duplicates": sum(log.duplicates for log in logs),
        "corrupt": sum(log.corrupt for log in logs),
        "misrouted": sum(log.misrouted for log in logs),
        "sessions_failed": sum(1 for log in logs if log.open_s is None),
        "sessions_disconnected": sum(1 for log in logs if log.disconnected),
    }


def _cpu_report(window: _Window, chunks: int) -> dict[str, dict[str, float | None]]:
    report: dict[str, dict[str, float | None]] = {}
    for name, before in window.cpu_before.items():
        after = window.cpu_after.get(name)
        spent = after - before if after is not None and before is not None else None
        per_chunk = spent / chunks * 1e6 if spent is not None and chunks else None
        share = spent / window.wall_s if spent is not None and window.wall_s else None
        report[name] = {"cpu_s": spent, "us_per_chunk": per_chunk, "core_share": share}
    return report


def _script_only_commands() -> frozenset[str]:
    """Commands that only the store's Lua scripts run (read from ``store.lua``).

    Redis counts a command run inside a script like one a client sent, so the client-side
    count (round trips: a script call is one) is the total less these. The reads that the
    Python code also issues itself stay client commands.
    """
    from store import lua

    text = "".join(getattr(lua, name) for name in lua.__all__)
    called = {name.lower() for name in re.findall(r"redis\.call\('(\w+)'", text)}
    return frozenset(called - _ALSO_DIRECT)


def _redis_report(window: _Window, session_seconds: float) -> dict[str, Any] | None:
    before, after = window.redis_before, window.redis_after
    if before is None or after is None:
        return None
    total = after["total"] - before["total"] - 1  # less our own INFO
    calls = {name: after[name] - before.get(name, 0) for name in after if name != "total"}
    calls["info"] = calls.get("info", 0) - 1
    calls = {name: n for name, n in sorted(calls.items(), key=lambda kv: -kv[1]) if n > 0}
    in_scripts = sum(n for name, n in calls.items() if name in _script_only_commands())
    client = total - in_scripts
    return {"client_commands": client, "per_session_second": client / session_seconds,
            "commands_incl_in_scripts": total,
            "incl_in_scripts_per_session_second": total / session_seconds,
            "session_seconds": session_seconds, "calls_by_command": calls}


def _summarize(name: str, logs: Sequence[_SessionLog], t0: float, seconds: float,
               window: _Window) -> dict[str, Any]:
    since = t0 + WARMUP_S
    trips, measured = _round_trips(logs, since)
    errors = [e for log in logs for e in log.errors][:_MAX_ERRORS]
    opens = [log.open_s for log in logs if log.open_s is not None]
    lags = [lag for log in logs for sent, lag in zip(log.sent, log.lag, strict=True)
            if sent >= since]
    summary: dict[str, Any] = {
        "phase": name,
        "round_trip_ms": distribution(trips),
        "round_trips_s": trips,
        "chunks": _chunk_counts(logs, measured, len(trips)),
        "send_lag_ms": distribution(lags),
        "open_ms": distribution(opens),
        "window_s": window.wall_s,
        "machine_cpu": _machine_report(window.machine_before, window.machine_after),
        "cpu": _cpu_report(window, len(trips)),
        "redis": _redis_report(window, len(logs) * (seconds - WARMUP_S)),
        "redis_memory_per_session": window.session_memory,
        "errors": errors,
    }
    if summary["machine_cpu"] is not None:
        summary["machine_cpu"]["other_cpus"] = _other_cpus(summary)
    return summary


# ============================================================================ phases


@dataclass(frozen=True, slots=True, kw_only=True)
class _Phase:
    """One phase's target and what to measure while it runs."""

    name: str
    url: str
    servers: dict[str, int]  # name -> pid
    redis_url: str | None
    sessions: int
    seconds: float
    clients: int
    compression: bool


def _split(sessions: int, clients: int) -> list[tuple[int, ...]]:
    """Session indices per client, interleaved so each process gets a spread of start times."""
    return [tuple(range(first, sessions, clients)) for first in range(min(clients, sessions))]


def _start_clients(phase: _Phase, stack: contextlib.ExitStack
                   ) -> tuple[list[Connection], dict[str, int]]:
    ctx = multiprocessing.get_context("spawn")
    conns: list[Connection] = []
    pids: dict[str, int] = {}
    for number, indices in enumerate(_split(phase.sessions, phase.clients)):
        parent, child = ctx.Pipe()
        spec = _ClientSpec(url=phase.url, mode=phase.name, indices=indices,
                           sessions=phase.sessions, seconds=phase.seconds,
                           compression=phase.compression)
        process = ctx.Process(target=_client_main, args=(child, spec), daemon=True,
                              name=f"bench-client-{number}")
        process.start()
        stack.callback(_stop_client, process)
        # Closed first on the way out: a client still waiting for "close" then sees EOF.
        stack.callback(parent.close)
        child.close()
        conns.append(parent)
        pids[f"client{number}"] = process.pid or 0
    return conns, pids


def _stop_client(process: Any) -> None:
    process.join(_STOP_TIMEOUT_S)
    if process.is_alive():
        process.terminate()
        process.join(_STOP_TIMEOUT_S)
    if process.is_alive():
        process.kill()
        process.join()


def _receive(conn: Connection, timeout: float, what: str) -> Any:
    if not conn.poll(max(0.0, timeout)):
        raise BenchError(f"no {what} from a client process in {timeout:.0f} s")
    try:
        return conn.recv()
    except EOFError:
        raise BenchError(f"a client process died before its {what}") from None


def _run_phase(phase: _Phase) -> dict[str, Any]:
    """Drive one phase with client processes; read counters around the measured window."""
    with contextlib.ExitStack() as stack:
        conns, client_pids = _start_clients(phase, stack)
        for conn in conns:
            _receive(conn, _START_TIMEOUT_S, "start handshake")
        t0 = time.monotonic() + 0.2
        for conn in conns:
            conn.send(t0)
        pids = {**phase.servers, **client_pids}
        probe = _RedisProbe(phase.redis_url)
        stack.callback(probe.close)
        time.sleep(max(0.0, t0 + WARMUP_S - time.monotonic()))
        began = time.monotonic()
        window = _Window(_cpu_snapshot(pids), probe.counters(), machine_before=_machine_ticks())
        deadline = t0 + phase.seconds + DRAIN_S + 2 * _OPEN_TIMEOUT_S + 10
        logs: list[_SessionLog] = []
        for conn in conns:
            logs += _receive(conn, deadline - time.monotonic(), "results")
        window.cpu_after = _cpu_snapshot(pids)
        window.machine_after = _machine_ticks()
        window.redis_after = probe.counters()
        window.session_memory = probe.session_memory()
        window.wall_s = time.monotonic() - began
        for conn in conns:
            conn.send("close")
    logs.sort(key=lambda log: log.index)
    return _summarize(phase.name, logs, t0, phase.seconds, window)


def _echo_phase(sessions: int, seconds: float, clients: int, compression: bool,
                log_dir: Path) -> dict[str, Any]:
    from store.embedded import free_port

    port = free_port()
    with contextlib.ExitStack() as stack:
        echo = start_http_server(stack, "echo", ["duplex_gateway._echo", "--port", str(port)],
                                  port, log_dir)
        return _run_phase(_Phase(
            name="echo", url=f"ws://127.0.0.1:{port}/v1/realtime", servers={"echo": echo.pid},
            redis_url=None, sessions=sessions, seconds=seconds, clients=clients,
            compression=compression))


def _gateway_phase(sessions: int, seconds: float, clients: int, compression: bool,
                   log_dir: Path) -> tuple[dict[str, Any], str]:
    from store.embedded import free_port, start_server

    port = free_port()
    with contextlib.ExitStack() as stack:
        redis = start_server("auto")
        stack.callback(shutil.rmtree, redis.workdir, True)
        stack.callback(redis.stop)
        # First: a gateway is ready (/readyz 200) only once a worker is live.
        worker = start_worker(stack, redis.url, max(sessions, 1), log_dir)
        gateway = start_http_server(
            stack, "gateway", ["duplex_gateway", "--log-level", "warning", "serve", "--host",
                               "127.0.0.1", "--port", str(port), "--redis-url", redis.url],
            port, log_dir)
        result = _run_phase(_Phase(
            name="gateway", url=f"ws://127.0.0.1:{port}/v1/realtime",
            servers={"gateway": gateway.pid, "worker": worker.pid,
                     "redis": redis.process.pid},
            redis_url=redis.url, sessions=sessions, seconds=seconds, clients=clients,
            compression=compression))
        return result, redis.binary.name


# ============================================================================ report


def _minus(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _stack_us(phase: dict[str, Any], names: Sequence[str]) -> float | None:
    values = [phase["cpu"][n]["us_per_chunk"] for n in names if n in phase["cpu"]]
    return sum(values) if values and all(v is not None for v in values) else None


def _verdict(value: float | None, target: float, valid: bool) -> str:
    """``met``/``missed`` against a design target; ``n/a`` when the run is not comparable."""
    if value is None:
        return "n/a"
    if not valid:
        return "n/a (lossy run)"
    return "met" if value <= target else "missed"


def _comparison(echo: dict[str, Any], gateway: dict[str, Any]) -> dict[str, Any]:
    e, g = echo["round_trip_ms"], gateway["round_trip_ms"]
    echo_us = echo["cpu"]["echo"]["us_per_chunk"]
    redis = gateway["redis"]
    added = {q: _minus(g[q], e[q]) for q in ("p50", "p90", "p99", "max")}
    cpu_ratio = _ratio(gateway["cpu"]["gateway"]["us_per_chunk"], echo_us)
    per_session_s = redis["per_session_second"] if redis else None
    memory = gateway.get("redis_memory_per_session")
    memory_kib = memory["mean_kib"] if memory else None
    valid = _lossless(echo) and _lossless(gateway)
    return {
        "added_round_trip_ms": added,
        "target_added_round_trip_p99_ms": TARGET_ADDED_RTT_P99_MS,
        "gateway_cpu_ratio": cpu_ratio,
        "stack_cpu_ratio": _ratio(_stack_us(gateway, ("gateway", "worker", "redis")), echo_us),
        "target_cpu_ratio": TARGET_CPU_RATIO,
        "redis_commands_per_session_second": per_session_s,
        "target_redis_commands_per_session_second": TARGET_REDIS_PER_SESSION_S,
        "redis_memory_per_session_kib": memory_kib,
        "target_redis_memory_per_session_kib": TARGET_SESSION_MEMORY_KIB,
        "verdicts": {
            "added_round_trip_p99": _verdict(added["p99"], TARGET_ADDED_RTT_P99_MS, valid),
            "gateway_cpu_ratio": _verdict(cpu_ratio, TARGET_CPU_RATIO, valid),
            "redis_commands_per_session_second": _verdict(per_session_s,
                                                          TARGET_REDIS_PER_SESSION_S, valid),
            "redis_memory_per_session": _verdict(memory_kib, TARGET_SESSION_MEMORY_KIB, valid),
        },
    }


def _lossless(phase: dict[str, Any]) -> bool:
    chunks = phase["chunks"]
    return bool(chunks["sent"] > 0 and chunks["lost"] == 0 and chunks["duplicates"] == 0
                and chunks["corrupt"] == 0 and chunks["misrouted"] == 0
                and chunks["sessions_failed"] == 0)


def _phase_warnings(phase: dict[str, Any], sessions: int, cpus: int) -> list[str]:
    name, chunks = phase["phase"], phase["chunks"]
    notes = []
    if chunks["sessions_failed"] or chunks["sessions_disconnected"]:
        notes.append(f"{name}: {chunks['sessions_failed']} of {sessions} sessions failed to "
                     f"open and {chunks['sessions_disconnected']} were disconnected: its "
                     "numbers cover fewer sessions (see errors in the JSON, and the logs)")
    if chunks["lost"]:
        notes.append(f"{name}: {chunks['lost']} chunks were sent and never came back")
    lag = phase["send_lag_ms"]["p99"]
    if lag is not None and lag > _LAG_WARNING_MS:
        notes.append(f"{name}: the load generator fell behind its clock (send lag p99 "
                     f"{lag:.1f} ms): the machine is overloaded, compare with care")
    busy = _busy_cpus(phase)
    if busy is not None and busy > _BUSY_WARNING * cpus:
        notes.append(f"{name}: the machine's CPUs were {busy / cpus:.0%} busy: saturated, "
                     "so latency includes waiting for a CPU")
    other = _other_cpus(phase)
    if other is not None and other > _OTHER_WARNING_CPUS:
        notes.append(f"{name}: {other:.2f} CPUs were busy outside the measured processes "
                     "(kernel networking, or another job on this machine): numbers disturbed")
    return notes


def _warnings(report: dict[str, Any]) -> list[str]:
    """What makes this run's numbers less than they seem: failures, overload."""
    config = report["config"]
    return [note for phase in report["phases"].values()
            for note in _phase_warnings(phase, config["sessions"], config["cpus"])]


def _shout(verdict: str) -> str:
    """Upper-case a miss so it stands out in the table."""
    return verdict.upper() if verdict == "missed" else verdict


def _fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _latency_rows(echo: dict[str, Any], gateway: dict[str, Any],
                  cmp: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    rows = []
    for q in ("p50", "p90", "p99", "max"):
        added = cmp["added_round_trip_ms"][q]
        target, verdict = "", ""
        if q == "p99":
            target = f"<= {TARGET_ADDED_RTT_P99_MS:g} (2/dir)"
            verdict = _shout(cmp["verdicts"]["added_round_trip_p99"])
        rows.append((f"round trip {q} (ms)", _fmt(echo["round_trip_ms"][q]),
                     _fmt(gateway["round_trip_ms"][q]), _fmt(added, suffix=" added"),
                     f"{target} {verdict}".strip()))
    return rows


def _count_rows(echo: dict[str, Any],
                gateway: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    rows = []
    for key in ("sent", "received", "lost", "measured_received"):
        rows.append((f"chunks {key.replace('_', ' ')}", str(echo["chunks"][key]),
                     str(gateway["chunks"][key]), "", "0" if key == "lost" else ""))
    for key in ("sessions_failed", "sessions_disconnected"):
        rows.append((key.replace("_", " "), str(echo["chunks"][key]),
                     str(gateway["chunks"][key]), "", "0"))
    rows.append(("send lag p99 (ms)", _fmt(echo["send_lag_ms"]["p99"]),
                 _fmt(gateway["send_lag_ms"]["p99"]), "", ""))
    return rows


def _cpu_rows(echo: dict[str, Any], gateway: dict[str, Any],
              cmp: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    def us(phase: dict[str, Any], name: str) -> str:
        entry = phase["cpu"].get(name)
        return "" if entry is None else _fmt(entry["us_per_chunk"], 1)

    rows = [("CPU/chunk (us): server", us(echo, "echo"), us(gateway, "gateway"),
             _fmt(cmp["gateway_cpu_ratio"], 2, "x echo"),
             f"<= {TARGET_CPU_RATIO:g}x {_shout(cmp['verdicts']['gateway_cpu_ratio'])}")]
    rows += [(f"CPU/chunk (us): {name}", "", us(gateway, name), "", "")
             for name in ("worker", "redis")]
    rows.append(("CPU/chunk (us): whole stack", us(echo, "echo"),
                 _fmt(_stack_us(gateway, ("gateway", "worker", "redis")), 1),
                 _fmt(cmp["stack_cpu_ratio"], 2, "x echo"), ""))
    clients = sorted(n for n in echo["cpu"] if n.startswith("client"))
    rows += [(f"core share: {name}", _fmt(echo["cpu"].get(name, {}).get("core_share"), 2),
              _fmt(gateway["cpu"].get(name, {}).get("core_share"), 2), "", "")
             for name in ("echo", "gateway", "worker", "redis", *clients)
             if name in echo["cpu"] or name in gateway["cpu"]]
    rows.append(("machine CPUs busy (all)", _fmt(_busy_cpus(echo), 2),
                 _fmt(_busy_cpus(gateway), 2), "", ""))
    rows.append(("  outside measured processes", _fmt(_other_cpus(echo), 2),
                 _fmt(_other_cpus(gateway), 2), "", ""))
    return rows


def _busy_cpus(phase: dict[str, Any]) -> float | None:
    machine = phase["machine_cpu"]
    return None if machine is None else float(machine["busy_cpus"])


def _other_cpus(phase: dict[str, Any]) -> float | None:
    """Busy CPUs not accounted to the phase's own processes (servers and clients)."""
    busy = _busy_cpus(phase)
    if busy is None:
        return None
    # /proc/stat is sampled per tick and per-process times are not: clamp the noise at 0.
    return max(0.0, busy - sum(v["core_share"] or 0.0 for v in phase["cpu"].values()))


def _redis_rows(gateway: dict[str, Any],
                cmp: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    redis = gateway["redis"]
    if redis is None:
        return []
    verdict = _shout(cmp["verdicts"]["redis_commands_per_session_second"])
    return [
        ("Redis cmds / session-s (sent)", "", _fmt(redis["per_session_second"], 1), "",
         f"<= {TARGET_REDIS_PER_SESSION_S:g} {verdict}"),
        ("  incl. run inside scripts", "", _fmt(redis["incl_in_scripts_per_session_second"], 1),
         "", ""),
        ("Redis KiB / session (mean)", "", _fmt(cmp["redis_memory_per_session_kib"], 1), "",
         f"<= {TARGET_SESSION_MEMORY_KIB:g} "
         f"{_shout(cmp['verdicts']['redis_memory_per_session'])}"),
    ]


def _format_table(report: dict[str, Any]) -> str:
    config = report["config"]
    echo, gateway = report["phases"]["echo"], report["phases"]["gateway"]
    cmp = report["comparison"]
    header = (f"relay bench: {config['sessions']} sessions x {config['seconds']:g} s, "
              f"{config['chunk_ms']:g} ms chunks ({config['chunk_bytes']} B pcm16), "
              f"warm-up {config['warmup_s']:g} s excluded; {config['cpus']} CPUs, "
              f"{config['client_processes']} client process(es), {config['redis_server']}")
    rows = [("", "echo", "gateway", "gateway - echo", "target")]
    rows += _latency_rows(echo, gateway, cmp) + _count_rows(echo, gateway)
    rows += _cpu_rows(echo, gateway, cmp) + _redis_rows(gateway, cmp)
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = [header]
    for row in rows:
        lines.append("  ".join([row[0].ljust(widths[0])]
                               + [cell.rjust(widths[i]) for i, cell in enumerate(row) if i]))
    lines.append(TARGETS_NOTE)
    lines += [f"warning: {note}" for note in report["warnings"]]
    return "\n".join(lines)


def _plot(path: Path, echo: Sequence[float], gateway: Sequence[float]) -> Path:
    """Draw the round-trip CDFs (milliseconds, log axis) to ``path`` as SVG."""
    return write_chart(path, Chart(
        title="relay round trip: bare websocket echo vs the gateway stack",
        x_label="round trip (ms, log scale)", y_label="fraction of chunks",
        series={"echo": cdf([t * 1000 for t in echo]),
                "gateway": cdf([t * 1000 for t in gateway])},
        log_x=True))


def _config(sessions: int, seconds: float, clients: int, compression: bool) -> dict[str, Any]:
    return {
        "sessions": sessions, "seconds": seconds, "chunk_ms": CHUNK_S * 1000,
        "chunk_bytes": CHUNK_BYTES, "warmup_s": WARMUP_S, "ramp_s": RAMP_S,
        "drain_s": DRAIN_S, "client_processes": clients,
        "websocket_compression": "permessage-deflate" if compression else None,
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "python": platform.python_version(), "platform": platform.platform(),
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _write(report: dict[str, Any], output: Path) -> list[str]:
    """Write the JSON (and the plot); return the lines that say where they went."""
    output.parent.mkdir(parents=True, exist_ok=True)
    trips = {name: phase.pop("round_trips_s") for name, phase in report["phases"].items()}
    output.write_text(json.dumps(report, indent=2) + "\n")
    notes = [f"results: {output}"]
    if trips["echo"] or trips["gateway"]:
        plot = _plot(output.with_suffix(".cdf.svg"), trips["echo"], trips["gateway"])
        notes.append(f"latency CDF plot: {plot}")
    logs = sorted(output.parent.glob("relay-*.log"))
    notes += [f"server log (not empty): {log}" for log in logs if log.stat().st_size]
    return notes


def _default_clients(sessions: int) -> int:
    """One client process per :data:`SESSIONS_PER_CLIENT` sessions, at most one per CPU."""
    cpus = os.cpu_count() or 1
    return max(1, min(cpus, math.ceil(sessions / SESSIONS_PER_CLIENT)))


def _measure(sessions: int, seconds: float, clients: int, compression: bool,
             log_dir: Path) -> dict[str, Any]:
    config = _config(sessions, seconds, clients, compression)
    print(f"echo phase: {sessions} sessions x {seconds:g} s ...", flush=True)
    echo = _echo_phase(sessions, seconds, clients, compression, log_dir)
    print(f"gateway phase: {sessions} sessions x {seconds:g} s ...", flush=True)
    gateway, redis_name = _gateway_phase(sessions, seconds, clients, compression, log_dir)
    config["redis_server"] = redis_name
    report: dict[str, Any] = {"config": config, "phases": {"echo": echo, "gateway": gateway},
                              "comparison": _comparison(echo, gateway)}
    report["lossless"] = _lossless(echo) and _lossless(gateway)
    report["warnings"] = _warnings(report)
    return report


def run_relay_bench(*, sessions: int, seconds: float,
                    output: str | os.PathLike[str] | None = None,
                    clients: int | None = None, compression: bool = True) -> int:
    """Run the echo phase and the gateway phase, print the table, write the JSON.

    Args:
        sessions: concurrent real-time sessions (N).
        seconds: length of each phase (S); the first second is warm-up.
        output: the JSON file; its folder is created, the plot goes next to it (default:
            :func:`default_output` of ``"relay"``).
        clients: load-generator processes (default: one per 100 sessions, at most one per CPU).
        compression: negotiate permessage-deflate, as the OpenAI SDK and browsers do.

    Returns:
        0 when it ran and every chunk came back intact, 1 when chunks were lost (or came
        back duplicated, corrupt or misrouted), 2 when it could not run, 130 when interrupted.
    """
    if sessions < 1 or seconds <= WARMUP_S + CHUNK_S:
        print(f"bench relay: need --sessions >= 1 and --seconds > {WARMUP_S:g}",
              file=sys.stderr)
        return 2
    path = output_path(output, "relay")
    path.parent.mkdir(parents=True, exist_ok=True)
    count = clients or _default_clients(sessions)
    try:
        with _sigterm_as_interrupt():
            report = _measure(sessions, seconds, count, compression, path.parent)
    except KeyboardInterrupt:
        print("bench relay: interrupted; every started process was stopped", file=sys.stderr)
        return 130
    except (BenchError, OSError, RuntimeError) as exc:
        print(f"bench relay: could not run: {exc}", file=sys.stderr)
        return 2
    notes = _write(report, path)
    print(_format_table(report))
    print("\n".join(notes))
    if not report["lossless"]:
        print("bench relay: chunks were lost, duplicated, corrupted or misrouted",
              file=sys.stderr)
        return 1
    return 0
