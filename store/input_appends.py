"""The input append's client half: where each session's input log stands, as its writer knows.

A session's input log has one writer at a time, the holder of its current generation, and its
entry IDs are ``<fence>-<index>`` (``store/lua/prelude.lua``). The writer learns the log's last
index and highest client seq from the open or the resume that attached it, and follows them
through each answer, so the script reads nothing on the way: it appends with ``XADD
<fence>-*``, and the index Redis gives must follow the one the writer last wrote
(``store/lua/append_input.lua``). A call sent again after a lost reply asks the script to read
the log's end instead, where the first run's call id tells it that run landed.

On the store's own connections (``store/script_lane.py``) an append needs nothing of the
script but what its writer already knows, so it goes without it: one ``XADD`` a session, one
``MULTI`` for the batch, with the push to the worker in it when the worker is pushed its input
(``store/keys.py``). For a pulling worker a session's commands of one call go in one entry,
packed (``store/logs.py``), whose ID the writer numbers (the index of its last command: each
command keeps its own index); otherwise each command is an entry Redis numbers, as the
script's are. Redis still refuses
every stale writer (a raised fence is an "equal or smaller" ID) and every closed session
(``NOMKSTREAM``); the push goes out whatever the ``XADD`` met, and the worker drops one whose
entries were refused, told of every raise of the fence first (``FenceRaised``,
``inference_worker/input_fences.py``). The writer deduplicates by client seq and checks the
caps against a bound of the log's length: the most entries it can hold, since only the
worker's trims change it while the fence stands. Whatever the writer cannot settle so goes to
the script: a log it does not know, entries that might reach a cap (the script counts
exactly), a refusal (the script says why), a reply lost (the script, as a resend, reads
whether the ``MULTI`` landed: it is all or nothing).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from store.answers import AppendResult, Lease, reply_text
from store.client import REDIS_ERRORS
from store.errors import Gone, LeaseLost, SessionGone
from store.keys import session_keys, worker_pulls_input
from store.logs import PACKED_FIELD, WriteToken, pack_commands
from store.pushes import InputPushed, encode_input_notice

__all__ = ["InputWriters", "Outcome", "PlainAppend", "TransactionLane", "append_input"]

_log = logging.getLogger(__name__)

#: The index a call gives for a log whose end the script must read.
UNKNOWN_INDEX = -1
#: How many entries a log holds, for a writer that does not know: the script counts them.
UNKNOWN_HELD = -1
#: The open creates the input log with one entry, its first fence's marker.
OPENED_HELD = 1

Outcome = AppendResult | LeaseLost | SessionGone
Entries = Sequence[tuple[int | None, bytes]]
Batch = Sequence[tuple[Lease, Entries]]
#: One entry of a plain append: its ID, the highest client seq up to it, its ``d`` and the
#: packed count's field and value (none for one command).
_Row = tuple[str, int, bytes, list[Any]]


class TransactionLane(Protocol):
    """Where a plain append goes: ``store/script_lane.py``, ``store/cluster_lane.py``."""

    async def transaction(self, key: str, commands: Sequence[Sequence[Any]]) -> list[Any]: ...


@dataclass(slots=True)
class _Position:
    """Where one session's input log stands, as its writer under ``generation`` left it:
    its last index, highest client seq, largest command (the byte cap's bound) and the most
    entries it may hold (``UNKNOWN_HELD``: not known)."""

    generation: int
    index: int
    client_seq: int
    biggest: int = 0
    held: int = UNKNOWN_HELD


@dataclass(frozen=True, slots=True)
class _Planned:
    """One session's part of a plain append: how many commands in how many entries (one
    ``XADD`` each; several commands share one when packed), and the client seq and the
    largest entry after them."""

    commands: int
    entries: int
    client_seq: int
    biggest: int

    @property
    def packed(self) -> bool:
        return self.entries < self.commands


@dataclass(frozen=True, slots=True)
class PlainAppend:
    """A batch's input as one ``MULTI`` of ``XADD``s: the commands (in the batch's order), a
    key of their slot, and each session's part."""

    key: str
    commands: list[list[Any]]
    sessions: list[_Planned]


class InputWriters:
    """The log positions of the sessions this process appends for; the script call's
    arguments and answers (``Scripts.append_input_many``) and the plain append's."""

    def __init__(self) -> None:
        self._positions: dict[str, _Position] = {}

    def attached(self, session_id: str, generation: int, *, index: int, client_seq: int,
                 biggest: int, held: int = UNKNOWN_HELD) -> None:
        """An open or a resume attached ``session_id`` under ``generation``: its input log
        stands at ``index``, its highest client seq at ``client_seq``, its largest command
        at ``biggest`` bytes, and it holds at most ``held`` entries."""
        self._positions[session_id] = _Position(generation, index, client_seq, biggest, held)

    def forget(self, session_id: str) -> None:
        """This process no longer writes for ``session_id``."""
        self._positions.pop(session_id, None)

    def arguments(self, batch: Batch, call_id: str, *, max_entries: int, max_bytes: int,
                  resend: bool) -> tuple[list[str], list[Any]]:
        """The script's KEYS and ARGV for ``batch`` (sessions of one worker); ``resend``:
        this call may have landed already, so every session reads its log's end."""
        worker = session_keys(batch[0][0].session_id).worker
        keys = [worker.input_channel]
        args: list[Any] = [max_entries, max_bytes, call_id,
                           "0" if worker_pulls_input(worker.worker_id) else "1"]
        for lease, entries in batch:
            k = session_keys(lease.session_id)
            if k.worker.worker_id != worker.worker_id:
                raise ValueError("append_input_many takes sessions of one worker only")
            keys += [k.record, k.input_log]
            known = self._positions.get(lease.session_id)
            if resend or known is None or known.generation != lease.generation:
                index, client_seq, biggest = UNKNOWN_INDEX, 0, 0
            else:
                index, client_seq, biggest = known.index, known.client_seq, known.biggest
            args += [lease.session_id, lease.epoch, lease.generation, index, client_seq,
                     biggest, len(entries)]
            for seq, payload in entries:
                args += ["" if seq is None else seq, payload]
        return keys, args

    def outcomes(self, batch: Batch, answers: Sequence[Any]) -> list[Outcome]:
        """Each session's outcome; the positions follow the answers. A log that went back
        (``rewound``) is an append of nothing whose last index is below the one the writer
        knew: the gateway's connection core ends such a session (``log_rewound``)."""
        results: list[Outcome] = []
        for (lease, _), answer in zip(batch, answers, strict=True):
            status, session_id = reply_text(answer[0]), lease.session_id
            if status == "stale":
                self.forget(session_id)
                results.append(LeaseLost(session_id, int(answer[3])))
            elif status not in ("ok", "full", "rewound"):
                self.forget(session_id)
                results.append(SessionGone(session_id, Gone(status)))
            else:
                last_index, client_seq = int(answer[4]), int(answer[2])
                self._positions[session_id] = _Position(lease.generation, last_index,
                                                        client_seq, int(answer[5]),
                                                        int(answer[6]))
                results.append(AppendResult(appended=int(answer[1]),
                                            last_client_seq=client_seq,
                                            last_index=last_index,
                                            backlog_full=status == "full"))
        return results

    def plain(self, batch: Batch, call_id: str, *, max_entries: int, max_bytes: int
              ) -> PlainAppend | None:
        """``batch`` as plain ``XADD``s, and for a pushed worker the push of them, or None
        where the script must take it: a session's log is not known well enough to be sure
        that its new entries pass the caps. For a pulling worker a session's new commands go
        in one entry, packed (``store/logs.py``), each keeping its index; for a pushed one,
        one entry each, as the script writes them."""
        worker_keys = session_keys(batch[0][0].session_id).worker
        worker, pushed = worker_keys.worker_id, not worker_pulls_input(worker_keys.worker_id)
        commands: list[list[Any]] = []
        sessions: list[_Planned] = []
        notices: list[InputPushed] = []
        for lease, entries in batch:
            k = session_keys(lease.session_id)
            known = self._positions.get(lease.session_id)
            if (k.worker.worker_id != worker or known is None
                    or known.generation != lease.generation or known.held == UNKNOWN_HELD):
                return None
            fresh = _fresh_commands(entries, known.client_seq)
            if not fresh:
                sessions.append(_Planned(0, 0, known.client_seq, known.biggest))
                continue
            fence = 2 * lease.generation
            if pushed or len(fresh) == 1:
                # One entry a command, numbered by Redis one above the log's last index (a
                # lower number tells a log that went back, see plain_outcomes), as the script
                # writes them: a pushed worker's calls mostly carry one command a session.
                rows: list[_Row] = [(f"{fence}-*", highest, payload, [])
                                    for highest, payload in fresh]
            else:
                # One entry, numbered by the holder: the index of its last command. A log
                # that went back shows its worker the indices missing before it.
                rows = [(f"{fence}-{known.index + len(fresh)}", fresh[-1][0],
                         pack_commands([command for _, command in fresh]),
                         [PACKED_FIELD, len(fresh)])]
            if not _within_caps(known, rows, max_entries, max_bytes):
                return None
            biggest = max(known.biggest, *(len(payload) for _, _, payload, _ in rows))
            for n, (entry_id, highest, payload, packed) in enumerate(rows, 1):
                # As the script writes them (store/lua/append_input.lua), the call's last
                # entry with the call id that tells a resend it landed.
                last = ["c", call_id, "n", len(fresh), "b", biggest] if n == len(rows) else []
                commands.append(["XADD", k.input_log, "NOMKSTREAM", entry_id, "d", payload,
                                 *packed, "h", highest, "e:" + lease.epoch, lease.generation,
                                 *last])
            sessions.append(_Planned(len(fresh), len(rows), fresh[-1][0], biggest))
            if pushed:
                notices.append(InputPushed(
                    lease.session_id, known.index + 1, [command for _, command in fresh],
                    WriteToken(lease.epoch, lease.generation), fence))
        if notices:
            # Published whatever the XADDs meet: the worker drops a push whose entries Redis
            # refused by its fence (inference_worker/input_fences.py).
            commands.append(["SPUBLISH", worker_keys.input_channel,
                             encode_input_notice(notices)])
        return PlainAppend(session_keys(batch[0][0].session_id).input_log, commands, sessions)

    def plain_outcomes(self, batch: Batch, plain: PlainAppend, replies: Sequence[Any]
                       ) -> tuple[list[Outcome | None], list[list[Any]]]:
        """Each session's outcome from the ``MULTI``'s replies (None: refused, the script
        must say why; it appended nothing), and the ``XDEL``s that take back an entry a
        rewound log numbered too low (as the script does; the connection core then ends the
        session)."""
        results: list[Outcome | None] = []
        take_back: list[list[Any]] = []
        at = 0
        for (lease, _), planned in zip(batch, plain.sessions, strict=True):
            mine, at = replies[at:at + planned.entries], at + planned.entries
            known = self._positions[lease.session_id]
            if not mine:
                results.append(AppendResult(appended=0, last_client_seq=known.client_seq,
                                            last_index=known.index))
                continue
            if not isinstance(mine[0], bytes):  # nil: no log; an error: the fence rose
                results.append(None)  # the MULTI is all or nothing per cause: none landed
                continue
            got = [int(reply.rpartition(b"-")[2]) for reply in mine]
            if not planned.packed and got[0] < known.index + 1:
                take_back.append(["XDEL", session_keys(lease.session_id).input_log, *mine])
                known.index, known.held = got[0] - 1, UNKNOWN_HELD
                results.append(AppendResult(appended=0, last_client_seq=known.client_seq,
                                            last_index=known.index))
                continue
            known.index, known.client_seq = got[-1], planned.client_seq
            known.biggest, known.held = planned.biggest, known.held + planned.entries
            results.append(AppendResult(appended=planned.commands,
                                        last_client_seq=planned.client_seq,
                                        last_index=known.index))
        return results, take_back


ScriptRun = Callable[[Sequence[str], Sequence[Any], Callable[[], Sequence[Any]]],
                     Awaitable[Any]]


async def append_input(writers: InputWriters, lane: TransactionLane | None, run_script: ScriptRun,
                       batch: Batch, call_id: str, *, max_entries: int, max_bytes: int
                       ) -> list[Outcome]:
    """Append ``batch`` (sessions of one worker): plainly where :meth:`InputWriters.plain`
    can and ``lane`` carries it, by the script for the rest. ``run_script(keys, args,
    resent)`` runs the input script, ``resent`` giving a resend's arguments."""

    async def by_script(part: Batch, *, resend: bool) -> list[Outcome]:
        def arguments(again: bool) -> tuple[list[str], list[Any]]:
            return writers.arguments(part, call_id, max_entries=max_entries,
                                     max_bytes=max_bytes, resend=again)
        keys, args = arguments(resend)
        answers = await run_script(keys, args, lambda: arguments(True)[1])
        return writers.outcomes(part, answers)

    plain = (None if lane is None else
             writers.plain(batch, call_id, max_entries=max_entries, max_bytes=max_bytes))
    if lane is None or plain is None:
        return await by_script(batch, resend=False)
    try:
        replies = await lane.transaction(plain.key, plain.commands) if plain.commands else []
    except REDIS_ERRORS:
        # It may have run (a lost reply), or did not (a refused queue, out of memory): the
        # script, as a resend, reads each log's end and appends what did not land.
        return await by_script(batch, resend=True)
    outcomes, take_back = writers.plain_outcomes(batch, plain, replies)
    if take_back:
        try:
            await lane.transaction(plain.key, take_back)
        except REDIS_ERRORS as exc:  # the session ends (log_rewound) in any case
            _log.warning("taking back input a rewound log numbered too low failed: %s", exc)
    refused = [i for i, outcome in enumerate(outcomes) if outcome is None]
    if refused:
        told = await by_script([batch[i] for i in refused], resend=False)
        for i, outcome in zip(refused, told, strict=True):
            outcomes[i] = outcome
    return [outcome for outcome in outcomes if outcome is not None]


def _fresh_commands(entries: Entries, client_seq: int) -> list[tuple[int, bytes]]:
    """The commands that are new: no client seq, or one above the highest appended (which
    rises as they are taken), each with the highest seq after it (the script's rule)."""
    fresh: list[tuple[int, bytes]] = []
    for seq, payload in entries:
        if seq is None or seq > client_seq:
            if seq is not None:
                client_seq = seq
            fresh.append((client_seq, payload))
    return fresh


def _within_caps(known: _Position, rows: Sequence[_Row], max_entries: int, max_bytes: int
                 ) -> bool:
    """Whether ``rows`` surely leave the log within both caps, by the script's own bound
    (``over_caps`` in ``store/lua/append_input.lua``) on at most ``known.held`` entries, none
    larger than ``known.biggest``."""
    if known.held - 1 + len(rows) > max_entries:
        return False
    if max_bytes <= 0:
        return True
    adding = sum(len(payload) for _, _, payload, _ in rows)
    return 2 * known.held * (known.biggest + 64) + 8192 + adding <= max_bytes
