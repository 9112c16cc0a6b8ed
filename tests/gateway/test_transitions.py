"""The connection's transition table and the diagram drawn from it."""

from __future__ import annotations

import pytest

from gateway.protocol.transitions import (
    TRANSITIONS,
    ConnectionState,
    Trigger,
    mermaid,
    next_state,
)


def test_the_diagram_draws_every_transition_and_nothing_else() -> None:
    lines = mermaid().splitlines()
    assert lines[0] == "stateDiagram-v2"
    assert lines[1] == f"    [*] --> {ConnectionState.AWAITING_FIRST.value}"
    edges = lines[2:]
    assert edges == [f"    {state.value} --> {target.value}: {trigger.value}"
                     for (state, trigger), target in TRANSITIONS.items()]
    assert len(set(edges)) == len(TRANSITIONS)


def test_every_state_and_trigger_is_in_the_table() -> None:
    assert {state for state, _ in TRANSITIONS} | set(TRANSITIONS.values()) == set(ConnectionState)
    assert {trigger for _, trigger in TRANSITIONS} == set(Trigger)


def test_every_state_is_reached_from_the_handshake() -> None:
    reached, frontier = {ConnectionState.AWAITING_FIRST}, [ConnectionState.AWAITING_FIRST]
    while frontier:
        state = frontier.pop()
        for (source, _), target in TRANSITIONS.items():
            if source is state and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(ConnectionState)


def test_closed_is_left_by_nothing() -> None:
    assert {target for (state, _), target in TRANSITIONS.items()
            if state is ConnectionState.CLOSED} == {ConnectionState.CLOSED}


def test_a_move_the_table_lacks_is_a_bug() -> None:
    assert next_state(ConnectionState.OPENING, Trigger.ATTACHED) is ConnectionState.ATTACHED
    with pytest.raises(AssertionError, match="can't handle terminal_event in state opening"):
        next_state(ConnectionState.OPENING, Trigger.TERMINAL_EVENT)
