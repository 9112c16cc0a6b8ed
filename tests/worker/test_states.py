"""The transitions table of the worker's three session machines."""

from __future__ import annotations

import pytest

from inference_worker.backends.registry import loopback_core
from inference_worker.conversation.states import (
    MACHINES,
    TRANSITIONS,
    GateState,
    IllegalTransition,
    InputState,
    ResponseState,
    State,
    Trigger,
    mermaid,
    move,
    transition,
)

Machine = type[InputState] | type[ResponseState] | type[GateState]


def test_every_entry_stays_inside_its_machine() -> None:
    """A transition never moves one machine into the other machine's states."""
    for (state, _trigger), target in TRANSITIONS.items():
        assert type(target) is type(state)


@pytest.mark.parametrize("machine", MACHINES)
def test_closed_is_terminal(machine: Machine) -> None:
    """CLOSED has no way out, so nothing happens after session.close."""
    closed: State = machine("closed")
    assert all(transition(closed, trigger) is None for trigger in Trigger)


@pytest.mark.parametrize("machine", MACHINES)
def test_every_open_state_can_close(machine: Machine) -> None:
    """session.close is legal in every state that is not already closed."""
    state: State
    for state in machine:
        if state.value != "closed":
            assert transition(state, Trigger.CLOSE) == machine("closed")


@pytest.mark.parametrize("initial", [InputState.EMPTY, ResponseState.IDLE, GateState.LIVE])
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


#: Moves the table refuses: a second response, a cancel or end while idle, an empty commit.
ILLEGAL: list[tuple[State, Trigger]] = [
    (ResponseState.IDLE, Trigger.CANCEL),
    (ResponseState.IDLE, Trigger.FINISH),
    (ResponseState.OPEN, Trigger.CREATE),
    (ResponseState.SPEAKING, Trigger.CREATE),
    (ResponseState.SPEAKING, Trigger.APPEND),
    (InputState.EMPTY, Trigger.COMMIT),
    (GateState.LIVE, Trigger.AUDIBLE),
]


@pytest.mark.parametrize(("state", "trigger"), ILLEGAL)
def test_illegal_moves_are_lookup_misses(
    state: InputState | ResponseState | GateState, trigger: Trigger
) -> None:
    """Refused moves (second response, cancel while idle, empty commit) are not in the table."""
    assert transition(state, trigger) is None


def test_legal_moves() -> None:
    """The main paths of a turn are in the table."""
    assert transition(InputState.EMPTY, Trigger.APPEND) is InputState.BUFFERED
    assert transition(InputState.BUFFERED, Trigger.COMMIT) is InputState.EMPTY
    assert transition(ResponseState.IDLE, Trigger.CREATE) is ResponseState.OPEN
    assert transition(ResponseState.OPEN, Trigger.AUDIBLE) is ResponseState.SPEAKING
    assert transition(ResponseState.SPEAKING, Trigger.FINISH) is ResponseState.IDLE
    assert transition(ResponseState.SPEAKING, Trigger.CANCEL) is ResponseState.IDLE
    assert transition(GateState.LIVE, Trigger.CANCEL) is GateState.MUTED
    assert transition(GateState.MUTED, Trigger.TURN_OVER) is GateState.LIVE


@pytest.mark.parametrize(("state", "trigger"), ILLEGAL)
def test_an_illegal_move_raises(state: State, trigger: Trigger) -> None:
    """``move`` raises for a move the table does not have, naming the state and trigger."""
    with pytest.raises(IllegalTransition) as raised:
        move(state, trigger)
    assert (raised.value.state, raised.value.trigger) == (state, trigger)
    assert trigger.value in str(raised.value) and state.value in str(raised.value)


def test_a_legal_move_is_the_tables() -> None:
    """``move`` answers what the table says, for every entry."""
    for (state, trigger), target in TRANSITIONS.items():
        assert move(state, trigger) is target


def test_an_illegal_move_in_the_core_raises_and_leaves_the_state() -> None:
    """The core's moves go through the table: an illegal one raises instead of being
    skipped, and the machine keeps its state."""
    core = loopback_core("sess_states")
    responses = core._responses
    with pytest.raises(IllegalTransition):
        responses._move(Trigger.AUDIBLE)  # no response is open
    with pytest.raises(IllegalTransition):
        core._input.commit()  # nothing is buffered
    with pytest.raises(IllegalTransition):
        responses.move_gate(Trigger.AUDIBLE)  # the gate has no such trigger
    assert (responses.state, core._input.state, responses.gate) == (
        ResponseState.IDLE, InputState.EMPTY, GateState.LIVE)
    assert core.active_response is None


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
    assert "    idle --> open: create" in lines
    assert "buffered" not in diagram


def test_machines_start_in_their_first_state() -> None:
    """MACHINES lists each machine with its initial state first, as the core starts them."""
    assert [next(iter(machine)) for machine in MACHINES] == [
        InputState.EMPTY, ResponseState.IDLE, GateState.LIVE]
