"""Layers only import downward: gateway and inference_worker use store; store knows neither."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package -> top-level modules it must never import
FORBIDDEN = {
    "store": {"gateway", "inference_worker", "duplex_gateway", "starlette", "uvicorn", "torch"},
    "gateway": {"inference_worker", "duplex_gateway", "torch", "transformers"},
    "inference_worker": {"gateway", "duplex_gateway", "starlette", "uvicorn"},
    # The client library stands alone: usable without the server installed.
    "duplex_client": {"gateway", "store", "inference_worker", "duplex_gateway", "starlette",
                      "uvicorn", "redis"},
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
    "inference_worker/untrusted.py": _NO_THREADS,
    "store/follower.py": {"asyncio", "redis", "time"},
    "store/reasons.py": {"asyncio", "redis", "time"},
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


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layers_import_downward(package: str) -> None:
    """No module of a package imports a layer above it (or torch into the gateway)."""
    for path in files(package):
        bad = imported_tops(path) & FORBIDDEN[package]
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
#: no web framework and no torch: the store's contract (messages, follower, errors) imports
#: without its Redis half (store/__init__.py loads names on first use).
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
    "store.messages",
    "store.follower",
    "store.reasons",
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
