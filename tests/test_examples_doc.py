"""The programs in ``examples/`` and the Markdown that shows them agree, and each is run.

A fenced block right after a line ``<!-- example: examples/NAME.py -->`` in README.md or any
page under docs/ is that file's text, exactly; the README shows the SDK turn and the Python
client that way. Every file in examples/ is run by ``tests/e2e/test_examples.py`` (a
``run_example("NAME.py", ...)`` call there) and says in its docstring how to run it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
RUNNER = ROOT / "tests" / "e2e" / "test_examples.py"
MARKER = re.compile(r"<!-- example: (examples/[\w.-]+) -->")
#: What the README must show in full.
README_EXAMPLES = ("examples/sdk_turn.py", "examples/resume_client.py")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def shown_examples(page: Path) -> list[tuple[str, str | None]]:
    """Each marker of ``page``: the example it names and the fenced block on the next line
    (None when no block opens there)."""
    lines = page.read_text().splitlines()
    shown: list[tuple[str, str | None]] = []
    for index, line in enumerate(lines):
        marker = MARKER.fullmatch(line.strip())
        if marker is None:
            continue
        block = None
        if index + 1 < len(lines) and lines[index + 1].startswith("```"):
            body = lines[index + 2:]
            end = next((at for at, text in enumerate(body) if text.startswith("```")), None)
            if end is not None:
                block = "".join(f"{text}\n" for text in body[:end])
        shown.append((marker[1], block))
    return shown


def example_files() -> list[Path]:
    return sorted(path for path in EXAMPLES.iterdir() if path.is_file())


def run_by_the_e2e_test() -> set[str]:
    """The first argument of every ``run_example(...)`` call in the e2e test."""
    calls = [node for node in ast.walk(ast.parse(RUNNER.read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
             and node.func.id == "run_example"]
    return {call.args[0].value for call in calls
            if call.args and isinstance(call.args[0], ast.Constant)
            and isinstance(call.args[0].value, str)}


def test_every_shown_example_is_the_file_itself() -> None:
    checked = 0
    for page in markdown_files():
        for name, block in shown_examples(page):
            where = f"{page.relative_to(ROOT)}: {name}"
            assert block is not None, f"{where}: no fenced block right after the marker"
            assert (ROOT / name).is_file(), f"{where}: no such file"
            assert block == (ROOT / name).read_text(), f"{where}: the block differs from the file"
            checked += 1
    assert checked >= len(README_EXAMPLES)


def test_the_readme_shows_the_sdk_turn_and_the_client() -> None:
    shown = {name for name, _ in shown_examples(ROOT / "README.md")}
    assert set(README_EXAMPLES) <= shown, f"missing from the README: {set(README_EXAMPLES) - shown}"


def test_every_example_is_run_by_the_e2e_test() -> None:
    files = {path.name for path in example_files()}
    assert files, "examples/ is empty"
    assert files == run_by_the_e2e_test(), (
        f"not run by {RUNNER.relative_to(ROOT)}: {files - run_by_the_e2e_test()}; run there but"
        f" missing: {run_by_the_e2e_test() - files}")


def test_every_example_says_how_to_run_it() -> None:
    for path in example_files():
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        for needed in ("./scripts/dev", f"examples/{path.name}", "DUPLEX_GATEWAY_URL",
                       "ws://127.0.0.1:8000/v1"):
            assert needed in docstring, f"{path.name}'s docstring does not name {needed}"
