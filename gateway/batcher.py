"""Coalescing input appends across the sessions of one gateway process.

Every session served by one worker shares that worker's hash slot, so one script call can append
for all of them. Each connection hands its pending commands to the batcher and awaits the
answer; whatever queued up while the previous call for the same worker was in flight goes out
in the next single call. Under load that turns one Redis command per audio chunk per session
into one per batch (DESIGN §5, "coalesce chunks, pipeline"); when idle, a lone append goes out
at once, so nothing waits on a timer, and from the connection's own task: a drain task is
started only for what queued up behind a call in flight (at real-time load most calls carry
one append, and starting a task for each cost more than the call's own Python steps).

Ordering per session holds because a connection never has two appends in flight: it awaits its
answer before submitting more.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from runtime.ratelog import RateLimitedLog, cause_of
from store import AppendResult, Lease, LeaseLost, Scripts, SessionGone, StoreError
from store.keys import session_keys
from store.outages import OutageLog

__all__ = ["InputBatcher"]

_log = logging.getLogger(__name__)
# A bug here would fail every batch of every session: its traceback once per minute per cause.
_bugs = RateLimitedLog(_log, interval_s=60.0)

Entries = Sequence[tuple[int | None, bytes]]


@dataclass
class _Group:
    """The pending appends for one worker, and whether a call for it is in flight."""

    pending: list[tuple[Lease, Entries, asyncio.Future[AppendResult]]] = field(
        default_factory=list)
    busy: bool = False


class InputBatcher:
    """Batches :meth:`Scripts.append_input_many` calls per worker."""

    def __init__(self, scripts: Scripts, *, max_entries: int, max_bytes: int = 0,
                 max_batch: int = 256, outages: OutageLog | None = None) -> None:
        """``outages``: the process's outage log (by default one of its own)."""
        self._scripts = scripts
        self._outages = outages or OutageLog(_log)
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._max_batch = max_batch
        self._groups: dict[str, _Group] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def append(self, lease: Lease, entries: Entries) -> AppendResult:
        """Append ``entries`` for ``lease``'s session, batched with other sessions.

        Raises:
            LeaseLost: a newer attach holds the session.
            SessionGone: the session is closed or unknown.
            StoreError: Redis failed.
        """
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        worker = session_keys(lease.session_id).worker.worker_id  # cached: once per chunk
        group = self._groups.get(worker)
        if group is None:  # not setdefault: that would build a group per call to drop it
            group = self._groups[worker] = _Group()
        item = (lease, entries, future)
        if group.busy:
            group.pending.append(item)  # the call in flight's drain sends it next
        else:
            # Idle (nothing pending then): this call goes out from the caller's task. Its
            # cancellation (the connection ends) leaves no other session's append unsent:
            # what queues meanwhile is drained by a task of its own once this call is over.
            group.busy = True
            try:
                await self._send([item])
            finally:
                self._call_over(worker, group)
        return await future

    def _call_over(self, worker: str, group: _Group) -> None:
        """A call for ``worker`` ended: drain what queued behind it, or mark the group idle."""
        if group.pending:
            task = asyncio.create_task(self._drain(worker, group), name=f"append-{worker}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            group.busy = False
            self._groups.pop(worker, None)

    async def _drain(self, worker: str, group: _Group) -> None:
        try:
            while group.pending:
                batch = group.pending[:self._max_batch]
                del group.pending[:self._max_batch]
                await self._send(batch)
        finally:
            group.busy = False
            if not group.pending:
                self._groups.pop(worker, None)

    async def _send(self, batch: list[tuple[Lease, Entries, asyncio.Future[AppendResult]]]
                    ) -> None:
        try:
            outcomes = await self._scripts.append_input_many(
                [(lease, entries) for lease, entries, _ in batch],
                max_entries=self._max_entries, max_bytes=self._max_bytes)
        except Exception as exc:  # whatever failed, every waiter must hear it
            self._failed(exc)
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, _, future), outcome in zip(batch, outcomes, strict=True):
            if future.done():  # the connection gave up waiting (cancelled)
                continue
            if isinstance(outcome, LeaseLost | SessionGone):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _failed(self, exc: Exception) -> None:
        """A store error is each waiter's to report (its connection knows the session); a
        Redis error that escaped the store's wrapping is still an outage, told once per change;
        anything else is a bug in this gateway, logged with its traceback."""
        if isinstance(exc, StoreError) or self._outages.call_failed("input append", exc):
            return
        _bugs.exception(cause_of(exc), "append batch failed", exc)

    async def aclose(self) -> None:
        """Cancel in-flight calls (shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
