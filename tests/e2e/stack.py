"""Real processes for end-to-end tests: gateways and workers on a real Redis, killable."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from redis import Redis
from redis.cluster import RedisCluster

from runtime.embedded import EmbeddedServer, free_port
from store.client import is_cluster_url
from store.keys import WORKER_DIRECTORY

DEADLINE_S = 20.0

#: Where every spawned process writes its output, for the whole test run: the suite scans it
#: for ERROR lines after each test and for secrets at the end (tests/conftest.py). Set by the
#: session fixture; a temporary folder when the stack is used alone.
LOG_DIR_VARIABLE = "DUPLEX_TEST_LOG_DIR"
#: A file in the log folder listing, one a line, the API keys the stack handed to processes.
KNOWN_SECRETS = "known-secrets.txt"
_log_names = itertools.count()

#: What a gateway's /readyz answers when it can place sessions, and when it reaches Redis
#: but no worker is live in the directory.
READY = (200, "ready")
NO_WORKER = (503, "no worker")


def log_dir() -> Path:
    """The folder process logs go to (made on first use)."""
    folder = os.environ.get(LOG_DIR_VARIABLE)
    if not folder:
        folder = tempfile.mkdtemp(prefix="duplex-logs-")
        os.environ[LOG_DIR_VARIABLE] = folder
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    return path


def new_log_path(name: str) -> Path:
    """A fresh file in the log folder for one process called ``name``."""
    return log_dir() / f"{next(_log_names):04d}-{name}.log"


def print_tail(name: str, log: Path) -> None:
    """The last lines of a process's log on stderr, which pytest shows only when the test
    failed."""
    tail = log.read_text(errors="replace").splitlines()[-40:]
    if tail:
        print(f"--- {name} ({log}) ---", *tail, sep="\n", file=sys.stderr)


# What an ERROR looks like in a process log: the product's text format
# ("<asctime> ERROR <logger>: ..."), uvicorn's own ("ERROR:    ..."), a Python traceback
# (printed with or without a log line before it), and a JSON line whose level is ERROR.
_TEXT_ERROR = re.compile(r"^\d{4}-\d\d-\d\d [\d:,.]+ (?:ERROR|CRITICAL) \S+:(?: |$)")
_UVICORN_ERROR = re.compile(r"^(?:ERROR|CRITICAL):\s")
_TRACEBACK = "Traceback (most recent call last):"
_ERROR_LEVELS = frozenset({"ERROR", "CRITICAL"})


def _json_level(line: str) -> str:
    """The ``level`` of a JSON log line, upper-cased; "" for any other line."""
    if not line.lstrip().startswith("{"):
        return ""
    try:
        record = json.loads(line)
    except ValueError:
        return ""
    return str(record.get("level", "")).upper() if isinstance(record, dict) else ""


def is_error_line(line: str) -> bool:
    """Whether one line of a process log reports an error (ERROR, CRITICAL, a traceback)."""
    return (bool(_TEXT_ERROR.match(line)) or bool(_UVICORN_ERROR.match(line))
            or _TRACEBACK in line or _json_level(line) in _ERROR_LEVELS)


# How many lines of a traceback a report shows: enough for the deepest of ours.
_TRACEBACK_SHOWN = 40


def _told(lines: list[str], index: int) -> str:
    """``lines[index]``; for a traceback's first line, the traceback down to its exception,
    and the line before it when that one is no ERROR line itself (what printed it: "Exception
    ignored in ...", a WARNING with a traceback), so a report names the failure, not only
    that there was one."""
    line = lines[index]
    if _TRACEBACK not in line:
        return line
    told = [line]
    if index and not is_error_line(lines[index - 1]):
        told.insert(0, lines[index - 1])
    for following in lines[index + 1:index + 1 + _TRACEBACK_SHOWN]:
        told.append(following)
        if following[:1] not in ("", " ", "\t"):  # the exception: the traceback's last line
            break
    return "\n".join(told)


@dataclass(frozen=True)
class LogWatch:
    """Reads the process logs of a folder a piece at a time: each call sees only the lines
    written since the last one, so every line is judged once, in the test that was running
    when it was written (or the first check after)."""

    folder: Path
    #: How far each log has been read: always the end of a complete line.
    offsets: dict[Path, int] = field(default_factory=dict)

    def new_error_lines(self) -> list[str]:
        """``file: line`` for every ERROR line written since the last call; a traceback's
        with what it says (:func:`_told`)."""
        found = []
        for log in sorted(self.folder.glob("*.log")):
            lines = self._new_lines(log)
            found += [f"{log.name}: {_told(lines, index)}"
                      for index, line in enumerate(lines) if is_error_line(line)]
        return found

    def _new_lines(self, log: Path) -> list[str]:
        start = self.offsets.get(log, 0)
        if log.stat().st_size <= start:
            return []
        with log.open("rb") as stream:
            stream.seek(start)
            chunk = stream.read()
        # A running process may be halfway through a line: that line waits for the next call.
        complete = chunk.rfind(b"\n") + 1
        self.offsets[log] = start + complete
        return chunk[:complete].decode(errors="replace").splitlines()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = DEADLINE_S) -> None:
    """Poll ``condition`` until it holds, failing with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def http_answer(url: str) -> tuple[int, str] | None:
    """The status and body of a GET of ``url``; None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode()
    except (urllib.error.URLError, OSError):
        return None


def http_ok(url: str) -> bool:
    answer = http_answer(url)
    return answer is not None and answer[0] == 200


@dataclass
class Proc:
    """One child process of the stack."""

    name: str
    process: subprocess.Popen[bytes]
    port: int = 0
    log: Path | None = None
    #: The address it serves on, as this process reaches it.
    host: str = "127.0.0.1"

    def output(self) -> str:
        """Everything the process wrote so far (stdout and stderr)."""
        return self.log.read_text(errors="replace") if self.log is not None else ""

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}/v1/realtime"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def kill(self) -> None:
        """SIGKILL: a crash, nothing flushed."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM and wait for a graceful exit."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)


@dataclass
class Stack:
    """A Redis server plus the gateways and workers a test started on it."""

    redis: EmbeddedServer
    env: dict[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    #: What the processes are given; the server's own URL unless a test names another
    #: (``redis+sentinel://``; ``redis+cluster://``, where ``redis`` is one of its nodes).
    redis_url: str = ""

    @property
    def url(self) -> str:
        return self.redis_url or self.redis.url

    def reader(self) -> Redis | RedisCluster:
        """A client for the test's own reads of what the processes store: a Cluster client
        on a ``redis+cluster://`` URL (a key may live on any node), else the server itself."""
        if is_cluster_url(self.url):
            seed = urlsplit(self.url)._replace(scheme="redis")
            return RedisCluster.from_url(urlunsplit(seed))
        return Redis.from_url(self.redis.url)

    def _spawn(self, name: str, args: list[str], port: int = 0, *,
               log_level: str = "warning", host: str = "127.0.0.1",
               prefix: Sequence[str] = ()) -> Proc:
        env = {**os.environ, **self.env}
        folder = log_dir()
        keys = [k for k in env.get("DUPLEX_GATEWAY_API_KEYS", "").split(",") if k]
        if keys:
            with (folder / KNOWN_SECRETS).open("a") as known:
                known.writelines(f"{key}\n" for key in keys)
        path = new_log_path(name)
        with path.open("wb") as sink:  # the child keeps its own descriptor
            process = subprocess.Popen(
                [*prefix, sys.executable, "-m", "duplex_gateway", "--log-level", log_level,
                 *args], env=env, stdout=sink, stderr=subprocess.STDOUT)
        proc = Proc(name, process, port, path, host)
        self.procs.append(proc)
        return proc

    def gateway(self, *, log_level: str = "warning", redis_url: str = "",
                host: str = "127.0.0.1", prefix: Sequence[str] = ()) -> Proc:
        """Start a gateway and wait until it serves and reaches Redis: ready, or lacking only
        a live worker (/readyz wants one, and tests mostly start the gateway first).
        ``redis_url``: where this one reaches Redis (a fault proxy, say) instead; ``host``:
        the address it serves on; ``prefix``: what runs it (``ip netns exec <name>``, say)."""
        port = free_port()
        proc = self._spawn("gateway", ["serve", "--host", host, "--port", str(port),
                                       "--redis-url", redis_url or self.url], port,
                           log_level=log_level, host=host, prefix=prefix)
        wait_for(lambda: http_answer(proc.http_url + "/readyz") in (READY, NO_WORKER)
                 or proc.process.poll() is not None, f"gateway on {port}")
        assert proc.process.poll() is None, "gateway exited at start"
        return proc

    def worker(self, slots: int = 8, backend: str = "loopback", *, metrics_port: int = 0,
               models: Sequence[str] = (), redis_url: str = "",
               prefix: Sequence[str] = ()) -> Proc:
        """Start a worker (serving ``models``; none: its backend's name) and wait until it is
        in the directory (models load first). ``redis_url`` and ``prefix`` as for
        :meth:`gateway`."""
        client = self.reader()
        before = set(client.zrange(WORKER_DIRECTORY, 0, -1))
        extra = ["--metrics-port", str(metrics_port)] if metrics_port else []
        if models:
            extra += ["--served-model-name", ",".join(models)]
        proc = self._spawn("worker", ["worker", "--redis-url", redis_url or self.url,
                                      "--backend", backend, "--slots", str(slots), *extra],
                           metrics_port, prefix=prefix)
        wait_for(lambda: len(set(client.zrange(WORKER_DIRECTORY, 0, -1)) - before) > 0
                 or proc.process.poll() is not None, "worker registration",
                 timeout=DEADLINE_S if backend == "loopback" else 90.0)
        client.close()
        assert proc.process.poll() is None, "worker exited at start"
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.kill()
        for proc in self.procs:
            if proc.log is not None:
                print_tail(proc.name, proc.log)


class Balancer:
    """A TCP load balancer in front of gateways, as a deployment puts one: each new connection
    goes to the next gateway in turn, skipping one that refuses it (a dead one), and is relayed
    both ways until either side closes. Runs in the test's event loop."""

    def __init__(self, upstreams: Sequence[Proc]) -> None:
        self._ports = [proc.port for proc in upstreams]
        self._turn = 0
        self._server: asyncio.Server | None = None
        self._relays: set[asyncio.Task[None]] = set()
        #: The upstream port of each connection relayed so far, in order.
        self.picks: list[int] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    @property
    def url(self) -> str:
        """``ws://HOST:PORT``: the base URL a client is given."""
        assert self._server is not None
        return f"ws://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for relay in list(self._relays):
            relay.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        relay = asyncio.current_task()
        assert relay is not None
        self._relays.add(relay)
        try:
            for _ in self._ports:
                port = self._ports[self._turn % len(self._ports)]
                self._turn += 1
                try:
                    up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    continue
                self.picks.append(port)
                await _pump_both(reader, writer, up_reader, up_writer)
                return
        finally:
            writer.close()
            self._relays.discard(relay)


async def _pump_both(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> None:
    """Relay bytes both ways until one side ends; then close both."""

    async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()

    pumps = [asyncio.create_task(pump(reader, up_writer)),
             asyncio.create_task(pump(up_reader, writer))]
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        up_writer.close()
