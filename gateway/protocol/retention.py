"""Output the client took long ago counts as acknowledged: the time-based trim of the log.

Clients that never send ``session.event_ack`` (the openai SDK) would otherwise keep the whole
capped log in Redis. Events taken by the websocket ``delivered_retention_s`` ago on a live
connection may be trimmed: a client that lost them anyway gets ``session.resync_required`` on
resume, never a silent gap (DESIGN §2.7, §5). Taken means written to the socket: what waits
behind a client that does not read stays in the log for its resume. The ack-based trim
(:class:`~gateway.protocol.actions.TrimLog` on ``session.event_ack``) and the log's length
cap bound it too.
"""

from __future__ import annotations

import collections

__all__ = ["TIMER_S", "DeliveredRetention"]

#: How often the connection's timer fires (the driver's housekeeping: the tenant renewal too).
TIMER_S = 1.0


class DeliveredRetention:
    """Samples of how far the client took the output, one per timer; says how far to trim."""

    def __init__(self, retention_s: float) -> None:
        self._retention_s = retention_s
        self._samples: collections.deque[tuple[float, int]] = collections.deque()
        self._trimmed = 0

    def sample(self, now: float, taken_seq: int) -> int | None:
        """Note that the client had taken every event up to ``taken_seq`` at ``now``; the
        seq to trim the log up to now, or None when nothing new is old enough."""
        if self._retention_s <= 0:
            return None
        samples = self._samples
        samples.append((now, taken_seq))
        upto = 0
        while samples and now - samples[0][0] >= self._retention_s:
            upto = samples.popleft()[1]
        if upto > self._trimmed:
            self._trimmed = upto
            return upto
        return None
