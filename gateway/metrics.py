"""Every Prometheus metric of the gateway, defined in one place (namespace ``duplex_gateway``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from store.heap import GENERATIONS, PAUSE_BUCKETS
from store.loop_lag import LAG_BUCKETS, PROBE_INTERVAL_S

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
        self.resumes.labels(outcome="ok")  # exported from the start; refusals as they come
        self.frames_sent = Counter(f"{_NS}_frames_sent", "Frames sent to clients", registry=r)
        self.commands_appended = Counter(f"{_NS}_commands_appended",
                                         "Client commands appended to input logs", registry=r)
        self.commands_refused = Counter(
            f"{_NS}_commands_refused",
            "Client commands not appended because their session's worker was behind (its"
            " unread input at INPUT_LOG_MAX_ENTRIES); each refusal is an input_backpressure"
            " error", registry=r)
        self.output_backpressure = Counter(
            f"{_NS}_output_backpressure",
            "Times a client's untaken output went over OUTPUT_BACKPRESSURE_EVENTS or _BYTES and"
            " its session's worker was told to end the active response (output_backpressure)",
            registry=r)
        self.output_stalls = Counter(
            f"{_NS}_output_stalls",
            "Connections closed 1013 output_stalled: a send to the client stayed blocked for"
            " OUTPUT_STALL_TIMEOUT_S (the session is detached, resumable)", registry=r)
        self.reaped = Counter(f"{_NS}_sessions_reaped", "Sessions ended by this reaper",
                              registry=r)
        self.lease_renewals = Counter(
            f"{_NS}_lease_renewals",
            "Attachment lease renewals sent (one per worker this gateway serves, per round)",
            registry=r)
        self.lapsed_detached = Counter(
            f"{_NS}_sessions_lease_detached",
            "Sessions this reaper detached because their gateway's attachment lease lapsed",
            registry=r)
        self.paced_seconds = Counter(
            f"{_NS}_paced_seconds",
            "Time client reads were held back because a connection was over its frame, byte"
            " or audio rate", registry=r)
        # DESIGN §6: relay and resume latency as the gateway itself adds them.
        self.relay_seconds = Histogram(
            f"{_NS}_relay_seconds",
            "Time a relayed message spends in this gateway: direction=in, from a client "
            "command read to its append acknowledged by Redis; direction=out, from a push "
            "taken to its events written to the client", ["direction"], registry=r,
            buckets=(0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256,
                     0.512, 1.024))
        for direction in ("in", "out"):  # exported from the start, so rate() sees the rise
            self.relay_seconds.labels(direction=direction)
        self.resume_seconds = Histogram(
            f"{_NS}_resume_seconds",
            "From session.resume read to the replay read from the log (or the refusal)",
            registry=r, buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
        # store/heap.py: the collector's passes stop every thread; what startup built is
        # frozen out of them.
        self.gc_pause_seconds = Histogram(
            f"{_NS}_gc_pause_seconds",
            "Length of each pass of Python's cyclic garbage collector, which stops the"
            " process, by generation (2: a full pass)", ["generation"], registry=r,
            buckets=PAUSE_BUCKETS)
        # Bound now: observed from inside a pass, which may have started under the lock
        # that labels() takes (store.heap.CollectorPauses says why that would deadlock).
        self._gc_pause_by_generation = tuple(
            self.gc_pause_seconds.labels(generation=str(generation))
            for generation in GENERATIONS)
        # store/loop_lag.py: a step that holds the event loop delays every connection.
        self.event_loop_lag_seconds = Histogram(
            f"{_NS}_event_loop_lag_seconds",
            f"How much later than due the event loop woke a probe due every"
            f" {PROBE_INTERVAL_S:g} s (the length of a step that held it)",
            registry=r, buckets=LAG_BUCKETS)
        self.gc_frozen_objects = Gauge(
            f"{_NS}_gc_frozen_objects",
            "Objects of the startup heap moved out of the collector's passes", registry=r)
        self.connection_seconds = Histogram(
            f"{_NS}_connection_seconds", "Lifetime of websocket connections", registry=r,
            buckets=(0.1, 1, 10, 60, 300, 1800, 3600))

    def observe_gc_pause(self, generation: int, seconds: float) -> None:
        """One collector pass (:class:`store.heap.CollectorPauses`): no ``labels()`` here."""
        self._gc_pause_by_generation[generation].observe(seconds)
