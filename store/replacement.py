"""Re-placing a lost worker's sessions (docs/design/hand-over.md, "Re-placement on loss").

The reaper that declares a worker lost offers its sessions here before it ends them: each
that has a checkpoint is moved, from that checkpoint, to the least loaded live worker serving
its model (its home and the lost worker left out): a slot reserved there
(``reserve_slot.lua``), the ownership moved naming the lost worker's owner epoch and the
checkpoint (``adopt_session.lua``, so of two reapers one wins, and the lost worker's writes are
refused from then on), the adopter woken. What could not move (no checkpoint, no room, its
checkpoint forfeit) is left to the reaper to end ``worker_lost`` as before; the adoption took
each moved one out of its home's session set, so that end skips it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass

from store.checkpoints import AdoptStatus, ReserveStatus, read_checkpoint, tell_adopter
from store.client import RedisClient
from store.directory import WorkerLoad, list_workers, server_time_ms, worker_loads
from store.errors import StoreError
from store.keys import worker_of_session
from store.logs import session_start
from store.scripts import Scripts

__all__ = ["Placement", "ReplaceStatus", "Replacer"]

_log = logging.getLogger("store.replacement")


class ReplaceStatus(enum.StrEnum):
    """What became of one of a lost worker's sessions offered for re-placement."""

    #: Another worker owns it now, from its last checkpoint.
    MOVED = "moved"
    #: It has no checkpoint to continue from (or it was forfeit): it ends.
    NO_CHECKPOINT = "no_checkpoint"
    #: No live worker of its model has a free slot: it ends.
    NO_ROOM = "no_room"
    #: Not the lost worker's to move (ended, moved already, or another format's).
    NOT_OWNED = "not_owned"
    #: The adoption was refused or Redis failed: it ends (or a later reap offers it again).
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one session went: its id, what became of it and the worker that took it."""

    session_id: str
    status: ReplaceStatus
    adopter: str | None = None
    #: What the adoption script answered, where it refused (its log line says it).
    refusal: AdoptStatus | None = None


# What ends a session the lost worker still served (one it no longer owned is not its to end).
_ENDS = frozenset({ReplaceStatus.NO_CHECKPOINT, ReplaceStatus.NO_ROOM, ReplaceStatus.FAILED})


class Replacer:
    """Moves a lost worker's sessions to live workers of their model (see the module
    docstring)."""

    def __init__(self, client: RedisClient, scripts: Scripts, *,
                 counted: Callable[[ReplaceStatus], None] | None = None) -> None:
        self._client = client
        self._scripts = scripts
        self._counted = counted  # told each session's outcome (metrics)

    async def moved(self, lost: str, session_ids: Sequence[str]) -> set[str]:
        """The sessions of ``session_ids`` that :meth:`re_place` moved (``store/reaping.py``
        ends the rest)."""
        placements = await self.re_place(lost, session_ids)
        for placement in placements:
            if self._counted is not None:
                self._counted(placement.status)
            if placement.status in _ENDS:  # why a session ends rather than moves
                why = placement.status.value + (
                    f": {placement.refusal.value}" if placement.refusal is not None else "")
                _log.warning("session %s of lost worker %s not re-placed (%s): it ends",
                             placement.session_id, lost, why)
        return {p.session_id for p in placements if p.status is ReplaceStatus.MOVED}

    async def re_place(self, lost: str, session_ids: Sequence[str]) -> list[Placement]:
        """Offer ``session_ids``, served by worker ``lost``, to live workers; where each went.

        Raises:
            StoreError: the directory could not be read (nothing was moved).
        """
        if not session_ids:
            return []
        now_ms = await server_time_ms(self._client)
        loads = [load for load in await worker_loads(self._client,
                                                     await list_workers(self._client, now_ms))
                 if load.state == "live" and load.worker_id != lost]
        free = {load.worker_id: load.free for load in loads}
        placements: list[Placement] = []
        for session_id in session_ids:
            try:
                placement = await self._re_place_one(lost, session_id, loads, free)
            except StoreError as exc:
                _log.warning("session %s of lost worker %s not re-placed: %s", session_id,
                             lost, exc)
                placement = Placement(session_id, ReplaceStatus.FAILED)
            placements.append(placement)
        return placements

    async def _re_place_one(self, lost: str, session_id: str, loads: Sequence[WorkerLoad],
                            free: dict[str, int]) -> Placement:
        start = await session_start(self._client, session_id)
        home = worker_of_session(session_id)
        if (start is None or start.closed or start.other_format
                or (start.owner or home) != lost):
            return Placement(session_id, ReplaceStatus.NOT_OWNED)
        checkpoint = await read_checkpoint(self._client, session_id)
        if checkpoint is None:
            return Placement(session_id, ReplaceStatus.NO_CHECKPOINT)
        model = start.model or ""
        candidates = sorted(
            (load for load in loads
             if load.worker_id != home and free[load.worker_id] > 0
             and (not model or model in load.models)),
            key=lambda load: -free[load.worker_id])
        for load in candidates:
            adopter = load.worker_id
            if await self._scripts.reserve_slot(adopter, session_id,
                                                model=model) is not ReserveStatus.OK:
                continue
            free[adopter] -= 1
            adoption = await self._scripts.adopt_session(
                session_id, replaces_epoch=start.owner_epoch, adopter=adopter,
                checkpoint_seq=checkpoint.seq)
            if adoption.status is not AdoptStatus.OK:
                free[adopter] += 1
                await self._scripts.release_slot(adopter, session_id)
                status = (ReplaceStatus.NO_CHECKPOINT
                          if adoption.status in (AdoptStatus.INPUT_GONE,
                                                 AdoptStatus.NO_CHECKPOINT)
                          else ReplaceStatus.FAILED)
                return Placement(session_id, status, refusal=adoption.status)
            with suppress(StoreError):  # its poll finds it otherwise
                await tell_adopter(self._client, adopter, session_id)
            _log.info("session %s of lost worker %s re-placed on worker %s", session_id,
                      lost, adopter)
            return Placement(session_id, ReplaceStatus.MOVED, adopter)
        return Placement(session_id, ReplaceStatus.NO_ROOM)
