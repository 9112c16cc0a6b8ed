"""The pushes the store's scripts publish (``store/lua/``), decoded once into types.

Every push is a MessagePack array whose first element names its kind; the scripts (and the
plain input append, ``store/input_appends.py``) publish eight kinds on two sorts of channel:

* a session's output channel (``SessionKeys.output_channel``, the gateway listens):
  ``{'e', first_seq, {payload, ...}}`` (:class:`OutputPushed`, ``append_events`` and
  ``add_events``) and ``{'r', generation}`` (:class:`LeaseMoved`, ``RESUME``);
* a worker's input channel (``WorkerKeys.input_channel``, the worker listens):
  ``{'i', session_id, first_index, {payload, ...}, epoch, generation, fence}``
  (:class:`InputPushed`), ``{'I', session_id, {{session_id, first_index, {payload, ...},
  epoch, generation, fence}, ...}}``
  (:class:`InputBatch`, both ``APPEND_INPUT`` and the plain append), ``{'f', session_id,
  fence}`` (:class:`FenceRaised`, ``raise_fence``), ``{'o', session_id}``
  (:class:`SessionPlaced`, ``OPEN_SESSION``), ``{'c', session_id}`` (:class:`SessionEnded`,
  ``end_session``) and ``{'a', session_id}`` (:class:`SessionHandedOver`: the worker that
  handed the session over says so, :func:`encode_hand_over`).

:func:`decode_push` is the one place that reads those shapes; consumers ``match`` on the types.
A push is a wake-up, never the truth (the logs are): a malformed one is refused here
(:class:`PushDecodeError`) and its subscriber reads the log instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import msgpack  # type: ignore[import-untyped]

from store.logs import InputEntry, WriteToken

__all__ = [
    "FenceRaised",
    "InputBatch",
    "InputPushed",
    "LeaseMoved",
    "OutputPushed",
    "Push",
    "PushDecodeError",
    "SessionEnded",
    "SessionHandedOver",
    "SessionPlaced",
    "decode_push",
    "encode_hand_over",
    "encode_input_notice",
]


class PushDecodeError(ValueError):
    """A push that none of the scripts publishes in that shape."""


@dataclass(frozen=True, slots=True)
class OutputPushed:
    """Output events appended to a session's log, numbered from ``first_seq``. ``payloads``
    is shared by every handler of the channel: read it, never change it."""

    first_seq: int
    payloads: list[bytes]


@dataclass(frozen=True, slots=True)
class LeaseMoved:
    """A resume attached the session under ``generation``: older connections are replaced."""

    generation: int


@dataclass(frozen=True, slots=True)
class InputPushed:
    """Commands appended to one session's input log, indexed from ``first_index``, all
    written under ``token`` (None: the push names none, so it vouches for none of them) and
    the write fence ``fence`` (their IDs are ``<fence>-<index>``)."""

    session_id: str
    first_index: int
    payloads: list[bytes]
    token: WriteToken | None
    fence: int = 0

    def entries(self) -> list[InputEntry]:
        """The pushed commands as input log entries."""
        first, token, fence = self.first_index, self.token, self.fence
        return [InputEntry(first + offset, payload, token, fence)
                for offset, payload in enumerate(self.payloads)]


@dataclass(frozen=True, slots=True)
class InputBatch:
    """One input append for several sessions of the worker: one :class:`InputPushed` each."""

    parts: tuple[InputPushed, ...]


@dataclass(frozen=True, slots=True)
class FenceRaised:
    """A session's input log's write fence rose to ``fence`` (a resume or a detachment): an
    input push under an older fence that comes after this is one Redis refused the entries
    of (its writer lost its lease)."""

    session_id: str
    fence: int


@dataclass(frozen=True, slots=True)
class SessionPlaced:
    """A session was opened on the worker."""

    session_id: str


@dataclass(frozen=True, slots=True)
class SessionEnded:
    """A session of the worker ended (its terminal event is in its output log)."""

    session_id: str


@dataclass(frozen=True, slots=True)
class SessionHandedOver:
    """Another worker handed a session over to the worker (it owns it now, from its
    checkpoint: docs/design/hand-over.md)."""

    session_id: str


Push: TypeAlias = (
    OutputPushed | LeaseMoved | InputPushed | InputBatch | FenceRaised | SessionPlaced
    | SessionEnded | SessionHandedOver
)


def encode_hand_over(session_id: str) -> bytes:
    """The notice a worker publishes on its adopter's input channel once it handed
    ``session_id`` over (a wake-up: the adopter's poll finds the session too)."""
    packed: bytes = msgpack.packb(["a", session_id], use_bin_type=True)
    return packed


def _check_payloads(value: Any) -> None:
    if type(value) is not list:
        raise PushDecodeError("the entries are not an array")
    # One join checks that every entry is bytes (msgpack's raw strings are never another
    # bytes-like type); a walk over them would cost calls per entry on the relay's path.
    b"".join(value)


def _input(part: list[Any]) -> InputPushed:
    """``{session_id, first_index, {payload, ...}, epoch, generation, fence}``, the token
    and the fence optional."""
    payloads = part[2]
    _check_payloads(payloads)
    token = WriteToken(part[3].decode(), int(part[4])) if len(part) > 4 else None
    fence = int(part[5]) if len(part) > 5 else 0
    return InputPushed(part[0].decode(), int(part[1]), payloads, token, fence)


def encode_input_notice(parts: Sequence[InputPushed]) -> bytes:
    """The input push of one append (``parts``: one per session with new entries, at least
    one), as ``APPEND_INPUT`` publishes it: ``{'i', ...}`` for one session, ``{'I', ...}``
    for several."""
    fields = [[part.session_id, part.first_index, part.payloads,
               *((part.token.epoch, part.token.generation) if part.token else ("", 0)),
               part.fence] for part in parts]
    notice = ["i", *fields[0]] if len(fields) == 1 else ["I", fields[0][0], fields]
    packed: bytes = msgpack.packb(notice, use_bin_type=True)
    return packed


def decode_push(data: bytes) -> Push:
    """The push in ``data``, as a script published it.

    Raises:
        PushDecodeError: not MessagePack, or not a shape any script publishes.
    """
    try:
        push = msgpack.unpackb(data, raw=True)
        kind = push[0]
        # The two kinds of the relay's every chunk come first, read inline: each call on
        # this path repeats per chunk.
        if kind == b"e":
            payloads = push[2]
            if type(payloads) is not list:
                raise PushDecodeError("the entries are not an array")
            b"".join(payloads)  # every entry is bytes (see _check_payloads)
            return OutputPushed(int(push[1]), payloads)
        if kind == b"i":
            return _input(push[1:])
        if kind == b"r":
            return LeaseMoved(int(push[1]))
        if kind == b"I":
            return InputBatch(tuple(_input(part) for part in push[2]))
        if kind == b"o":
            return SessionPlaced(push[1].decode())
        if kind == b"c":
            return SessionEnded(push[1].decode())
        if kind == b"f":
            return FenceRaised(push[1].decode(), int(push[2]))
        if kind == b"a":
            return SessionHandedOver(push[1].decode())
    except PushDecodeError:
        raise
    except (msgpack.UnpackException, ValueError, TypeError, IndexError, KeyError,
            AttributeError) as exc:
        raise PushDecodeError(f"a malformed push: {exc!r}") from None
    raise PushDecodeError(f"unknown push kind {kind!r}")
