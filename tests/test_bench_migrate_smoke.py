"""`bench migrate` runs end to end on a tiny load: every session is handed over and nothing
is lost (no speed asserted)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from duplex_gateway.bench.migrate import run_migrate_bench

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_bench_migrate_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One and three sessions on the first worker, drained then killed: exit 0, each session
    moved (the bench checks every record's owner) with every event once and in order, turns
    talked in both windows, a stall and a baseline for each run, no answer cut by the drain,
    the plot's series, and the table."""
    out = tmp_path / "migrate.json"
    code = run_migrate_bench(sessions=[1, 3], output=str(out))
    assert code == 0, capsys.readouterr().out  # its problems, and what was logged about them
    report = json.loads(out.read_text())
    assert [(row["event"], row["sessions"]) for row in report["rows"]] == [
        ("drain", 1), ("drain", 3), ("kill", 1), ("kill", 3)]
    for row in report["rows"]:
        assert row["problems"] == [] and row["logged"] == []
        assert row["stall_ms"]["p99"] > 0 and row["baseline_gap_ms"]["p99"] > 0
        assert row["turns"] > 2 * row["sessions"] and row["events_checked"] > row["turns"]
        assert row["cut_short"] <= (0 if row["event"] == "drain" else row["sessions"])
    plot = ET.parse(out.with_suffix(".svg")).getroot()
    titles = [t.text for t in plot.iter("{http://www.w3.org/2000/svg}title")]
    assert titles == [f"{event}: {name}" for event in ("drain", "kill")
                      for name in ("stall p50", "stall p99", "between turns before, p99")]
    printed = capsys.readouterr().out
    assert "each re-placed" in printed and f"results: {out}" in printed


def test_bench_migrate_refuses_an_unknown_event(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_migrate_bench(sessions=[1], events=["reboot"]) == 2
    assert "--event" in capsys.readouterr().err


def test_bench_migrate_fake_drain_smoke(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The frame path: two sessions talking to a fake worker that is drained: exit 0, each
    moved with its engine slot, each word echoed once, every event once and in order."""
    out = tmp_path / "migrate-fake.json"
    code = run_migrate_bench(sessions=[2], events=["drain"], backend="fake", output=str(out))
    assert code == 0, capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["config"]["backend"] == "fake"
    [row] = report["rows"]
    assert row["problems"] == [] and row["turns"] > 2 * row["sessions"]
    assert "a fake worker drained" in capsys.readouterr().out


def test_bench_migrate_refuses_an_unknown_backend(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_migrate_bench(sessions=[1], backend="moshi") == 2
    assert "--backend one of loopback, fake" in capsys.readouterr().err
