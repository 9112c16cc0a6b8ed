"""The three state machines of a worker session, as data (style rule 2, after h11 ``_state.py``).

A session has a user-turn machine (:class:`InputState`, the input audio buffer), a response
machine (:class:`ResponseState`: at most one response, opened, then speaking) and an output
gate (:class:`GateState`: whether the model's output reaches the client), kept separate like
h11's client/server pair. Every legal move of the three is one entry of :data:`TRANSITIONS`;
a move that is not there is illegal: the conversation core checks (:func:`transition`) before
a move the client may ask for out of turn and answers it with an ``error`` event, and
:func:`move` raises :class:`IllegalTransition` for any other, a bug in the core. The docs' diagrams
are generated from the table by :func:`mermaid`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, TypeAlias, overload

__all__ = [
    "MACHINES",
    "TRANSITIONS",
    "GateState",
    "IllegalTransition",
    "InputState",
    "ResponseState",
    "State",
    "Trigger",
    "mermaid",
    "move",
    "transition",
]


class _Symbol(enum.Enum):
    """An enum hashed by identity, as its equality already is (members are singletons).

    :class:`enum.Enum`'s own ``__hash__`` is Python code (it hashes the name); every move of
    the machines hashes a state and a trigger (a :data:`TRANSITIONS` lookup), several times
    per relayed audio chunk, and ``object.__hash__`` does it in C.
    """

    __hash__ = object.__hash__


class InputState(_Symbol):
    """The input audio buffer (``input_audio_buffer.*``)."""

    EMPTY = "empty"
    BUFFERED = "buffered"
    CLOSED = "closed"


class ResponseState(_Symbol):
    """The response machine: at most one response is active at a time (openai_realtime.md §1b)."""

    IDLE = "idle"
    OPEN = "open"  # response.created sent; the model has not made a sound in it yet
    SPEAKING = "speaking"  # the model's audible output is flowing into it
    CLOSED = "closed"


class GateState(_Symbol):
    """Whether the model's output reaches the client.

    A model that cannot be stopped mid-word (a full-duplex model runs on) is muted when its
    response is cancelled, until its turn is over: the client never hears the rest.
    """

    LIVE = "live"
    MUTED = "muted"
    CLOSED = "closed"


class Trigger(_Symbol):
    """What moves a machine: a command, or what the model did."""

    APPEND = "append"  # input_audio_buffer.append
    COMMIT = "commit"  # a committed user turn (at least 100 ms): manual, or turn detection's
    CLEAR = "clear"  # input_audio_buffer.clear, input.cancel
    CREATE = "create"  # a response opens: response.create, an automatic one, or the model's own
    AUDIBLE = "audible"  # the model's output in the response is audible
    FINISH = "finish"  # the model's turn ended (end of turn, silence, played out, timeout)
    CANCEL = "cancel"  # response.cancel, barge-in, output_audio_buffer.clear, a truncation
    TURN_OVER = "turn_over"  # the model's turn is over (it fell silent or said so)
    CLOSE = "close"  # session.close


State: TypeAlias = InputState | ResponseState | GateState
#: Every machine, each with its initial state first.
MACHINES: Final = (InputState, ResponseState, GateState)

_I, _R, _G, _T = InputState, ResponseState, GateState, Trigger

TRANSITIONS: Final[Mapping[tuple[State, Trigger], State]] = MappingProxyType({
    # ---- user turn
    (_I.EMPTY, _T.APPEND): _I.BUFFERED,
    (_I.EMPTY, _T.CLEAR): _I.EMPTY,
    (_I.EMPTY, _T.CLOSE): _I.CLOSED,
    (_I.BUFFERED, _T.APPEND): _I.BUFFERED,
    (_I.BUFFERED, _T.COMMIT): _I.EMPTY,
    (_I.BUFFERED, _T.CLEAR): _I.EMPTY,
    (_I.BUFFERED, _T.CLOSE): _I.CLOSED,
    # ---- response
    (_R.IDLE, _T.CREATE): _R.OPEN,
    (_R.IDLE, _T.CLOSE): _R.CLOSED,
    (_R.OPEN, _T.AUDIBLE): _R.SPEAKING,
    (_R.OPEN, _T.FINISH): _R.IDLE,
    (_R.OPEN, _T.CANCEL): _R.IDLE,
    (_R.OPEN, _T.CLOSE): _R.CLOSED,
    (_R.SPEAKING, _T.AUDIBLE): _R.SPEAKING,
    (_R.SPEAKING, _T.FINISH): _R.IDLE,
    (_R.SPEAKING, _T.CANCEL): _R.IDLE,
    (_R.SPEAKING, _T.CLOSE): _R.CLOSED,
    # ---- output gate
    (_G.LIVE, _T.CANCEL): _G.MUTED,
    (_G.LIVE, _T.CREATE): _G.LIVE,
    (_G.LIVE, _T.TURN_OVER): _G.LIVE,
    (_G.LIVE, _T.CLOSE): _G.CLOSED,
    (_G.MUTED, _T.CANCEL): _G.MUTED,
    (_G.MUTED, _T.CREATE): _G.LIVE,  # an explicit request wants to hear the model again
    (_G.MUTED, _T.TURN_OVER): _G.LIVE,
    (_G.MUTED, _T.CLOSE): _G.CLOSED,
})


@overload
def transition(state: InputState, trigger: Trigger) -> InputState | None: ...
@overload
def transition(state: ResponseState, trigger: Trigger) -> ResponseState | None: ...
@overload
def transition(state: GateState, trigger: Trigger) -> GateState | None: ...
@overload
def transition(state: State, trigger: Trigger) -> State | None: ...


def transition(state: State, trigger: Trigger) -> State | None:
    """Look up where ``trigger`` moves ``state``.

    Every entry stays inside its machine (tests/worker/test_states.py checks the table), so the
    overloads give the next state the type of ``state``.

    Args:
        state: the current state of one machine.
        trigger: what happened.

    Returns:
        The next state (of the same machine), or None when the move is illegal.
    """
    return TRANSITIONS.get((state, trigger))


class IllegalTransition(Exception):
    """A move that :data:`TRANSITIONS` does not have was made: the core's bug, never the
    client's (a client's out-of-turn command is refused before any move)."""

    def __init__(self, state: State, trigger: Trigger) -> None:
        super().__init__(f"{trigger.value} is not a move of {type(state).__name__}"
                         f" {state.value}")
        self.state = state
        self.trigger = trigger


@overload
def move(state: InputState, trigger: Trigger) -> InputState: ...
@overload
def move(state: ResponseState, trigger: Trigger) -> ResponseState: ...
@overload
def move(state: GateState, trigger: Trigger) -> GateState: ...
@overload
def move(state: State, trigger: Trigger) -> State: ...


def move(state: State, trigger: Trigger) -> State:
    """Where ``trigger`` moves ``state``.

    Raises:
        IllegalTransition: the table has no such move.
    """
    target = TRANSITIONS.get((state, trigger))
    if target is None:
        raise IllegalTransition(state, trigger)
    return target


def mermaid(machine: type[InputState] | type[ResponseState] | type[GateState]) -> str:
    """Render one machine of :data:`TRANSITIONS` as a Mermaid ``stateDiagram-v2``."""
    lines = ["stateDiagram-v2"]
    for (state, trigger), target in TRANSITIONS.items():
        if isinstance(state, machine):
            lines.append(f"    {state.value} --> {target.value}: {trigger.value}")
    return "\n".join(lines)
