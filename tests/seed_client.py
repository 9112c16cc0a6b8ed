"""The seed's released client, ``vllm_omni.clients`` of vLLM-Omni 0.30.0, loaded from its wheel.

The acceptance tests (``tests/e2e/test_seed_client*.py``) run the client a vLLM-Omni user
already has, unmodified, against the gateway. Nothing of the wheel is kept in this repository:

* **Fetched at test time.** ``pip download --no-deps vllm-omni==0.30.0`` from the package
  index pip is configured with, pinned by version and by the wheel's sha256 (pip checks the
  hash with ``--require-hashes``, and so does :func:`wheel`), into ``.deps/seed-client/``
  (ignored by git). A wheel already there with the right hash is used as it is: CI fetches
  it once before the suite (``scripts/test`` runs ``python -m tests.seed_client``), and a
  developer's first test run fetches it through the same function.
* **Loaded without the package's ``__init__``.** ``vllm_omni/__init__.py`` imports vllm (a GPU
  serving stack); the client modules import only the standard library and ``pybase64``, and
  each other by their full names (``from vllm_omni.clients.duplex import SessionConfig``). So
  :func:`load` puts bare module objects for the packages ``vllm_omni``, ``vllm_omni.clients``,
  ``vllm_omni.protocol``, ``vllm_omni.protocol.realtime`` and ``vllm_omni.protocol.duplex`` in
  ``sys.modules`` (none of their ``__init__`` runs), then executes each module's source, read
  from the wheel (a zip), under its real name with ``importlib`` (a spec from
  :class:`_ZipSource`, then ``exec_module``): ``clients/utils.py``, ``clients/duplex.py``,
  the three presets, and the seed's error-code vocabulary (``protocol/realtime/errors.py`` and
  ``protocol/duplex/errors.py``, also standard library only).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Final

__all__ = ["PRESETS", "REQUIREMENT", "SHA256", "WHEEL_NAME", "SeedClient", "load", "wheel"]

ROOT: Final = Path(__file__).resolve().parents[1]
#: The released package and the hash of its one wheel (``py3-none-any``).
REQUIREMENT: Final = "vllm-omni==0.30.0"
SHA256: Final = "141cb0c7b9c07970e5c92a99aab9696e81682dbfa3d2bfcde359c3c1533385f4"
WHEEL_NAME: Final = "vllm_omni-0.30.0-py3-none-any.whl"
CACHE: Final = ROOT / ".deps" / "seed-client"

#: The released presets: module name under ``vllm_omni.clients``.
PRESETS: Final = ("minicpmo_4_5", "personaplex", "nemotron_voicechat")
# Packages whose __init__ must not run (vllm_omni's imports vllm): bare modules stand in.
_PACKAGES: Final = (
    "vllm_omni", "vllm_omni.clients", "vllm_omni.protocol", "vllm_omni.protocol.realtime",
    "vllm_omni.protocol.duplex",
)
# In dependency order: each imports only the standard library, pybase64 and the ones before.
_MODULES: Final = (
    "vllm_omni.clients.utils", "vllm_omni.clients.duplex",
    *(f"vllm_omni.clients.{preset}" for preset in PRESETS),
    "vllm_omni.protocol.realtime.errors", "vllm_omni.protocol.duplex.errors",
)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wheel(cache_dir: Path = CACHE) -> Path:
    """The wheel in ``cache_dir``, downloaded with pip first unless it is there with the pinned
    hash.

    Raises:
        AssertionError: the downloaded file's hash is not the pinned one.
        subprocess.CalledProcessError: pip could not download it.
    """
    cached = cache_dir / WHEEL_NAME
    if cached.is_file() and _digest(cached) == SHA256:
        return cached
    with tempfile.TemporaryDirectory() as tmp:
        pinned = Path(tmp) / "requirements.txt"
        pinned.write_text(f"{REQUIREMENT} --hash=sha256:{SHA256}\n")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--require-hashes", "--dest", tmp, "-r", str(pinned)],
            check=True)
        downloaded = Path(tmp) / WHEEL_NAME
        assert _digest(downloaded) == SHA256, f"{REQUIREMENT}: not the pinned wheel"
        cache_dir.mkdir(parents=True, exist_ok=True)
        # Into place in one step: a concurrent run sees the old file or the whole new one.
        partial = cache_dir / f".{WHEEL_NAME}.partial"
        shutil.copyfile(downloaded, partial)
        partial.replace(cached)
    return cached


class _ZipSource(importlib.abc.SourceLoader):
    """Source of one module read from the wheel (a zip), without extracting it."""

    def __init__(self, archive: Path, member: str) -> None:
        self._archive = archive
        self._member = member

    def get_filename(self, fullname: str) -> str:
        return f"{self._archive}/{self._member}"

    def get_data(self, path: str) -> bytes:
        with zipfile.ZipFile(self._archive) as archive:
            return archive.read(self._member)


@dataclass(frozen=True, slots=True)
class SeedClient:
    """The seed's client modules, as loaded from the wheel.

    Attributes:
        duplex: ``vllm_omni.clients.duplex`` (``DuplexClient``, ``SessionConfig``,
            ``EventCollector``, ``ReconnectPolicy``, ``audio_data_url``, ...).
        presets: each of :data:`PRESETS` to its module (``create_duplex_session_config``).
        error_types: every error code the seed's server sends (its vocabulary), with its
            ``error.type`` (``REALTIME_ERROR_TYPES_BY_CODE``).
        wheel: the wheel it was loaded from.
    """

    duplex: Any
    presets: Mapping[str, Any]
    error_types: Mapping[str, str]
    wheel: Path


@cache
def load() -> SeedClient:
    """The seed's client, loaded once per process (see the module's docstring for how)."""
    archive = wheel()
    for name in _PACKAGES:
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = []  # a package: its submodules are registered below
            sys.modules[name] = package
    modules: dict[str, types.ModuleType] = {}
    for name in _MODULES:
        module = sys.modules.get(name)
        if module is None:
            loader = _ZipSource(archive, name.replace(".", "/") + ".py")
            spec = importlib.util.spec_from_loader(name, loader)
            assert spec is not None
            module = importlib.util.module_from_spec(spec)
            # Registered before it runs, as an import would: dataclasses look it up there.
            sys.modules[name] = module
            loader.exec_module(module)
            parent, _, leaf = name.rpartition(".")
            setattr(sys.modules[parent], leaf, module)
        modules[name] = module
    codes = modules["vllm_omni.protocol.duplex.errors"].REALTIME_ERROR_TYPES_BY_CODE
    return SeedClient(
        duplex=modules["vllm_omni.clients.duplex"],
        presets={preset: modules[f"vllm_omni.clients.{preset}"] for preset in PRESETS},
        error_types=dict(codes),
        wheel=archive,
    )


if __name__ == "__main__":
    # CI fetches the wheel once, before the suite (.ci/run); the tests then find it cached.
    print(wheel())
