"""The two state machines of a worker session, as data (style rule 2, after h11 ``_state.py``).

A session has a user-turn machine (:class:`InputState`, the input audio buffer) and a response
machine (:class:`ResponseState`), kept separate like h11's client/server pair. Every legal move
of both is one entry of :data:`TRANSITIONS`; a move that is not there is illegal, and the
session runner answers it with an ``error`` event (or, where the protocol has no refusal for
it, by doing nothing). The docs' diagram is generated from the table by :func:`mermaid`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, TypeAlias, overload

__all__ = [
    "TRANSITIONS",
    "InputState",
    "ResponseState",
    "State",
    "Trigger",
    "mermaid",
    "transition",
]


class InputState(enum.Enum):
    """The input audio buffer (``input_audio_buffer.*``)."""

    EMPTY = "empty"
    BUFFERED = "buffered"
    CLOSED = "closed"


class ResponseState(enum.Enum):
    """The response machine: at most one response is active at a time (openai_realtime.md §1b)."""

    IDLE = "idle"
    PLAYING = "playing"  # turn mode: a committed turn is played back at real-time pace
    STREAMING = "streaming"  # stream mode: appended audio is echoed as it arrives
    CLOSED = "closed"


class Trigger(enum.Enum):
    """What moves a machine: a command, or the end of a response's audio."""

    APPEND = "append"  # input_audio_buffer.append
    COMMIT = "commit"  # input_audio_buffer.commit (with at least 100 ms buffered)
    CLEAR = "clear"  # input_audio_buffer.clear
    CREATE = "create"  # response.create (or a commit with auto_response)
    STREAM = "stream"  # input_audio_buffer.append in stream mode
    FINISH = "finish"  # all audio released (turn) or the turn committed (stream)
    CANCEL = "cancel"  # response.cancel
    CLOSE = "close"  # session.close


State: TypeAlias = InputState | ResponseState

_I, _R, _T = InputState, ResponseState, Trigger

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
    (_R.IDLE, _T.CREATE): _R.PLAYING,
    (_R.IDLE, _T.STREAM): _R.STREAMING,
    (_R.IDLE, _T.CLOSE): _R.CLOSED,
    (_R.PLAYING, _T.FINISH): _R.IDLE,
    (_R.PLAYING, _T.CANCEL): _R.IDLE,
    (_R.PLAYING, _T.CLOSE): _R.CLOSED,
    (_R.STREAMING, _T.STREAM): _R.STREAMING,
    (_R.STREAMING, _T.FINISH): _R.IDLE,
    (_R.STREAMING, _T.CANCEL): _R.IDLE,
    (_R.STREAMING, _T.CLOSE): _R.CLOSED,
})


@overload
def transition(state: InputState, trigger: Trigger) -> InputState | None: ...
@overload
def transition(state: ResponseState, trigger: Trigger) -> ResponseState | None: ...
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


def mermaid(machine: type[InputState] | type[ResponseState]) -> str:
    """Render one machine of :data:`TRANSITIONS` as a Mermaid ``stateDiagram-v2``."""
    lines = ["stateDiagram-v2"]
    for (state, trigger), target in TRANSITIONS.items():
        if isinstance(state, machine):
            lines.append(f"    {state.value} --> {target.value}: {trigger.value}")
    return "\n".join(lines)
