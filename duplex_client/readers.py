"""Who reads a client's events: the handover between the caller's readers and
:meth:`DuplexClient.wait_closed`'s own reading."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["Readers"]


class Readers:
    """Open :meth:`DuplexClient.events` iterators, pending :meth:`DuplexClient.recv` calls and a
    draining :meth:`DuplexClient.wait_closed` each count one reader; ``wait_closed`` reads by
    itself only when no one else does."""

    def __init__(self) -> None:
        self.count = 0
        # Set (and replaced) whenever the readers or the session's outcome change: what
        # wait_closed() waits on while someone else reads.
        self.changed = asyncio.Event()
        # wait_closed()'s own reading, a task so that a reader arriving later can stop it.
        self.drain: asyncio.Task[None] | None = None
        #: A resume is under way: not a point at which reading can be handed over.
        self.recovering = False
        # Per task, its events() iterators paused at their yield: that task's own caller runs.
        self._parked: dict[asyncio.Task[Any] | None, int] = {}

    def busy_elsewhere(self) -> bool:
        """Whether someone other than the running task reads: its own events() loops, paused
        while it runs, read nothing until it returns to them."""
        mine = self._parked.get(asyncio.current_task(), 0)
        return self.count > mine or self.drain is not None

    def park(self) -> asyncio.Task[Any] | None:
        """An events() iterator of the running task hands an event out (it pauses); returns
        the task, for :meth:`unpark` (which may run in another task: a generator finalised
        by the event loop)."""
        task = asyncio.current_task()
        self._parked[task] = self._parked.get(task, 0) + 1
        return task

    def unpark(self, task: asyncio.Task[Any] | None) -> None:
        left = self._parked.get(task, 0) - 1
        if left > 0:
            self._parked[task] = left
        else:
            self._parked.pop(task, None)

    def notify(self) -> None:
        """Wake every wait_closed() waiting on the readers or the outcome."""
        self.changed.set()
        self.changed = asyncio.Event()

    async def enter(self) -> None:
        """A caller starts reading (events(), recv()): wait_closed()'s own reading, if any,
        stops first (websockets allows one recv at a time), at a point where nothing is lost:
        while it waits for a frame (a cancelled recv keeps the frame for the next one), never
        in the middle of a resume."""
        self.count += 1
        drain = self.drain
        if drain is None:
            return
        while self.recovering and not drain.done():
            await self.changed.wait()
        drain.cancel()
        await asyncio.wait({drain})

    def leave(self) -> None:
        self.count -= 1
        self.notify()

    async def drain_with(self, read: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``read`` (reading and dropping events until the session's end) in a task a
        reader arriving meanwhile stops (:meth:`enter`); its failure is this call's."""
        drain = self.drain = asyncio.create_task(read(), name="duplex-client-drain")
        try:
            await asyncio.wait({drain})
        finally:
            if not drain.done():  # this call was cancelled (its timeout)
                drain.cancel()
                await asyncio.wait({drain})
            self.drain = None
            self.notify()
        if not drain.cancelled() and (error := drain.exception()) is not None:
            raise error
