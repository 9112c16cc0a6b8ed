"""docs/reference/cli.md documents every ``duplex-gateway`` subcommand the parser has."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from duplex_gateway.cli import _parser

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "cli.md"
_HEADING = re.compile(r"^#{2,4} `([^`]+)`$", re.MULTILINE)


def _commands(parser: argparse.ArgumentParser, prefix: str) -> list[str]:
    """Every runnable command under ``prefix``, subcommands of subcommands included."""
    found: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _commands(sub, f"{prefix} {name}")
                found += nested or [f"{prefix} {name}"]
    return found


def test_the_parser_has_the_commands_this_test_expects_to_walk() -> None:
    commands = _commands(_parser(), "duplex-gateway")
    assert {"duplex-gateway serve", "duplex-gateway bench relay"} <= set(commands)


def test_every_subcommand_has_a_section_and_every_section_a_subcommand() -> None:
    headings = {h for h in _HEADING.findall(PAGE.read_text()) if h.startswith("duplex-gateway")}
    commands = set(_commands(_parser(), "duplex-gateway"))
    assert sorted(commands - headings) == [], "subcommands without a section in cli.md"
    assert sorted(headings - commands) == [], "sections of cli.md naming no subcommand"
