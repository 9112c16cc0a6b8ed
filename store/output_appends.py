"""The worker's output append: one call per flush and home for all the sessions it writes,
each session's events under the numbers the worker gave them (``server_event_seq``).

Two scripts write them. ``store/lua/append_output.lua`` reads each session's log end first
(its last event, to tell a resend, a gap or a conflict) and does the rare parts: a terminal
event, a session object, a checkpoint, a bound read from the record.
``store/lua/flush_output.lua`` reads nothing per session: it is for a session whose log the
worker knows ends just before its first event, because its last append was answered on a
connection the store has kept since (``OutputAppend.top_known_at``). Every failover that can
lose an acknowledged write breaks or redirects the store's connection (a master that
crashed, or one demoted: Sentinel cuts its clients, a Cluster redirects them), so while none
did, the log still ends there. Redis refuses the rest itself: an event stored already (a
resend: "equal or smaller" ID), a session that ended (its terminal event moved the log's
last ID to the highest there is), a log that is gone (``NOMKSTREAM``). Whatever the fast
script was refused goes to the full script in a second call, which says why; so does every
session of a fast call that failed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from contract.messages import SessionClosed, encode_message
from store.answers import OutputAppend, json_argument, reply_text
from store.client import REDIS_ERRORS
from store.errors import (
    Gone,
    Mismatch,
    OutputMismatch,
    SessionGone,
    WorkerFenced,
    raise_if_cancelled,
)
from store.keys import WorkerKeys, session_keys

__all__ = ["OutputOutcome", "RunScript", "append_output"]

#: One session's outcome: the seq of its first event (0: it had none), or its error.
OutputOutcome = int | SessionGone | OutputMismatch
#: Runs a script with these keys and arguments and returns its answer.
RunScript = Callable[[Sequence[str], Sequence[Any]], Awaitable[Any]]

# The fast script's answer per session: written (and pushed) whole.
_WRITTEN = "o"


async def append_output(batch: Sequence[OutputAppend], *, careful: RunScript,
                        fast: RunScript | None, route_changes: int | None,
                        ) -> list[OutputOutcome]:
    """Append ``batch``, one home (hash slot) at a time: a worker writes the sessions it
    opened, and those it took over from other homes (docs/design/hand-over.md).

    Raises:
        WorkerFenced: the worker was declared lost (nothing more was written).
        StoreUnavailable: (from ``careful``) the store could not be reached.
    """
    homes: dict[str, list[int]] = {}
    for at, item in enumerate(batch):
        homes.setdefault(session_keys(item.session_id).worker.worker_id, []).append(at)
    outcomes: list[OutputOutcome] = [0] * len(batch)
    for positions in homes.values():
        written = await _append_home([batch[at] for at in positions], careful=careful,
                                     fast=fast, route_changes=route_changes)
        for at, outcome in zip(positions, written, strict=True):
            outcomes[at] = outcome
    return outcomes


async def _append_home(batch: Sequence[OutputAppend], *, careful: RunScript,
                       fast: RunScript | None, route_changes: int | None,
                       ) -> list[OutputOutcome]:
    """Append ``batch`` (sessions of ONE home): the sessions whose log end is known at
    ``route_changes`` by ``fast`` (sent once: a failed call is sent again as ``careful``),
    the others, and those ``fast`` was refused, by ``careful``. The home's worker writing
    its own sessions (owner epoch 1: a home never takes a session back) is refused whole
    once lost; a worker writing sessions it took over is fenced by their owner epochs."""
    worker = session_keys(batch[0].session_id).worker
    outcomes: list[OutputOutcome | None] = [None] * len(batch)
    known = ([] if fast is None or route_changes is None else
             [at for at, item in enumerate(batch) if _end_known(item, route_changes)])
    if known and fast is not None:
        letters = await _flush(fast, worker, [batch[at] for at in known])
        for at, letter in zip(known, letters, strict=True):
            if letter == _WRITTEN:
                outcomes[at] = batch[at].first_seq if batch[at].events else 0
    rest = [at for at, outcome in enumerate(outcomes) if outcome is None]
    if rest:
        answers = await _append_carefully(careful, worker, [batch[at] for at in rest])
        for at, outcome in zip(rest, answers, strict=True):
            outcomes[at] = outcome
    return [outcome for outcome in outcomes if outcome is not None]


def _end_known(item: OutputAppend, route_changes: int) -> bool:
    """Whether ``item`` may go without its log's end read: nothing but events and a trim,
    numbered, with the bound named, after an append answered on these connections."""
    return (item.top_known_at == route_changes and item.first_seq > 0
            and item.close_reason is None and item.session is None
            and item.checkpoint is None and item.output_log_max_entries is not None)


async def _flush(fast: RunScript, worker: WorkerKeys, batch: Sequence[OutputAppend]) -> str:
    """The fast script's letters for ``batch`` (all of them "sent again" when it failed)."""
    keys = [worker.record]
    args: list[Any] = [_home_writes(batch)]
    for item in batch:
        k = session_keys(item.session_id)
        keys += [k.output_log, k.output_channel, k.input_log, k.record]
        args += [item.owner_epoch, item.first_seq, item.output_log_max_entries, _trim_id(item),
                 len(item.events), *item.events]
    try:
        answer = await fast(keys, args)
    except REDIS_ERRORS:
        raise_if_cancelled()
        return "r" * len(batch)  # whether any of it landed, the full script finds out
    letters = reply_text(answer)
    if letters == "fenced":
        raise WorkerFenced(f"worker {worker.worker_id} was declared lost")
    return letters


async def _append_carefully(careful: RunScript, worker: WorkerKeys,
                            batch: Sequence[OutputAppend]) -> list[OutputOutcome]:
    keys = worker.ending
    args: list[Any] = [_home_writes(batch)]
    for item in batch:
        k = session_keys(item.session_id)
        keys += [k.record, k.input_log, k.output_log, k.output_channel]
        terminal = b""
        if item.close_reason is not None:
            terminal = encode_message(SessionClosed(reason=item.close_reason))
        bound, checkpoint = item.output_log_max_entries, item.checkpoint
        if checkpoint is not None and (not item.events or not item.first_seq
                                       or item.close_reason is not None):
            raise ValueError("a checkpoint rides numbered events of an open session")
        args += [item.session_id, item.owner_epoch, item.first_seq,
                 "" if bound is None else bound, _trim_id(item), terminal,
                 item.close_reason or "", json_argument(item.session),
                 *(("", "", "") if checkpoint is None else
                   (checkpoint.applied, checkpoint.keep, checkpoint.core)),
                 len(item.events), *item.events]
    answers = await careful(keys, args)
    if answers and reply_text(answers[0]) == "fenced":
        raise WorkerFenced(f"worker {worker.worker_id} was declared lost")
    results: list[OutputOutcome] = []
    for item, answer in zip(batch, answers, strict=True):
        status = reply_text(answer[0])
        if status == "ok":
            results.append(int(answer[1]))
        elif status in (Mismatch.GAP, Mismatch.CONFLICT):
            results.append(OutputMismatch(item.session_id, Mismatch(status), item.first_seq,
                                          int(answer[1])))
        else:
            results.append(SessionGone(item.session_id, Gone(status)))
    return results


def _home_writes(batch: Sequence[OutputAppend]) -> str:
    """The scripts' first argument: '1' when the home's own worker writes (refused whole once
    lost), '0' when another that took these sessions over does."""
    return "1" if all(item.owner_epoch == 1 for item in batch) else "0"


def _trim_id(item: OutputAppend) -> str:
    """The ID of the input entry ``item`` trims its input log to ('' none)."""
    return f"{item.input_trim_fence}-{item.input_trim_to}" if item.input_trim_to else ""
