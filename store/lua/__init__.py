"""Every Lua script of the store, and nothing else: their source is the ``*.lua`` files beside
this module, loaded once at import.

Each script is a compare-and-set: it reads what it must check and writes only if the check holds,
atomically, so no read-then-write race exists in Python (style rule 6). Each starts with its
KEYS/ARGV/returns contract and binds them to named locals.

Conventions shared by all scripts:

* Time is the Redis server's own clock (``TIME``), in milliseconds, so every gateway, worker and
  reaper agrees on deadlines without trusting their host clocks. Redis >= 5 replicates script
  effects, so non-deterministic commands are allowed.
* Every key a script touches is passed in ``KEYS``, named by ``store/keys.py``, and carries one
  hash tag, so Redis Cluster keeps them in one slot. The reaper too: ``reap.lua`` touches only
  the worker's keys and names the sessions that need it, whose keys ``reap_sessions.lua`` then
  receives.
* Reasons a script writes are ``REASON.<value>`` in the source, and record formats
  ``SESSION_FORMAT`` / ``WORKER_FORMAT`` in the field ``FORMAT_FIELD``: the loader writes in
  their values from ``contract/reasons.py`` and ``store/formats.py``. Every script that reads a
  record checks its format first and answers ``other_format`` for another one, without reading
  further.
* Push notices are MessagePack arrays (``cmsgpack`` ships with Redis and Valkey) published with
  ``SPUBLISH`` (sharded pub/sub, also valid on a single node). Output notice: ``{"e", first_seq,
  {payload, ...}}`` or ``{"r", generation}`` (the lease moved to a newer connection). Worker
  notice: ``{"i", session_id, first_index, {payload, ...}, epoch, generation, fence}`` (the
  fencing token the entries were written under, and the write fence of their IDs), or for
  several sessions at once ``{"I", session_id, {{session_id, first_index, {payload, ...},
  epoch, generation, fence}, ...}}``, ``{"o", session_id}`` (placed) or ``{"c", session_id}``
  (closed).
* Statuses come back as short strings that ``store/scripts.py`` turns into the enums of
  ``store/answers.py``.
* Every script is safe to send twice. A connection can break after Redis ran a script and
  before its answer arrived; ``Scripts`` then sends it again, so a second run must change
  nothing: open recognises its own token digest, resume its call id, a resent input append
  its call id on the input log's last entry, output appends their events' numbers (the worker
  numbers them); close, detach, trim, reap, heartbeat and tenant reservations check state
  that the first run already set.
"""

from __future__ import annotations

import re
from importlib import resources

from contract.reasons import CloseReason
from store.formats import FORMAT_FIELD, SESSION_FORMAT, WORKER_FORMAT

__all__ = [
    "ABANDON_OPEN",
    "ADOPT_SESSION",
    "APPEND_INPUT",
    "APPEND_OUTPUT",
    "CLOSE_SESSION",
    "DETACH",
    "FLUSH_OUTPUT",
    "GATEWAY_ANNOUNCE",
    "GATEWAY_LEASE",
    "OPEN_SESSION",
    "REAP",
    "REAP_SESSIONS",
    "RELEASE_SLOT",
    "RESERVE_SLOT",
    "RESUME",
    "TENANT_OPEN_RATE",
    "TENANT_RESERVE",
    "WORKER_HEARTBEAT",
    "WRITE_CHECKPOINT",
    "reasons_written",
]

# Names the Lua source uses for values Python owns, written into the text as string literals
# when it is loaded: the scripts and the Python that reads what they wrote cannot drift apart.
# ``REASON.<value>`` is a member of CloseReason (an unknown one fails the import).
_CONSTANTS = {"FORMAT_FIELD": FORMAT_FIELD, "SESSION_FORMAT": SESSION_FORMAT,
              "WORKER_FORMAT": WORKER_FORMAT}
_REASON = re.compile(r"\bREASON\.([a-z_]+)\b")
_CONSTANT = re.compile(r"\b(" + "|".join(_CONSTANTS) + r")\b")


def _reason(match: re.Match[str]) -> str:
    return f"'{CloseReason(match.group(1)).value}'"


def _source(name: str) -> str:
    text = (resources.files(__name__) / f"{name}.lua").read_text(encoding="utf-8")
    text = _REASON.sub(_reason, text)
    return _CONSTANT.sub(lambda match: f"'{_CONSTANTS[match.group(1)]}'", text)


def reasons_written() -> frozenset[str]:
    """Every ``REASON.<value>`` the scripts' source names (all of them CloseReason members,
    or this module would not have loaded)."""
    found: set[str] = set()
    for entry in resources.files(__name__).iterdir():
        if entry.name.endswith(".lua"):
            found.update(_REASON.findall(entry.read_text(encoding="utf-8")))
    return frozenset(found)


# Shared helpers, prepended to the scripts that need them.
_PRELUDE = _source("prelude")

OPEN_SESSION = _PRELUDE + _source("open_session")
RESUME = _PRELUDE + _source("resume")
DETACH = _PRELUDE + _source("detach")
TENANT_RESERVE = _PRELUDE + _source("tenant_reserve")
TENANT_OPEN_RATE = _PRELUDE + _source("tenant_open_rate")
APPEND_INPUT = _PRELUDE + _source("append_input")
APPEND_OUTPUT = _PRELUDE + _source("append_output")
# The output flush's fast path reads and ends no session: none of the helpers.
FLUSH_OUTPUT = _source("flush_output")
CLOSE_SESSION = _PRELUDE + _source("close_session")
ABANDON_OPEN = _PRELUDE + _source("abandon_open")
REAP = _PRELUDE + _source("reap")
REAP_SESSIONS = _PRELUDE + _source("reap_sessions")
GATEWAY_LEASE = _PRELUDE + _source("gateway_lease")
GATEWAY_ANNOUNCE = _PRELUDE + _source("gateway_announce")
WORKER_HEARTBEAT = _PRELUDE + _source("worker_heartbeat")
WRITE_CHECKPOINT = _PRELUDE + _source("write_checkpoint")
RESERVE_SLOT = _PRELUDE + _source("reserve_slot")
RELEASE_SLOT = _source("release_slot")
ADOPT_SESSION = _PRELUDE + _source("adopt_session")
