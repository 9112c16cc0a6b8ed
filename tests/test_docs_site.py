"""The docs site builds strictly: a broken link, a missing anchor, a page in no toctree or a
missing include fails the build, and so fails the suite."""

from __future__ import annotations

import re
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


# A Markdown link or image: [text](target) / ![alt](target).
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _local_targets(page: Path) -> list[str]:
    return [t for t in _LINK.findall(page.read_text())
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


@pytest.mark.parametrize("name", ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"])
def test_the_root_pages_link_only_to_files_that_exist(name: str) -> None:
    """Sphinx does not read the root pages: their links into docs/ are checked here."""
    page = ROOT / name
    missing = [t for t in _local_targets(page)
               if not (page.parent / t.split("#", 1)[0]).exists()]
    assert missing == [], f"{name} links to files that do not exist"
    if name == "README.md":
        assert any(t.startswith("docs/") for t in _local_targets(page))
