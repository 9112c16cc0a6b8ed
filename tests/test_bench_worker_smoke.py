"""bench worker and the GPU check: a tiny run of each, and the batch search they share."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from duplex_gateway import gpu_check
from duplex_gateway.bench.stack import read_process_cpu
from duplex_gateway.bench.worker import largest_batch_within
from duplex_gateway.cli import main


def test_bench_worker_fake_writes_table_and_json(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A tiny fake-backend run prints the table and writes one JSON row per batch size."""
    output = tmp_path / "worker.json"
    with pytest.raises(SystemExit) as done:
        main(["bench", "worker", "--backend", "fake", "--batch", "4,1,2", "--steps", "3",
              "--warmup", "1", "--backend-options", "per_slot_ms=0.5",
              "--relay-seconds", "0", "--output", str(output)])
    assert done.value.code == 0
    result = json.loads(output.read_text())
    assert result["backend"] == "fake" and result["frame_ms"] == 80.0
    assert result["relay"]["skipped"] == "--relay-seconds 0" and result["relay"]["rows"] == []
    assert not output.with_name(f"{output.stem}-relay.svg").exists()
    rows = result["rows"]
    assert [row["batch"] for row in rows] == [1, 2, 4]
    assert rows[0]["ratio_vs_b1"] == 1.0
    assert all(row["steps"] == 3 and row["fits_frame"] for row in rows)
    assert rows[2]["p50_ms"] >= 2.0  # 4 slots x 0.5 ms of simulated compute
    # the fake's slot moves with one record: its whole state
    assert result["resume"]["records"] == 1 and len(result["resume"]["resume_ms"]) == 3
    printed = capsys.readouterr().out
    assert "resume: a slot rebuilt from its newest 1 step records" in printed
    assert "per-session ms" in printed
    assert f"results: {output}\nstep time plot: {output.with_suffix('.svg')}" in printed
    chart = ET.parse(output.with_suffix(".svg")).getroot()
    titles = [t.text for t in chart.iter("{http://www.w3.org/2000/svg}title")]
    assert titles == ["fake p50", "fake p99"]


@pytest.mark.timeout(120)
def test_bench_worker_times_a_moshi_slot_rebuilt_from_its_records(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tiny Moshi of a 200-frame context: the resume phase steps a slot for a checkpoint's
    worth of records (200: the newest 125 whole, 4,184 bytes with PCM16 input, the older 75
    compact, 40) and rebuilds another from them, reporting their size and how many frames
    the rebuild holds the adopter's other sessions up."""
    from inference_worker.backends.moshi_tiny import write_tiny_moshi

    write_tiny_moshi(tmp_path / "tiny", sliding_window=200)
    output = tmp_path / "worker.json"
    with pytest.raises(SystemExit) as done:
        main(["bench", "worker", "--backend", "moshi", "--model-path", str(tmp_path / "tiny"),
              "--batch", "1", "--steps", "2", "--warmup", "0", "--threads", "1",
              "--relay-seconds", "0", "--output", str(output)])
    assert done.value.code == 0
    resume = json.loads(output.read_text())["resume"]
    assert resume["records"] == 200 and resume["record_bytes"] == 4184
    assert resume["records_bytes"] == 125 * 4184 + 75 * 40
    assert resume["frames_held_up"] >= 1 and all(t > 0 for t in resume["resume_ms"])
    assert "resume: a slot rebuilt from its newest 200 step records" in capsys.readouterr().out


@pytest.mark.timeout(180)
def test_bench_worker_relay_phase_reports_relay_and_model_cpu_per_batch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With a relay phase, every batch size's row has the worker's CPU split into relay (the
    event-loop thread) and model, per session-second and per chunk, next to the step phase's
    step time, from B sessions that all opened and got the fake's echoed frames back."""
    output = tmp_path / "worker.json"
    with pytest.raises(SystemExit) as done:
        main(["bench", "worker", "--backend", "fake", "--batch", "1,2", "--steps", "3",
              "--warmup", "1", "--backend-options", "per_slot_ms=0.5",
              "--relay-seconds", "2.5", "--output", str(output)])
    assert done.value.code == 0
    relay = json.loads(output.read_text())["relay"]
    assert relay["skipped"] is None and relay["seconds"] == 2.5 and "main thread" in relay["method"]
    assert [row["batch"] for row in relay["rows"]] == [1, 2]
    for row in relay["rows"]:
        assert (row["sessions_opened"], row["sessions_failed"]) == (row["batch"], 0), row
        assert row["chunks"] > 0 and row["output_deltas"] > 0 and row["errors"] == []
        assert row["relay_cpu_s"] > 0 and row["relay_us_per_chunk"] > 0
        assert row["relay_ms_per_session_s"] > 0 and row["model_ms_per_session_s"] is not None
        assert row["relay_cpu_s"] + row["model_cpu_s"] == pytest.approx(row["worker_cpu_s"],
                                                                         abs=1e-3)
        assert row["step_ms_per_session_s"] >= 0.5 * 1000 / 80  # 0.5 ms a slot, 80 ms frames
        assert row["clients"] == 1 and len(row["threads"]) >= 1
    printed = capsys.readouterr().out
    assert "relay us/chunk" in printed and "relay plot:" in printed
    chart = ET.parse(output.with_name(f"{output.stem}-relay.svg")).getroot()
    titles = [t.text for t in chart.iter("{http://www.w3.org/2000/svg}title")]
    assert titles == ["relay (event loop)", "model threads", "model step (step phase)"]


@pytest.mark.parametrize("value", ["0.5", "1", "-2", "nan", "soon"])
def test_relay_seconds_refuses_what_cannot_measure(value: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """--relay-seconds takes 0 or more than the warm-up; anything else is argparse's usage
    error (exit 2), naming the flag."""
    with pytest.raises(SystemExit) as done:
        main(["bench", "worker", "--relay-seconds", value])
    assert done.value.code == 2
    assert "--relay-seconds" in capsys.readouterr().err


def test_process_cpu_is_split_by_thread() -> None:
    """A thread's CPU is counted under its own thread id, not the main thread's, and the
    process total covers both."""
    before = read_process_cpu(os.getpid())
    native: list[int] = []
    spun, release = threading.Event(), threading.Event()

    def spin() -> None:
        native.append(threading.get_native_id())
        while time.thread_time() < 0.2:  # CPU this thread itself spent, not wall time
            pass
        spun.set()
        release.wait()  # stay alive until read: an ended thread leaves /proc/<pid>/task

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        assert spun.wait(30)
        after = read_process_cpu(os.getpid())
    finally:
        release.set()
        spinner.join()
    thread_spent = after.by_thread[native[0]]
    main_spent = after.by_thread[os.getpid()] - before.by_thread[os.getpid()]
    assert thread_spent > main_spent
    assert after.total_s - before.total_s >= thread_spent - 0.02  # a tick of rounding


@pytest.mark.parametrize(("threshold", "start"), [(37, 1), (37, 16), (64, 1), (0, 1), (1, 16),
                                                  (15, 16), (16, 16)])
def test_search_finds_the_largest_fitting_batch(threshold: int, start: int) -> None:
    """Doubling from ``start`` then bisecting finds the largest B <= threshold (limit 64)."""
    tried: list[int] = []

    def fits(batch: int) -> bool:
        tried.append(batch)
        return batch <= threshold

    assert largest_batch_within(fits, limit=64, start=start) == threshold
    assert len(tried) == len(set(tried)) and len(tried) <= 13


def test_search_counts_memory_errors_as_misses_and_stops_in_time() -> None:
    """MemoryError is a miss; once out of time the best size so far is returned."""
    def fits(batch: int) -> bool:
        if batch > 8:
            raise MemoryError
        return True

    assert largest_batch_within(fits, limit=64) == 8
    calls: list[int] = []

    def slow(batch: int) -> bool:
        calls.append(batch)
        return True

    assert largest_batch_within(slow, limit=64, out_of_time=lambda: len(calls) >= 3) == 4


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None
                    and __import__("torch").cuda.is_available(), reason="a CUDA device is here")
def test_gpu_check_fails_clearly_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    """With no CUDA device the check exits 2 and says why."""
    assert gpu_check.main(["--output", "/nonexistent/never-written.json"]) == 2
    assert "gpu_check:" in capsys.readouterr().err


@pytest.mark.timeout(240)
# torch.compile's own imports use APIs torch itself deprecates; not this project's code.
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_gpu_check_logic_on_a_tiny_cpu_moshi(tmp_path: Path) -> None:
    """--cpu-tiny runs both modes' searches end to end and writes the JSON."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    output = tmp_path / "gpu.json"
    status = gpu_check.main(["--cpu-tiny", "--max-batch", "2", "--steps", "2", "--warmup", "1",
                             "--budget-ms", "60000", "--graphs-start", "2",
                             "--compile-backend", "eager", "--output", str(output)])
    assert status == 0
    result = json.loads(output.read_text())
    assert result["device"] == "cpu (tiny)" and result["budget_ms"] == 60000
    modes = {mode["mode"]: mode for mode in result["modes"]}
    assert set(modes) == {"eager", "graphs"}
    chart = ET.parse(output.with_suffix(".svg")).getroot()
    assert len(chart.findall("{http://www.w3.org/2000/svg}polyline")) == 4
    for mode in modes.values():
        assert mode["error"] is None, mode["error"]
        assert mode["largest_batch"] == 2 and mode["complete"]


# What a GPU machine's image may lack: the check must not need the serving stack.
_SERVING_ONLY = ("redis", "store", "gateway", "starlette", "uvicorn", "websockets", "msgpack")


@pytest.mark.timeout(120)
def test_gpu_check_runs_without_the_serving_stack(tmp_path: Path) -> None:
    """The check imports and runs with only torch and transformers (no Redis client, no web)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    output = tmp_path / "gpu.json"
    code = (
        "import sys\n"
        f"for name in {_SERVING_ONLY!r}: sys.modules[name] = None\n"
        "from duplex_gateway import gpu_check\n"
        "sys.exit(gpu_check.main(sys.argv[1:]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "--cpu-tiny", "--modes", "eager", "--max-batch", "1",
         "--steps", "1", "--warmup", "0", "--budget-ms", "60000", "--output", str(output)],
        capture_output=True, text=True, timeout=110, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(output.read_text())["modes"][0]["largest_batch"] == 1


def test_a_relay_row_never_gives_the_main_thread_more_than_the_process() -> None:
    """/proc rounds each thread's CPU and the process's to clock ticks apart, so the event
    loop thread's delta can read a tick above the whole process's (seen as a 1-in-4 flake of
    the relay phase's test): the row then splits the process's time, relay + model == all."""
    from duplex_gateway.bench.stack import ProcessCpu, StreamResult
    from duplex_gateway.bench.worker_relay import _RelayWindow, relay_row
    from duplex_gateway.bench.worker_rows import BenchRow

    window = _RelayWindow(
        worker_pid=7, before=ProcessCpu(total_s=1.00, by_thread={7: 0.50, 8: 0.50}),
        after=ProcessCpu(total_s=1.07, by_thread={7: 0.58, 8: 0.50}), wall_s=2.0,
        client_cpu_s=(0.1,), streamed=StreamResult(opened=2, sent_in_window=100,
                                                    deltas_in_window=100))
    step = BenchRow(batch=2, steps=3, p50_ms=1.0, p99_ms=1.0, mean_ms=1.0, per_session_ms=0.5,
                    ratio_vs_b1=1.0, fits_frame=True)
    row = relay_row(window, step, 80.0)
    assert row.relay_cpu_s == row.worker_cpu_s == pytest.approx(0.07)
    assert row.model_cpu_s == 0.0
