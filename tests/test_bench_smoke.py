"""Smoke test of ``duplex-gateway bench relay``: it runs both phases and loses nothing.

Nothing here checks speed: the numbers depend on the machine. It checks that the benchmark
starts its processes, relays every chunk in both phases, writes plausible JSON and stops
everything it started.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from duplex_gateway.bench import TARGETS_NOTE, run_relay_bench

pytestmark = pytest.mark.e2e


def _check_phase(phase: dict[str, Any], servers: set[str]) -> None:
    chunks = phase["chunks"]
    assert chunks["sent"] > 0
    assert chunks["received"] == chunks["sent"]
    assert chunks["lost"] == 0
    assert chunks["duplicates"] == chunks["corrupt"] == chunks["misrouted"] == 0
    assert chunks["sessions_failed"] == chunks["sessions_disconnected"] == 0
    # 2 sessions x 1 s after warm-up at 50 chunks/s, give or take the ramp's slots.
    assert 80 <= chunks["measured_received"] == chunks["measured_sent"] <= 110
    trips = phase["round_trip_ms"]
    assert 0 < trips["p50"] <= trips["p90"] <= trips["p99"] <= trips["max"]
    assert servers <= set(phase["cpu"])
    for name in servers:
        cpu = phase["cpu"][name]
        assert cpu["cpu_s"] is not None and cpu["cpu_s"] >= 0
        assert math.isfinite(cpu["us_per_chunk"])
    assert phase["errors"] == []

SVG = "{http://www.w3.org/2000/svg}"


@pytest.mark.timeout(120)
def test_relay_bench_runs_both_phases_without_loss(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Two sessions x 2 s: both phases relay every chunk, the JSON, the table (with what its
    target column means) and the CDF plot are written, and the run exits 0."""
    output = tmp_path / "results" / "relay.json"

    assert run_relay_bench(sessions=2, seconds=2, output=output) == 0

    report = json.loads(output.read_text())
    assert report["lossless"] is True
    assert report["config"]["sessions"] == 2
    echo, gateway = report["phases"]["echo"], report["phases"]["gateway"]
    _check_phase(echo, {"echo"})
    _check_phase(gateway, {"gateway", "worker", "redis"})
    assert gateway["redis"]["client_commands"] > 0
    assert gateway["redis"]["commands_incl_in_scripts"] >= gateway["redis"]["client_commands"]
    assert echo["redis"] is None
    comparison = report["comparison"]
    assert set(comparison["added_round_trip_ms"]) == {"p50", "p90", "p99", "max"}
    assert comparison["gateway_cpu_ratio"] is not None
    printed = capsys.readouterr().out
    assert "round trip p99 (ms)" in printed and "Redis cmds / session-s" in printed
    # The target column says where its numbers come from and what MISSED means, in words.
    assert TARGETS_NOTE in printed and "MISSED: above it" in TARGETS_NOTE
    assert "DESIGN" not in printed
    plot = output.with_suffix(".cdf.svg")
    assert f"latency CDF plot: {plot}" in printed
    assert [t.text for t in ET.parse(plot).getroot().iter(f"{SVG}title")] == ["echo", "gateway"]


def test_relay_bench_refuses_a_run_shorter_than_warm_up(tmp_path: Path) -> None:
    """A phase no longer than the warm-up measures nothing: exit 2, nothing written."""
    assert run_relay_bench(sessions=1, seconds=1, output=tmp_path / "r.json") == 2
    assert not (tmp_path / "r.json").exists()
