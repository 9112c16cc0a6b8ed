"""Why a session ended: the reasons the gateway, the worker and the store's scripts write.

Part of the shared contract: it imports nothing from Redis, so the I/O-free cores can name a
reason. The Lua scripts get these values written into their text when they are loaded
(``store/lua/``), so a script can only write a reason that is a member here.

A client's own ``session.close`` reason is its text, not one of these: ``session.closed``
carries a plain string, and these are the reasons the service itself decides.
"""

from __future__ import annotations

import enum

__all__ = ["CloseReason"]


class CloseReason(enum.StrEnum):
    """The reason of a ``session.closed`` or ``session.expired`` the service decided."""

    #: A client's ``session.close`` without a usable reason of its own.
    CLIENT_CLOSE = "client_close"
    #: The model failed while serving the session.
    MODEL_ERROR = "model_error"
    #: The worker stopped and could not hand the session on.
    WORKER_SHUTDOWN = "worker_shutdown"
    #: The worker had no free slot for a session placed on it.
    NO_FREE_SLOT = "no_free_slot"
    #: A log went back (a failover lost acknowledged writes): ended loudly, not run on.
    LOG_REWOUND = "log_rewound"
    #: A bug or a failure the session cannot recover from.
    INTERNAL_ERROR = "internal_error"
    #: A gateway gave up on an open whose outcome it did not know.
    OPEN_ABANDONED = "open_abandoned"
    #: The worker's heartbeat lapsed and a reaper declared it lost.
    WORKER_LOST = "worker_lost"
    #: Detached longer than its disconnect grace (``session.expired``).
    DISCONNECT_GRACE_EXPIRED = "disconnect_grace_expired"
    #: No client activity for its idle TTL (``session.expired``).
    IDLE_TTL_EXPIRED = "idle_ttl_expired"
