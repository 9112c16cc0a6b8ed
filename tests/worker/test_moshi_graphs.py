"""The moshi backend's CUDA-graphs option on a CPU: refused there (no CUDA), before any weight
loads, whichever way it is asked for (the backend, the registry, the worker's setting or flag);
the same compile plumbing without graphs (dynamo's eager backend) leaves the tokens as they were.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference_worker.backends.moshi import MoshiBackend
from inference_worker.backends.registry import BackendRequest, create_backend
from tests.worker.moshi_fixtures import Session, load, run_alone, write_tiny

REFUSED = "CUDA graphs need a CUDA device, and the model is on cpu"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("tiny_moshi"))


def test_the_backend_refuses_cuda_graphs_on_a_cpu_before_loading(tmp_path: Path) -> None:
    """The refusal comes before the weights: a directory without any still gets it."""
    with pytest.raises(ValueError, match=REFUSED):
        MoshiBackend.load(tmp_path / "no-model-here", device="cpu", cuda_graphs=True)


def test_the_registry_passes_the_option_to_the_backend(tiny_dir: Path) -> None:
    """A request with cuda_graphs reaches the moshi backend, which refuses it on a CPU; the
    same request without it loads."""
    request = BackendRequest(name="moshi", slots=1, model_path=str(tiny_dir))
    with pytest.raises(ValueError, match=REFUSED):
        create_backend(BackendRequest(name="moshi", slots=1, model_path=str(tiny_dir),
                                      cuda_graphs=True))
    assert isinstance(create_backend(request), MoshiBackend)


def test_compiling_graphs_on_a_cpu_is_refused_and_changes_nothing(tiny_dir: Path) -> None:
    """A built backend asked for CUDA graphs on a CPU raises, and keeps its own modules."""
    backend = load(tiny_dir, max_slots=1)
    decoder, depth = backend.model.decoder, backend.model.depth_decoder
    with pytest.raises(ValueError, match=REFUSED):
        backend.compile_graphs()
    assert backend.model.decoder is decoder and backend.model.depth_decoder is depth


@pytest.mark.timeout(240)
# torch.compile's own imports use APIs torch itself deprecates; not this project's code.
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_the_compiled_transformers_step_as_the_plain_ones(tiny_dir: Path) -> None:
    """The compile plumbing (cloned outputs, a new step per tick), with dynamo's eager backend
    on the CPU: a greedy session gives the same tokens as without it."""
    torch.manual_seed(0)
    plain = run_alone(load(tiny_dir, max_slots=1), Session(3, 6))
    compiled_backend = load(tiny_dir, max_slots=1)
    decoder = compiled_backend.model.decoder
    compiled_backend.compile_graphs("eager")
    assert compiled_backend.model.decoder is not decoder
    compiled = run_alone(compiled_backend, Session(3, 6))
    assert any(tokens is not None for tokens in plain.tokens)
    assert compiled.tokens == plain.tokens


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["variable", "flag"])
def test_the_worker_setting_reaches_the_backend(tiny_dir: Path, how: str) -> None:
    """``duplex-gateway worker --backend moshi`` with DUPLEX_GATEWAY_MOSHI_CUDA_GRAPHS=true, or
    with --moshi-cuda-graphs, on a CPU: the backend's refusal stops the start, exit status 2,
    before Redis is needed (none listens at the URL)."""
    env = {**os.environ, "DUPLEX_GATEWAY_DEVICE": "cpu"}
    flags = ["--moshi-cuda-graphs"] if how == "flag" else []
    if how == "variable":
        env["DUPLEX_GATEWAY_MOSHI_CUDA_GRAPHS"] = "true"
    done = subprocess.run(
        [sys.executable, "-m", "duplex_gateway", "worker", "--backend", "moshi",
         "--model-path", str(tiny_dir), "--redis-url", "redis://127.0.0.1:1/0", *flags],
        capture_output=True, text=True, env=env, timeout=110, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert REFUSED in done.stderr
