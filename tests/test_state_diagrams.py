"""docs/design/state-machines.md holds the diagrams its machines' tables generate."""

from __future__ import annotations

from pathlib import Path

from gateway.protocol.transitions import mermaid as gateway_mermaid
from inference_worker.conversation.states import MACHINES, mermaid

PAGE = Path(__file__).resolve().parent.parent / "docs" / "design" / "state-machines.md"


def _block(diagram: str) -> str:
    return f"```mermaid\n{diagram}\n```"


def test_each_worker_machine_diagram_is_the_one_its_table_generates() -> None:
    page = PAGE.read_text()
    stale = [machine for machine in MACHINES if _block(mermaid(machine)) not in page]
    regenerated = "\n\n".join(_block(mermaid(machine)) for machine in stale)
    assert [machine.__name__ for machine in stale] == [], (
        f"regenerate these diagrams in {PAGE.name}:\n{regenerated}")


def test_the_worker_section_holds_no_diagram_its_table_does_not_generate() -> None:
    page = PAGE.read_text()
    start = page.index("## Worker session")
    end = page.index("\n## ", start + 1)
    assert page[start:end].count("```mermaid") == len(MACHINES)


def test_the_gateway_connection_diagram_is_the_one_its_table_generates() -> None:
    page = PAGE.read_text()
    start = page.index("## Gateway connection")
    end = page.find("\n## ", start + 1)
    section = page[start:] if end == -1 else page[start:end]
    assert section.count("```mermaid") == 1
    assert _block(gateway_mermaid()) in section, (
        f"regenerate the gateway diagram in {PAGE.name}:\n{_block(gateway_mermaid())}")
