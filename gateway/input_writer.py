"""One connection's input appends: fenced, in order, coalesced.

Whatever the client sends while one append is in flight goes out in the next single script
call, so a busy session costs one Redis round trip per batch, not per frame; for a worker
that reads its input once per tick, input is held until it completes a model frame
(``gateway/input_frames.py``), at most ``PULLED_INPUT_HOLD_S``. The store's answer goes to
the connection core (:class:`~gateway.protocol.connection.ConnectionCore`), whose actions the
driver runs. After a failed or refused append nothing more goes upstream on the connection:
a later batch landing would move ``last_client_seq`` past the failed commands, and the
resuming client would never send them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from contract.messages import Command, JsonObject, encode_message
from gateway.input_frames import FrameCuts, frame_cuts_for
from gateway.protocol.connection import ConnectionCore
from gateway.protocol.errors import InternalError
from gateway.services import GatewayServices
from store import Gone, Lease, LeaseLost, SessionGone, StoreError
from store.keys import session_keys, worker_pulls_input

__all__ = ["InputWriter"]

#: Reports a store call that failed: (duty in plain words, session id, the error).
StoreFailed = Callable[[str, str, StoreError], None]


class InputWriter:
    """The outbox of one connection and the task that appends it (:meth:`run`)."""

    def __init__(self, core: ConnectionCore, services: GatewayServices,
                 store_failed: StoreFailed) -> None:
        self._core = core
        self._svc = services
        self._store_failed = store_failed
        #: The lease appends are fenced on; None: no session yet, nothing is appended.
        self.lease: Lease | None = None
        self._outbox: list[tuple[int | None, Command]] = []
        self._since = 0.0  # when the oldest command in the outbox was read
        # Held input (a pulling worker's) is cut on the model's frames; None: never held.
        self._cuts: FrameCuts | None = None
        self._cut = asyncio.Event()  # the outbox ends on a cut: append it now
        self._ready = asyncio.Event()
        self._lock = asyncio.Lock()  # one append at a time, in order
        self._failed = False  # an append failed: nothing more goes upstream
        self._relay_in = services.metrics.relay_seconds.labels("in")

    def attach(self, lease: Lease, session: JsonObject | None,
               capabilities: JsonObject | None) -> None:
        """Append under ``lease`` from now on; ``session`` and ``capabilities``: its session's
        object and capabilities as the open or resume found them, whose input format and
        ``chunk_period_ms`` measure the model frames a pulling worker's input is cut on."""
        self.lease = lease
        self._cuts = None
        if self._svc.settings.pulled_input_hold_s and worker_pulls_input(
                session_keys(lease.session_id).worker.worker_id):
            self._cuts = frame_cuts_for(session, capabilities)

    def queue(self, entries: tuple[tuple[int | None, Command], ...]) -> None:
        """Queue commands for the next append; never waits."""
        if not self._outbox:
            self._since = time.monotonic()
        self._outbox.extend(entries)
        cuts = self._cuts
        if cuts is not None and any([cuts.cut_after(command) for _, command in entries]):
            self._cut.set()
        self._ready.set()

    async def run(self, step: Callable[[], Awaitable[None]]) -> None:
        """Append whatever is queued, batch after batch; ``step`` runs what the core decided
        on the store's answer (the usual answer decides nothing: no step to take)."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            await self._hold()
            await self.flush()
            if self._core.has_actions:
                await step()

    async def _hold(self) -> None:
        """Let more input join the oldest queued command until it completes a model frame
        (or is not audio), at most ``PULLED_INPUT_HOLD_S``, when the session's worker reads
        its input once per tick itself (a frame backend's): the model would not take it
        sooner, and one append of a frame costs Redis about what one of a single chunk does.
        Any other worker is woken by each append: no hold."""
        if self._cuts is None or not self._outbox:
            return
        deadline = self._since + self._svc.settings.pulled_input_hold_s
        if not self._cut.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline - time.monotonic()):
                    await self._cut.wait()
        # The relay time counts from the hold's end: it is the time the gateway adds beyond
        # what it chose to wait (the relay alert's target is a few ms).
        self._since = min(deadline, time.monotonic())

    async def flush(self) -> None:
        """Append what the outbox holds, in order after any append in flight; the core hears
        the store's answer."""
        async with self._lock:
            batch, self._outbox = self._outbox, []
            self._cut.clear()
            lease = self.lease
            if not batch or lease is None or self._failed:
                return
            since = self._since
            entries = [(seq, encode_message(command)) for seq, command in batch]
            try:
                appended = await self._svc.batcher.append(lease, entries)
                if appended.backlog_full:
                    self._failed = True
                    self._svc.metrics.commands_refused.inc(len(batch))
                    self._core.input_refused(len(batch),
                                             getattr(batch[0][1], "event_id", None))
                else:
                    self._svc.metrics.commands_appended.inc(len(entries))
                    self._relay_in.observe(time.monotonic() - since)
                    # Client activity: the idle TTL counts from the next lease renewal.
                    self._svc.leases.active(lease.session_id)
                self._core.input_appended(appended.last_index - appended.appended + 1,
                                          appended.last_index)
            except LeaseLost as exc:
                if exc.current_generation == lease.generation:
                    # Not replaced: our attachment lapsed (this gateway could not renew in
                    # time) and a reaper detached the session. Let the client resume it.
                    self._core.lease_lapsed()
                else:
                    self._core.lease_moved(exc.current_generation)
            except SessionGone as exc:
                if exc.status is Gone.CLOSED:
                    self._core.session_gone()
                else:
                    self._core.session_lost()
            except StoreError as exc:
                # Redis is failing: close 1011 so the client resumes (and resends by
                # client_seq) once the store is back, through any gateway.
                self._failed = True
                self._store_failed("input append", lease.session_id, exc)
                self._core.fail(InternalError(str(exc)))
