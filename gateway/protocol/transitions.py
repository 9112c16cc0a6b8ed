"""Where one client connection stands, and the only table of its moves.

Every change of :class:`ConnectionState` goes through :data:`TRANSITIONS`
(:func:`next_state`); :func:`mermaid` draws the table, so the picture cannot drift from it.

A resume never depends on capacity (DESIGN §2.7): a ``?model=`` URL opens its session only at
the first client frame that is not ``session.resume``, or once the quiet period is over; a
quiet open refused for a retryable reason goes back to waiting (``held``), and a
``session.resume`` sent as the client's first event gives up the session the URL opened
(``resume`` from ``opening`` or ``attached``).
"""

from __future__ import annotations

import enum

__all__ = ["TRANSITIONS", "ConnectionState", "Trigger", "mermaid", "next_state"]


class ConnectionState(enum.Enum):
    """Where one connection stands."""

    AWAITING_FIRST = "awaiting_first"
    OPENING = "opening"
    RESUMING = "resuming"
    ATTACHED = "attached"
    CLOSED = "closed"


class Trigger(enum.Enum):
    """What moves a connection."""

    #: The first command, or a ``?model=`` URL's quiet period over: a session is opened.
    OPEN = "open"
    #: ``session.resume`` as the client's first event.
    RESUME = "resume"
    #: A quiet open was refused for now (retryable): wait for the client again.
    HELD = "held"
    #: The open or resume landed.
    ATTACHED = "attached"
    #: The session's terminal event was delivered: it is over.
    TERMINAL_EVENT = "terminal_event"
    #: A newer attachment took the session.
    REPLACED = "replaced"
    #: The gateway's own attachment lapsed: the session lives on, detached.
    LEASE_LAPSED = "lease_lapsed"
    #: The store lost the session's record.
    SESSION_LOST = "session_lost"
    #: The client reads nothing: the connection is closed, the session detached.
    OUTPUT_STALLED = "output_stalled"
    #: A refusal that closes, a failure, or the socket gone.
    FAIL = "fail"


_S = ConnectionState
_T = Trigger

#: The only place connection transitions live: (state, trigger) -> next state.
TRANSITIONS: dict[tuple[ConnectionState, Trigger], ConnectionState] = {
    (_S.AWAITING_FIRST, _T.OPEN): _S.OPENING,
    (_S.AWAITING_FIRST, _T.RESUME): _S.RESUMING,
    (_S.OPENING, _T.HELD): _S.AWAITING_FIRST,
    (_S.OPENING, _T.RESUME): _S.RESUMING,
    (_S.ATTACHED, _T.RESUME): _S.RESUMING,
    (_S.OPENING, _T.ATTACHED): _S.ATTACHED,
    (_S.RESUMING, _T.ATTACHED): _S.ATTACHED,
    (_S.ATTACHED, _T.TERMINAL_EVENT): _S.CLOSED,
    (_S.ATTACHED, _T.REPLACED): _S.CLOSED,
    (_S.ATTACHED, _T.LEASE_LAPSED): _S.CLOSED,
    (_S.ATTACHED, _T.SESSION_LOST): _S.CLOSED,
    **{(state, _T.OUTPUT_STALLED): _S.CLOSED for state in ConnectionState},
    **{(state, _T.FAIL): _S.CLOSED for state in ConnectionState},
}


def next_state(state: ConnectionState, trigger: Trigger) -> ConnectionState:
    """Where ``trigger`` moves a connection in ``state``.

    Raises:
        AssertionError: the table has no such move (a bug in the core).
    """
    try:
        return TRANSITIONS[(state, trigger)]
    except KeyError:
        raise AssertionError(f"can't handle {trigger.value} in state {state.value}") from None


def mermaid() -> str:
    """Render :data:`TRANSITIONS` as a Mermaid ``stateDiagram-v2``."""
    lines = ["stateDiagram-v2", f"    [*] --> {ConnectionState.AWAITING_FIRST.value}"]
    for (state, trigger), target in TRANSITIONS.items():
        lines.append(f"    {state.value} --> {target.value}: {trigger.value}")
    return "\n".join(lines)
