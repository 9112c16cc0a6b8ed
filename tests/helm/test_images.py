"""The Dockerfiles and the chart agree, as far as can be told without building the images.

The chart's containers call the images' entrypoint (the ``duplex-gateway`` CLI, with
subcommands it has), as the images' non-root user; the gateway image installs no torch; the
worker image installs CUDA torch before the model extras.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helm.render import ROOT, render

DOCKERFILES = {"gateway": ROOT / "deploy" / "Dockerfile.gateway",
               "worker": ROOT / "deploy" / "Dockerfile.worker"}


@dataclass(frozen=True, slots=True)
class Instruction:
    """One Dockerfile instruction, continuation lines joined."""

    keyword: str
    arguments: str


def instructions(path: Path) -> list[Instruction]:
    text = re.sub(r"\\\n", " ", path.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, arguments = line.partition(" ")
            found.append(Instruction(keyword.upper(), arguments.strip()))
    return found


def final_stage(path: Path) -> list[Instruction]:
    """The instructions of the image that is shipped: after the last FROM."""
    steps = instructions(path)
    last_from = max(i for i, step in enumerate(steps) if step.keyword == "FROM")
    return steps[last_from:]


def image_user(path: Path) -> tuple[int, int]:
    """The final stage's last USER as (uid, gid); it must be numeric (Kubernetes checks
    runAsNonRoot only on a numeric user)."""
    users = [step.arguments for step in final_stage(path) if step.keyword == "USER"]
    assert users, f"{path.name} ends without a USER"
    match = re.fullmatch(r"(\d+):(\d+)", users[-1])
    assert match, f"{path.name}: USER {users[-1]} is not numeric uid:gid"
    return int(match.group(1)), int(match.group(2))


def entrypoint(path: Path) -> list[str]:
    (step,) = [step for step in final_stage(path) if step.keyword == "ENTRYPOINT"]
    command: list[str] = json.loads(step.arguments)
    return command


def pip_installs(path: Path) -> list[str]:
    return [step.arguments for step in instructions(path)
            if step.keyword == "RUN" and "pip install" in step.arguments]


@pytest.mark.parametrize("component", sorted(DOCKERFILES))
def test_the_chart_runs_the_images_entrypoint(component: str) -> None:
    """The container's command is the image's ENTRYPOINT, the project's console script."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint(DOCKERFILES[component]) == ["duplex-gateway"]
    assert scripts["duplex-gateway"] == "duplex_gateway.cli:main"
    assert render().container(component)["command"] == ["duplex-gateway"]


@pytest.mark.parametrize("component", sorted(DOCKERFILES))
def test_the_charts_subcommand_exists(component: str) -> None:
    """The chart's args name a subcommand the CLI has (asked of the CLI itself)."""
    args = render().container(component)["args"]
    result = subprocess.run([sys.executable, "-m", "duplex_gateway", *args, "--help"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("component", sorted(DOCKERFILES))
def test_both_images_end_as_the_charts_non_root_user(component: str) -> None:
    """Each image's final USER is numeric and not root, and is the chart's runAsUser and
    runAsGroup."""
    uid, gid = image_user(DOCKERFILES[component])
    assert uid > 0 and gid > 0
    pod = render().component("Deployment", component)["spec"]["template"]["spec"]
    context = pod["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"]) == (uid, gid)


def test_the_gateway_image_installs_no_torch() -> None:
    """The gateway image installs the project without extras, and the base dependencies
    name no torch."""
    (install,) = pip_installs(DOCKERFILES["gateway"])
    assert "torch" not in install
    assert re.search(r"pip install [^\n]* \.$", install), install
    base = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [requirement for requirement in base if requirement.startswith("torch")]


def test_the_worker_image_installs_cuda_torch_first() -> None:
    """The worker image installs torch from the PyTorch CUDA index before the moshi and
    cascade extras (which then find it installed)."""
    torch, project = pip_installs(DOCKERFILES["worker"])
    assert '--index-url "${TORCH_INDEX_URL}"' in torch and "torch==" in torch
    (index,) = [step.arguments for step in instructions(DOCKERFILES["worker"])
                if step.keyword == "ARG" and step.arguments.startswith("TORCH_INDEX_URL=")]
    assert re.fullmatch(r"TORCH_INDEX_URL=https://download\.pytorch\.org/whl/cu\d+", index)
    assert project.endswith('".[moshi,cascade]"')


@pytest.mark.parametrize("component", sorted(DOCKERFILES))
def test_the_images_are_multi_stage(component: str) -> None:
    """A build stage and a runtime stage that copies only the built environment from it."""
    steps = instructions(DOCKERFILES[component])
    stages = [step.arguments for step in steps if step.keyword == "FROM"]
    assert len(stages) == 2 and stages[0].endswith(" AS build")
    copies = [step.arguments for step in final_stage(DOCKERFILES[component])
              if step.keyword == "COPY"]
    assert copies == ["--from=build /opt/duplex-gateway /opt/duplex-gateway"]
