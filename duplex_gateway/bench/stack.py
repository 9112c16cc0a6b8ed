"""A real stack for ``bench worker``'s relay phase: one frame-backend worker, one gateway, an
embedded Redis, real-time streaming clients in their own processes, and per-thread CPU.

The worker's CPU is split by thread from ``/proc/<pid>/task/<tid>/stat``. Python 3.11 gives
its threads no OS name (every ``/proc/<pid>/task/<tid>/comm`` reads the process's name), so the
model thread cannot be found by name without a change to the worker. What is robust instead:
the worker runs its asyncio event loop (websocket-free, but every Redis read and write, the
JSON and base64 codec of every chunk: the relay) on the process's main thread, whose thread id
is the process id. Everything else the process spends is the model side: the engine's model
thread (its ``Backend.step``, and the conversion of each frame to pcm16 it does there) and any
threads the model's library starts (torch's intra-op pool). The model side is the process
total less the main thread, so threads that ended inside the window are counted too.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import multiprocessing
import os
import random
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

from duplex_gateway.bench.kit import receive_from_client, start_http_server, stop_process
from duplex_gateway.bench.spec import CHUNK_BYTES, CHUNK_S

__all__ = ["ClientRun", "ProcessCpu", "StreamResult", "StreamSpec", "WorkerCommand",
           "collect", "go", "read_process_cpu", "start_clients",
           "start_frame_worker", "start_gateway", "start_redis", "window"]

#: Sessions start over this long, so their opens do not all land in one tick.
RAMP_S: Final = 0.5
_OPEN_TIMEOUT_S: Final = 10.0
_CLOSE_TIMEOUT_S: Final = 5.0
_STOP_TIMEOUT_S: Final = 10.0
#: Loading a model (a tiny Moshi included) takes longer than starting the loopback.
_WORKER_START_S: Final = 120.0
_MAX_ERRORS: Final = 5
# Loud noise, not silence: a full-duplex model hears it and answers (the fake echoes it).
_NOISE: Final = base64.b64encode(random.Random(13).randbytes(CHUNK_BYTES)).decode("ascii")
_APPEND: Final = json.dumps({"type": "input_audio_buffer.append", "audio": _NOISE})
# No turn detector of the worker's hears the stream, whatever a backend's sessions start with:
# the relay phase measures the relay and the model, not a VAD.
_PUSH_TO_TALK: Final = json.dumps({"type": "session.update", "session": {
    "type": "realtime", "audio": {"input": {"turn_detection": None}}}})
_CLOSE: Final = json.dumps({"type": "session.close"})


# ============================================================================ CPU by thread


@dataclass(frozen=True, slots=True)
class ProcessCpu:
    """One read of a process's CPU seconds: all of it, and each live thread's."""

    total_s: float
    by_thread: Mapping[int, float]


def _stat_cpu_seconds(stat: str) -> float:
    """utime + stime of one ``stat`` line, in seconds."""
    fields = stat.rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_process_cpu(pid: int) -> ProcessCpu:
    """The CPU seconds of ``pid`` and of each of its threads (``/proc``).

    Raises:
        OSError: the process is gone, or there is no ``/proc``.
    """
    total = _stat_cpu_seconds(Path(f"/proc/{pid}/stat").read_text())
    threads: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended between list and read
            threads[int(task.name)] = _stat_cpu_seconds((task / "stat").read_text())
    return ProcessCpu(total_s=total, by_thread=threads)


# ============================================================================ servers


def _server_env() -> dict[str, str]:
    """Defaults, not the caller's ``DUPLEX_GATEWAY_*``: the figures must not depend on them."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DUPLEX_GATEWAY_")}


def start_redis(stack: contextlib.ExitStack) -> str:
    """An embedded Redis-compatible server, stopped by ``stack``; returns its URL."""
    from runtime.embedded import start_server

    server = start_server("auto")
    stack.callback(server.stop)
    return server.url


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerCommand:
    """What the relay phase's worker runs."""

    backend: str
    slots: int
    model_path: str = ""
    device: str = "cpu"
    dtype: str = "float32"
    backend_options: str = ""

    def arguments(self, redis_url: str) -> list[str]:
        """The ``duplex_gateway worker`` command line (after ``python -m``)."""
        args = ["duplex_gateway", "--log-level", "warning", "worker", "--redis-url", redis_url,
                "--backend", self.backend, "--slots", str(self.slots),
                "--drain-timeout", "1"]  # nobody takes over its sessions: do not wait
        if self.model_path:
            args += ["--model-path", self.model_path]
        if self.backend == "moshi":
            args += ["--device", self.device, "--dtype", self.dtype]
        if self.backend_options:
            args += ["--backend-options", self.backend_options]
        return args


def _worker_registered(redis_url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Return once the worker is in the directory; raise if it exits or takes too long."""
    from redis import Redis

    from store.keys import WORKER_DIRECTORY

    client = Redis.from_url(redis_url)
    deadline = time.monotonic() + _WORKER_START_S
    try:
        while not client.zcard(WORKER_DIRECTORY):
            if process.poll() is not None:
                raise RuntimeError(f"the worker exited with {process.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not register in {_WORKER_START_S:g} s")
            time.sleep(0.05)  # polling another process's registration: no event to wait on
    finally:
        client.close()


def start_frame_worker(stack: contextlib.ExitStack, redis_url: str, command: WorkerCommand,
                       log_dir: Path) -> int:
    """Start a worker, stopped by ``stack``, and wait until it registers; returns its pid.

    Raises:
        RuntimeError: it exited at start or did not register in time.
    """
    log = log_dir / "worker.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", *command.arguments(redis_url)],
                                   env=_server_env(), stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    stack.callback(stop_process, process)
    _worker_registered(redis_url, process, log)
    return process.pid


def start_gateway(stack: contextlib.ExitStack, redis_url: str, log_dir: Path) -> str:
    """Start one gateway (after the worker: it is ready once a worker is live); returns the
    websocket URL of its realtime endpoint."""
    from runtime.embedded import free_port

    port = free_port()
    start_http_server(stack, "gateway", [
        "duplex_gateway", "--log-level", "warning", "serve", "--host", "127.0.0.1",
        "--port", str(port), "--redis-url", redis_url], port, log_dir)
    return f"ws://127.0.0.1:{port}/v1/realtime"


# ============================================================================ clients


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamSpec:
    """What one client process streams. Times are ``time.monotonic()`` seconds from the common
    start ``t0``, which the parent sends once every client is ready (the clock is system-wide,
    so the parent's window means the same in every client)."""

    url: str
    model: str
    indices: tuple[int, ...]
    sessions: int
    warmup_s: float  # sends before t0 + warmup_s are not counted
    seconds: float  # streaming ends at t0 + seconds


def window(spec: StreamSpec, t0: float) -> tuple[float, float]:
    """The measured window of a run that started at ``t0``: [end of warm-up, end)."""
    return t0 + spec.warmup_s, t0 + spec.seconds


@dataclass(slots=True)
class StreamResult:
    """What the sessions of one client process saw."""

    opened: int = 0
    failed: int = 0
    sent_in_window: int = 0
    deltas_in_window: int = 0
    errors: list[str] = field(default_factory=list)

    def error(self, text: str) -> None:
        """Keep the first few errors."""
        if len(self.errors) < _MAX_ERRORS:
            self.errors.append(text[:300])

    def add(self, other: StreamResult) -> None:
        """Fold another process's figures into these."""
        self.opened += other.opened
        self.failed += other.failed
        self.sent_in_window += other.sent_in_window
        self.deltas_in_window += other.deltas_in_window
        for text in other.errors:
            self.error(text)


async def _sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


def _inside(span: tuple[float, float], when: float) -> bool:
    return span[0] <= when < span[1]


async def _count_deltas(ws: Any, span: tuple[float, float], result: StreamResult) -> None:
    """Count the audio the model sends back inside the window (the reader of one session)."""
    from websockets.exceptions import ConnectionClosed

    with contextlib.suppress(ConnectionClosed):
        async for message in ws:
            kind = json.loads(message).get("type")
            if kind == "response.output_audio.delta" and _inside(span, time.monotonic()):
                result.deltas_in_window += 1
            elif kind == "error":
                result.error(str(message))


async def _open(spec: StreamSpec) -> Any:
    from websockets.asyncio.client import connect

    ws = await connect(f"{spec.url}?model={spec.model}", max_size=None,
                       open_timeout=_OPEN_TIMEOUT_S)
    first = json.loads(await asyncio.wait_for(ws.recv(), _OPEN_TIMEOUT_S))
    if first.get("type") != "session.created":
        await ws.close()
        raise RuntimeError(f"open refused: {first}")
    await ws.send(_PUSH_TO_TALK)  # applied before any append: the input log is ordered
    return ws


async def _stream(ws: Any, span: tuple[float, float], phase: float,
                  result: StreamResult) -> None:
    """Send one chunk every 20 ms on an absolute clock (phase + k * 20 ms) until the window
    ends; a late send does not shift the ones after it."""
    chunk = math.ceil(max(0.0, time.monotonic() - phase) / CHUNK_S)
    while (due := phase + chunk * CHUNK_S) < span[1]:
        await _sleep_until(due)
        await ws.send(_APPEND)
        result.sent_in_window += _inside(span, time.monotonic())
        chunk += 1


async def _session(index: int, spec: StreamSpec, t0: float, result: StreamResult) -> None:
    await _sleep_until(t0 + RAMP_S * index / spec.sessions)
    try:
        ws = await _open(spec)
    except Exception as exc:  # a session that did not open is a result, not a crash
        result.failed += 1
        result.error(f"open: {exc!r}")
        return
    result.opened += 1
    span = window(spec, t0)
    reader = asyncio.create_task(_count_deltas(ws, span, result))
    # Phases spread over the 20 ms period, as independent clients' would be.
    phase = t0 + CHUNK_S * index / spec.sessions
    try:
        await _stream(ws, span, phase, result)
        await ws.send(_CLOSE)  # the gateway closes the socket after session.closed
        await asyncio.wait_for(asyncio.shield(reader), _CLOSE_TIMEOUT_S)
    except Exception as exc:  # a dropped session is a result too
        result.error(f"stream: {exc!r}")
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(), _CLOSE_TIMEOUT_S)


async def _drive(spec: StreamSpec, t0: float) -> StreamResult:
    result = StreamResult()
    await asyncio.gather(*(_session(index, spec, t0, result) for index in spec.indices))
    return result


def _client_process(conn: Connection, spec: StreamSpec) -> None:
    """One client process: say ready (imports done), take the start time, stream, report."""
    import websockets.asyncio.client  # noqa: F401  (imported before the clock starts)

    with contextlib.suppress(KeyboardInterrupt, EOFError, BrokenPipeError):
        conn.send("ready")
        t0: float = conn.recv()
        conn.send(asyncio.run(_drive(spec, t0)))


def _stop_client(process: Any) -> None:
    process.join(_STOP_TIMEOUT_S)
    if process.is_alive():
        process.kill()
        process.join()


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientRun:
    """Streaming clients started and ready: their pids, and the parent's ends of their pipes."""

    pids: tuple[int, ...]
    conns: tuple[Connection, ...]


def start_clients(stack: contextlib.ExitStack, specs: Sequence[StreamSpec]) -> ClientRun:
    """One ``spawn`` process per spec, stopped by ``stack``; returns once each is ready."""
    ctx = multiprocessing.get_context("spawn")
    conns: list[Connection] = []
    pids: list[int] = []
    for number, spec in enumerate(specs):
        parent, child = ctx.Pipe()
        process = ctx.Process(target=_client_process, args=(child, spec), daemon=True,
                              name=f"bench-worker-client-{number}")
        process.start()
        stack.callback(_stop_client, process)
        stack.callback(parent.close)
        child.close()
        conns.append(parent)
        pids.append(process.pid or 0)
    for conn in conns:
        receive_from_client(conn, 60.0, "start handshake")
    return ClientRun(pids=tuple(pids), conns=tuple(conns))


def go(clients: ClientRun, t0: float) -> None:
    """Tell every client when the sessions start."""
    for conn in clients.conns:
        conn.send(t0)


def collect(clients: ClientRun, deadline: float) -> StreamResult:
    """Every client's figures folded together, once each has finished."""
    total = StreamResult()
    for conn in clients.conns:
        total.add(receive_from_client(conn, deadline - time.monotonic(), "results"))
    return total

