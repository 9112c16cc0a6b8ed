"""Playback truth: each response's ledger of what was generated and what the client says it
played and committed (seed §6.4), fed by ``playback.ack``.

:class:`PlaybackLedgers` keeps the ledgers of a session's :data:`LEDGERS` newest responses.
The conversation core opens one per response, counts the audio it generates, closes it when
the response ends, and applies the client's acks: values only move forward, and an ack that
claims more than was generated (or commits more than was played) is refused. What an
interrupted answer keeps in the history is its ledger's committed milliseconds. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from contract import messages as msg
from contract.messages import JsonObject
from inference_worker.conversation.profiles import BYTES_PER_SECOND
from inference_worker.conversation.refusals import Refusal, RefusalCode
from inference_worker.untrusted import describe

__all__ = ["LEDGERS", "Ledger", "PlaybackLedgers", "signalled_ack"]

#: The ledgers of this many newest responses are kept: an ack for an older one is refused.
LEDGERS: Final = 16
#: The longest position an ack may name (24 hours of audio, as ``playback.ack``'s bound).
_MAX_MS: Final = 86_400_000
_BYTES_PER_MS: Final = BYTES_PER_SECOND // 1000


@dataclass(slots=True, kw_only=True)
class Ledger:
    """One response's playback ledger, in bytes of pcm16 24 kHz audio generated and
    milliseconds the client acknowledged; each only moves forward."""

    response_id: str
    item_id: str
    generated: int = 0  # bytes of audio written (what the worker sent is what it generated)
    played_ms: int = 0
    committed_ms: int = 0
    acknowledged: bool = False  # the client sent a playback.ack for it
    ended: bool = False  # completed, cancelled or failed
    interrupted: bool = False  # cancelled or failed: only what was heard stays

    @property
    def generated_ms(self) -> int:
        """Milliseconds generated, rounded up (a client that played every byte may say so)."""
        return -(-self.generated // _BYTES_PER_MS)

    @property
    def heard_ms(self) -> int | None:
        """What an interrupted answer keeps in the history: the committed milliseconds once
        acknowledged (None: keep it whole, not interrupted or never acknowledged)."""
        return self.committed_ms if self.interrupted and self.acknowledged else None

    def acknowledgement(self) -> msg.PlaybackAcknowledged:
        """``playback.acknowledged`` with this ledger; ``history_committed`` when the
        conversation's item holds what was acknowledged (an interrupted answer, cut to its
        committed part; a completed one stays whole, whatever was played). ``truncate`` stays
        false: no ack asks to cut a whole answer (the seed's wire never carries it)."""
        return msg.PlaybackAcknowledged(
            response_id=self.response_id, item_id=self.item_id,
            generated_ms=self.generated_ms, sent_ms=self.generated_ms,
            played_ms=self.played_ms, committed_ms=self.committed_ms,
            history_committed=self.heard_ms is not None)


class PlaybackLedgers:
    """The ledgers of a session's newest responses, oldest first."""

    __slots__ = ("_ledgers",)

    def __init__(self) -> None:
        self._ledgers: dict[str, Ledger] = {}

    def __iter__(self) -> Iterator[Ledger]:
        return iter(self._ledgers.values())

    def snapshot(self) -> tuple[Ledger, ...]:
        """Copies of the ledgers, oldest first (a checkpoint's)."""
        return tuple(dataclasses.replace(ledger) for ledger in self._ledgers.values())

    def restore(self, ledgers: tuple[Ledger, ...]) -> None:
        """Continue from a :meth:`snapshot` (its ledgers are copied, not shared)."""
        self._ledgers = {ledger.response_id: dataclasses.replace(ledger) for ledger in ledgers}

    def open(self, response_id: str, item_id: str) -> None:
        """A response opened (the oldest ledger goes beyond :data:`LEDGERS`)."""
        self._ledgers[response_id] = Ledger(response_id=response_id, item_id=item_id)
        while len(self._ledgers) > LEDGERS:
            del self._ledgers[next(iter(self._ledgers))]

    def generated(self, response_id: str, size: int) -> None:
        """``size`` more bytes of the response's audio were written."""
        ledger = self._ledgers.get(response_id)
        if ledger is not None:
            ledger.generated += size

    def ended(self, response_id: str, *, interrupted: bool) -> Ledger | None:
        """The response ended (``interrupted``: cancelled or failed); its ledger."""
        ledger = self._ledgers.get(response_id)
        if ledger is not None:
            ledger.ended, ledger.interrupted = True, interrupted
        return ledger

    def acknowledge(self, command: msg.AckPlayback, active: str | None) -> Ledger | Refusal:
        """Apply a ``playback.ack`` (``active``: the response playing, if any); the ledger it
        moved, or why it is refused (nothing moves then)."""
        ledger = self._named(command, active)
        if isinstance(ledger, Refusal):
            return ledger
        committed = command.played_ms if command.committed_ms is None else command.committed_ms
        if command.played_ms > ledger.generated_ms:
            return Refusal(code=RefusalCode.INVALID_VALUE, param="played_ms",
                           message=f"played_ms {command.played_ms} is longer than the"
                           f" {ledger.generated_ms} ms of audio of response"
                           f" {ledger.response_id}")
        if committed > command.played_ms:
            return Refusal(code=RefusalCode.INVALID_VALUE, param="committed_ms",
                           message="committed_ms cannot exceed played_ms: only audio the user"
                           " heard can be committed to the conversation")
        ledger.acknowledged = True
        ledger.played_ms = max(ledger.played_ms, command.played_ms)
        ledger.committed_ms = max(ledger.committed_ms, committed)
        return ledger

    def _named(self, command: msg.AckPlayback, active: str | None) -> Ledger | Refusal:
        """The ledger an ack names: by response id, by item id, or (neither) the active
        response's, else the newest."""
        if command.response_id is not None:
            ledger = self._ledgers.get(command.response_id)
            if ledger is None:
                return Refusal(code=RefusalCode.PLAYBACK_ITEM_NOT_FOUND, param="response_id",
                               message=f"no response {describe(command.response_id)} to"
                               " acknowledge (unknown, or too old)")
            if command.item_id is not None and command.item_id != ledger.item_id:
                return Refusal(code=RefusalCode.PLAYBACK_ITEM_MISMATCH, param="item_id",
                               message=f"item {describe(command.item_id)} is not the item of"
                               f" response {ledger.response_id} ({ledger.item_id})")
            return ledger
        if command.item_id is not None:
            for ledger in self._ledgers.values():
                if ledger.item_id == command.item_id:
                    return ledger
            return Refusal(code=RefusalCode.PLAYBACK_ITEM_NOT_FOUND, param="item_id",
                           message=f"no response item {describe(command.item_id)} to"
                           " acknowledge (unknown, or too old)")
        if active is not None and active in self._ledgers:
            return self._ledgers[active]
        if self._ledgers:
            return next(reversed(self._ledgers.values()))
        return Refusal(code=RefusalCode.PLAYBACK_ITEM_NOT_FOUND,
                       message="no response to acknowledge playback of")


def signalled_ack(payload: JsonObject, event_id: str | None) -> msg.AckPlayback | Refusal:
    """The ``playback.ack`` a ``turn.signal`` ``playback_ack`` stands for: the seed applies
    its payload's ``played_ms`` (required) and ``committed_ms``, ``response_id``, ``item_id``
    (optional) as an ack; a value of the wrong kind is refused, naming it in the payload."""
    positions: dict[str, int | None] = {}
    for name in ("played_ms", "committed_ms"):
        value = payload.get(name)
        if value is None and name == "committed_ms":
            positions[name] = None
        elif isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_MS:
            positions[name] = value
        else:
            return Refusal(code=RefusalCode.INVALID_VALUE, param=f"payload.{name}",
                           message=f"Invalid value for 'payload.{name}': an integer from 0 to"
                           f" {_MAX_MS} is required.")
    ids: dict[str, str | None] = {}
    for name in ("response_id", "item_id"):
        value = payload.get(name)
        if value is not None and not isinstance(value, str):
            return Refusal(code=RefusalCode.INVALID_TYPE, param=f"payload.{name}",
                           message=f"Invalid type for 'payload.{name}': a string is required.")
        ids[name] = value
    played = positions["played_ms"]
    assert played is not None  # required above
    return msg.AckPlayback(played_ms=played, committed_ms=positions["committed_ms"],
                           response_id=ids["response_id"], item_id=ids["item_id"],
                           event_id=event_id)
