"""Smoke test of ``duplex-gateway bench relay``: a small sweep runs every setup and loses nothing.

Nothing here checks speed: the numbers depend on the machine. It checks that the sweep starts
its processes, relays every chunk at every point of every setup (echo, python-socketio peer,
project at 1 and 2 gateways), writes JSON holding every figure of every point, draws both
plots, and stops everything it started; and that without python-socketio the peer is skipped
with a note.
"""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from duplex_gateway.bench.relay import Progress, run_relay_bench
from duplex_gateway.bench.relay_report import PROFILE_NOTE
from duplex_gateway.bench.relay_setups import PEER_SKIPPED
from duplex_gateway.bench.spec import CHUNK_S, SCALE_SESSIONS, SHARD_COMMANDS_PER_S, TARGETS_NOTE

pytestmark = pytest.mark.e2e

SVG = "{http://www.w3.org/2000/svg}"
SERIES = ["project (1 gateway)", "project (2 gateways)", "echo", "peer (1 server)",
          "peer (2 servers)"]
# The processes whose CPU each setup reports, at 1 and 2 gateways (socket.io servers).
SERVERS = {("echo", 1): {"echo"}, ("peer", 1): {"peer0", "redis"},
           ("peer", 2): {"peer0", "peer1", "redis"},
           ("project", 1): {"gateway0", "worker", "redis"},
           ("project", 2): {"gateway0", "gateway1", "worker", "redis"}}
TARGETS = {"added_per_direction_p99_ms", "gateway_cpu_vs_echo", "worker_cpu_vs_echo",
           "stack_cpu_vs_peer", "redis_writes_per_session_second", "redis_us_per_chunk",
           "redis_memory_per_session_kib"}


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _check_chunks(point: dict[str, Any], seconds: float) -> None:
    chunks = point["chunks"]
    assert chunks["sent"] > 0 and chunks["received"] == chunks["sent"]
    assert chunks["lost"] == chunks["duplicates"] == chunks["corrupt"] == 0
    assert chunks["misrouted"] == chunks["sessions_failed"] == 0
    assert chunks["sessions_disconnected"] == 0
    # sessions x the measured seconds at 50 chunks/s, give or take the ramp's slots.
    expected = point["sessions"] * (seconds - 1) * 50
    assert 0.8 * expected <= chunks["measured_received"] == chunks["measured_sent"]
    assert chunks["measured_sent"] <= 1.1 * expected
    assert point["lossless"] is True and point["errors"] == []


def _check_latency(point: dict[str, Any]) -> None:
    trips = point["round_trip_ms"]
    assert 0 < trips["p50"] <= trips["p90"] <= trips["p99"] <= trips["max"]
    for q in ("p50", "p99"):
        added = point["added_round_trip_ms"][q]
        assert _finite(added) and point["added_per_direction_ms"][q] == pytest.approx(added / 2)
    if point["setup"] == "echo":
        assert point["added_round_trip_ms"] == {"p50": 0.0, "p99": 0.0}


def _check_cpu(point: dict[str, Any]) -> None:
    servers = SERVERS[point["setup"], point["gateways"]]
    assert servers <= set(point["cpu"])
    for name in servers:
        cpu = point["cpu"][name]
        assert cpu["cpu_s"] >= 0 and _finite(cpu["us_per_chunk"]) and _finite(cpu["core_share"])
        assert cpu["user_s"] + cpu["system_s"] == pytest.approx(cpu["cpu_s"])
        assert cpu["user_share"] is None or 0 <= cpu["user_share"] <= 1
    tiers = point["cpu_us_per_chunk"]
    assert _finite(tiers["whole_stack"]) and _finite(tiers["websocket_servers"])
    assert tiers["whole_stack"] >= tiers["websocket_servers"]
    assert (tiers["worker"] is not None) == (point["setup"] == "project")
    assert (tiers["redis"] is not None) == (point["setup"] != "echo")
    shares = point["cpu_user_share"]
    assert set(shares) == set(tiers)
    for tier, share in shares.items():
        # Known wherever the tier has processes that read a clock tick (10 ms) of CPU.
        assert (share is not None) == bool(tiers[tier]), tier
        assert share is None or 0 <= share <= 1, tier
    clients = point["clients"]
    assert clients["processes"] >= 1 and _finite(clients["max_core_share"])


def _check_redis(point: dict[str, Any]) -> None:
    redis, memory = point["redis"], point["redis_memory_per_session"]
    if point["setup"] == "echo":
        assert redis is None and memory is None
        return
    for key in ("per_session_second", "in_scripts_per_session_second",
                "bytes_in_per_session_second", "bytes_out_per_session_second"):
        assert _finite(redis[key]) and redis[key] >= 0, key
    assert redis["per_session_second"] > 0 and redis["bytes_in_per_session_second"] > 0
    assert _finite(memory["mean_kib"])
    if point["setup"] == "peer":  # python-socketio runs no scripts and keeps no session keys
        assert redis["commands_in_scripts"] == 0 and memory["mean_kib"] == 0
    else:
        assert redis["in_scripts_per_session_second"] > 0 and memory["mean_kib"] > 0
        assert memory["sessions"] == point["sessions"]


def _check_scale(point: dict[str, Any]) -> None:
    """The scale on paper is the point's own costs times SCALE_SESSIONS sessions."""
    scale, tiers, redis = point["scale_on_paper"], point["cpu_us_per_chunk"], point["redis"]
    chunks_per_s = SCALE_SESSIONS / CHUNK_S
    assert scale["sessions"] == SCALE_SESSIONS
    assert scale["websocket_server_cores"] == pytest.approx(
        tiers["websocket_servers"] * chunks_per_s / 1e6)
    if point["setup"] == "echo":
        assert scale["redis_cores"] is None and scale["redis_shards"] is None
        return
    assert scale["redis_cores"] == pytest.approx(tiers["redis"] * chunks_per_s / 1e6)
    sent = redis["per_session_second"] * SCALE_SESSIONS
    assert scale["redis_commands_sent_per_s"] == pytest.approx(sent)
    assert scale["redis_shards"] == max(math.ceil(scale["redis_cores"]),
                                        math.ceil(sent / SHARD_COMMANDS_PER_S))
    assert scale["redis_memory_gib"] == pytest.approx(
        point["redis_memory_per_session"]["mean_kib"] * SCALE_SESSIONS / 2**20)


def _check_point(point: dict[str, Any], seconds: float) -> None:
    _check_chunks(point, seconds)
    _check_scale(point)
    _check_latency(point)
    _check_cpu(point)
    _check_redis(point)
    assert point["real_time"]["keeps_up"] == (not point["real_time"]["why_not"])
    _check_loop_lag(point)
    if point["setup"] == "project":
        assert set(point["targets"]) == TARGETS
        for name, target in point["targets"].items():
            if name.endswith(("_vs_echo", "_vs_peer")) and target["value"] is None:
                continue  # a ratio to a process whose CPU read no clock tick at this size
            assert _finite(target["value"]) and target["verdict"] in {"met", "missed"}, name


def _check_loop_lag(point: dict[str, Any]) -> None:
    """The project's gateways and worker report their event loop lag over the window (a
    3 s point wakes each probe ~20 times, so each has a p99); the echo and the peer have no
    probe."""
    lag = point["event_loop_lag_ms"]
    if point["setup"] != "project":
        assert lag == {}
        return
    gateways = {f"gateway{n}" for n in range(point["gateways"])}
    assert set(lag) == gateways | {"worker"}
    for process in lag.values():
        assert _finite(process["p99_at_most"]) and _finite(process["max_at_most"])
        assert 0 < process["p99_at_most"] <= process["max_at_most"]


def _check_series(series: dict[str, Any], sessions: list[int]) -> None:
    points = series["points"]
    assert [p["sessions"] for p in points] == sessions
    held = None  # the largest count up to which every point kept up
    for point in points:
        if not point["real_time"]["keeps_up"]:
            break
        held = point["sessions"]
    assert series["most_real_time_sessions"] == held


@pytest.mark.timeout(300)
def test_small_sweep_measures_every_figure_of_every_setup(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """2 and 4 sessions x 1 and 2 gateways, 3 s a point: every point of the echo, the peer and
    the project relays every chunk and holds every figure; the table, both plots and the
    capacity line are written, and the run exits 0."""
    output = tmp_path / "results" / "relay.json"
    seconds = 3.0

    assert run_relay_bench(sessions=[4, 2], gateways=[1, 2], seconds=seconds,
                           output=output) == 0

    report = json.loads(output.read_text())
    assert report["lossless"] is True and report["warnings"] is not None
    assert report["config"]["sessions"] == [2, 4] and report["config"]["gateways"] == [1, 2]
    assert report["peer_skipped"] is None
    assert [s["gateways"] for s in report["echo"]] == [1]
    assert [s["gateways"] for s in report["peer"]] == [1, 2]
    assert [s["gateways"] for s in report["project"]] == [1, 2]
    for name in ("echo", "peer", "project"):
        for series in report[name]:
            _check_series(series, [2, 4])
            for point in series["points"]:
                _check_point(point, seconds)
    assert set(report["method"]) >= {"added_latency", "redis_commands", "real_time",
                                      "scale_on_paper"}
    printed = capsys.readouterr()
    assert "most sessions held in real time: echo " in printed.out
    assert TARGETS_NOTE in printed.out and "MISSED: above it" in TARGETS_NOTE
    assert f"{SCALE_SESSIONS:,} sessions at the costs of" in printed.out
    assert printed.err == ""  # not a terminal: no progress bar
    for suffix, what in ((".cpu.svg", "CPU plot"), (".p99.svg", "p99 plot")):
        plot = output.with_suffix(suffix)
        assert f"{what}: {plot}" in printed.out
        titles = [t.text for t in ET.parse(plot).getroot().iter(f"{SVG}title")]
        assert titles == SERIES


@pytest.mark.timeout(180)
def test_a_profiled_run_counts_python_calls_per_chunk(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--profile``: every server but Redis (the echo, the peer's server, the gateway, the
    worker) reports its Python calls per relayed chunk over the measured window (counts, not
    times), the table gives each as a multiple of the echo's and says what they mean, and the
    profiles are kept for pstats."""
    output = tmp_path / "relay.json"
    assert run_relay_bench(sessions=[2], gateways=[1], seconds=3.0, output=output,
                           profile=True) == 0

    report = json.loads(output.read_text())
    assert report["config"]["profiled"] is True
    expected = {"echo": {"echo"}, "peer": {"peer0"}, "project": {"gateway0", "worker"}}
    if report["peer_skipped"]:
        del expected["peer"]
    for setup, processes in expected.items():
        (point,) = report[setup][0]["points"]
        calls = point["python_calls"]
        assert set(calls) == processes
        for process in calls.values():
            # A relayed chunk is Python steps in each process (the echo's websocket stack
            # too), never none.
            assert process["calls_per_chunk"] >= process["python_calls_per_chunk"] >= 10
            assert process["most_called"] and all(
                row["calls_per_chunk"] > 0 and ":" in row["function"]
                for row in process["most_called"])
    kept = sorted(path.name for path in (tmp_path / "relay-profiles").rglob("*.prof"))
    assert kept == sorted(f"{name}.prof" for names in expected.values() for name in names)
    printed = capsys.readouterr().out
    assert PROFILE_NOTE in printed and "python calls per chunk" in printed
    echo_calls = report["echo"][0]["points"][0]["python_calls"]["echo"]["calls_per_chunk"]
    project = report["project"][0]["points"][0]["python_calls"]
    ratio = f"{project['gateway0']['calls_per_chunk'] / echo_calls:.1f}"
    assert any(line.startswith("project (1 gateway), 2") and " gateway0 " in line
               and f" {ratio} " in line for line in printed.splitlines())


@pytest.mark.timeout(120)
def test_without_python_socketio_the_peer_is_skipped_with_a_note(tmp_path: Path) -> None:
    """On an interpreter where python-socketio cannot be imported the sweep still runs the
    echo and the project, and the JSON and the table say why the peer is missing."""
    output = tmp_path / "relay.json"
    code = ("import sys\n"
            "sys.modules['socketio'] = None\n"  # as if the [bench] extra were not installed
            "from duplex_gateway.cli import main\n"
            f"main(['bench', 'relay', '--sessions', '1', '--gateways', '1', '--seconds', '2',"
            f" '--output', {str(output)!r}])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=110, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(output.read_text())
    assert report["peer"] is None and report["peer_skipped"] == PEER_SKIPPED
    assert [s["label"] for s in report["echo"] + report["project"]] == [
        "echo", "project (1 gateway)"]
    assert report["project"][0]["points"][0]["targets"]["stack_cpu_vs_peer"]["verdict"] == "n/a"
    assert f"peer: skipped ({PEER_SKIPPED}; install the [bench] extra)" in done.stdout


def test_relay_bench_refuses_a_run_shorter_than_warm_up(tmp_path: Path) -> None:
    """A point no longer than the warm-up measures nothing: exit 2, nothing written."""
    assert run_relay_bench(sessions=[1], seconds=1, output=tmp_path / "r.json") == 2
    assert not (tmp_path / "r.json").exists()


class _Terminal(io.StringIO):
    """A text stream that says it is a terminal, as stderr does in an interactive shell."""

    def isatty(self) -> bool:
        return True


def test_progress_bar_is_drawn_on_a_terminal_and_erased_at_the_end() -> None:
    """On a terminal the bar shows points done of the total and what runs now, then erases
    itself; on anything else (a pipe, a log) nothing is written."""
    terminal = _Terminal()
    progress = Progress(4, terminal)
    progress.show(0, "echo, 10 sessions")
    progress.show(2, "project (1 gateway), 10 sessions")
    progress.close()
    drawn = terminal.getvalue().split("\r")
    assert drawn[1].startswith("[" + "." * 24 + "] 0/4 echo, 10 sessions")
    assert drawn[2].startswith("[" + "#" * 12 + "." * 12 + "] 2/4 project (1 gateway)")
    assert "s left" in drawn[2] and drawn[-1] == "\x1b[K"
    quiet = io.StringIO()
    piped = Progress(4, quiet)
    piped.show(1, "echo, 10 sessions")
    piped.close()
    assert quiet.getvalue() == ""
