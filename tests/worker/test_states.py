"""The transitions table of the worker's two session machines."""

from __future__ import annotations

import pytest

from inference_worker.states import (
    TRANSITIONS,
    InputState,
    ResponseState,
    State,
    Trigger,
    mermaid,
    transition,
)

MACHINES = (InputState, ResponseState)


def test_every_entry_stays_inside_its_machine() -> None:
    """A transition never moves one machine into the other machine's states."""
    for (state, _trigger), target in TRANSITIONS.items():
        assert type(target) is type(state)


@pytest.mark.parametrize("machine", MACHINES)
def test_closed_is_terminal(machine: type[InputState] | type[ResponseState]) -> None:
    """CLOSED has no way out, so nothing happens after session.close."""
    closed: State = machine("closed")
    assert all(transition(closed, trigger) is None for trigger in Trigger)


@pytest.mark.parametrize("machine", MACHINES)
def test_every_open_state_can_close(machine: type[InputState] | type[ResponseState]) -> None:
    """session.close is legal in every state that is not already closed."""
    state: State
    for state in machine:
        if state.value != "closed":
            assert transition(state, Trigger.CLOSE) == machine("closed")


@pytest.mark.parametrize("initial", [InputState.EMPTY, ResponseState.IDLE])
def test_every_state_is_reachable(initial: State) -> None:
    """Every state of a machine is reachable from its initial state through the table."""
    seen: set[State] = {initial}
    frontier = [initial]
    while frontier:
        state = frontier.pop()
        for trigger in Trigger:
            target = transition(state, trigger)
            if target is not None and target not in seen:
                seen.add(target)
                frontier.append(target)
    assert seen == set(type(initial))


@pytest.mark.parametrize(
    ("state", "trigger"),
    [
        (ResponseState.IDLE, Trigger.CANCEL),
        (ResponseState.IDLE, Trigger.FINISH),
        (ResponseState.PLAYING, Trigger.CREATE),
        (ResponseState.STREAMING, Trigger.CREATE),
        (ResponseState.PLAYING, Trigger.STREAM),
        (InputState.EMPTY, Trigger.COMMIT),
    ],
)
def test_illegal_moves_are_lookup_misses(
    state: InputState | ResponseState, trigger: Trigger
) -> None:
    """Refused moves (second response, cancel while idle, empty commit) are not in the table."""
    assert transition(state, trigger) is None


def test_legal_moves() -> None:
    """The main paths of a turn are in the table."""
    assert transition(InputState.EMPTY, Trigger.APPEND) is InputState.BUFFERED
    assert transition(InputState.BUFFERED, Trigger.COMMIT) is InputState.EMPTY
    assert transition(ResponseState.IDLE, Trigger.CREATE) is ResponseState.PLAYING
    assert transition(ResponseState.PLAYING, Trigger.FINISH) is ResponseState.IDLE
    assert transition(ResponseState.STREAMING, Trigger.CANCEL) is ResponseState.IDLE


def test_table_is_read_only() -> None:
    """The table cannot be changed at run time."""
    with pytest.raises(TypeError):
        TRANSITIONS[(InputState.EMPTY, Trigger.COMMIT)] = InputState.EMPTY  # type: ignore[index]


def test_mermaid_lists_each_edge_of_one_machine() -> None:
    """The diagram has one line per table entry of the machine and none of the other."""
    diagram = mermaid(ResponseState)
    lines = diagram.splitlines()
    assert lines[0] == "stateDiagram-v2"
    edges = [key for key in TRANSITIONS if isinstance(key[0], ResponseState)]
    assert len(lines) == 1 + len(edges)
    assert "    idle --> playing: create" in lines
    assert "buffered" not in diagram
