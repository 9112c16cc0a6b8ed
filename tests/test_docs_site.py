"""The docs site builds strictly: a broken link, a missing anchor, a page in no toctree or a
missing include fails the build, and so fails the suite."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The files outside docs/ that its pages include.
INCLUDED = ("CHANGELOG.md", "CONTRIBUTING.md", "LICENSE")
BUILD_TIMEOUT_S = 240

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + 30)


def build(source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """Build ``source`` as HTML into ``out``, warnings as errors, every reference checked."""
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-E",
               "-b", "html", "-d", str(out / ".doctrees"), str(source), str(out)]
    return subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                          check=False)


def test_the_docs_site_builds_without_a_warning(tmp_path: Path) -> None:
    result = build(ROOT / "docs", tmp_path / "html")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "html" / "index.html").is_file()


def test_a_broken_link_an_unknown_anchor_and_an_orphan_page_each_fail_the_build(
        tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs", ignore=shutil.ignore_patterns("_build"))
    for name in INCLUDED:
        shutil.copy(ROOT / name, copy / name)
    page = copy / "docs" / "guides" / "backends.md"
    page.write_text(page.read_text() + "\nSee [a page](../reference/no-such-page.md) and"
                    " [an anchor](../reference/cli.md#no-such-heading).\n")
    (copy / "docs" / "orphan.md").write_text("# A page no toctree lists\n")
    result = build(copy / "docs", tmp_path / "html")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "no-such-page.md" in output
    assert "no-such-heading" in output
    assert "orphan.md" in output and "toctree" in output
