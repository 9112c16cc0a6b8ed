"""The output half of the connection core: following the session's output log, delivering.

Log entries arrive from pushes and reads in any order, duplicated or missing; the follower
(:class:`~contract.follower.LogFollower`) puts them in order, and what this half decides is what
the client sees of them: each event rendered once under its ``server_event_seq``, a
``session.resync_required`` whenever the log lost or trimmed events the client lacks (never a
silent gap, DESIGN §2.7), and the close once the terminal event went out.
:class:`~gateway.protocol.connection.ConnectionCore` is the rest of the core and holds the
state this half reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contract.follower import REWIND_WINDOW, LogFollower
from contract.messages import MessageDecodeError, decode_event, is_terminal
from gateway.protocol.actions import Action, CheckLogEnd, CloseConnection, FetchLog, SendFrame
from gateway.protocol.envelope import Notice, ResyncRequiredNotice
from gateway.protocol.errors import CloseCode, InternalError
from gateway.protocol.render import encode_frame
from gateway.protocol.transitions import ConnectionState, Trigger, next_state

__all__ = ["RETRY_LATER_REASONS", "OutputDelivery"]

#: Terminal reasons that refuse a session for want of capacity rather than end it: the
#: connection closes 1013 (try again later), as an open refused ``resource_exhausted`` does.
RETRY_LATER_REASONS = frozenset({"no_free_slot"})


class OutputDelivery:
    """The log inputs of :class:`~gateway.protocol.connection.ConnectionCore`."""

    state: ConnectionState
    session_id: str | None
    _follower: LogFollower
    _actions: list[Action]
    _event_counter: int
    # The connection's dialect's renderers (render_event and render_notice's signatures).
    _render_event: Callable[..., dict[str, Any]]
    _render_notice: Callable[..., dict[str, Any]]
    # Frames the duplex renderer derived from the event it rendered last: (before it, frame).
    _extra_frames: list[tuple[bool, dict[str, Any]]]

    @property
    def delivered_seq(self) -> int:
        """The highest ``server_event_seq`` sent to the client."""
        return self._follower.next_index - 1

    def receive_log_entries(self, first_seq: int, payloads: list[bytes], *,
                            read_after: int | None = None) -> None:
        """Output entries from a push or a log read; any order, duplicates allowed.
        ``read_after``: they are a read of the entries from ``read_after`` on (the driver's
        reads overlap the last entry delivered by one)."""
        if self.state is not ConnectionState.ATTACHED:
            return
        if first_seq < self._follower.next_index and not self._check_rewind(
                first_seq, payloads, read_after):
            return
        fresh, gap = self._follower.offer(first_seq, payloads)
        if gap:
            self._actions.append(FetchLog(after_seq=self.delivered_seq))
        for seq, payload in fresh:
            if not self._deliver(seq, payload):
                return

    def _check_rewind(self, first_seq: int, payloads: list[bytes], read_after: int | None,
                      ) -> bool:
        """A different event under a delivered number: the log lost what we sent (a failover
        to a replica that lagged) and numbers on from there. Say so, then deliver again from
        that number; the client must not drop those events as seen. False: deliver none of
        these entries yet."""
        seq = self._follower.rewound_at(first_seq, payloads)
        if seq is None:
            return True
        if seq == first_seq == read_after:
            # The read's overlap, the last entry it did not need, changed: the log went back
            # to there or before and was numbered past it again, which entries after it
            # cannot show. Read back from before it to find where the log differs.
            self._actions.append(FetchLog(after_seq=max(0, seq - 1 - REWIND_WINDOW)))
            return False
        assert self.session_id is not None
        self._notice(ResyncRequiredNotice(session_id=self.session_id, reason="log_rewound",
                                          replay_from=seq))
        self._follower.rewind(seq)
        return True

    def log_read(self, after_seq: int, rows: list[tuple[int, bytes]], *, quiet: bool = False,
                 rewound_to: int | None = None) -> None:
        """A read of the output log after ``after_seq`` (a :class:`FetchLog`) found ``rows``;
        unless ``rewound_to`` is given, they may begin with the entry at ``after_seq`` itself,
        read again to check that the log still holds it.

        ``quiet``: the read was the periodic poll of a quiet channel; one that finds nothing
        also checks where the log ends (:class:`CheckLogEnd`). ``rewound_to``: the read of
        the entries around a log end found behind what was delivered.
        """
        if rewound_to is not None:
            if rows:
                self.receive_log_entries(rows[0][0], [payload for _, payload in rows])
            self.log_rewound(rewound_to)
            return
        if not rows:
            if quiet and after_seq and self.state is ConnectionState.ATTACHED:
                self._actions.append(CheckLogEnd(after_seq=after_seq))
            return
        if rows[0][0] > after_seq + 1:
            self.log_trimmed(rows[0][0])
        self.receive_log_entries(rows[0][0], [payload for _, payload in rows],
                                 read_after=after_seq)

    def log_end_read(self, after_seq: int, last_output: int) -> None:
        """The output log ends at ``last_output`` (a :class:`CheckLogEnd` after
        ``after_seq``). Behind ``after_seq``, a lossy failover took it back: re-read what it
        holds now around there, so the follower finds where it differs from what was
        delivered, or else resumes at its end."""
        if last_output < after_seq and self.state is ConnectionState.ATTACHED:
            self._actions.append(FetchLog(after_seq=max(0, last_output - REWIND_WINDOW),
                                          rewound_to=last_output))

    def log_rewound(self, last_seq: int) -> None:
        """The log now ends at ``last_seq``, before what was delivered (a failover lost
        events the client got): the next event will be ``last_seq + 1``; say so."""
        if self.state is not ConnectionState.ATTACHED or last_seq >= self.delivered_seq:
            return
        assert self.session_id is not None
        self._notice(ResyncRequiredNotice(session_id=self.session_id, reason="log_rewound",
                                          replay_from=last_seq + 1))
        self._follower.rewind(last_seq + 1)

    def log_trimmed(self, first_available_seq: int) -> None:
        """A log read found entries missing before ``first_available_seq`` (trimmed)."""
        # A read issued before live pushes caught up may report a "trim" below what was
        # already delivered: nothing is missing then, and moving back would send duplicates.
        if (self.state is not ConnectionState.ATTACHED
                or first_available_seq <= self._follower.next_index):
            return
        assert self.session_id is not None
        self._notice(ResyncRequiredNotice(session_id=self.session_id, reason="log_trimmed",
                                          replay_from=first_available_seq))
        self._follower = LogFollower(first_available_seq - 1)

    def _deliver(self, seq: int, payload: bytes) -> bool:
        """Send one event; False once the stream ended (terminal event)."""
        assert self.session_id is not None
        try:
            event = decode_event(payload)
            # Deterministic ids: a replayed event carries the same event_id as the first time.
            text = encode_frame(self._render_event(
                event, server_event_seq=seq, event_id=f"event_{self.session_id[-12:]}_{seq}",
                session_id=self.session_id))
        except (MessageDecodeError, InternalError):
            # A corrupt or unencodable entry (NaN from a worker) is our fault, never the
            # client's; skipping it keeps the stream going (the seq still advances, so replay
            # stays exact).
            self._extra_frames.clear()
            return True
        if self._extra_frames:
            self._send_extra(text, seq)
        else:
            self._actions.append(SendFrame(text=text, seq=seq))
        if is_terminal(event):
            reason = getattr(event, "reason", "")
            # A session its worker had no slot for ended before it began: open again later.
            code = (CloseCode.TRY_AGAIN_LATER if reason in RETRY_LATER_REASONS
                    else CloseCode.NORMAL)
            self._actions.append(CloseConnection(code=code, reason=reason))
            self._move(Trigger.TERMINAL_EVENT)
            return False
        return True

    def _send_extra(self, text: str, seq: int) -> None:
        """The event's frame with the duplex decision frames derived from it around it; they
        are no log entries, so carry no ``seq``."""
        extra = list(self._extra_frames)
        self._extra_frames.clear()
        for before, frame in extra:
            if before:
                frame["event_id"] = self._next_event_id()
                self._actions.append(SendFrame(text=encode_frame(frame)))
        self._actions.append(SendFrame(text=text, seq=seq))
        for before, frame in extra:
            if not before:
                frame["event_id"] = self._next_event_id()
                self._actions.append(SendFrame(text=encode_frame(frame)))

    def _notice(self, notice: Notice) -> None:
        self._actions.append(SendFrame(text=encode_frame(self._render_notice(
            notice, event_id=self._next_event_id()))))

    def _next_event_id(self) -> str:
        self._event_counter += 1
        return f"event_gw_{self._event_counter}"

    def _move(self, trigger: Trigger) -> None:
        self.state = next_state(self.state, trigger)
