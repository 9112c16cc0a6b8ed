"""A frame backend's worker reading its sessions' input on its own clock.

A worker whose id says so (:func:`store.keys.worker_pulls_input`) gets no input pushes: after
each engine tick it reads every session's input log past what the session applied, all in one
non-blocking ``XREAD`` (the logs share the worker's hash slot), so the next tick has them. A
frame backend consumes input a frame at a time, so reading a tick's worth at once adds at most
one tick before a command is applied and takes the push off every append.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from inference_worker.sessions import Session, SessionTable
from store import StoreError
from store.client import RedisClient
from store.logs import InputEntry, InputPosition, pull_input
from store.outages import OutageLog

__all__ = ["InputPuller"]

#: Entries read per session and pull: more than a tick's worth of audio at any frame size, so
#: a backlog after an outage drains over a few ticks.
PULL_ENTRIES = 256


class InputPuller:
    """One pull at a time: a tick that comes while the last pull is still out starts none."""

    def __init__(self, client: RedisClient, sessions: SessionTable,
                 offer: Callable[[str, Session, list[InputEntry]], Awaitable[None]],
                 outages: OutageLog, spawn: Callable[[Any], None]) -> None:
        self._client = client
        self._sessions = sessions
        self._offer = offer
        self._outages = outages
        self._spawn = spawn
        self._pulling = False

    def tick(self) -> None:
        """An engine tick ended: read what came in for the next one."""
        if not self._pulling:
            self._pulling = True
            self._spawn(self._pull())

    async def _pull(self) -> None:
        try:
            served = {session_id: session for session_id, session in self._sessions.items()
                      if not session.failed}
            positions = {session_id: InputPosition(session.applied_fence,
                                                   session.follower.next_index - 1)
                         for session_id, session in served.items()}
            pulled = await pull_input(self._client, positions, PULL_ENTRIES)
            for session_id, entries in pulled.items():
                session = served[session_id]
                session.pushed = True  # it had input: the poll need not read its log
                await self._offer(session_id, session, entries)
        except StoreError as exc:
            # Redis is failing over or restarting: the next tick pulls again, and the poll
            # loop reads every log once a second.
            self._outages.failed("input pull", exc)
        else:
            self._outages.succeeded()
        finally:
            self._pulling = False
