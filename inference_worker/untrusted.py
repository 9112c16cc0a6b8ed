"""Rules for values a client controls, which the worker never trusts (the gateway checks them
too, but a worker serves many sessions: one bad value must not reach code that cannot take it).

* Nesting: a ``session.update`` deeper than :data:`MAX_SESSION_DEPTH` is refused before any
  recursive code (a deep copy, a merge, JSON encoding) sees it, so every recursion the worker
  runs over session values is bounded by this constant, never by the client.
* Close reasons: ``session.close`` carries a free-form ``reason`` that the store writes back
  as ``session.closed``; one it could not encode is replaced by :data:`DEFAULT_CLOSE_REASON`.
* Messages: a refusal that quotes a client value quotes a short, shallow rendering of it.

Nothing here does I/O.
"""

from __future__ import annotations

import reprlib
from typing import Any, Final

__all__ = [
    "DEFAULT_CLOSE_REASON",
    "MAX_CLOSE_REASON_BYTES",
    "MAX_SESSION_DEPTH",
    "close_reason",
    "describe",
    "nests_deeper_than",
]

#: Objects and arrays nested inside one another in a session object, the session object itself
#: counted. Generous for tool parameter schemas, far below Python's recursion limit.
MAX_SESSION_DEPTH: Final = 32
#: Longest ``session.close`` reason kept, in UTF-8 bytes.
MAX_CLOSE_REASON_BYTES: Final = 256
DEFAULT_CLOSE_REASON: Final = "client_close"

_SHORT = reprlib.Repr()
_SHORT.maxlevel = 2  # shallow: reprlib recurses, so its depth is what bounds it
_SHORT.maxstring = 60
_SHORT.maxother = 60
_SHORT.maxdict = _SHORT.maxlist = 4


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` (decoded JSON) nests objects and arrays more than ``limit`` deep.

    Iterative, so a value of any depth is measured without recursion; it stops at the first
    path that is too deep.
    """
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


def close_reason(value: Any) -> str:
    """The reason a session ends with, from a client's ``session.close``.

    A non-empty string that is valid UTF-8 (no lone surrogates) and at most
    :data:`MAX_CLOSE_REASON_BYTES` long is kept; anything else becomes
    :data:`DEFAULT_CLOSE_REASON`.
    """
    if not isinstance(value, str) or not value:
        return DEFAULT_CLOSE_REASON
    try:
        encoded = value.encode("utf-8")  # strict: the store's client encodes it so
    except UnicodeEncodeError:
        return DEFAULT_CLOSE_REASON
    if len(encoded) > MAX_CLOSE_REASON_BYTES:
        return DEFAULT_CLOSE_REASON
    return value


def describe(value: Any) -> str:
    """A short rendering of a client value for an error message: at most two levels deep and
    a few dozen characters per part, whatever the value's size or depth."""
    return _SHORT.repr(value)
