"""The worker's settings: one frozen object, read once (see ``store/config.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from inference_worker.silero_vad import AUTO, VAD_CHOICES
from store.config import ENV_PREFIX, SettingsError

__all__ = ["WorkerSettings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    """One inference worker process."""

    redis_url: str = field(
        default="redis://127.0.0.1:6379/0", metadata={"help": "as for the gateway"}
    )
    backend: str = field(
        default="loopback", metadata={"help": "model backend: loopback, fake, moshi, cascade"}
    )
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
    model_path: str = field(
        default="", metadata={"help": "weights of the backend: a save_pretrained directory"}
    )
    device: str = field(default="cpu", metadata={"help": "torch device of the model (cuda, cpu)"})
    dtype: str = field(
        default="float32", metadata={"help": "torch dtype of the model (bfloat16, float32)"}
    )
    backend_options: str = field(
        default="", metadata={"help": "key=value,... passed to the backend (e.g. fake: step_ms=5)"}
    )
    tick_budget_fraction: float = field(
        default=0.8, metadata={"help": "admit sessions while the p99 tick time is under this"
                                       " fraction of the frame period"}
    )
    tick_window: int = field(
        default=250, metadata={"help": "ticks in the rolling window the p99 is taken over"}
    )
    metrics_port: int = field(
        default=0, metadata={"help": "serve Prometheus /metrics on this port; 0: off"}
    )
    vad: str = field(
        default=AUTO, metadata={"help": "turn detector of server_vad / semantic_vad: auto"
                                          " (Silero where installed, else energy), silero,"
                                          " energy"}
    )

    def __post_init__(self) -> None:
        """Refuse a ``vad`` that names no detector, naming the variable."""
        if self.vad not in VAD_CHOICES:
            raise SettingsError(f"{ENV_PREFIX}VAD={self.vad!r} is not one of "
                                + ", ".join(VAD_CHOICES))
