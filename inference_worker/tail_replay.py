"""Reconciling a session taken over from a lost worker with what that worker wrote past its
last checkpoint (docs/design/hand-over.md, "Re-placement on loss").

The lost worker may have applied input after its checkpoint and written events for it: the
log's **tail**, which its client saw and which stays. The adopter's core restored from the
checkpoint replays that input (:func:`replay_tail`) and its events are matched against the
tail, one for one and in order, by what identifies them (their type, the response and item
they belong to, a response's final status; the content of deltas is not compared, nor how
the model's output was cut into them): a matched event is not written again. Once the whole
tail is matched, and the response it left open (the client saw it start, not end) has produced
as much output as the client got of it, the session is where its client is, and what follows
is new: that response ends once, ``response.done`` ``failed`` with error code ``worker_lost``,
its item keeping what the replay produced (none of its output is sent again), and the input
after is applied as usual.

The replay runs on a clock of its own: every entry at the time reached so far, which moves only
to let the active response end as the tail shows it ended by itself (a completed answer), or
play the open one as far as the client heard it, so an answer that ended before the next turn
was heard ends before it here too, and one cut short by input is cut by that input. A replay
that does not reproduce the tail (a backend that is not deterministic given its input, a
client that paced its commands by a clock this replay does not see) raises
:class:`ReplayDiverged`: the session ends ``worker_lost``, never continues on a guess.

It does no I/O: the caller reads the tail and the input and writes what it returns.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from contract import messages as msg
from contract.messages import MessageDecodeError, decode_command
from inference_worker.conversation.core import ConversationCore
from inference_worker.sessions import Session, is_current
from store.logs import InputEntry

__all__ = ["ReplayDiverged", "Replayed", "TailMatch", "event_key", "replay_tail"]

# Events whose number and cut depend on when the model's output was taken, not on the input:
# never compared, and suppressed while they belong to a response the client saw.
_LOOSE: tuple[type[msg.Event], ...] = (
    msg.AudioDelta, msg.TranscriptDelta, msg.TextDelta, msg.FunctionCallArgumentsDelta,
    msg.InputTranscriptionDelta)
# How far before now the replay's own clock starts, and so how far it may run: past it, the
# tail shows an answer longer than any the replay can play.
_MAX_ADVANCE_S = 600.0

#: What identifies an event in a comparison with the tail.
EventKey = tuple[str, str | None, str | None, str | None]


class ReplayDiverged(Exception):
    """The replay did not reproduce what the lost worker wrote."""


@dataclass(frozen=True, slots=True)
class Replayed:
    """What :func:`replay_tail` did.

    Attributes:
        events: the events to write after the tail, in order (none of them seen by the client).
        applied: the input entries replayed, a prefix of those given; the caller applies the
            rest as usual.
        lost_response: the response the tail left open and the replay ended ``failed``
            (None: none was open).
    """

    events: tuple[msg.Event, ...]
    applied: int
    lost_response: str | None


def event_key(event: msg.Event) -> EventKey | None:
    """What identifies ``event`` in the comparison (None: a loose event, never compared)."""
    if isinstance(event, _LOOSE):
        return None
    response_id = getattr(event, "response_id", None)
    item_id = getattr(event, "item_id", None)
    status = None
    if isinstance(event, msg.ResponseCreated | msg.ResponseDone):
        response_id = str(event.response.get("id"))
        if isinstance(event, msg.ResponseDone):
            status = str(event.response.get("status"))
    item = getattr(event, "item", None)
    if isinstance(item, dict) and item_id is None:
        item_id = str(item.get("id"))
    return (event.KIND, response_id, item_id, status)


def _size(event: msg.Event) -> int:
    """How much output a loose event carries (audio bytes, or text bytes)."""
    if isinstance(event, msg.AudioDelta):
        return len(event.audio)
    delta = getattr(event, "delta", "")
    return len(delta.encode()) if isinstance(delta, str) else 0


def _response_of(event: msg.Event) -> str | None:
    if isinstance(event, msg.ResponseCreated | msg.ResponseDone):
        return str(event.response.get("id"))
    found = getattr(event, "response_id", None)
    return found if isinstance(found, str) else None


class TailMatch:
    """The tail's events still to match, and the responses it opened."""

    def __init__(self, tail: Sequence[msg.Event]) -> None:
        self._expected: deque[tuple[EventKey, str | None]] = deque()
        self._ends: dict[str, str] = {}  # response id -> the status the tail ended it with
        opened: list[str] = []
        for event in tail:
            if (key := event_key(event)) is not None:
                self._expected.append((key, _response_of(event)))
            if isinstance(event, msg.ResponseCreated):
                opened.append(str(event.response.get("id")))
            elif isinstance(event, msg.ResponseDone):
                self._ends[str(event.response.get("id"))] = str(event.response.get("status"))
        left_open = [rid for rid in opened if rid not in self._ends]
        #: The response the client saw start and not end (None: none).
        self.open_response = left_open[-1] if left_open else None
        # How much of its output the client got, and how much of it the replay produced.
        self._heard = sum(_size(e) for e in tail if event_key(e) is None and self._of_open(e))
        self._replayed = 0

    def _of_open(self, event: msg.Event) -> bool:
        """Whether ``event`` belongs to the response the tail left open."""
        return self.open_response is not None and _response_of(event) == self.open_response

    @property
    def matched(self) -> bool:
        """Whether every event of the tail but the loose ones was reproduced."""
        return not self._expected

    def behind(self, active: str | None) -> bool:
        """Whether the tail is matched but ``active``, the response it left open, has not
        produced as much output as the client got of it yet."""
        return (not self._expected and active is not None and active == self.open_response
                and self._replayed < self._heard)

    def caught_up(self, active: str | None) -> bool:
        """Whether the replay stands where the client does (``active``: the core's active
        response): the tail matched, and the response it left open, still active, produced
        what the client got of it."""
        return self.matched and not self.behind(active)

    def ends_by_itself(self, response_id: str | None) -> bool:
        """Whether the next event to match is ``response_id``'s own and the tail shows it
        ending completed, or not at all (the replay lets it play on)."""
        if response_id is None or not self._expected:
            return False
        return (self._expected[0][1] == response_id
                and self._ends.get(response_id, "completed") == "completed")

    def take(self, events: Sequence[msg.Event]) -> list[msg.Event]:
        """Match ``events``, the core's next ones; those the client has not seen.

        Raises:
            ReplayDiverged: one differs from the tail's next.
        """
        fresh: list[msg.Event] = []
        for event in events:
            key = event_key(event)
            if key is None:
                # Within the tail, or of the response the client heard up to the loss (which
                # ends at once): the client had this output, cut its own way.
                if self._of_open(event):
                    self._replayed += _size(event)
                elif not self._expected:
                    fresh.append(event)
                continue
            if self._expected:
                expected, _ = self._expected.popleft()
                if key != expected:
                    raise ReplayDiverged(f"the replay wrote {key}, its worker {expected}")
                continue
            fresh.append(event)
        return fresh


def replay_tail(session: Session, entries: Sequence[InputEntry], tail: Sequence[msg.Event],
                *, now: float) -> Replayed:
    """Replay ``entries`` (the input after the checkpoint, in order) through ``session``'s
    restored core until its events reproduce ``tail`` (the events the lost worker wrote after
    the checkpoint), then end the response the tail left open. ``now``: monotonic seconds;
    the replay's clock runs before it, so the session goes on later than any time the replay
    used.

    Raises:
        ReplayDiverged: the replay does not reproduce the tail.
    """
    core = session.core
    match = TailMatch(tail)
    hold = session.checkpoints.hold if session.checkpoints is not None else None
    start = clock = now - _MAX_ADVANCE_S
    fresh: list[msg.Event] = []
    applied = 0
    for entry in entries:
        clock = _play_on(core, match, clock, start, fresh)
        if match.caught_up(core.active_response):
            break
        if is_current(entry.token, session.applied_under):
            session.applied_under = entry.token
            try:
                command = decode_command(entry.payload)
            except MessageDecodeError:
                pass  # skipped by its worker too
            else:
                core.receive(command, clock)
        session.applied_fence = entry.fence
        if hold is not None:
            hold.applied(entry.fence, entry.index, core.input_audio[0], len(entry.payload))
        fresh += match.take(core.events_to_send())
        applied += 1
    clock = _play_on(core, match, clock, start, fresh)
    if not match.matched:
        raise ReplayDiverged("the replay ends short of what its worker wrote")
    lost_response = match.open_response
    if lost_response is None or core.active_response != lost_response:
        lost_response = None  # it ended in the replay's last step: its end is fresh
    else:
        core.lose_response()
        fresh += match.take(core.events_to_send())
    return Replayed(events=tuple(fresh), applied=applied, lost_response=lost_response)


def _play_on(core: ConversationCore, match: TailMatch, clock: float, start: float,
             fresh: list[msg.Event]) -> float:
    """Let the active response play on while the tail shows it ending by itself next, or
    while it is the one the tail left open and has not played what the client got of it; the
    clock reached."""
    last_due = None
    while match.ends_by_itself(core.active_response) or match.behind(core.active_response):
        due = core.next_deadline()
        if due is None or due == last_due:
            break
        last_due, clock = due, max(clock, due)
        if clock - start > _MAX_ADVANCE_S:
            raise ReplayDiverged("the tail's answer outlasts any the replay can play")
        core.tick(clock)
        fresh += match.take(core.events_to_send())
    return clock
