"""`bench open` runs end to end on a few connections (no speed asserted; counts are)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from duplex_gateway.bench.open import KINDS, run_open_bench

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_bench_open_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Five connections of each kind through both gateways: every one answered; each
    connection that does not resume opens one session, and a resume through the gateway with
    the quiet period opens none for nothing."""
    out = tmp_path / "open.json"
    assert run_open_bench(connections=5, output=str(out)) == 0
    report = json.loads(out.read_text())
    assert report["problem"] == ""
    rows = report["results"]
    assert sorted(rows) == sorted(f"{g}/{k}" for g in ("at-once", "quiet") for k in KINDS)
    for row in rows.values():
        assert len(row["samples_ms"]) == 5 and row["first_answer_ms"]["p50"] > 0
    assert {name: row["sessions_opened"] for name, row in rows.items()
            if not name.endswith("/resumes")} == dict.fromkeys(
        ("at-once/waits", "at-once/sends", "quiet/waits", "quiet/sends"), 5)
    assert rows["quiet/resumes"]["sessions_opened"] == 0
    plot = ET.parse(out.with_suffix(".cdf.svg")).getroot()
    titles = [t.text for t in plot.iter("{http://www.w3.org/2000/svg}title")]
    assert titles == list(rows)
    assert "quiet/waits" in capsys.readouterr().out
