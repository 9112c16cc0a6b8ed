"""One reap of one worker: the two scripts a reaper runs per worker per pass, and the ends of
the sessions a lost worker had taken over in other homes.

``store/lua/reap.lua`` does the worker's part: declares it lost when its heartbeat lapsed,
else finds the sessions of gateways whose attachment lease lapsed and the sessions whose
deadline is due, and names them; ``store/lua/reap_sessions.lua``, given their keys, checks each
again and ends, detaches or expires it. A lost worker that had taken sessions over from other
workers (docs/design/hand-over.md) is their owner but not their home: each is ended in its
home's slot, only if that worker still owns it, and let go of in the lost worker's. A lost
worker that is still the home of sessions other workers serve answers ``home`` and is reaped
on: their leases, deadlines and ends live in its slot.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

from contract.messages import SessionClosed, SessionExpired, encode_message
from contract.reasons import CloseReason
from store.answers import EndedSession, Reaped, WorkerState, reply_text
from store.keys import WorkerKeys, session_keys

__all__ = ["ReplaceSessions", "RunScript", "reap"]

#: Runs a script with these keys and arguments and returns its answer.
RunScript = Callable[[Sequence[str], Sequence[Any]], Awaitable[Any]]

#: Offers a lost worker's sessions (its id, theirs) to live workers; those that moved
#: (``store/replacement.py``).
ReplaceSessions = Callable[[str, Sequence[str]], Awaitable[Collection[str]]]

# The terminal events a reaper writes: the same bytes for every session, encoded once.
_WORKER_LOST = encode_message(SessionClosed(reason=CloseReason.WORKER_LOST))
_GRACE_EXPIRED = encode_message(SessionExpired(reason=CloseReason.DISCONNECT_GRACE_EXPIRED))
_IDLE_EXPIRED = encode_message(SessionExpired(reason=CloseReason.IDLE_TTL_EXPIRED))

# One session's action for reap_sessions.lua: (action, session id, gateway or owner id).
_Action = tuple[str, str, str]


async def reap(reap_worker: RunScript, reap_sessions: RunScript, release_slot: RunScript,
               worker_id: str, *, budget: int, outage_ms: int, release_budget: int,
               lease_ms: int, re_place: ReplaceSessions | None = None) -> Reaped:
    """Declare ``worker_id`` lost if its heartbeat lapsed, ending its sessions (those it took
    over from other homes too) but those ``re_place`` moves to live workers; else detach the
    sessions of gateways whose attachment lease (``lease_ms`` long) lapsed, and expire up to
    ``budget`` due sessions. Take up to ``release_budget`` of its ended sessions, whose tenant
    places the caller releases.

    One call (REAP) does the worker's part and names the sessions that need more; only
    then, ``budget`` sessions per call, REAP_SESSIONS (whose keys name them) acts on each,
    checking it again: a pass with nothing to do is one call.

    ``outage_ms``: a longer gap since any reaper last reached the worker's slot is an
    outage of that slot (a failover, a restart). The worker then gets a full heartbeat TTL
    from now to beat before it can be declared lost, lapsed gateways a full lease to
    renew, clients their grace and idle time from now. Keep it above the gap between two
    of the caller's passes (see ``gateway/reaper.py``).
    """
    w = WorkerKeys(worker_id)
    answer = await reap_worker([*w.ending, w.adopted],
                               [budget, outage_ms, release_budget, lease_ms])
    released = EndedSession.parse_all(answer[2])
    lost = [reply_text(sid) for sid in answer[1]]
    taken_over = [reply_text(member) for member in answer[6]]
    moved: Collection[str] = ()
    if re_place is not None and (lost or taken_over):
        moved = await re_place(worker_id, lost + taken_over)
    actions: list[_Action] = [("lost", sid, "") for sid in lost if sid not in moved]
    for member in answer[3]:
        gateway_id, _, session_id = reply_text(member).partition(" ")
        actions.append(("detach", session_id, gateway_id))
    actions += [("due", reply_text(sid), "") for sid in answer[4]]
    run = _SessionsRun(reap_sessions, budget=budget, release_budget=release_budget,
                       lease_ms=lease_ms)
    await run.act(worker_id, actions)
    orphans: dict[str, list[_Action]] = {}
    for session_id in taken_over:
        if session_id not in moved:
            home = session_keys(session_id).worker.worker_id
            orphans.setdefault(home, []).append(("orphan", session_id, worker_id))
    for home, ended_there in orphans.items():
        await run.act(home, ended_there)
    for session_id in taken_over:  # ended or moved on: its slot here goes either way
        await release_slot([w.record, w.adopted], [session_id])
    return Reaped(state=WorkerState(reply_text(answer[0])), ended=run.ended,
                  released=tuple(released + run.released), detached=run.detached,
                  outage_ms=int(answer[5]), settled=not answer[1] and not answer[6],
                  moved=len(moved))


class _SessionsRun:
    """REAP_SESSIONS calls of one reap, ``budget`` sessions each, and what they did."""

    def __init__(self, run: RunScript, *, budget: int, release_budget: int,
                 lease_ms: int) -> None:
        self._run = run
        self._batch = max(budget, 1)
        self._release_budget, self._lease_ms = release_budget, lease_ms
        self.ended = self.detached = 0
        self.released: list[EndedSession] = []

    async def act(self, worker_id: str, actions: Sequence[_Action]) -> None:
        """Act on ``actions``, sessions homed at ``worker_id``."""
        ending = WorkerKeys(worker_id).ending
        for start in range(0, len(actions), self._batch):
            keys = list(ending)
            args: list[Any] = [_WORKER_LOST, _GRACE_EXPIRED, _IDLE_EXPIRED,
                               self._release_budget, self._lease_ms]
            for action, session_id, other_id in actions[start:start + self._batch]:
                k = session_keys(session_id)
                if k.worker.worker_id != worker_id:
                    raise ValueError(f"session {session_id} is not worker {worker_id}'s")
                keys += [k.record, k.input_log, k.output_log, k.output_channel]
                args += [action, session_id, other_id]
            done = await self._run(keys, args)
            self.ended += int(done[0])
            self.detached += int(done[1])
            self.released += EndedSession.parse_all(done[2])
