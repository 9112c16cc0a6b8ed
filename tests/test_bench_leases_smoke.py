"""`bench leases` runs end to end on a tiny load; lease renewals follow workers, not sessions.

Nothing here checks speed. The counts it checks hold on any machine: renewals are sent once
per worker with sessions per period (1 s at the default lease), so 4 times the sessions on
the same workers cost no more renewals.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from duplex_gateway.cli import main

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

WORKERS = 2


def test_bench_leases_renewals_do_not_grow_with_sessions(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """4 then 16 idle sessions on 2 workers: one JSON row per count, exit 0; each window holds
    whole rounds of one renewal per worker with sessions; renewals per second are bounded by
    the workers (at most 1.5 per worker-second, never per session), no more per worker at 16
    sessions than at 4, and close to the figure on paper."""
    output = tmp_path / "results" / "leases.json"
    with pytest.raises(SystemExit) as done:
        main(["bench", "leases", "--sessions", "16,4", "--workers", str(WORKERS),
              "--seconds", "2", "--output", str(output)])
    assert done.value.code == 0
    report = json.loads(output.read_text())
    assert report["stopped"] is None and report["largest_measured"] == 16
    rows = report["rows"]
    assert [row["sessions"] for row in rows] == [4, 16]
    for row in rows:
        assert row["gateway_connections"] == row["sessions"]
        assert 1 <= row["workers_with_sessions"] <= WORKERS
        # Whole rounds, each renewing every worker with sessions once.
        assert row["renewals"] > 0
        assert row["renewals"] % row["workers_with_sessions"] == 0
        assert row["renewals_per_s"] <= WORKERS * 1.5
        expected = row["expected_renewals_per_s"]
        assert expected == row["workers_with_sessions"] / report["config"]["renewal_period_s"]
        assert 0.5 * expected <= row["renewals_per_s"] <= 1.5 * expected
        assert row["redis_commands"] > 0
    per_worker = [row["renewals_per_s"] / row["workers_with_sessions"] for row in rows]
    assert per_worker[1] <= per_worker[0] + 0.5
    table = capsys.readouterr().out
    assert "renewals/s" in table and "cmds/session-s" in table
