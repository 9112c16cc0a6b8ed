"""One point of ``duplex-gateway bench relay`` (:mod:`duplex_gateway.bench.relay`): the client
processes that drive its load, the counters read around its measured window, and the figures
of the point."""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

from duplex_gateway.bench.kit import (
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    bucket_bounds,
    cpu_snapshot,
    distribution,
    histogram_counts,
    machine_report,
    machine_ticks,
    receive_from_client,
)
from duplex_gateway.bench.load import ClientSpec, LoadSession, SessionLog
from duplex_gateway.bench.profiling import START, STOP, calls_per_chunk
from duplex_gateway.bench.relay_setups import Target
from duplex_gateway.bench.spec import (
    DRAIN_S,
    MAX_ERRORS,
    OPEN_TIMEOUT_S,
)

__all__ = ["WARMUP_S", "ClientPool", "RedisCounters", "lossless", "run_point"]

WARMUP_S: Final = 1.0
# How long a profiled server may take to write its statistics once told to.
_PROFILE_WRITE_S: Final = 30.0


def _session_class(mode: str) -> type[LoadSession]:
    if mode == "peer":
        from duplex_gateway.bench.peer import PeerSession

        return PeerSession
    return LoadSession


async def _drive(conn: Connection, spec: ClientSpec, t0: float) -> None:
    """Run every session of this process, report their logs, close when told to."""
    kind = _session_class(spec.mode)
    sessions = [kind(index, spec, t0) for index in spec.indices]
    await asyncio.gather(*(session.run() for session in sessions))
    conn.send([session.log for session in sessions])
    # Sessions stay open until the parent has read the CPU counters: closing costs CPU too.
    await asyncio.to_thread(conn.recv)
    await asyncio.gather(*(session.close() for session in sessions))
    conn.send("closed")


def _client_main(conn: Connection) -> None:
    """Entry point of one client process: for each point, take its spec, say ready (imports
    done), take the start time, drive; ``None`` ends the process."""
    with contextlib.suppress(KeyboardInterrupt, EOFError, BrokenPipeError):
        conn.send("ready")
        while (spec := conn.recv()) is not None:
            _session_class(spec.mode)  # imported before the clock starts
            conn.send("ready")
            t0: float = conn.recv()
            asyncio.run(_drive(conn, spec, t0))


@dataclass(frozen=True, slots=True)
class RedisCounters:
    """One ``INFO all`` read: commands (all, and calls per command), bytes on the wire, reads
    from clients (one per batch of commands that arrived together) and the main thread's CPU
    seconds (None where the server does not report it), and the execution time per command."""

    total: int
    net_in: int
    net_out: int
    calls: dict[str, int]
    reads: int = 0
    main_thread_cpu_s: float | None = None
    usec: dict[str, float] = field(default_factory=dict)


class _RedisProbe:
    """Reads Redis counters over one connection, opened before the window."""

    def __init__(self, url: str | None) -> None:
        from redis import Redis

        self._client = Redis.from_url(url) if url is not None else None
        if self._client is not None:
            self._client.ping()  # connect now: the handshake's commands stay out of the window

    def counters(self) -> RedisCounters | None:
        """Command and byte counters (one ``INFO all`` command)."""
        if self._client is None:
            return None
        info: dict[str, Any] = self._client.info("all")
        calls = {key[len("cmdstat_"):]: int(value["calls"]) for key, value in info.items()
                 if key.startswith("cmdstat_") and isinstance(value, dict)}
        main = None
        if "used_cpu_user_main_thread" in info:
            main = (float(info["used_cpu_user_main_thread"])
                    + float(info["used_cpu_sys_main_thread"]))
        return RedisCounters(total=int(info["total_commands_processed"]),
                             net_in=int(info["total_net_input_bytes"]),
                             net_out=int(info["total_net_output_bytes"]), calls=calls,
                             reads=int(info.get("total_reads_processed", 0)),
                             main_thread_cpu_s=main,
                             usec={key[len("cmdstat_"):]: float(value["usec"])
                                   for key, value in info.items()
                                   if key.startswith("cmdstat_") and isinstance(value, dict)})

    def session_memory(self, sessions: int, *, per_session_keys: bool) -> dict[str, float] | None:
        """Redis memory per session, read while the sessions are still attached.

        With ``per_session_keys`` (the project): every session's keys (record and logs),
        grouped by session; otherwise (the peer, which keeps no per-session keys) the memory
        of every key over ``sessions``.
        """
        if self._client is None:
            return None
        pattern = "dg:*:s:*" if per_session_keys else "*"
        per_session: dict[bytes, int] = {}
        for key in self._client.scan_iter(match=pattern, count=1000):
            group = key.rsplit(b":", 1)[0] if per_session_keys else b""
            usage = self._client.memory_usage(key, samples=0)
            per_session[group] = per_session.get(group, 0) + int(usage or 0)
        if not per_session_keys:
            mean = per_session.get(b"", 0) / max(1, sessions) / 1024
            return {"sessions": sessions, "mean_kib": mean, "max_kib": mean}
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

    cpu_before: dict[str, tuple[float, float] | None]  # (user, system) seconds
    redis_before: RedisCounters | None
    cpu_after: dict[str, tuple[float, float] | None] = field(default_factory=dict)
    redis_after: RedisCounters | None = None
    machine_before: tuple[int, int] | None = None
    machine_after: tuple[int, int] | None = None
    session_memory: dict[str, float] | None = None
    while_attached: dict[str, Any] | None = None
    wall_s: float = 0.0
    profiles: dict[str, Path] = field(default_factory=dict)  # name -> its written profile
    # name -> its event loop lag histogram's bucket counts (None: not read)
    lag_before: dict[str, dict[float, float] | None] = field(default_factory=dict)
    lag_after: dict[str, dict[float, float] | None] = field(default_factory=dict)


def _round_trips(logs: Sequence[SessionLog], since: float) -> tuple[list[float], int]:
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


def _chunk_counts(logs: Sequence[SessionLog], measured: int, returned: int) -> dict[str, int]:
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
    """Per process: CPU seconds, per chunk, core share, and the share spent in user space
    (the process's own code and libraries; the rest is the kernel's: system calls, the
    network stack of what it sends, scheduling)."""
    report: dict[str, dict[str, float | None]] = {}
    for name, before in window.cpu_before.items():
        after = window.cpu_after.get(name)
        user = after[0] - before[0] if after is not None and before is not None else None
        system = after[1] - before[1] if after is not None and before is not None else None
        spent = user + system if user is not None and system is not None else None
        per_chunk = spent / chunks * 1e6 if spent is not None and chunks else None
        share = spent / window.wall_s if spent is not None and window.wall_s else None
        report[name] = {"cpu_s": spent, "user_s": user, "system_s": system,
                        "us_per_chunk": per_chunk, "core_share": share,
                        "user_share": user / spent if user is not None and spent else None}
    return report


def _redis_report(window: _Window, session_seconds: float,
                  script_commands: frozenset[str]) -> dict[str, Any] | None:
    before, after = window.redis_before, window.redis_after
    if before is None or after is None:
        return None
    total = after.total - before.total - 1  # less our own INFO
    calls = {name: n - before.calls.get(name, 0) for name, n in after.calls.items()}
    calls["info"] = calls.get("info", 0) - 1
    calls = {name: n for name, n in sorted(calls.items(), key=lambda kv: -kv[1]) if n > 0}
    usec = {name: us - before.usec.get(name, 0.0) for name, us in after.usec.items()}
    # Inside a call: what scripts run, and what a MULTI carries (the input append's XADDs and
    # push, store/input_appends.py: commands no process sends on their own). A transaction
    # counts once, as its EXEC.
    in_scripts = sum(n for name, n in calls.items() if name in script_commands)
    client = total - in_scripts - calls.get("multi", 0)
    return {"client_commands": client, "per_session_second": client / session_seconds,
            "commands_in_scripts": in_scripts,
            "in_scripts_per_session_second": in_scripts / session_seconds,
            "commands_incl_in_scripts": total,
            "bytes_in_per_session_second": (after.net_in - before.net_in) / session_seconds,
            "bytes_out_per_session_second": (after.net_out - before.net_out) / session_seconds,
            "session_seconds": session_seconds, "calls_by_command": calls,
            # less our own INFO's read
            "reads_processed": after.reads - before.reads - 1,
            # client calls (a script call, a transaction, a pipelined batch read at once)
            "writes_per_session_second": (after.reads - before.reads - 1) / session_seconds,
            # execution time of the commands sent (a script's includes what it ran)
            "sent_usec": sum(us for name, us in usec.items()
                             if name not in script_commands and name != "info"),
            "usec_by_command": {name: us for name, us in usec.items() if us > 0},
            "main_thread_cpu_s": None
            if after.main_thread_cpu_s is None or before.main_thread_cpu_s is None
            else after.main_thread_cpu_s - before.main_thread_cpu_s}


def _is_server(name: str) -> bool:
    return not name.startswith("client")


def _tier_us(cpu: dict[str, dict[str, float | None]], names: Sequence[str]) -> float | None:
    """CPU per chunk of these processes together; None when one is unknown or none ran."""
    values = [cpu[name]["us_per_chunk"] for name in names]
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


def _tier_names(cpu: dict[str, dict[str, float | None]]) -> dict[str, list[str]]:
    """The server processes of each tier: the websocket servers (echo, peer or gateway
    processes), the worker, Redis, and all of them together (the whole stack)."""
    servers = [name for name in cpu if _is_server(name)]
    return {"whole_stack": servers,
            "websocket_servers": [n for n in servers if n.startswith(("echo", "peer", "gateway"))],
            "worker": [n for n in servers if n == "worker"],
            "redis": [n for n in servers if n == "redis"]}


def _tiers(cpu: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    """CPU per chunk by tier (:func:`_tier_names`)."""
    return {tier: _tier_us(cpu, names) for tier, names in _tier_names(cpu).items()}


def _user_shares(cpu: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    """The user-space share of each tier's CPU; None when a process's is unknown or the tier
    spent none (or has no process)."""
    shares: dict[str, float | None] = {}
    for tier, names in _tier_names(cpu).items():
        users = [cpu[name]["user_s"] for name in names]
        totals = [cpu[name]["cpu_s"] for name in names]
        known = names and None not in users and None not in totals
        total = sum(t for t in totals if t is not None) if known else 0.0
        shares[tier] = sum(u for u in users if u is not None) / total if total else None
    return shares


def _clients_report(cpu: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    shares = {name: entry["core_share"] for name, entry in cpu.items() if not _is_server(name)}
    known = [share for share in shares.values() if share is not None]
    return {"processes": len(shares), "core_share": shares,
            "max_core_share": max(known) if known else None}


def _summarize(target: Target, logs: Sequence[SessionLog], t0: float, seconds: float,
               window: _Window) -> dict[str, Any]:
    since = t0 + WARMUP_S
    trips, measured = _round_trips(logs, since)
    errors = [e for log in logs for e in log.errors][:MAX_ERRORS]
    opens = [log.open_s for log in logs if log.open_s is not None]
    lags = [lag for log in logs for sent, lag in zip(log.sent, log.lag, strict=True)
            if sent >= since]
    cpu = _cpu_report(window, len(trips))
    summary: dict[str, Any] = {
        "setup": target.setup.name, "gateways": target.setup.gateways, "sessions": len(logs),
        "round_trip_ms": distribution(trips),
        "chunks": _chunk_counts(logs, measured, len(trips)),
        "send_lag_ms": distribution(lags),
        "open_ms": distribution(opens),
        "window_s": window.wall_s,
        "machine_cpu": machine_report(window.machine_before, window.machine_after),
        "cpu": cpu,
        "cpu_us_per_chunk": _tiers(cpu),
        "cpu_user_share": _user_shares(cpu),
        "clients": _clients_report(cpu),
        "redis": _redis_report(window, len(logs) * (seconds - WARMUP_S),
                               target.script_commands),
        "redis_memory_per_session": window.session_memory,
        "while_attached": window.while_attached,
        "event_loop_lag_ms": _loop_lag_report(window),
        "errors": errors,
    }
    if window.profiles:
        summary["python_calls"] = {name: calls_per_chunk(path, max(len(trips), 1))
                                   for name, path in sorted(window.profiles.items())}
    summary["lossless"] = lossless(summary)
    return summary


def lossless(point: dict[str, Any]) -> bool:
    """Every chunk came back once, intact, to its own session; every session stayed open."""
    chunks = point["chunks"]
    return bool(chunks["sent"] > 0 and chunks["lost"] == 0 and chunks["duplicates"] == 0
                and chunks["corrupt"] == 0 and chunks["misrouted"] == 0
                and chunks["sessions_failed"] == 0 and chunks["sessions_disconnected"] == 0)


class ClientPool:
    """The load generator: client processes started once and reused for every point."""

    def __init__(self, count: int, stack: contextlib.ExitStack) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conns: list[Connection] = []
        self.pids: dict[str, int] = {}
        for number in range(count):
            parent, child = ctx.Pipe()
            process = ctx.Process(target=_client_main, args=(child,), daemon=True,
                                  name=f"bench-client-{number}")
            process.start()
            stack.callback(_stop_client, process)
            # Closed first on the way out: a client waiting for its next spec then sees EOF.
            stack.callback(parent.close)
            child.close()
            self.conns.append(parent)
            self.pids[f"client{number}"] = process.pid or 0
        for conn in self.conns:
            receive_from_client(conn, START_TIMEOUT_S, "start handshake")

    def start(self, target: Target, sessions: int, seconds: float, compression: bool) -> float:
        """Give every client its share of the point's sessions; returns the common start."""
        shares = _split(sessions, len(self.conns))
        for conn, indices in zip(self.conns, shares, strict=True):
            conn.send(ClientSpec(urls=target.urls, mode=target.mode, indices=indices,
                                 sessions=sessions, seconds=seconds, compression=compression))
        for conn in self.conns:
            receive_from_client(conn, START_TIMEOUT_S, "ready")
        t0 = time.monotonic() + 0.2
        for conn in self.conns:
            conn.send(t0)
        return t0

    def results(self, deadline: float) -> list[SessionLog]:
        """Every session's log, once every client has finished streaming."""
        logs: list[SessionLog] = []
        for conn in self.conns:
            logs += receive_from_client(conn, deadline - time.monotonic(), "results")
        return logs

    def close_sessions(self) -> None:
        """Tell the clients to close their sessions, and wait until they have."""
        for conn in self.conns:
            conn.send("close")
        for conn in self.conns:
            receive_from_client(conn, STOP_TIMEOUT_S + 2 * OPEN_TIMEOUT_S, "close")

    def stop(self) -> None:
        """End every client process (each then exits on its own)."""
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)


def _split(sessions: int, clients: int) -> list[tuple[int, ...]]:
    """Session indices per client, interleaved so each process gets a spread of start times."""
    return [tuple(range(first, sessions, clients)) for first in range(clients)]


def _stop_client(process: Any) -> None:
    process.join(STOP_TIMEOUT_S)
    if process.is_alive():
        process.terminate()
        process.join(STOP_TIMEOUT_S)
    if process.is_alive():
        process.kill()
        process.join()


def run_point(pool: ClientPool, target: Target, sessions: int, seconds: float,
               compression: bool) -> dict[str, Any]:
    """Drive one point; read counters around the measured window."""
    t0 = pool.start(target, sessions, seconds, compression)
    pids = {**target.servers, **pool.pids}
    with contextlib.ExitStack() as stack:
        probe = _RedisProbe(target.redis_url)
        stack.callback(probe.close)
        time.sleep(max(0.0, t0 + WARMUP_S - time.monotonic()))  # the warm-up: nothing to poll
        began = time.monotonic()
        lag_before = _loop_lag_counts(target)  # outside the CPU window: a scrape costs CPU
        window = _Window(cpu_snapshot(pids), probe.counters(), machine_before=machine_ticks(),
                         lag_before=lag_before)
        _signal_servers(target, START)
        logs = pool.results(t0 + seconds + DRAIN_S + 2 * OPEN_TIMEOUT_S + 10)
        window.cpu_after = cpu_snapshot(pids)
        window.machine_after = machine_ticks()
        window.redis_after = probe.counters()
        window.lag_after = _loop_lag_counts(target)
        _signal_servers(target, STOP)  # after every counter: writing a profile takes a while
        window.profiles = _written_profiles(target)
        window.session_memory = probe.session_memory(
            sessions, per_session_keys=target.setup.name == "project")
        if target.while_attached is not None:
            window.while_attached = target.while_attached()
        window.wall_s = time.monotonic() - began
    pool.close_sessions()
    logs.sort(key=lambda log: log.index)
    return _summarize(target, logs, t0, seconds, window)


def _loop_lag_counts(target: Target) -> dict[str, dict[float, float] | None]:
    return {name: histogram_counts(url, metric)
            for name, (url, metric) in target.loop_lag.items()}


def _loop_lag_report(window: _Window) -> dict[str, dict[str, float | None]]:
    """Per process, how late its event loop woke the probe due every 0.1 s over the window
    (runtime/loop_lag.py), ms: the bucket bounds of the p99 and of the latest wake-up (None:
    not read, or past the last bucket)."""
    report: dict[str, dict[str, float | None]] = {}
    for name, after in window.lag_after.items():
        bounds = bucket_bounds(window.lag_before.get(name), after, (0.99, 1.0))
        report[name] = {
            "p99_at_most": None if bounds is None or math.isinf(bounds[0]) else bounds[0] * 1000,
            "max_at_most": None if bounds is None or math.isinf(bounds[1]) else bounds[1] * 1000,
        }
    return report


def _signal_servers(target: Target, signum: int) -> None:
    """Send ``signum`` to every profiled server of ``target`` (none unless --profile)."""
    for name in target.profiles:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target.servers[name], signum)


def _written_profiles(target: Target) -> dict[str, Path]:
    """The profiles the servers wrote on :data:`STOP`; a server that wrote none (it died) is
    left out, and said so in the point's errors by its absence."""
    deadline = time.monotonic() + _PROFILE_WRITE_S
    waiting = dict(target.profiles)
    while waiting and time.monotonic() < deadline:
        waiting = {name: path for name, path in waiting.items() if not path.exists()}
        if waiting:
            time.sleep(0.05)  # polling for a file another process writes: no event to wait on
    return {name: path for name, path in target.profiles.items() if name not in waiting}
