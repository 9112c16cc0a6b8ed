"""Which input pushes a worker may apply as they are: the write fence each session's log is
under, as this worker knows it.

A gateway appends a pushed worker's input as plain ``XADD``s and publishes the push in the
same ``MULTI`` (``store/input_appends.py``), so the push goes out even when Redis refused the
entries: the writer's fence was raised (a resume or a detachment took its lease). Every raise
tells the worker first, on the same channel (``FenceRaised``, ``store/lua/prelude.lua``), and
Redis delivers one channel's messages in the order it ran them, so a push under a fence below
the one the worker knows is such a refused one: dropped, and counted. A push under the fence
it knows carries entries that are in the log. A session whose fence the worker does not know
(a resubscription may have missed notices, until the record was read again) takes each push
as a wake-up only, and reads its log, the truth, instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from inference_worker.sessions import Session
from store.client import RedisClient
from store.logs import SessionStart, session_start
from store.pushes import InputPushed

__all__ = ["FenceKeeper", "PushVerdict", "fence_raised", "verdict"]


class PushVerdict(Enum):
    """What to do with an input push."""

    #: Under the fence the worker knows: its entries are in the log, apply them.
    APPLY = "apply"
    #: Under an older fence, after the notice of its raise: Redis refused its entries.
    STALE = "stale"
    #: The fence is not known, or the push names none: read the log instead.
    READ_LOG = "read_log"


def verdict(session: Session, pushed: InputPushed) -> PushVerdict:
    """The verdict on ``pushed`` for ``session``."""
    known = session.input_fence
    if known is None or pushed.fence == 0 or pushed.fence > known:
        return PushVerdict.READ_LOG
    return PushVerdict.STALE if pushed.fence < known else PushVerdict.APPLY


def fence_raised(session: Session, fence: int) -> None:
    """A ``FenceRaised`` notice for ``session``: fences only rise (an unknown one stays so)."""
    if session.input_fence is not None and fence > session.input_fence:
        session.input_fence = fence


class FenceKeeper:
    """Learns each session's fence from its record, and forgets every one when the worker's
    subscription came back (notices may have been missed meanwhile). A record read that a
    resubscription overtook is not trusted: it may predate a raise whose notice was lost."""

    def __init__(self, client: RedisClient) -> None:
        self._client = client
        self._subscriptions = 0

    def resubscribed(self, sessions: Iterable[Session]) -> None:
        """The subscription was established again: no session's fence is known now."""
        self._subscriptions += 1
        for session in sessions:
            session.input_fence = None

    def reading(self) -> int:
        """Taken before a record read whose answer goes to :meth:`learned`."""
        return self._subscriptions

    def learned(self, reading: int, session: Session, start: SessionStart | None) -> None:
        """``start`` was read since :meth:`reading` answered ``reading``."""
        if start is not None and reading == self._subscriptions:
            session.input_fence = start.input_fence

    async def learn(self, session_id: str, session: Session) -> None:
        """Read ``session``'s record for its fence.

        Raises:
            store.StoreError: Redis failed (the fence stays unknown).
        """
        reading = self._subscriptions
        self.learned(reading, session, await session_start(self._client, session_id))
