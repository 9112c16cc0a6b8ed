"""The input append's client half: where each session's input log stands, as its writer knows.

A session's input log has one writer at a time, the holder of its current generation, and its
entry IDs are ``<fence>-<index>`` (``store/lua/prelude.lua``). The writer learns the log's last
index and highest client seq from the open or the resume that attached it, and follows them
through each answer, so the script reads nothing on the way: it appends with ``XADD
<fence>-*``, and the index Redis gives must follow the one the writer last wrote
(``store/lua/append_input.lua``). A call sent again after a lost reply asks the script to read
the log's end instead, where the first run's call id tells it that run landed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from store.answers import AppendResult, Lease
from store.errors import Gone, LeaseLost, SessionGone
from store.keys import session_keys, worker_pulls_input

__all__ = ["InputWriters", "Outcome"]

#: The index a call gives for a log whose end the script must read.
UNKNOWN_INDEX = -1

Outcome = AppendResult | LeaseLost | SessionGone
Entries = Sequence[tuple[int | None, bytes]]


@dataclass(slots=True)
class _Position:
    """Where one session's input log stands, as its writer under ``generation`` left it:
    its last index, highest client seq, and largest command (the byte cap's bound)."""

    generation: int
    index: int
    client_seq: int
    biggest: int = 0


class InputWriters:
    """The log positions of the sessions this process appends for, and the script call's
    arguments and answers (``Scripts.append_input_many``)."""

    def __init__(self) -> None:
        self._positions: dict[str, _Position] = {}

    def attached(self, session_id: str, generation: int, *, index: int, client_seq: int,
                 biggest: int) -> None:
        """An open or a resume attached ``session_id`` under ``generation``: its input log
        stands at ``index``, its highest client seq at ``client_seq``, its largest command
        at ``biggest`` bytes."""
        self._positions[session_id] = _Position(generation, index, client_seq, biggest)

    def forget(self, session_id: str) -> None:
        """This process no longer writes for ``session_id``."""
        self._positions.pop(session_id, None)

    def arguments(self, batch: Sequence[tuple[Lease, Entries]], call_id: str, *,
                  max_entries: int, max_bytes: int, resend: bool
                  ) -> tuple[list[str], list[Any]]:
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

    def outcomes(self, batch: Sequence[tuple[Lease, Entries]], answers: Sequence[Any]
                 ) -> list[Outcome]:
        """Each session's outcome; the positions follow the answers. A log that went back
        (``rewound``) is an append of nothing whose last index is below the one the writer
        knew: the gateway's connection core ends such a session (``log_rewound``)."""
        results: list[Outcome] = []
        for (lease, _), answer in zip(batch, answers, strict=True):
            status, session_id = _text(answer[0]), lease.session_id
            if status == "stale":
                self.forget(session_id)
                results.append(LeaseLost(session_id, int(answer[3])))
            elif status not in ("ok", "full", "rewound"):
                self.forget(session_id)
                results.append(SessionGone(session_id, Gone(status)))
            else:
                last_index, client_seq = int(answer[4]), int(answer[2])
                self._positions[session_id] = _Position(lease.generation, last_index,
                                                        client_seq, int(answer[5]))
                results.append(AppendResult(appended=int(answer[1]),
                                            last_client_seq=client_seq,
                                            last_index=last_index,
                                            backlog_full=status == "full"))
        return results


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
