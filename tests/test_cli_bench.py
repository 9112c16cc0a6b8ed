"""The bench commands explain themselves: bad arguments get argparse's one-line error (exit
status 2, no traceback), every flag's help names its default, results go to a new timestamped
file unless ``--output`` says otherwise, and ``scripts/make-tiny-moshi`` runs as written."""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from duplex_gateway.bench.kit import (
    bucket_bounds,
    default_output,
    histogram_counts,
    positive_int_list,
)
from duplex_gateway.bench.resume import cuts_per_session
from duplex_gateway.cli import _parser

ROOT = Path(__file__).resolve().parent.parent
BENCHES = ("relay", "resume", "leases", "worker", "calls", "open", "video", "migrate")

# (command line after `bench`, the flag argparse names, what its message says)
BAD_ARGUMENTS = [
    (["worker", "--batch", "0"], "--batch", "must be at least 1, got 0"),
    (["worker", "--batch", "a,b"], "--batch", "'a' is not a whole number"),
    (["worker", "--batch", "1,-2"], "--batch", "must be at least 1, got -2"),
    (["worker", "--batch", ","], "--batch", "expected whole numbers >= 1"),
    (["worker", "--steps", "0"], "--steps", "must be at least 1, got 0"),
    (["worker", "--warmup", "-1"], "--warmup", "must be 0 or more, got -1"),
    (["worker", "--threads", "two"], "--threads", "'two' is not a whole number"),
    (["worker", "--backend", "loopback"], "--backend", "invalid choice: 'loopback'"),
    (["resume", "--sessions", "0"], "--sessions", "must be at least 1, got 0"),
    (["video", "--frame-bytes", "0"], "--frame-bytes", "must be at least 1, got 0"),
    (["resume", "--disconnects", "0"], "--disconnects", "must be at least 1, got 0"),
    (["resume", "--disconnects", "1e3"], "--disconnects", "'1e3' is not a whole number"),
    (["relay", "--sessions", "-5"], "--sessions", "must be at least 1, got -5"),
    (["relay", "--sessions", "10,x"], "--sessions", "'x' is not a whole number"),
    (["relay", "--sessions", "10,0"], "--sessions", "must be at least 1, got 0"),
    (["relay", "--gateways", "0"], "--gateways", "must be at least 1, got 0"),
    (["relay", "--gateways", ","], "--gateways", "expected whole numbers >= 1"),
    (["relay", "--seconds", "1"], "--seconds", "must be more than 1 (the warm-up"),
    (["relay", "--seconds", "nan"], "--seconds", "must be a finite number above 0"),
    (["relay", "--seconds", "soon"], "--seconds", "'soon' is not a number"),
    (["leases", "--sessions", "100,0"], "--sessions", "must be at least 1, got 0"),
    (["leases", "--workers", "0"], "--workers", "must be at least 1, got 0"),
    (["leases", "--seconds", "0"], "--seconds", "must be a finite number above 0"),
    (["leases", "--seconds", "inf"], "--seconds", "must be a finite number above 0"),
    (["calls", "--sessions", "0"], "--sessions", "must be at least 1, got 0"),
    (["calls", "--per-call", "1,x"], "--per-call", "'x' is not a whole number"),
    (["calls", "--seconds", "0"], "--seconds", "must be a finite number above 0"),
    (["calls", "--calls", "-3"], "--calls", "must be at least 1, got -3"),
    (["open", "--connections", "0"], "--connections", "must be at least 1, got 0"),
]


@pytest.mark.parametrize(("argv", "flag", "message"), BAD_ARGUMENTS,
                         ids=[" ".join(case[0]) for case in BAD_ARGUMENTS])
def test_bad_argument_is_refused_by_argparse(argv: list[str], flag: str, message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Each out-of-range or unparsable value exits 2 with argparse's error naming the flag."""
    with pytest.raises(SystemExit) as refused:
        _parser().parse_args(["bench", *argv])
    assert refused.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"duplex-gateway bench {argv[0]}: error: argument {flag}")
    assert message in last


@pytest.mark.parametrize("argv", [["worker", "--batch", "0"], ["worker", "--steps", "0"],
                                  ["resume", "--sessions", "0"], ["relay", "--seconds", "0.5"],
                                  ["leases", "--sessions", "x"]])
def test_the_real_command_answers_a_sentence_not_a_traceback(argv: list[str]) -> None:
    """``python -m duplex_gateway bench ...`` with a bad value: exit 2, usage and one error
    line, no traceback, nothing started."""
    done = subprocess.run([sys.executable, "-m", "duplex_gateway", "bench", *argv],
                          capture_output=True, text=True, timeout=50, check=False)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("usage: duplex-gateway bench")
    assert done.stderr.strip().splitlines()[-1].startswith(
        f"duplex-gateway bench {argv[0]}: error: argument {argv[1]}")


def _bench_commands() -> dict[str, argparse.ArgumentParser]:
    """The parser of each ``bench`` subcommand, by name."""
    def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    return subcommands(subcommands(_parser())["bench"])


def test_every_bench_flag_has_help_with_its_default() -> None:
    """Every flag of every bench command has help text that says what happens by default."""
    commands = _bench_commands()
    assert set(commands) == set(BENCHES)
    for name, command in commands.items():
        flags = [a for a in command._actions if not isinstance(a, argparse._HelpAction)]
        assert flags, name
        for action in flags:
            assert action.help and "default" in action.help, (name, action.dest)
        output = next(a for a in flags if a.dest == "output")
        assert output.default is None  # resolved at run time, to a new stamped file
        assert f"bench-results/{name}-<UTC time>.json" in str(output.help), name


def test_comma_lists_are_sorted_and_unique() -> None:
    """``--batch`` / ``--sessions`` lists: spaces ignored, duplicates dropped, ascending."""
    assert positive_int_list("8, 1,8,2") == [1, 2, 8]
    assert _parser().parse_args(["bench", "worker"]).batch == [1, 2, 4, 8, 16, 32]
    assert _parser().parse_args(["bench", "leases"]).sessions == [100, 1000, 2000]


def test_bench_relay_defaults_to_the_full_sweep() -> None:
    """Without flags ``bench relay`` sweeps 10 to 400 sessions at 1 and 2 gateways; the lists
    are parsed like every other comma list."""
    args = _parser().parse_args(["bench", "relay"])
    assert args.sessions == [10, 25, 50, 100, 200, 400] and args.gateways == [1, 2]
    args = _parser().parse_args(["bench", "relay", "--sessions", "4, 2,4", "--gateways", "2"])
    assert args.sessions == [2, 4] and args.gateways == [2]


@pytest.mark.parametrize(("sessions", "disconnects"), [(3, 20), (2, 20), (20, 1000), (7, 3),
                                                       (1, 1)])
def test_disconnects_are_shared_out_exactly(sessions: int, disconnects: int) -> None:
    """`bench resume` runs exactly the disconnects asked: none dropped when they do not divide
    (3 sessions, 20 disconnects: 7 + 7 + 6), and no session has two more than another."""
    cuts = cuts_per_session(sessions, disconnects)
    assert len(cuts) == sessions and sum(cuts) == disconnects
    assert max(cuts) - min(cuts) <= 1
    assert cuts == sorted(cuts, reverse=True)


def test_default_output_is_stamped_in_utc_and_never_reused(tmp_path: Path) -> None:
    """bench-results/<name>-<UTC stamp>.json; a run in the same second gets -2, then -3."""
    tz = datetime.timezone(datetime.timedelta(hours=2))
    now = datetime.datetime(2026, 3, 4, 7, 8, 9, tzinfo=tz)
    assert default_output("relay", now=now) == Path("bench-results/relay-20260304T050809Z.json")
    first = default_output("worker", now=now, folder=tmp_path)
    assert first == tmp_path / "worker-20260304T050809Z.json"
    first.write_text("{}")
    second = default_output("worker", now=now, folder=tmp_path)
    assert second == tmp_path / "worker-20260304T050809Z-2.json"
    second.write_text("{}")
    assert default_output("worker", now=now, folder=tmp_path).name.endswith("Z-3.json")


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DUPLEX_GATEWAY_")}


def test_bench_worker_keeps_every_run_under_bench_results(tmp_path: Path) -> None:
    """Without --output, two runs write two timestamped JSON files (and plots) under
    ./bench-results/ and each prints where it wrote; neither overwrites the other."""
    command = [sys.executable, "-m", "duplex_gateway", "bench", "worker", "--backend", "fake",
               "--batch", "1,2", "--steps", "2", "--warmup", "0", "--relay-seconds", "0"]
    printed = []
    for _ in range(2):
        done = subprocess.run(command, cwd=tmp_path, env=_clean_env(), capture_output=True,
                              text=True, timeout=50, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        printed.append(done.stdout)
    results = sorted((tmp_path / "bench-results").glob("worker-*.json"))
    assert len(results) == 2
    for path in results:
        assert path.stem.startswith("worker-20") and json.loads(path.read_text())["rows"]
        assert path.with_suffix(".svg").exists()
        relative = path.relative_to(tmp_path)
        assert sum(f"results: {relative}\n" in out for out in printed) == 1


def test_bench_worker_refuses_an_unusable_backend_with_a_sentence(tmp_path: Path) -> None:
    """A backend option it cannot parse ends the run with exit 2 and one line saying so."""
    done = subprocess.run(
        [sys.executable, "-m", "duplex_gateway", "bench", "worker", "--backend", "fake",
         "--backend-options", "nonsense", "--output", str(tmp_path / "w.json")],
        env=_clean_env(), capture_output=True, text=True, timeout=50, check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == ("bench worker: cannot load the fake backend: backend "
                                   "option 'nonsense' is not key=value")
    assert not (tmp_path / "w.json").exists()


def test_make_tiny_moshi_help_needs_no_model_stack() -> None:
    """``scripts/make_tiny_moshi.py --help`` runs by path and names every option's default."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tiny_moshi.py"),
                           "--help"], capture_output=True, text=True, timeout=50, check=False)
    assert done.returncode == 0, done.stderr
    assert "(default 0)" in done.stdout and "(default 3000)" in done.stdout


def test_make_tiny_moshi_without_torch_says_so() -> None:
    """On an interpreter without torch, the script exits 2 with a sentence, not a traceback."""
    code = ("import runpy, sys\n"
            "sys.modules['torch'] = None\n"  # an interpreter on which torch is not installed
            f"sys.argv = [{str(ROOT / 'scripts' / 'make_tiny_moshi.py')!r}, 'never-written']\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=50, check=False)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("make_tiny_moshi: needs torch and transformers")


@pytest.mark.timeout(180)
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="needs the moshi extra (torch, transformers)")
def test_make_tiny_moshi_runs_as_the_readme_writes_it(tmp_path: Path) -> None:
    """``scripts/make-tiny-moshi DIR`` from another folder writes a loadable checkpoint into
    DIR relative to where it was called."""
    wrapper = ROOT / "scripts" / "make-tiny-moshi"
    assert os.access(wrapper, os.X_OK)
    done = subprocess.run([str(wrapper), "tiny"], cwd=tmp_path, env=_clean_env(),
                          capture_output=True, text=True, timeout=170, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "wrote a tiny Moshi" in done.stdout
    assert json.loads((tmp_path / "tiny" / "config.json").read_text())
    assert (tmp_path / "tiny" / "model.safetensors").stat().st_size > 0


def test_bucket_bounds_read_what_was_observed_between_two_reads(tmp_path: Path) -> None:
    """The histogram reader sums a histogram's label sets from a real Prometheus page, and
    the quantiles are those of what was observed between the two reads only."""
    from prometheus_client import CollectorRegistry, Histogram, write_to_textfile

    registry = CollectorRegistry()
    lag = Histogram("probe_lag_seconds", "lag", ["backend"], registry=registry,
                    buckets=(0.001, 0.01, 0.1))
    page = tmp_path / "metrics.txt"

    def read() -> dict[float, float] | None:
        write_to_textfile(str(page), registry)
        return histogram_counts(page.as_uri(), "probe_lag_seconds")

    assert histogram_counts(page.as_uri(), "probe_lag_seconds") is None  # no page yet
    for _ in range(50):
        lag.labels("a").observe(0.5)  # before the window: not counted
    before = read()
    for _ in range(98):
        lag.labels("a" if _ % 2 else "b").observe(0.0005)
    lag.labels("b").observe(0.05)
    lag.labels("a").observe(0.05)
    after = read()
    assert after is not None and after[math.inf] == 150
    assert bucket_bounds(before, after, (0.5, 0.99, 1.0)) == [0.001, 0.1, 0.1]
    assert bucket_bounds(after, after, (0.99,)) is None  # nothing observed in between
    lag.labels("a").observe(5)
    assert bucket_bounds(after, read(), (1.0,)) == [math.inf]
