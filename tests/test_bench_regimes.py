"""Smoke test of ``duplex-gateway bench relay``'s Redis regimes (``--busy``, ``--spread``): the
project on one pair and spread over gateways and workers, idle and busy, in one run beside the
sweep; every chunk relayed, each spread session on its own (gateway, worker) pair, the load
generator's commands counted apart.

Nothing here checks speed: the figures depend on the machine; the counts do not.
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from duplex_gateway.bench.busy import ServerChoice
from duplex_gateway.bench.relay import run_relay_bench
from duplex_gateway.bench.relay_regimes import Regime, add_regime_arguments, plan_regimes

pytestmark = pytest.mark.e2e

SVG = "{http://www.w3.org/2000/svg}"
#: Writes per session-second on the frame path, two sessions: an input append and an output
#: flush a frame each (12.5 a second each), and the housekeeping (lease rounds, heartbeats,
#: the reaper's passes), more per session the fewer share it and the more processes there
#: are (about 38 on one pair, 64 spread); the loopback's 20 ms entries alone make 100.
WRITES_PER_FRAME_SESSION_S = (25.0, 90.0)
LABELS = ["single 1g x 1w, idle, auto, io-threads 1",
          "single 1g x 1w, busy 4, auto, io-threads 1",
          "spread 2g x 2w, idle, auto, io-threads 1",
          "spread 2g x 2w, busy 4, auto, io-threads 1"]


@pytest.mark.timeout(300)
def test_regimes_run_beside_the_sweep_and_place_one_session_per_pair(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """2 sessions, one gateway: the sweep as ever, then the four regimes; the spread places
    each session on its own pair; counts per session-second are one write per chunk per
    direction plus the housekeeping; the generator's cost alone comes with each busy row."""
    output = tmp_path / "relay.json"
    assert run_relay_bench(sessions=[2], gateways=[1], seconds=2.5, output=output, busy=4,
                           spread=(2, 2)) == 0

    report = json.loads(output.read_text())
    assert report["lossless"] is True and report["config"]["regimes"] == LABELS
    rows = report["regimes"]
    assert [row["regime"] for row in rows] == LABELS
    for row in rows:
        assert row["lossless"] is True and row["sessions"] == 2
        spread = row["workers"] == 2
        assert row["pairs"] == {"sessions": 2, "pairs": 2 if spread else 1,
                                "max_sessions_per_pair": 1 if spread else 2,
                                "sessions_per_pair": 1.0 if spread else 2.0}
        # 50 chunks a second each way, one call each, and a few housekeeping calls (lease
        # rounds, the worker's polls and heartbeats, the reaper's passes), more per session
        # the fewer sessions share them
        assert 100 <= row["commands_sent_per_session_s"] <= 140
        assert 100 <= row["writes_per_session_s"] <= 140
        # run inside a call, per chunk: the input append's MULTI's two (XADD, SPUBLISH) and
        # the output flush's three (its worker's state, XADD, SPUBLISH: no log's end or
        # record read once the worker knows the log's end); a command more a chunk fails it
        assert 240 <= row["in_scripts_per_session_s"] < 320
        if row["busy"]:
            # Under load the relay's share can be smaller than the generator's own drift: the
            # figure is then withheld and marked, never printed as a negative or a zero.
            assert (row["redis_us_per_round_trip"] is None) is row["under_generator_drift"]
            assert row["generator_commands"] > 0 and row["modelled_us_per_round_trip"] > 0
            assert row["generator_alone"]["connections"] == 4
            assert row["point"]["redis"]["calls_by_command"]["echo"] > 0
        else:
            assert row["redis_us_per_round_trip"] is not None
            assert not row["under_generator_drift"]
            assert row["generator_commands"] == 0 and row["generator_alone"] is None
            assert row["modelled_us_per_round_trip"] is None
    printed = capsys.readouterr().out
    assert "Redis regimes: Redis us per 20 ms chunk round trip" in printed
    plot = output.with_name("relay-regimes.svg")
    assert f"plot: {plot}" in printed
    titles = [t.text for t in ET.parse(plot).getroot().iter(f"{SVG}title")]
    # a series per regime with a figure (the idle ones always have theirs)
    assert titles == [row["regime"] for row in rows
                      if row["redis_us_per_round_trip"] is not None]
    assert {LABELS[0], LABELS[2]} <= set(titles)


FRAME_LABELS = ["single 1g x 1w, frame path, idle, auto, io-threads 1",
                "spread 2g x 2w, frame path, idle, auto, io-threads 1"]


@pytest.mark.timeout(300)
def test_the_frame_path_regimes_find_every_chunk_in_the_frames(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--backend fake``: the regimes' workers run a frame backend (80 ms frames both ways,
    the input pulled once a tick) that echoes, and the load client finds every chunk, once
    and in order, in the frames it gets back; the writes per session-second are those of
    80 ms entries, a fraction of the loopback's hundred."""
    output = tmp_path / "relay.json"
    assert run_relay_bench(sessions=[2], gateways=[1], seconds=3.0, output=output,
                           spread=(2, 2), backend="fake") == 0

    report = json.loads(output.read_text())
    assert report["lossless"] is True and report["config"]["regimes"] == FRAME_LABELS
    for row in report["regimes"]:
        assert row["backend"] == "fake" and row["lossless"] is True
        point = row["point"]["chunks"]
        assert point["received"] == point["sent"] > 0
        assert WRITES_PER_FRAME_SESSION_S[0] <= row["writes_per_session_s"] \
            <= WRITES_PER_FRAME_SESSION_S[1], row["writes_per_session_s"]
    assert "frame path" in capsys.readouterr().out


def test_regimes_are_planned_from_the_flags() -> None:
    """None without --busy or --spread; each topology idle, then busy once per thread count."""
    assert plan_regimes(spread=None, busy=None, kind="auto", io_threads=None) == []
    assert plan_regimes(spread=(3, 2), busy=None, kind="auto", io_threads=None) == [
        Regime(1, 1, ServerChoice("auto"), 0), Regime(3, 2, ServerChoice("auto"), 0)]
    assert plan_regimes(spread=None, busy=8, kind="valkey", io_threads=[1, 2]) == [
        Regime(1, 1, ServerChoice("valkey"), 0), Regime(1, 1, ServerChoice("valkey", 1), 8),
        Regime(1, 1, ServerChoice("valkey", 2), 8)]
    assert plan_regimes(spread=None, busy=4, kind="auto", io_threads=None,
                        backend="fake") == [Regime(1, 1, ServerChoice("auto"), 0, "fake"),
                                            Regime(1, 1, ServerChoice("auto", 1), 4, "fake")]


def test_spread_takes_two_counts() -> None:
    parser = argparse.ArgumentParser()
    add_regime_arguments(parser)
    assert parser.parse_args(["--spread", "4,3"]).spread == (4, 3)
    for bad in ("4", "4,0", "a,b", "1,2,3"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--spread", bad])


def test_relay_io_threads_without_busy_are_refused(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """I/O threads are measured in the busy regime only: refused before anything starts."""
    from duplex_gateway.cli import main

    output = tmp_path / "relay.json"
    with pytest.raises(SystemExit) as ended:
        main(["bench", "relay", "--io-threads", "2", "--output", str(output)])
    assert ended.value.code == 2
    assert "--io-threads needs --busy" in capsys.readouterr().err
    assert not output.exists()
    with pytest.raises(SystemExit) as ended:
        main(["bench", "relay", "--backend", "fake", "--output", str(output)])
    assert ended.value.code == 2
    assert "--backend needs --busy or --spread" in capsys.readouterr().err
    assert not output.exists()


def test_a_share_below_the_generators_drift_is_no_figure() -> None:
    """The frame path's busy point of the committed run: the relay's Redis time is smaller
    than the generator's drift, the subtraction comes out negative, and the table says
    ``drift`` where a figure would be, keeping the model's."""
    from duplex_gateway.bench.busy import GeneratorCost
    from duplex_gateway.bench.relay_regimes import _figures, format_regimes

    saved = json.loads((Path(__file__).parents[1] / "docs/performance/bench"
                        / "relay-frames-busy.json").read_text())
    row = next(r for r in saved["regimes"] if r["busy"] and r["sessions"] == 10
               and r["workers"] == 1)
    figures = _figures(row["point"], GeneratorCost(**row["generator_alone"]))
    assert figures["under_generator_drift"] is True
    assert figures["redis_us_per_round_trip"] is None
    assert figures["main_thread_us_per_round_trip"] is None
    assert figures["modelled_us_per_round_trip"] == pytest.approx(17.0, abs=0.1)
    line = format_regimes([{**row, **figures}]).splitlines()[2]
    assert line.split()[-10:-7] == ["drift", "drift", "17.0"], line
