"""Counting the calls a step makes into some packages: the hot-path budget tests' one counter
(``tests/gateway/test_hot_path_budget.py``, ``tests/worker/test_hot_path_budget.py``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType, ModuleType


def calls_into(packages: tuple[ModuleType, ...], step: Callable[[], None]) -> int:
    """How many calls of functions defined in ``packages`` ``step`` makes. Only theirs: the
    standard library's and the dependencies' calls move with their versions."""
    # Where the counted code lives, wherever it is installed (as its frames name their files).
    roots = tuple(str(Path(str(package.__file__)).parent) + "/" for package in packages)
    calls = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call" and frame.f_code.co_filename.startswith(roots):
            calls += 1

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return calls
