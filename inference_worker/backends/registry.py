"""Backend selection by name: each backend module is imported only when it is chosen.

``loopback`` is not here: it has no frames and is served by the ``SessionRunner`` path of the
worker. Every other backend is a frame backend, stepped by the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from inference_worker.backend import Backend

__all__ = [
    "BACKENDS",
    "FRAME_BACKENDS",
    "BackendRequest",
    "create_backend",
    "explicit_turns",
    "parse_options",
]

#: Backends stepped frame by frame by the engine.
FRAME_BACKENDS: Final = ("fake", "moshi", "cascade")
#: Every backend name the worker accepts.
BACKENDS: Final = ("loopback", *FRAME_BACKENDS)


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendRequest:
    """What to build: the backend's name, its capacity and where its weights are."""

    name: str
    slots: int
    model_path: str = ""
    device: str = "cpu"
    dtype: str = "float32"
    options: Mapping[str, str] = field(default_factory=dict)


def parse_options(text: str) -> dict[str, str]:
    """Parse ``key=value,key=value`` (the ``BACKEND_OPTIONS`` setting).

    Raises:
        ValueError: an entry without ``=`` or with an empty key.
    """
    options: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"backend option {entry!r} is not key=value")
        options[key.strip()] = value.strip()
    return options


def explicit_turns(name: str) -> bool:
    """Whether the backend signals turns in its events (the cascade) rather than by audio."""
    return name == "cascade"


def create_backend(request: BackendRequest) -> Backend:
    """Build (and load) the frame backend ``request.name`` names.

    This may take long (model weights): call it off the event loop.

    Raises:
        ValueError: an unknown backend or option.
        ImportError: the backend's libraries are not installed (torch for ``moshi``, the
            ``cascade`` extra for ``cascade``).
    """
    if request.name == "fake":
        from inference_worker.backends.fake import FakeBackend, FakeOptions

        return FakeBackend(max_slots=request.slots,
                           options=FakeOptions.parse(request.options))
    if request.name == "moshi":
        return _moshi(request)
    if request.name == "cascade":
        return _cascade(request)
    raise ValueError(f"unknown frame backend {request.name!r}; available: {FRAME_BACKENDS}")


def _moshi(request: BackendRequest) -> Backend:
    from inference_worker.backends.moshi import MoshiBackend

    if request.options:
        raise ValueError(f"the moshi backend takes no options, got {sorted(request.options)}")
    if not request.model_path:
        raise ValueError("the moshi backend needs a model path (DUPLEX_GATEWAY_MODEL_PATH): a"
                         " save_pretrained directory, e.g. from scripts/make_tiny_moshi.py")
    backend: Backend = MoshiBackend.load(request.model_path, max_slots=request.slots,
                                         device=request.device, dtype=request.dtype)
    return backend


_CASCADE_PATHS: Final = ("vad_path", "asr_path", "voice_path", "responder_path")


def _cascade(request: BackendRequest) -> Backend:
    from inference_worker.backends.cascade import CascadeBackend, CascadeConfig

    unknown = set(request.options) - {*_CASCADE_PATHS, "responder"}
    if unknown:
        raise ValueError(f"unknown cascade options {sorted(unknown)}")
    paths = {key: request.options.get(key) for key in _CASCADE_PATHS}
    if request.model_path and paths["responder_path"] is None:
        paths["responder_path"] = request.model_path  # a transformers causal LM directory
    responder = request.options.get(
        "responder", "causal_lm" if paths["responder_path"] else "echo")
    return CascadeBackend.load(**paths, responder=responder,
                               config=CascadeConfig(max_slots=request.slots))
