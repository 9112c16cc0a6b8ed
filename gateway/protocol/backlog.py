"""The output one client has not taken, and when it is too much (output backpressure).

The other I/O-free part of a connection beside :class:`~gateway.protocol.connection.ConnectionCore`:
the driver keeps it apart from the core because it must be fed while a send to the client is
blocked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Backlog", "OutputBacklog", "OutputLimits"]

@dataclass(frozen=True, slots=True, kw_only=True)
class OutputLimits:
    """How much output a client may leave untaken (``OUTPUT_BACKPRESSURE_EVENTS`` and
    ``_BYTES``); 0 turns that bound off."""

    max_events: int = 512
    max_bytes: int = 2 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Backlog:
    """The output a client has not taken, at one moment."""

    events: int
    bytes: int


def _client_bytes(payload: bytes) -> int:
    """About what one log entry costs on the wire: the client gets JSON with its audio in
    base64, a third larger than the raw bytes the log keeps (the rest is small)."""
    return (len(payload) * 4 + 2) // 3


class OutputBacklog:
    """The output one client has not taken, and when it is too much.

    Counted: ``events``, every event of the session's log numbered after the last one whose
    frame the websocket accepted, up to the highest number the connection knows the log
    holds (pushes announce each write as it lands, also while a send waits; reads too);
    ``bytes``, those events' size as the client gets them (estimated from their log entries,
    for the ones this connection saw) plus ``buffered_bytes``, the transport's write buffer
    (frames accepted, not yet taken by the kernel). Not counted: the kernels' socket buffers
    and whatever the client's own library holds, which the gateway cannot see.

    :meth:`crossed` reports the backlog once when it goes over a limit (more than
    ``max_events`` events or ``max_bytes`` bytes), and again only after :meth:`taken` found it
    back at or under half of both.

    Args:
        limits: the bounds.
        taken_seq: where the connection starts: the last event the client already has.
    """

    def __init__(self, limits: OutputLimits, *, taken_seq: int = 0) -> None:
        self._limits = limits
        #: The highest ``server_event_seq`` whose frame the websocket accepted.
        self.taken_seq = taken_seq
        self._known_seq = taken_seq  # the highest seq known to be in the log
        self._sizes: dict[int, int] = {}  # seq -> client bytes, for seen events not taken
        self._bytes = 0
        self._armed = True

    def seen(self, first_seq: int, payloads: Sequence[bytes]) -> None:
        """Log entries ``first_seq``, ``first_seq + 1``, ... exist (a push or a read)."""
        for offset, payload in enumerate(payloads):
            seq = first_seq + offset
            if seq > self.taken_seq and seq not in self._sizes:
                size = _client_bytes(payload)
                self._sizes[seq] = size
                self._bytes += size
        self._known_seq = max(self._known_seq, first_seq + len(payloads) - 1)

    def taken(self, seq: int, *, buffered_bytes: int = 0) -> None:
        """The websocket accepted the frame of event ``seq`` (and so everything before it:
        frames go out in order). An older ``seq`` (the log was rewound and numbers are
        reused) moves nothing: the count may then be low for a while, never high."""
        if seq <= self.taken_seq:
            return
        if seq - self.taken_seq <= len(self._sizes):
            gone: Sequence[int] = range(self.taken_seq + 1, seq + 1)
        else:  # a jump (a resync skipped events): fewer sizes than numbers to walk
            gone = [known for known in self._sizes if known <= seq]
        for known in gone:
            self._bytes -= self._sizes.pop(known, 0)
        self.taken_seq = seq
        self._known_seq = max(self._known_seq, seq)
        if not self._armed and not self._over(self.backlog(buffered_bytes), share=2):
            self._armed = True

    def backlog(self, buffered_bytes: int = 0) -> Backlog:
        """What the client has not taken, now."""
        return Backlog(events=self._known_seq - self.taken_seq,
                       bytes=self._bytes + buffered_bytes)

    def crossed(self, buffered_bytes: int = 0) -> Backlog | None:
        """The backlog, when it has just gone over a limit; None otherwise (also while it
        stays over after the crossing was reported)."""
        backlog = self.backlog(buffered_bytes)
        if not self._armed or not self._over(backlog, share=1):
            return None
        self._armed = False
        return backlog

    def _over(self, backlog: Backlog, *, share: int) -> bool:
        """Whether ``backlog`` is over 1/``share`` of a limit that is on."""
        limits = self._limits
        return ((limits.max_events > 0 and backlog.events * share > limits.max_events)
                or (limits.max_bytes > 0 and backlog.bytes * share > limits.max_bytes))
