"""The log codec: a command or an event as the bytes of one log entry, and back."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

import orjson

from contract.messages.commands import Command
from contract.messages.events import Event, SessionClosed, SessionExpired

_COMMAND_CLASSES: tuple[type[Any], ...] = typing.get_args(Command)
_EVENT_CLASSES: tuple[type[Any], ...] = typing.get_args(Event)
# Derived from the unions, so that a class added to one cannot be left out of the codec.
_CLASSES: tuple[type[Any], ...] = (*_COMMAND_CLASSES, *_EVENT_CLASSES)
_BY_KIND: dict[str, type[Any]] = {cls.KIND: cls for cls in _CLASSES}
if len(_BY_KIND) != len(_CLASSES):  # two classes of one KIND would decode as each other
    raise RuntimeError("every command and event class needs a KIND of its own")
# The (at most one) bytes field of each class; found once, not per message.
_BYTES_FIELD: dict[type[Any], str | None] = {
    cls: next((f.name for f in dataclasses.fields(cls) if f.type in ("bytes", bytes)), None)
    for cls in _CLASSES
}
TERMINAL_KINDS = frozenset({SessionClosed.KIND, SessionExpired.KIND})
# The tuple fields of each class: JSON reads them back as lists, and a list would make two
# equal messages compare unequal.
_TUPLE_FIELDS: dict[type[Any], tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls) if str(f.type).startswith("tuple"))
    for cls in _CLASSES
}

# Each class's fields with their defaults, found once, not per message (dataclasses.fields
# builds its tuple on every call).
_FIELD_DEFAULTS: dict[type[Any], tuple[tuple[str, Any], ...]] = {
    cls: tuple((f.name, f.default) for f in dataclasses.fields(cls)) for cls in _CLASSES
}

# orjson writes a dataclass or a datetime where the standard library refuses one: handing them
# back makes it refuse them too, so the standard library decides (and refuses) them. The one
# home of that rule: the gateway's frame encoder passes it too.
ORJSON_REFUSE = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME

# JSON never contains a raw NUL (it would be escaped as \u0000), so NUL safely ends the header.
_SEPARATOR = b"\0"


class MessageDecodeError(ValueError):
    """A log entry that this version cannot decode (corrupt, or from a newer writer)."""


def encode_message(message: Command | Event) -> bytes:
    """Encode a command or event as ``<json header>\\0<raw bytes field>``."""
    cls = type(message)
    blob_field = _BYTES_FIELD[cls]
    header: dict[str, Any] = {"k": cls.KIND}
    blob = b""
    for name, default in _FIELD_DEFAULTS[cls]:
        value = getattr(message, name)
        if name == blob_field:
            blob = value
        elif value is not None and value != default:
            header[name] = value
    return _encode_header(header) + _SEPARATOR + blob


def _encode_header(header: dict[str, Any]) -> bytes:
    """The header as JSON: orjson's bytes (a fifth of the standard library's cost) when they
    are what the standard library would have read back the same; else the standard library's.

    orjson refuses an integer beyond 64 bits and a lone surrogate, and writes NaN and the
    infinities as ``null``: a header holding a ``null`` (values of None are left out of the
    header, so only a nested one) is written by the standard library too, which keeps NaN as
    NaN. Either writer's output is read by :func:`decode_message`.
    """
    try:
        raw = orjson.dumps(header, option=ORJSON_REFUSE)
    except orjson.JSONEncodeError:
        return json.dumps(header, separators=(",", ":")).encode()
    if b"null" in raw:
        return json.dumps(header, separators=(",", ":")).encode()
    return raw


# orjson reads JSON text as the standard library does (a value for a value, an error for an
# error: tests/contract/test_messages.py holds it to that) but for an integer beyond 64 bits,
# which it reads as a float. Every such integer is a run of 19 digits or more; so is nothing
# else a header is likely to hold. Finding one costs a translate and a search, both in C.
_DIGITS_ONLY = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x2E for byte in range(256))
_LONG_DIGIT_RUN = b"0" * 19


def load_header(head: bytes) -> Any:
    """``json.loads(head)``, through orjson where it reads the same: about eight times
    faster, and no Python frames (a header is decoded once per relayed chunk in the gateway
    and in the worker). A header with a run of 19 digits goes to the standard library, as
    does one orjson refuses (NaN and the infinities, which the standard library writes and
    reads back; a lone surrogate; nesting past orjson's limit), whose error stands."""
    if _LONG_DIGIT_RUN not in head.translate(_DIGITS_ONLY):
        try:
            return orjson.loads(head)
        except orjson.JSONDecodeError:
            pass
    return json.loads(head)


def decode_message(data: bytes) -> Command | Event:
    """Decode what :func:`encode_message` wrote.

    Raises:
        MessageDecodeError: unknown kind, bad JSON, or fields that do not fit the class.
    """
    head, sep, blob = data.partition(_SEPARATOR)
    if not sep:
        raise MessageDecodeError("missing header separator")
    try:
        header = load_header(head)
        cls = _BY_KIND[header.pop("k")]
        blob_field = _BYTES_FIELD[cls]
        if blob_field is not None:
            header[blob_field] = blob
        for name in _TUPLE_FIELDS[cls]:
            if name in header:
                header[name] = tuple(header[name])
        message: Command | Event = cls(**header)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        # AttributeError: a JSON header that is not an object; RecursionError: absurd nesting.
        raise MessageDecodeError(f"undecodable log entry: {exc!r}") from exc
    return message


def is_terminal(event: Event) -> bool:
    """Whether ``event`` ends its session (exactly one per session, always last)."""
    return isinstance(event, SessionClosed | SessionExpired)




def decode_event(data: bytes) -> Event:
    """Decode an output-log entry.

    Raises:
        MessageDecodeError: not an event.
    """
    message = decode_message(data)
    if not isinstance(message, _EVENT_CLASSES):
        raise MessageDecodeError(f"expected an event, got {type(message).__name__}")
    return message  # type: ignore[no-any-return]


def decode_command(data: bytes) -> Command:
    """Decode an input-log entry.

    Raises:
        MessageDecodeError: not a command.
    """
    message = decode_message(data)
    if not isinstance(message, _COMMAND_CLASSES):
        raise MessageDecodeError(f"expected a command, got {type(message).__name__}")
    return message  # type: ignore[no-any-return]
