"""Smoke test of ``duplex-gateway bench calls`` at a small size: it runs the real input script
on a real server, writes JSON holding every figure and a plot, and refuses a bad split.

Nothing here checks speed: the numbers depend on the machine.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from redis.asyncio import Redis

from duplex_gateway.bench.call_shapes import (
    OUTPUT_FLUSH,
    PLAIN_INPUT,
    PULLED_PACKED_INPUT,
    PULLED_PLAIN_INPUT,
    PUSHED_PLAIN_INPUT,
)
from duplex_gateway.bench.calls import CommandStats, executed_usec
from duplex_gateway.cli import main

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


def run_cli(*argv: str) -> int:
    with pytest.raises(SystemExit) as ended:
        main(["bench", "calls", *argv])
    code = ended.value.code
    assert isinstance(code, int)
    return code


@pytest.mark.timeout(120)
def test_a_small_run_measures_every_shape_and_both_clients(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """4 sessions, 1, 2 and 4 per call: the bare publish, then the input script (to a pushed
    and to a pulling worker), the store's plain append to a pulling worker, the study's plain
    append and the output flush (the full script, and the fast one with the log ends known,
    also 80 ms a call) at each split, every
    figure positive, chunks = calls x sessions per call, both clients measured, the table and
    the plot written."""
    output = tmp_path / "out" / "calls.json"
    assert run_cli("--sessions", "4", "--per-call", "4,1,2", "--seconds", "0.5",
                   "--calls", "30", "--output", str(output)) == 0

    report = json.loads(output.read_text())
    assert report["config"]["sessions"] == 4 and report["config"]["per_call"] == [1, 2, 4]
    assert report["target_us_per_chunk_per_direction"] == 10.0
    shapes = [(row["shape"], row["sessions_per_call"]) for row in report["calls"]]
    assert shapes == [(BARE, 1)] + [
        (shape, n)
        for shape in SHAPES for n in (1, 2, 4)]
    for row in report["calls"]:
        assert row["calls"] > 0 and row["chunks"] == row["calls"] * row["sessions_per_call"] * (
            4 if row["shape"] in (PACKED, FRAME_OUTPUT) else 1)
        assert row["redis_us_per_chunk"] > 0 and row["redis_us_per_call"] > 0
        # Each call its own write: the sessions' clocks are spread over the period, so no
        # two calls are due at once (a sleep of the loop can still join a few; redis-py's
        # pool may connect in the window, whose reads count too).
        assert 0.7 < row["reads_per_call"] < 1.5, row
        by_name = row["commands_us_per_chunk_by_name"]
        if row["shape"] in (BARE, PUSHED_PLAIN, PULLED_PLAIN, PACKED, PLAIN):  # no script
            assert row["script_us_per_chunk"] == 0 and by_name == {}
            continue
        if row["shape"] in (SCRIPT, PULLED):  # every command the input script runs
            # Each session's first call, which reads its log's end (the bench opened none),
            # comes before the window; a pulling worker is pushed nothing, and its reads are
            # its own, not the script's.
            pushed = {"spublish"} if row["shape"] == SCRIPT else set()
            assert set(by_name) == {"xlen", "xadd", *pushed}, by_name
        elif row["shape"] == OUTPUT:  # the worker's state (the lost-worker fence, and
            # whether any session was taken over from it), the output log's last entry, the
            # event, its push; nothing of the record
            assert set(by_name) == {"hmget", "xrevrange", "xadd", "spublish"}, by_name
        else:  # with the log's end known, nothing read but the worker's state
            assert set(by_name) == {"hmget", "xadd", "spublish"}, by_name
        assert row["commands_us_per_chunk"] == pytest.approx(sum(by_name.values()))
        assert 0 < row["commands_us_per_chunk"] < row["script_us_per_chunk"]
    assert [row["client"] for row in report["clients"]] == [
        "redis-py (hiredis), through Scripts", "the store's own connection, through Scripts"]
    assert all(row["calls"] == 30 and row["client_us_per_call"] > 0
               for row in report["clients"])
    printed = capsys.readouterr().out
    assert "Redis CPU per chunk, one direction (4 sessions" in printed
    plot = output.with_suffix(".svg")
    assert f"(plot: {plot})" in printed
    titles = [t.text for t in ET.parse(plot).getroot().iter(f"{SVG}title")]
    assert titles == [*SHAPES, BARE]


def test_sessions_per_call_that_do_not_divide_the_sessions_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every call carries the same number of sessions: a split that leaves a remainder is
    refused before anything starts (exit 2, nothing written)."""
    output = tmp_path / "calls.json"
    assert run_cli("--sessions", "5", "--per-call", "1,2", "--output", str(output)) == 2
    assert "--per-call [2] do not divide --sessions 5" in capsys.readouterr().err
    assert not output.exists()


@pytest.mark.timeout(30)
async def test_a_transaction_is_charged_once_in_the_modelled_execution(
        redis_client: Redis) -> None:
    """Redis charges a ``MULTI``'s ``EXEC`` the time of the commands it ran, and those
    commands their own time too (on both servers), so a transaction shape's execution is its
    ``EXEC`` and ``MULTI`` alone: counting its ``XADD``s as well would count them twice."""
    await redis_client.config_resetstat()
    for _ in range(50):
        pipe = redis_client.pipeline(transaction=True)
        pipe.xadd("log", {"d": b"x" * 4096})
        pipe.spublish("channel", b"x")
        await pipe.execute()
    stats = CommandStats.of(await redis_client.info("commandstats"))
    assert stats.calls["exec"] == stats.calls["xadd"] == stats.calls["spublish"] == 50
    # Each EXEC's time holds its commands' (whole microseconds, each rounded down once).
    assert stats.usec["exec"] + 50 >= stats.usec["xadd"] + stats.usec["spublish"]
    for shape in (PUSHED_PLAIN_INPUT, PLAIN_INPUT):
        assert shape.charged == {"multi", "exec"}
    for shape in (PULLED_PLAIN_INPUT, PULLED_PACKED_INPUT):
        assert shape.charged == {"multi", "exec", "xread"}
    assert executed_usec(stats, PLAIN_INPUT) == stats.usec["exec"] + stats.usec["multi"]
    # A script's call holds its commands' time the same way; what it ran is not charged.
    assert OUTPUT_FLUSH.charged == OUTPUT_FLUSH.sent == {"evalsha"}
