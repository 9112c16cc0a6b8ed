"""The worker's settings: one frozen object, read once (see ``store/config.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["WorkerSettings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    """One inference worker process."""

    redis_url: str = field(
        default="redis://127.0.0.1:6379/0", metadata={"help": "as for the gateway"}
    )
    backend: str = field(default="loopback", metadata={"help": "model backend: loopback"})
    slots: int = field(default=16, metadata={"help": "concurrent sessions this worker serves"})
    heartbeat_interval_s: float = field(
        default=1.0, metadata={"help": "how often the worker renews its registration"}
    )
    heartbeat_ttl_s: float = field(
        default=1.5, metadata={"help": "declared lost when not renewed for this long"}
    )
    input_poll_interval_s: float = field(
        default=1.0, metadata={"help": "safety read of the input logs when pushes are quiet"}
    )
    drain_timeout_s: float = field(
        default=30.0, metadata={"help": "on SIGTERM, sessions get this long to finish"}
    )

