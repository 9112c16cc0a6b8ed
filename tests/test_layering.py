"""Layers only import downward.

From the bottom: ``contract`` (what the services share without Redis) and ``runtime`` (process
helpers); ``store`` (Redis); ``gateway`` and ``inference_worker``; ``duplex_gateway`` (the
command). ``duplex_client`` stands alone.
"""

from __future__ import annotations

import ast
import graphlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Each package of the project and the project packages it may import: the import map. A
#: package imports only packages below it, so the map has no upward arrow and no circle.
LAYERS: dict[str, frozenset[str]] = {
    "contract": frozenset(),
    "runtime": frozenset({"contract"}),
    "store": frozenset({"contract", "runtime"}),
    "gateway": frozenset({"contract", "runtime", "store"}),
    "inference_worker": frozenset({"contract", "runtime", "store"}),
    # The client library stands alone: usable without the server installed.
    "duplex_client": frozenset(),
    "duplex_gateway": frozenset({"contract", "runtime", "store", "gateway", "inference_worker",
                                 "duplex_client"}),
}
# package -> third-party modules it must never import
FORBIDDEN = {
    "contract": {"redis", "asyncio", "starlette", "uvicorn", "torch"},
    "runtime": {"redis", "starlette", "uvicorn", "torch"},
    "store": {"starlette", "uvicorn", "torch"},
    "gateway": {"torch", "transformers"},
    "inference_worker": {"starlette", "uvicorn"},
    "duplex_client": {"starlette", "uvicorn", "redis"},
    "duplex_gateway": set(),
}
# I/O-free cores: no event loop, no Redis, no web framework, no clock.
_NO_IO = frozenset({"asyncio", "redis", "time"})
_NO_THREADS = _NO_IO | {"threading"}
_NO_TORCH = _NO_THREADS | {"torch"}
_NO_MODELS = _NO_TORCH | {"onnxruntime"}
PURE = {
    "gateway/protocol": {"asyncio", "redis", "starlette", "time", "websockets"},
    "inference_worker/conversation": _NO_TORCH,
    "inference_worker/turn_detection": _NO_MODELS,
    "inference_worker/backends/loopback.py": _NO_IO,
    "inference_worker/audio_formats.py": _NO_TORCH,
    "inference_worker/audio_frames.py": _NO_TORCH,
    "inference_worker/g711.py": _NO_TORCH,
    "inference_worker/untrusted.py": _NO_THREADS,
    "contract": _NO_IO,
    "store/formats.py": {"asyncio", "redis", "time"},
    "store/answers.py": {"asyncio", "redis", "time"},
    "store/lua": {"asyncio", "redis", "time"},
}


def imported_tops(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    tops: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            tops |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            tops.add(node.module.split(".")[0])
    return tops


def files(target: str) -> list[Path]:
    path = ROOT / target
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def test_the_import_map_has_every_package_and_no_circle() -> None:
    """LAYERS names every package the project ships, and its arrows form no circle."""
    shipped = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests"}
    assert shipped == set(LAYERS)
    graphlib.TopologicalSorter(LAYERS).static_order()  # raises CycleError on a circle


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_layers_import_downward(package: str) -> None:
    """No module of a package imports a project package above it, or a library it must not
    (torch into the gateway, Redis into the contract)."""
    above = set(LAYERS) - LAYERS[package] - {package}
    for path in files(package):
        bad = imported_tops(path) & (above | FORBIDDEN[package])
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


@pytest.mark.parametrize("target", sorted(PURE))
def test_cores_are_io_free(target: str) -> None:
    """The sans-I/O cores import no event loop, Redis, web framework or clock."""
    for path in files(target):
        bad = imported_tops(path) & PURE[target]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_only_store_talks_to_redis() -> None:
    """Only store/ imports redis (the tests and entry points excepted)."""
    for package in ("gateway", "inference_worker"):
        for path in files(package):
            assert "redis" not in imported_tops(path), path.relative_to(ROOT)


#: Cores whose import, with everything it pulls in, must load no event loop, no Redis client,
#: no web framework and no torch: the contract imports no Redis at all, and the store's errors
#: and answers import without its Redis half (store/__init__.py loads names on first use).
TRANSITIVELY_PURE = (
    "gateway.protocol.connection",
    "gateway.protocol.parse",
    "gateway.protocol.render",
    "inference_worker.conversation.history",
    "inference_worker.conversation.core",
    "inference_worker.audio_formats",
    "inference_worker.conversation.states",
    "inference_worker.turn_detection.vad",
    "inference_worker.turn_detection.silero",
    "contract.messages",
    "contract.follower",
    "contract.reasons",
    "store.answers",
    "store.lua",
)
HEAVY = ("asyncio", "redis", "starlette", "uvicorn", "torch", "websockets")


@pytest.mark.parametrize("module", TRANSITIVELY_PURE)
def test_importing_a_core_loads_no_io(module: str) -> None:
    """In a fresh interpreter, importing the core leaves the I/O libraries unloaded."""
    probe = (f"import json, sys, {module}; "
             f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=ROOT, timeout=60)
    assert json.loads(out.stdout) == [], f"importing {module} loads {out.stdout.strip()}"


def test_the_client_library_loads_nothing_of_the_server() -> None:
    """In a fresh interpreter, ``import duplex_client`` leaves the server's packages and its
    web framework and Redis client unloaded."""
    server = ["gateway", "store", "inference_worker", "duplex_gateway", "starlette", "uvicorn",
              "redis"]
    probe = (f"import json, sys, duplex_client; "
             f"print(json.dumps([m for m in {server!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=ROOT, timeout=60)
    assert json.loads(out.stdout) == [], f"importing duplex_client loads {out.stdout.strip()}"
