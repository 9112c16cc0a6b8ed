"""The format versions of the records the store keeps in Redis hashes.

A record carries its format in the field ``v``, written when it is created (a session by its
open, a worker by its registration). Every reader checks it and refuses a record of another
format instead of guessing at its fields: a record without ``v`` or with a number this code
does not know was written by other code, and nothing it holds is trusted. A worker reads a
session's record once, when it adopts the session, and checks it there; its output appends
read no record. Change a number
when the fields or their meaning change in a way older readers would misread.
"""

from __future__ import annotations

from typing import Final

__all__ = ["FORMAT_FIELD", "SESSION_FORMAT", "WORKER_FORMAT"]

#: The hash field that holds a record's format version.
FORMAT_FIELD: Final = "v"
#: The format of a session record (``SessionKeys.record``).
SESSION_FORMAT: Final = "3"
#: The format of a worker record (``WorkerKeys.record``).
WORKER_FORMAT: Final = "1"
