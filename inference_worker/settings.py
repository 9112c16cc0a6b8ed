"""The worker's settings: one frozen object, read once (see ``runtime/config.py``).

Ranges are checked as the object is built; the torch device only once a backend that runs on
torch is about to load (:func:`check_torch_device`), so a worker without torch never imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inference_worker.backends.registry import BACKENDS
from inference_worker.turn_detection.silero import AUTO, VAD_CHOICES
from runtime.config import (
    PORT,
    POSITIVE,
    POSITIVE_COUNT,
    BindAddress,
    Choices,
    ModelNames,
    MoreThan,
    Range,
    RedisUrl,
    SettingsError,
    assignment,
    check_fields,
    env_name,
)

__all__ = ["TORCH_BACKENDS", "WorkerSettings", "check_torch_device"]

#: The backends whose model runs on a torch device (``DEVICE``, ``DTYPE``).
TORCH_BACKENDS = frozenset({"moshi"})
#: The dtypes the torch backends load weights in.
_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    """One inference worker process."""

    redis_url: str = field(
        default="redis://127.0.0.1:6379/0",
        metadata={"help": "as for the gateway", "accepts": RedisUrl()},
    )
    backend: str = field(
        default="loopback",
        metadata={"help": "model backend: loopback, fake, moshi, cascade, recording",
                  "accepts": Choices(tuple(BACKENDS))},
    )
    served_model_names: tuple[str, ...] = field(
        default=(),
        metadata={"help": "the model names this worker serves, comma-separated, its own name"
                          " first (sessions report it), then aliases; clients choose a model by"
                          " any of them; empty: the backend's name",
                  "accepts": ModelNames(), "flag": "--served-model-name"},
    )
    slots: int = field(
        default=16,
        metadata={"help": "concurrent sessions this worker serves", "accepts": POSITIVE_COUNT},
    )
    heartbeat_interval_s: float = field(
        default=1.0,
        metadata={"help": "how often the worker renews its registration", "accepts": POSITIVE},
    )
    redis_start_timeout_s: float = field(
        default=60.0,
        metadata={"help": "at start, wait this long for Redis to answer, then exit 2",
                  "accepts": POSITIVE},
    )
    # A TTL no longer than the interval lapses between two beats: the worker is declared lost
    # while healthy, and never rejoins.
    heartbeat_ttl_s: float = field(
        default=1.5,
        metadata={"help": "declared lost when not renewed for this long (more than"
                          " HEARTBEAT_INTERVAL_S)", "accepts": POSITIVE,
                  "relation": MoreThan("heartbeat_interval_s")},
    )
    input_poll_interval_s: float = field(
        default=1.0,
        metadata={"help": "safety read of the input logs when pushes are quiet",
                  "accepts": POSITIVE},
    )
    drain_timeout_s: float = field(
        default=30.0,
        metadata={"help": "on SIGTERM, sessions get this long to be handed over to another"
                          " worker, or to finish",
                  "flag": "--drain-timeout"},
    )
    checkpoint_interval_s: float = field(
        default=2.0,
        metadata={"help": "a session that changed is checkpointed at least this often (and at"
                          " each response end and item change); 0: no checkpoints"},
    )
    # What a session's input log holds for its checkpoint counts against Redis's memory per
    # session (DESIGN §5: 256 KiB), and against the gateway's input bounds (a quarter at most).
    checkpoint_hold_entries: int = field(
        default=256,
        metadata={"help": "input entries a session's log keeps for its last checkpoint, at"
                          " most a quarter of its INPUT_LOG_MAX_ENTRIES; past them the trim"
                          " overtakes it", "accepts": POSITIVE_COUNT},
    )
    checkpoint_hold_bytes: int = field(
        default=128 << 10,
        metadata={"help": "bytes of input commands a session's log keeps for its last"
                          " checkpoint, at most a quarter of its INPUT_LOG_MAX_BYTES; past them"
                          " the trim overtakes it", "accepts": POSITIVE_COUNT},
    )
    model_path: str = field(
        default="", metadata={"help": "weights of the backend: a save_pretrained directory"}
    )
    device: str = field(default="cpu", metadata={"help": "torch device of the model (cuda, cpu)"})
    dtype: str = field(
        default="float32",
        metadata={"help": "torch dtype of the model (bfloat16, float32)",
                  "accepts": Choices(_DTYPES)},
    )
    backend_options: str = field(
        default="", metadata={"help": "key=value,... passed to the backend (e.g. fake: step_ms=5)"}
    )
    # Off by default: each batch size a tick spans is compiled the first time it runs, on the
    # model thread, so the first ticks at every new size are slow.
    moshi_cuda_graphs: bool = field(
        default=False,
        metadata={"help": "moshi: replay the temporal and depth transformers as CUDA graphs"
                          " (torch.compile, reduce-overhead); needs DEVICE cuda; true or false"},
    )
    tick_budget_fraction: float = field(
        default=0.8,
        metadata={"help": "admit sessions while the p99 tick time is under this fraction of"
                          " the frame period", "accepts": Range(0, 1, low_open=True)},
    )
    tick_window: int = field(
        default=250,
        metadata={"help": "ticks in the rolling window the p99 is taken over",
                  "accepts": POSITIVE_COUNT},
    )
    metrics_port: int = field(
        default=0,
        metadata={"help": "serve Prometheus /metrics on this port; 0: off", "accepts": PORT},
    )
    # Metrics say how busy the worker is and which backend it runs: loopback unless an
    # operator chooses to expose them.
    metrics_host: str = field(
        default="127.0.0.1",
        metadata={"help": "address the /metrics listener binds", "accepts": BindAddress()},
    )
    vad: str = field(
        default=AUTO, metadata={"help": "turn detector of server_vad / semantic_vad: auto"
                                          " (Silero where installed, else energy), silero,"
                                          " energy", "accepts": Choices(tuple(VAD_CHOICES))}
    )

    def __post_init__(self) -> None:
        """Refuse a value out of its field's range, a TTL a beat cannot renew in time, or
        CUDA graphs for a backend that has none."""
        check_fields(self)
        if self.moshi_cuda_graphs and self.backend != "moshi":
            raise SettingsError(f"{env_name('moshi_cuda_graphs')}=true: only the moshi backend"
                                f" has CUDA graphs, and {env_name('backend')} is {self.backend}")

    @property
    def models(self) -> tuple[str, ...]:
        """The model names this worker serves: its own first."""
        return self.served_model_names or (self.backend,)


def check_torch_device(device: str, label: str) -> None:
    """Refuse a torch device the installed torch cannot use; ``label`` names its flag or variable.

    Imports torch: call it only for a backend in :data:`TORCH_BACKENDS`, before loading it.

    Raises:
        SettingsError: torch is not installed, ``device`` does not parse, or names a device
            this machine does not have; one line.
    """
    where = assignment(label, device)
    try:
        import torch
    except ImportError:
        raise SettingsError(f"{where}: the installed packages have no torch (install the"
                            " [moshi] extra)") from None
    usable = _usable_devices(torch)
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise SettingsError(f"{where}: expected a torch device, one of"
                            f" {', '.join(usable)}") from None
    if parsed.type != "cpu" and str(parsed) not in usable:
        raise SettingsError(f"{where}: this machine's torch {torch.__version__} can use"
                            f" {', '.join(usable)}")


def _usable_devices(torch: Any) -> list[str]:
    """``cpu``, then each CUDA device (by index) and ``mps`` where torch can reach them."""
    usable = ["cpu"]
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        usable += ["cuda", *(f"cuda:{index}" for index in range(count))]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        usable += ["mps", "mps:0"]
    return usable
