"""Every Prometheus metric of the gateway, defined in one place (namespace ``duplex_gateway``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["GatewayMetrics"]

_NS = "duplex_gateway"


class GatewayMetrics:
    """The gateway's metrics, on a registry of their own (one per app, so tests stay apart)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.connections = Gauge(f"{_NS}_connections", "Open websocket connections",
                                 registry=r)
        self.sessions_opened = Counter(f"{_NS}_sessions_opened", "Sessions placed on a worker",
                                       registry=r)
        self.resumes = Counter(f"{_NS}_resumes", "Resume attempts by outcome", ["outcome"],
                               registry=r)
        self.frames_sent = Counter(f"{_NS}_frames_sent", "Frames sent to clients", registry=r)
        self.commands_appended = Counter(f"{_NS}_commands_appended",
                                         "Client commands appended to input logs", registry=r)
        self.reaped = Counter(f"{_NS}_sessions_reaped", "Sessions ended by this reaper",
                              registry=r)
        self.connection_seconds = Histogram(
            f"{_NS}_connection_seconds", "Lifetime of websocket connections", registry=r,
            buckets=(0.1, 1, 10, 60, 300, 1800, 3600))
