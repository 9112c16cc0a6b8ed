"""`bench video` runs end to end on a few seconds (no memory figure asserted but the cap)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from duplex_gateway.bench.video import run_video_bench

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_bench_video_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two sessions, four seconds: a row a second, every frame counted as sent, no problem,
    the input log under the cap; the table is printed."""
    out = tmp_path / "video.json"
    assert run_video_bench(sessions=2, seconds=4, frame_bytes=20_000, output=str(out)) == 0
    report = json.loads(out.read_text())
    assert report["problems"] == [] and report["over_cap_at"] == []
    rows = report["rows"]
    assert [row["second"] for row in rows] == [1, 2, 3, 4]
    assert rows[-1]["video_bytes_sent"] >= 2 * 3 * 20_000
    assert all(row["input_bytes"] < report["config"]["input_log_max_bytes"] for row in rows)
    assert "input log KB" in capsys.readouterr().out
