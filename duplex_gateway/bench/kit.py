"""What every ``duplex-gateway bench`` command shares: argument types, where results go,
starting and stopping the servers it measures, and reading their CPU time.

The benches start real processes (gateways, workers, echo and peer servers) with
``python -m`` and measure them from outside: CPU from ``/proc`` (or psutil), readiness over
HTTP. Nothing here knows what a bench measures; :mod:`duplex_gateway.bench.relay` and the
others build on it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import math
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from types import FrameType
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

from duplex_gateway.bench.profiling import profiled
from duplex_gateway.bench.spec import BenchError

__all__ = [
    "RESULTS_DIR",
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "Server",
    "bucket_bounds",
    "cpu_seconds",
    "cpu_snapshot",
    "cpu_times",
    "default_output",
    "distribution",
    "histogram_counts",
    "machine_report",
    "machine_ticks",
    "non_negative_int",
    "output_help",
    "output_path",
    "positive_float",
    "positive_int",
    "positive_int_list",
    "receive_from_client",
    "sigterm_as_interrupt",
    "spawn",
    "start_http_server",
    "start_worker",
    "stop_process",
    "wait_until",
]

#: How long a started server may take to be ready (or a client process to answer).
START_TIMEOUT_S: Final = 30.0
#: How long a stopped process has after SIGTERM before SIGKILL.
STOP_TIMEOUT_S: Final = 10.0


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


# ============================================================================ processes


@dataclass(slots=True)
class Server:
    """One server process the bench started; ``pid`` is what its CPU is read from."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path | None = None

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid


def _child_env(settings: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of started servers: defaults, not the caller's DUPLEX_GATEWAY_*, but
    ``settings`` (the bench's own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPLEX_GATEWAY_")}
    env["DUPLEX_GATEWAY_DRAIN_TIMEOUT_S"] = "1"  # the worker: no one will take over
    return {**env, **(settings or {})}


def spawn(name: str, module_args: list[str], log_dir: Path, *,
          settings: dict[str, str] | None = None) -> Server:
    log_path = log_dir / f"relay-{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", *module_args], env=_child_env(settings),
            stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)  # Ctrl-C reaches the bench, which stops them in order
    return Server(name, process, log_path)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S`."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_until(ready: Callable[[], bool], server: Server, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
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
                       port: int, log_dir: Path, *,
                       settings: dict[str, str] | None = None) -> Server:
    server = spawn(name, module_args, log_dir, settings=settings)
    stack.callback(stop_process, server.process)
    wait_until(lambda: _http_ok(f"http://127.0.0.1:{port}/readyz"), server, f"{name} ready")
    return server


def start_worker(stack: contextlib.ExitStack, redis_url: str, slots: int,
                  log_dir: Path, *, profile_to: Path | None = None,
                  metrics_port: int | None = None, backend: str = "loopback",
                  listed: int = 1, name: str = "worker") -> Server:
    """Start a worker and wait until ``listed`` workers are in the directory (it too);
    ``name`` names its log (two of one name share one)."""
    from redis import Redis

    from store.keys import WORKER_DIRECTORY

    args = ["duplex_gateway", "--log-level", "warning", "worker", "--redis-url", redis_url,
            "--backend", backend, "--slots", str(slots)]
    if metrics_port is not None:
        args += ["--metrics-port", str(metrics_port)]
    server = spawn(name, args if profile_to is None else profiled(args, profile_to), log_dir)
    stack.callback(stop_process, server.process)
    client = Redis.from_url(redis_url)
    try:
        wait_until(lambda: int(client.zcard(WORKER_DIRECTORY)) >= listed, server,
                   "worker registration")
    finally:
        client.close()
    return server


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
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


def cpu_times(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of ``pid`` (psutil if installed, else /proc), or None."""
    try:
        psutil: Any = importlib.import_module("psutil")
    except ImportError:
        psutil = None
    try:
        if psutil is not None:
            times = psutil.Process(pid).cpu_times()
            return float(times.user), float(times.system)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except Exception:  # gone, or no /proc: unknown, not fatal
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick  # utime, stime (fields 14 and 15)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid``, or None."""
    times = cpu_times(pid)
    return None if times is None else times[0] + times[1]


def cpu_snapshot(pids: dict[str, int]) -> dict[str, tuple[float, float] | None]:
    return {name: cpu_times(pid) for name, pid in pids.items()}


def machine_ticks() -> tuple[int, int] | None:
    """(busy, total) CPU ticks of the whole machine since boot, from /proc/stat."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    ticks = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def machine_report(before: tuple[int, int] | None,
                    after: tuple[int, int] | None) -> dict[str, float] | None:
    """Busy CPUs of the whole machine over the window (kernel and other processes too)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    share = (after[0] - before[0]) / (after[1] - before[1])
    return {"busy_share": share, "busy_cpus": share * (os.cpu_count() or 1)}


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


def histogram_counts(url: str, name: str) -> dict[float, float] | None:
    """The cumulative bucket counts of the histogram ``name`` on the Prometheus page at
    ``url``, summed over its label sets (upper bound -> count); None when the page cannot be
    read or has no such histogram."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError, UnicodeDecodeError):
        return None
    counts: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name == f"{name}_bucket":
                bound = float(sample.labels["le"])
                counts[bound] = counts.get(bound, 0.0) + sample.value
    return counts or None


def bucket_bounds(before: dict[float, float] | None, after: dict[float, float] | None,
                  quantiles: Sequence[float]) -> list[float] | None:
    """Per quantile, the upper bound of the bucket that holds it among what was observed
    between two reads of one histogram (:func:`histogram_counts`): PromQL's
    ``histogram_quantile`` without its interpolation, so a bound the value is at most. None
    when nothing was observed; ``math.inf`` for a quantile past the last finite bound."""
    if before is None or after is None:
        return None
    observed = sorted((bound, count - before.get(bound, 0.0)) for bound, count in after.items())
    total = observed[-1][1]
    if total <= 0:
        return None
    return [next(bound for bound, count in observed if count >= q * total) for q in quantiles]


def receive_from_client(conn: Connection, timeout: float, what: str) -> Any:
    """The next message from a load-generating client process over its pipe.

    Raises:
        BenchError: nothing came in ``timeout`` seconds, or the process died first.
    """
    if not conn.poll(max(0.0, timeout)):
        raise BenchError(f"no {what} from a client process in {timeout:.0f} s")
    try:
        return conn.recv()
    except EOFError:
        raise BenchError(f"a client process died before its {what}") from None
