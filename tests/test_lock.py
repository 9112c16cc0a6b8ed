"""constraints.txt, the lock the README's commands install from, against pyproject.toml and
the install scripts: every requirement pinned to a version it accepts, nothing but exact pins,
and every pip install of the scripts constrained by it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.!+-]*)$")


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        match = _PIN.match(line)
        assert match is not None, f"constraints.txt: not an exact pin: {line!r}"
        name = canonicalize_name(match.group(1))
        assert name not in pins, f"constraints.txt pins {name} twice"
        pins[name] = Version(match.group(2))
    return pins


def _requirements() -> list[Requirement]:
    """Every requirement of the base install and of every extra, as pyproject lists them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        listed += extra
    return [Requirement(text) for text in listed]


def test_every_requirement_is_pinned_to_a_version_it_accepts() -> None:
    pins = _pins()
    for requirement in _requirements():
        name = canonicalize_name(requirement.name)
        if name == "duplex-gateway":  # an extra naming the others
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # not for this Python (audioop-lts on 3.13+)
        assert name in pins, f"{requirement} is not pinned in constraints.txt (scripts/lock)"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject's {requirement}")


def test_the_installers_themselves_are_pinned() -> None:
    pins = _pins()
    assert {"pip", "setuptools", "torch"} <= set(pins)
    # The build backend pyproject asks for is the pinned one (no isolated build environment).
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for text in build:
        requirement = Requirement(text)
        assert requirement.specifier.contains(pins[canonicalize_name(requirement.name)])


def test_every_install_of_the_readme_commands_goes_through_the_lock() -> None:
    for script in ("scripts/test", "scripts/dev"):
        installs = [line for line in _logical_lines(ROOT / script) if "pip install" in line]
        assert installs, f"{script} installs nothing"
        for line in installs:
            assert "-c constraints.txt" in line, f"{script}: unconstrained install: {line}"
            if "-e " in line:
                assert "--no-build-isolation" in line, (
                    f"{script}: the project would build with an unpinned setuptools: {line}")


def _logical_lines(path: Path) -> list[str]:
    """A shell script's lines, continuation lines joined."""
    return path.read_text().replace("\\\n", " ").splitlines()
