"""The report of ``duplex-gateway bench relay``: figures derived from the sweep's points (added
latency, real time, design targets), the table, the JSON and the two plots.

I/O-free but for :func:`write`; :mod:`duplex_gateway.bench.relay` measures, this module compares.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from duplex_gateway.bench.spec import (
    CHUNK_S,
    SCALE_SESSIONS,
    SHARD_COMMANDS_PER_S,
    TARGET_ADDED_RTT_P99_MS,
    TARGET_CPU_RATIO,
    TARGET_MAX_SESSIONS,
    TARGET_REDIS_US_PER_CHUNK,
    TARGET_REDIS_WRITES_PER_SESSION_S,
    TARGET_SESSION_MEMORY_KIB,
    TARGETS_NOTE,
    Setup,
)
from duplex_gateway.bench.svgplot import Chart, write_chart

__all__ = ["METHOD", "build", "format_table", "write"]

#: How the derived figures are defined; written into the JSON as ``method``.
METHOD: Final = {
    "added_latency": "the setup's round-trip percentile minus the bare echo's at the same "
                     "session count; per direction: half of that (the servers add no "
                     "timestamps, so the split is even by construction)",
    "redis_commands": "INFO commandstats and total_commands_processed over the window: "
                      "commands only the store's Lua scripts call count as run inside "
                      "scripts, the rest (script calls, and reads the processes also send "
                      "themselves) as sent, so sent is an upper bound; python-socketio runs "
                      "no scripts",
    "redis_memory": "MEMORY USAGE of every session's keys while attached (project); every "
                    "key over the session count (peer, which keeps no per-session keys)",
    "real_time": f"no chunk lost (nor duplicated, corrupt, misrouted, a session failed or "
                 f"dropped), p99 round trip below one chunk ({CHUNK_S * 1000:g} ms) and "
                 f"every server process below one core; the most sessions a setup holds is "
                 f"the largest swept count at which it and every smaller count kept up",
    "cpu_us_per_chunk": "CPU seconds of the processes over the window / chunks relayed in it",
    "cpu_user_share": "user CPU seconds / user + system CPU seconds of each tier's processes "
                      "over the window: the share spent in the processes' own code and "
                      "libraries (for Python servers, mostly the interpreter); the rest is the "
                      "kernel's (system calls, the network stack of what they send, "
                      "scheduling)",
    "scale_on_paper": f"DESIGN §5's arithmetic with the point's measured costs: "
                      f"{SCALE_SESSIONS:,} sessions each relaying {1 / CHUNK_S:g} chunks a "
                      f"second both ways at the point's CPU per chunk (cores: CPU-seconds a "
                      f"second), commands and memory per session; shards: one Redis core each, "
                      f"at most {SHARD_COMMANDS_PER_S:,} commands a second, whichever needs "
                      f"more",
}

_LAG_WARNING_MS: Final = 10.0
_BUSY_WARNING: Final = 0.85
_OTHER_WARNING_CPUS: Final = 0.5
_CLIENT_WARNING_SHARE: Final = 0.9
_QUANTILES: Final = ("p50", "p99")


# ============================================================================ derived figures


def _minus(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _added_latency(point: dict[str, Any], echo: dict[str, Any] | None) -> None:
    trips = point["round_trip_ms"]
    base = echo["round_trip_ms"] if echo is not None else {}
    added = {q: _minus(trips[q], base.get(q)) for q in _QUANTILES}
    point["added_round_trip_ms"] = added
    point["added_per_direction_ms"] = {q: None if v is None else v / 2 for q, v in added.items()}


def _why_not_real_time(point: dict[str, Any]) -> list[str]:
    """What kept this point from keeping up; empty when it did."""
    reasons = []
    if not point["lossless"]:
        reasons.append("chunks lost, duplicated, corrupt or misrouted, or sessions failed")
    p99 = point["round_trip_ms"]["p99"]
    if p99 is None or p99 >= CHUNK_S * 1000:
        reasons.append(f"p99 round trip not below {CHUNK_S * 1000:g} ms")
    busy = [name for name, cpu in point["cpu"].items()
            if not name.startswith("client") and (cpu["core_share"] or 0.0) >= 1.0]
    if busy:
        reasons.append(f"a full core or more: {', '.join(busy)}")
    return reasons


def _verdict(value: float | None, target: float, *, valid: bool, sessions: int) -> str:
    """``met``/``missed`` against a design target; ``n/a`` when not comparable."""
    if value is None:
        return "n/a"
    if sessions > TARGET_MAX_SESSIONS:
        return f"n/a (over {TARGET_MAX_SESSIONS} sessions)"
    if not valid:
        return "n/a (lossy run)"
    return "met" if value <= target else "missed"


def _targets(point: dict[str, Any], echo: dict[str, Any] | None,
             peer: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The project's design targets at this point, each with its value and verdict."""
    tiers = point["cpu_us_per_chunk"]
    echo_us = echo["cpu_us_per_chunk"]["websocket_servers"] if echo else None
    redis = point["redis"] or {}
    memory = point["redis_memory_per_session"] or {}
    values = {
        "added_per_direction_p99_ms": (point["added_per_direction_ms"]["p99"],
                                       TARGET_ADDED_RTT_P99_MS / 2, echo),
        "gateway_cpu_vs_echo": (_ratio(tiers["websocket_servers"], echo_us), TARGET_CPU_RATIO,
                                echo),
        "worker_cpu_vs_echo": (_ratio(tiers["worker"], echo_us), 1.0, echo),
        "stack_cpu_vs_peer": (_ratio(tiers["whole_stack"],
                                     peer["cpu_us_per_chunk"]["whole_stack"] if peer else None),
                              1.0, peer),
        "redis_writes_per_session_second": (redis.get("writes_per_session_second"),
                                            TARGET_REDIS_WRITES_PER_SESSION_S, point),
        "redis_us_per_chunk": (tiers["redis"], TARGET_REDIS_US_PER_CHUNK, point),
        "redis_memory_per_session_kib": (memory.get("mean_kib"), TARGET_SESSION_MEMORY_KIB,
                                         point),
    }
    return {name: {"value": value, "target": target,
                   "verdict": _verdict(value, target, sessions=point["sessions"],
                                       valid=point["lossless"] and other is not None
                                       and other["lossless"])}
            for name, (value, target, other) in values.items()}


def _scale_on_paper(point: dict[str, Any]) -> dict[str, Any]:
    """What :data:`SCALE_SESSIONS` streaming sessions would take if each cost what one cost
    at this point: DESIGN §5's scale on paper, from measured figures instead of targets."""
    chunks_per_s = SCALE_SESSIONS / CHUNK_S

    def cores(us_per_chunk: float | None) -> float | None:
        return None if us_per_chunk is None else us_per_chunk * chunks_per_s / 1e6

    tiers, redis = point["cpu_us_per_chunk"], point["redis"] or {}
    sent, in_scripts = redis.get("per_session_second"), redis.get("in_scripts_per_session_second")
    memory = (point["redis_memory_per_session"] or {}).get("mean_kib")
    redis_cores = cores(tiers["redis"])
    sent_per_s = None if sent is None else sent * SCALE_SESSIONS
    shards = [math.ceil(n) for n in (redis_cores, None if sent_per_s is None
                                     else sent_per_s / SHARD_COMMANDS_PER_S) if n is not None]
    return {
        "sessions": SCALE_SESSIONS,
        "websocket_server_cores": cores(tiers["websocket_servers"]),
        "worker_relay_cores": cores(tiers["worker"]),
        "redis_cores": redis_cores,
        "redis_commands_sent_per_s": sent_per_s,
        "redis_commands_in_scripts_per_s": (None if in_scripts is None
                                            else in_scripts * SCALE_SESSIONS),
        "redis_shards": max(shards) if shards else None,
        "redis_memory_gib": None if memory is None else memory * SCALE_SESSIONS / 2**20,
    }


def _most_real_time(points: Sequence[dict[str, Any]]) -> int | None:
    """The largest swept count at which the setup, and every smaller count, kept up."""
    held = None
    for point in sorted(points, key=lambda p: p["sessions"]):
        if not point["real_time"]["keeps_up"]:
            break
        held = point["sessions"]
    return held


def _series(points: Sequence[dict[str, Any]], setup: Setup) -> dict[str, Any]:
    mine = sorted((p for p in points if (p["setup"], p["gateways"]) == (setup.name,
                                                                       setup.gateways)),
                  key=lambda p: p["sessions"])
    return {"label": setup.label, "gateways": setup.gateways, "points": mine,
            "most_real_time_sessions": _most_real_time(mine)}


def build(config: dict[str, Any], points: list[dict[str, Any]],
          peer_skipped: str | None) -> dict[str, Any]:
    """The report: every point with its derived figures, grouped into series by setup."""
    echo_at = {p["sessions"]: p for p in points if p["setup"] == "echo"}
    peer_at = {(p["gateways"], p["sessions"]): p for p in points if p["setup"] == "peer"}
    for point in points:
        echo = echo_at.get(point["sessions"])
        _added_latency(point, echo)
        reasons = _why_not_real_time(point)
        point["real_time"] = {"keeps_up": not reasons, "why_not": reasons}
        point["scale_on_paper"] = _scale_on_paper(point)
        if point["setup"] == "project":
            point["targets"] = _targets(point, echo,
                                        peer_at.get((point["gateways"], point["sessions"])))
    setups = sorted({Setup(p["setup"], p["gateways"]) for p in points},
                    key=lambda s: s.gateways)
    grouped = {name: [_series(points, s) for s in setups if s.name == name]
               for name in ("echo", "peer", "project")}
    report: dict[str, Any] = {
        "config": config, "method": METHOD,
        "echo": grouped["echo"], "peer": None if peer_skipped else grouped["peer"],
        "peer_skipped": peer_skipped, "project": grouped["project"],
        "lossless": bool(points) and all(p["lossless"] for p in points),
    }
    report["warnings"] = [note for p in points for note in _warnings(p, config["cpus"])]
    return report


def all_points(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every point of the report, series by series."""
    return [point for name in ("echo", "peer", "project") for series in report[name] or []
            for point in series["points"]]


def _busy_cpus(point: dict[str, Any]) -> float | None:
    machine = point["machine_cpu"]
    return None if machine is None else float(machine["busy_cpus"])


def _other_cpus(point: dict[str, Any]) -> float | None:
    """Busy CPUs not accounted to the point's own processes (servers and clients)."""
    busy = _busy_cpus(point)
    if busy is None:
        return None
    # /proc/stat is sampled per tick and per-process times are not: clamp the noise at 0.
    return max(0.0, busy - sum(v["core_share"] or 0.0 for v in point["cpu"].values()))


def _warnings(point: dict[str, Any], cpus: int) -> list[str]:
    """What makes this point's numbers less than they seem: failures, overload."""
    name = f"{Setup(point['setup'], point['gateways']).label}, {point['sessions']} sessions"
    chunks, notes = point["chunks"], []
    if chunks["sessions_failed"] or chunks["sessions_disconnected"]:
        notes.append(f"{name}: {chunks['sessions_failed']} sessions failed to open and "
                     f"{chunks['sessions_disconnected']} were disconnected: its numbers cover "
                     "fewer sessions (see errors in the JSON, and the logs)")
    if chunks["lost"]:
        notes.append(f"{name}: {chunks['lost']} chunks were sent and never came back")
    lag = point["send_lag_ms"]["p99"]
    if lag is not None and lag > _LAG_WARNING_MS:
        notes.append(f"{name}: the load generator fell behind its clock (send lag p99 "
                     f"{lag:.1f} ms): the machine is overloaded, compare with care")
    client = point["clients"]["max_core_share"]
    if client is not None and client > _CLIENT_WARNING_SHARE:
        notes.append(f"{name}: a client process used {client:.2f} of a core: the load "
                     "generator may be the bottleneck")
    busy = _busy_cpus(point)
    if busy is not None and busy > _BUSY_WARNING * cpus:
        notes.append(f"{name}: the machine's CPUs were {busy / cpus:.0%} busy: saturated, "
                     "so latency includes waiting for a CPU")
    other = _other_cpus(point)
    if other is not None and other > _OTHER_WARNING_CPUS:
        notes.append(f"{name}: {other:.2f} CPUs were busy outside the measured processes "
                     "(kernel networking, or another job on this machine): numbers disturbed")
    return notes


# ============================================================================ the table


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _shout(verdict: str) -> str:
    """Upper-case a miss so it stands out in the table."""
    return verdict.upper() if verdict == "missed" else verdict


def _loop_lag_cell(lag: dict[str, dict[str, float | None]]) -> str:
    """The busiest gateway's p99 loop lag and the worker's, ms ("-": not measured)."""
    if not lag:
        return "-"
    worst = max((v["p99_at_most"] for name, v in lag.items()
                 if name != "worker" and v["p99_at_most"] is not None), default=None)
    worker = (lag.get("worker") or {}).get("p99_at_most")
    return f"{_fmt(worst, 1)}/{_fmt(worker, 1)}"


_POINT_COLUMNS: Final[tuple[tuple[str, Callable[[dict[str, Any]], str]], ...]] = (
    ("setup", lambda p: Setup(p["setup"], p["gateways"]).label),
    ("sessions", lambda p: str(p["sessions"])),
    ("lost", lambda p: str(p["chunks"]["lost"])),
    ("rt p50", lambda p: _fmt(p["round_trip_ms"]["p50"], 2)),
    ("rt p99", lambda p: _fmt(p["round_trip_ms"]["p99"], 2)),
    ("+dir p50", lambda p: _fmt(p["added_per_direction_ms"]["p50"], 2)),
    ("+dir p99", lambda p: _fmt(p["added_per_direction_ms"]["p99"], 2)),
    ("stack us", lambda p: _fmt(p["cpu_us_per_chunk"]["whole_stack"])),
    ("ws us", lambda p: _fmt(p["cpu_us_per_chunk"]["websocket_servers"])),
    ("worker us", lambda p: _fmt(p["cpu_us_per_chunk"]["worker"])),
    ("redis us", lambda p: _fmt(p["cpu_us_per_chunk"]["redis"])),
    ("user % ws/wk/redis", lambda p: "/".join(
        "-" if (share := p["cpu_user_share"][tier]) is None else f"{100 * share:.0f}"
        for tier in ("websocket_servers", "worker", "redis"))),
    ("client core", lambda p: _fmt(p["clients"]["max_core_share"], 2)),
    ("loop p99 gw/wk", lambda p: _loop_lag_cell(p.get("event_loop_lag_ms") or {})),
    ("cmd sent", lambda p: _fmt((p["redis"] or {}).get("per_session_second"))),
    ("in calls", lambda p: _fmt((p["redis"] or {}).get("in_scripts_per_session_second"))),
    ("KiB in+out", lambda p: _fmt(None if p["redis"] is None else (
        p["redis"]["bytes_in_per_session_second"]
        + p["redis"]["bytes_out_per_session_second"]) / 1024)),
    ("KiB/sess", lambda p: _fmt((p["redis_memory_per_session"] or {}).get("mean_kib"))),
    ("real time", lambda p: "yes" if p["real_time"]["keeps_up"] else "no"),
)
_LEGEND: Final = (
    "rt: round trip (ms); +dir: added latency per direction (ms): half the round trip's excess "
    "over the echo's\n"
    "  at the same session count; us: CPU microseconds per relayed chunk (stack: every server "
    "process; ws: the\n"
    "  websocket servers, i.e. the echo, the socket.io servers or the gateways); user %: the "
    "share of that CPU\n"
    "  spent in user space (own code and libraries; the rest is system calls and the kernel), "
    "per tier; client core: the busiest client\n"
    "  process's core share; loop p99: how late the busiest gateway's and the worker's event "
    "loop woke a probe due\n"
    "  every 0.1 s, ms at most (a histogram bucket's bound); cmd sent / in scripts: Redis "
    "commands per session-second; KiB "
    "in+out: Redis traffic\n"
    "  per session-second; KiB/sess: Redis memory per session; real time: no loss, p99 round "
    f"trip < {CHUNK_S * 1000:g} ms,\n"
    "  every server process below one core")
_TARGET_COLUMNS: Final = (
    ("+dir p99 <= 2 ms", "added_per_direction_p99_ms"),
    ("gw <= 2x echo", "gateway_cpu_vs_echo"),
    ("worker <= echo", "worker_cpu_vs_echo"),
    ("stack <= peer", "stack_cpu_vs_peer"),
    (f"writes <= {TARGET_REDIS_WRITES_PER_SESSION_S:g}", "redis_writes_per_session_second"),
    (f"redis <= {TARGET_REDIS_US_PER_CHUNK:g} us", "redis_us_per_chunk"),
    ("<= 256 KiB", "redis_memory_per_session_kib"),
)


_SCALE_COLUMNS: Final[tuple[tuple[str, str, int], ...]] = (
    ("ws cores", "websocket_server_cores", 0),
    ("worker relay cores", "worker_relay_cores", 0),
    ("redis cores", "redis_cores", 0),
    ("M cmd/s sent", "redis_commands_sent_per_s", 1),
    ("M cmd/s in scripts", "redis_commands_in_scripts_per_s", 1),
    ("shards", "redis_shards", 0),
    ("redis GiB", "redis_memory_gib", 0),
)


def _scale_rows(points: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = [[f"{SCALE_SESSIONS:,} sessions at the costs of", *(t for t, _, _ in _SCALE_COLUMNS)]]
    for point in points:
        scale = point["scale_on_paper"]
        cells = []
        for _, key, digits in _SCALE_COLUMNS:
            value = scale[key]
            if value is not None and key.endswith("_per_s"):
                value /= 1e6
            cells.append(_fmt(value, digits))
        rows.append([f"{Setup(point['setup'], point['gateways']).label}, {point['sessions']}",
                     *cells])
    return rows


def _grid(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join([row[0].ljust(widths[0])]
                      + [cell.rjust(widths[i]) for i, cell in enumerate(row) if i])
            for row in rows]


def _target_rows(points: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = [["project point", *(title for title, _ in _TARGET_COLUMNS)]]
    for point in points:
        label = f"{Setup('project', point['gateways']).label}, {point['sessions']}"
        rows.append([label, *(_shout(point["targets"][key]["verdict"].split(" ")[0])
                              for _, key in _TARGET_COLUMNS)])
    return rows


def format_table(report: dict[str, Any]) -> str:
    """The report as plain text: one row per point, the real-time capacities, the targets."""
    config = report["config"]
    points = all_points(report)
    lines = [f"relay bench: sessions {','.join(map(str, config['sessions']))} x "
             f"{config['seconds']:g} s per point, gateways {','.join(map(str, config['gateways']))}"
             f", {config['chunk_ms']:g} ms chunks ({config['chunk_bytes']} B pcm16), warm-up "
             f"{config['warmup_s']:g} s excluded; {config['cpus']} CPUs, "
             f"{config['client_processes']} client process(es), {config['redis_server']}"]
    if config.get("interrupted"):
        lines.append(f"INTERRUPTED: only the first {len(points)} point(s) of the sweep ran")
    if points:
        lines += _grid([[title for title, _ in _POINT_COLUMNS],
                        *([cell(p) for _, cell in _POINT_COLUMNS] for p in points)])
    lines.append(_LEGEND)
    if report["peer_skipped"]:
        lines.append(f"peer: skipped ({report['peer_skipped']}; install the [bench] extra)")
    lines.append("most sessions held in real time: " + "; ".join(
        f"{series['label']} {series['most_real_time_sessions'] or 'none swept'}"
        for name in ("echo", "peer", "project") for series in report[name] or []))
    project = [p for p in points if p["setup"] == "project"]
    if project:
        lines += _grid(_target_rows(project))
    lines.append(TARGETS_NOTE)
    relays = [p for p in points if p["setup"] != "echo"]
    if relays:
        lines += _grid(_scale_rows(relays))
        lines.append(f"scale on paper: {METHOD['scale_on_paper']}")
    profiled = [p for p in points if p.get("python_calls")]
    if profiled:
        lines += _grid(_call_rows(profiled))
        lines.append(PROFILE_NOTE)
    lines += [f"warning: {note}" for note in report["warnings"]]
    return "\n".join(lines)


#: What the Python-calls table says, and what a profiled run's other figures mean.
PROFILE_NOTE = (
    "python calls: per relayed chunk, over the measured window (cProfile, bench relay"
    " --profile): every call, built-ins included, then those of functions written in Python,"
    " and the most called of them; x echo: all calls over the echo's at the same session"
    " count (the websocket servers together, as the CPU targets count them; the worker on"
    " its own). A coroutine counts one call per resumption. Reproducible from run to run"
    " where CPU time is not. This run's CPU figures include the profiler's overhead: compare"
    " them with no other run.")


def _echo_calls(points: Sequence[dict[str, Any]]) -> dict[int, float]:
    """Session count -> the echo's calls per chunk, where the echo was profiled."""
    return {p["sessions"]: calls["calls_per_chunk"] for p in points if p["setup"] == "echo"
            for calls in p["python_calls"].values()}


def _call_rows(points: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = [["python calls per chunk", "process", "all", "python", "x echo",
             "most called (per chunk)"]]
    echo = _echo_calls(points)
    for point in points:
        calls_by_process = point["python_calls"]
        servers = sum(calls["calls_per_chunk"] for name, calls in calls_by_process.items()
                      if name != "worker")
        for name, calls in calls_by_process.items():
            most = ", ".join(f"{row['function']} {row['calls_per_chunk']:.1f}"
                             for row in calls["most_called"][:3])
            baseline = echo.get(point["sessions"])
            mine = calls["calls_per_chunk"] if name == "worker" else servers
            ratio = "-" if not baseline else f"{mine / baseline:.1f}"
            rows.append([f"{Setup(point['setup'], point['gateways']).label},"
                         f" {point['sessions']}", name,
                         f"{calls['calls_per_chunk']:.0f}",
                         f"{calls['python_calls_per_chunk']:.0f}", ratio, most])
    return rows


# ============================================================================ files


def _chart_series(report: dict[str, Any],
                  value: Callable[[dict[str, Any]], float | None]
                  ) -> dict[str, list[tuple[float, float]]]:
    """Series label -> (sessions, value) for every point whose value is known."""
    series: dict[str, list[tuple[float, float]]] = {}
    for name in ("project", "echo", "peer"):
        for one in report[name] or []:
            points = [(float(p["sessions"]), v) for p in one["points"]
                      if (v := value(p)) is not None]
            if points:
                series[one["label"]] = points
    return series


def _plots(report: dict[str, Any], output: Path) -> list[str]:
    """CPU per chunk and p99 round trip against sessions; returns where they went."""
    charts = {
        "CPU plot": (output.with_suffix(".cpu.svg"), Chart(
            title="relay CPU per chunk (every server process) against sessions",
            x_label="concurrent sessions", y_label="CPU per relayed chunk (us)",
            series=_chart_series(report, lambda p: p["cpu_us_per_chunk"]["whole_stack"]),
            integer_x=True)),
        "p99 plot": (output.with_suffix(".p99.svg"), Chart(
            title="relay p99 round trip against sessions",
            x_label="concurrent sessions", y_label="p99 round trip (ms)",
            series=_chart_series(report, lambda p: p["round_trip_ms"]["p99"]),
            reference=(CHUNK_S * 1000, f"one chunk ({CHUNK_S * 1000:g} ms)"), integer_x=True)),
    }
    notes = []
    for what, (path, chart) in charts.items():
        if chart.series:
            notes.append(f"{what}: {write_chart(path, chart)}")
    return notes


def write(report: dict[str, Any], output: Path) -> list[str]:
    """Write the JSON and the plots; return the lines that say where they went."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")
    return [f"results: {output}", *_plots(report, output)]
