"""`bench resume` runs end to end on a tiny load and finds nothing lost (no speed asserted)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from duplex_gateway.bench.resume import run_resume_bench

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_bench_resume_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three sessions, twenty forced disconnects (they do not divide: 7 + 7 + 6, all of them
    run): exit 0, timings of each recorded, no problems, and the table says what a MISSED
    target means without citing a document the reader does not have."""
    out = tmp_path / "resume.json"
    assert run_resume_bench(sessions=3, disconnects=20, output=str(out)) == 0
    report = json.loads(out.read_text())
    assert report["config"]["disconnects"] == 20
    assert report["resumes_timed"] == 20
    assert report["problems"] == []
    assert report["connect_to_first_replayed_ms"]["p50"] > 0
    assert report["events_checked"] > 20
    plot = ET.parse(out.with_suffix(".cdf.svg")).getroot()
    titles = [t.text for t in plot.iter("{http://www.w3.org/2000/svg}title")]
    assert titles == ["session.resumed", "first replayed event"]
    printed = capsys.readouterr().out
    assert "20 forced disconnects" in printed and "MISSED: this run's p99 is above it" in printed
    assert "DESIGN" not in printed and f"CDF plot: {out.with_suffix('.cdf.svg')}" in printed
