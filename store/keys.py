"""Every Redis key and channel name, in one place.

Cluster rule (DESIGN.md §2.1): one Lua script may only touch keys of one hash slot. Every key
of a session therefore carries the hash tag of the worker that serves it, and that tag travels
inside the session id (``sess_<worker>.<random>``). A session, its two logs, its worker's
record, its worker's input channel and the deadline set it sits in all live in one slot, so
placement, fencing and reaping are single-slot scripts.

The only cross-slot key is the worker directory (``dg:workers``): a sorted set of worker ids
scored by heartbeat deadline, read by placement and by the reaper, never written together
with a session.
"""

from __future__ import annotations

import functools
import re
import secrets

__all__ = [
    "GATEWAY_DIRECTORY",
    "SESSION_KEY_SUFFIXES",
    "WORKER_DIRECTORY",
    "SessionKeys",
    "WorkerKeys",
    "client_secret",
    "held_member",
    "new_gateway_id",
    "new_session_id",
    "new_worker_id",
    "placed_on",
    "session_keys",
    "tenant_opens",
    "tenant_sessions",
    "worker_of_session",
    "worker_pulls_input",
]

_PREFIX = "dg"
#: The worker directory: member = worker id, score = heartbeat deadline (ms, Redis clock).
WORKER_DIRECTORY = f"{_PREFIX}:workers"
#: The gateway directory: member = gateway id, score = the end of its listing (ms, Redis
#: clock), renewed by each pass of its reaper; the reapers share the workers out among these.
GATEWAY_DIRECTORY = f"{_PREFIX}:gateways"

_WORKER_ID = re.compile(r"^[wp][0-9a-f]{12}$")
_GATEWAY_ID = re.compile(r"^g[0-9a-f]{12}$")
_SESSION_ID = re.compile(r"^sess_([wp][0-9a-f]{12})\.([0-9a-f]{32})$")
#: The first letter of the id of a worker that reads its sessions' input logs on its own
#: clock (a frame backend, once per tick): the input appends send it no push.
_PULLS_INPUT = "p"


_TENANT_ID = re.compile(r"^[0-9a-z_-]{1,64}$")


def tenant_sessions(tenant_id: str) -> str:
    """Sorted set of a tenant's live sessions (member: session id, score: reservation expiry
    ms). Its own hash slot: reserving is a separate step from placing (DESIGN §2.1)."""
    if not _TENANT_ID.match(tenant_id):
        raise ValueError(f"not a tenant id: {tenant_id!r}")
    return f"{_PREFIX}:{{t.{tenant_id}}}:sessions"


def tenant_opens(tenant_id: str) -> str:
    """Sorted set of a tenant's recent session opens (member: call id, score: open time ms),
    for the new-sessions-per-minute limit; the tenant's slot, beside its session set."""
    if not _TENANT_ID.match(tenant_id):
        raise ValueError(f"not a tenant id: {tenant_id!r}")
    return f"{_PREFIX}:{{t.{tenant_id}}}:opens"


_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def client_secret(digest: str) -> str:
    """A client secret's record, by the SHA-256 hex digest of the secret (never the secret).

    One key, its own slot (no hash tag: secrets spread over the Cluster); it expires with the
    secret.
    """
    if not _DIGEST.match(digest):
        raise ValueError(f"not a SHA-256 hex digest: {digest!r}")
    return f"{_PREFIX}:secret:{digest}"


def new_gateway_id() -> str:
    """A fresh gateway process id: the holder of that process's attachment leases."""
    return "g" + secrets.token_hex(6)


def new_worker_id(*, pulls_input: bool = False) -> str:
    """A fresh worker incarnation id. A restarted worker never reuses one (fencing).

    ``pulls_input``: the worker reads its sessions' input logs itself, once per tick, so the
    input appends push it nothing (:func:`worker_pulls_input`). The id says so because every
    append names the session, and so its worker, already: the mode costs no lookup, and it
    never changes for the id.
    """
    return (_PULLS_INPUT if pulls_input else "w") + secrets.token_hex(6)


def worker_pulls_input(worker_id: str) -> bool:
    """Whether the worker ``worker_id`` reads its input logs itself (see :func:`new_worker_id`)."""
    return worker_id.startswith(_PULLS_INPUT)


def new_session_id(worker_id: str) -> str:
    """A never-reused session id that carries the serving worker's hash tag."""
    if not _WORKER_ID.match(worker_id):
        raise ValueError(f"not a worker id: {worker_id!r}")
    return f"sess_{worker_id}.{secrets.token_hex(16)}"


def worker_of_session(session_id: str) -> str:
    """The worker id embedded in a session id.

    Raises:
        ValueError: the string is not a session id this store allocated.
    """
    match = _SESSION_ID.match(session_id)
    if match is None:
        raise ValueError(f"not a session id: {session_id!r}")
    return match.group(1)


class WorkerKeys:
    """Keys of one worker; all share the hash tag ``{<worker_id>}``."""

    __slots__ = ("adopted", "deadlines", "ended", "gateways", "held", "input_channel", "moved",
                 "record", "session_prefix", "sessions", "worker_id")

    def __init__(self, worker_id: str) -> None:
        if not _WORKER_ID.match(worker_id):
            raise ValueError(f"not a worker id: {worker_id!r}")
        base = f"{_PREFIX}:{{{worker_id}}}"
        self.worker_id = worker_id
        #: hash: v (its format, store/formats.py), slots, used, alive_until, state
        #: (live|busy|draining|lost), profile (the
        #: JSON default session and capabilities of its new sessions, see store/directory.py),
        #: backend (its name, from registration) and tick_p99_ms (its engine's p99 tick time,
        #: every beat; see store/census.py).
        self.record = f"{base}:worker"
        #: set of the session ids placed on this worker and not yet closed.
        self.sessions = f"{base}:sessions"
        #: sorted set: session id -> next deadline (idle or grace expiry), ms.
        self.deadlines = f"{base}:deadlines"
        #: sharded pub/sub channel: new input entries and control notices for this worker.
        self.input_channel = f"{base}:input"
        #: list of ``<tenant> <session id>``: sessions that ended, until a reaper releases their
        #: tenant places (the tenant's key is in another hash slot than the session's end).
        self.ended = f"{base}:ended"
        #: sorted set: gateway id -> end of its attachment lease on this worker (ms); renewed
        #: once per gateway and worker, whatever the number of sessions (DESIGN §2.6).
        self.gateways = f"{base}:gateways"
        #: sorted set, every score 0: ``<gateway id> <session id>`` for each session a gateway
        #: holds attached on this worker (:func:`held_member`), so the sessions of one gateway
        #: are one lexicographic range of one key.
        self.held = f"{base}:held"
        #: set of the sessions opened here (their home: their keys stay in this slot) that
        #: another worker took over and serves now (docs/design/hand-over.md); the reapers
        #: keep reaping this slot while it holds any, whatever this worker's state.
        self.moved = f"{base}:moved"
        #: sorted set: session id -> when its slot here was reserved (ms), for each session
        #: homed elsewhere that this worker serves, or is about to take over.
        self.adopted = f"{base}:adopted"
        #: what each of this worker's session keys starts with; a session's keys are this, the
        #: random part of its id and one of :data:`SESSION_KEY_SUFFIXES`.
        self.session_prefix = f"{base}:s:"


    @property
    def ending(self) -> list[str]:
        """The keys every script that can end a session here receives, in this order (its
        terminal event releases the slot, queues the tenant's place, lets go of leases)."""
        return [self.record, self.sessions, self.deadlines, self.input_channel, self.ended,
                self.gateways, self.held, self.moved]


def held_member(gateway_id: str, session_id: str) -> str:
    """The member of :attr:`WorkerKeys.held` that says ``gateway_id`` holds ``session_id``."""
    if not _GATEWAY_ID.match(gateway_id):
        raise ValueError(f"not a gateway id: {gateway_id!r}")
    return f"{gateway_id} {session_id}"


#: The suffixes of a session's record, input log, output log and output channel keys, after
#: :attr:`WorkerKeys.session_prefix` and the random part of the session id.
SESSION_KEY_SUFFIXES = (":rec", ":in", ":out", ":events")


class SessionKeys:
    """Keys of one session, plus its worker's keys (same hash slot)."""

    __slots__ = ("abandoned", "input_log", "output_channel", "output_log", "record", "session_id",
                 "worker")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.worker = WorkerKeys(worker_of_session(session_id))
        base = self.worker.session_prefix + session_id.rsplit(".", 1)[1]
        record, input_log, output_log, output_channel = SESSION_KEY_SUFFIXES
        #: hash: the session record (v, its format: store/formats.py; state, generation,
        #: epoch, token digest, counters, the JSON public session and capabilities a resume
        #: announces, its owner and owner epoch, and its checkpoint: docs/design/store.md).
        self.record = base + record
        #: stream of client commands, entry id ``<n>-0`` for input index n.
        self.input_log = base + input_log
        #: stream of events, entry id ``<seq>-0`` for server_event_seq.
        self.output_log = base + output_log
        #: sharded pub/sub channel that pushes each output entry to the attached gateway.
        self.output_channel = base + output_channel
        #: tombstone written by a gateway that gave up on an open (DESIGN.md §2.10).
        self.abandoned = f"{base}:abandoned"


@functools.lru_cache(maxsize=4096)
def session_keys(session_id: str) -> SessionKeys:
    """:class:`SessionKeys` of ``session_id``, shared: the input and output appends name every
    session of a call once per relayed chunk, and building the names (a regular expression
    and a dozen strings) costs more than the rest of the call's arguments. Never change the
    object returned.

    Raises:
        ValueError: the string is not a session id this store allocated (not cached).
    """
    return SessionKeys(session_id)


def placed_on(session_id: str, worker_id: str) -> str:
    """``session_id``, checked to be a session placed on ``worker_id`` (a push names it).

    Raises:
        ValueError: not a session id, or one placed on another worker.
    """
    if session_keys(session_id).worker.worker_id != worker_id:
        raise ValueError(f"{session_id} is not placed on worker {worker_id}")
    return session_id
