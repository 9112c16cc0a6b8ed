"""Every Prometheus metric of the gateway, defined in one place (namespace ``duplex_gateway``).

The relay's own counts (a frame sent, a command appended, a relay time) happen once per audio
chunk per direction. prometheus_client's types take about ten Python calls and a thread lock
per observation there (a gateway serves from one event loop thread); :class:`HotCounter` and
:class:`HotHistogram` are plain numbers that the registry reads when it is scraped, with the
same names, help texts, samples and buckets.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from runtime.heap import GENERATIONS, PAUSE_BUCKETS
from runtime.loop_lag import LAG_BUCKETS, PROBE_INTERVAL_S
from store.replacement import ReplaceStatus

__all__ = ["GatewayMetrics", "HotCounter", "HotHistogram"]

_NS = "duplex_gateway"


class HotCounter(Collector):
    """A counter for the event loop's hot path, exported as a prometheus_client ``Counter``
    would be (``<name>_total``, ``<name>_created``). Not thread-safe: one thread counts."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self._name = name
        self._documentation = documentation
        self._created = time.time()
        self.value = 0.0
        registry.register(self)

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:  # as prometheus_client's Counter: a counter only goes up
            raise ValueError("counters can only be incremented by non-negative amounts")
        self.value += amount

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self._name, self._documentation, value=self.value,
                                  created=self._created)


class HotHistogram(Collector):
    """A histogram with one label for the event loop's hot path, exported as a
    prometheus_client ``Histogram`` would be (cumulative ``_bucket``s up to ``+Inf``,
    ``_count``, ``_sum``, ``_created``). Not thread-safe: one thread observes. Every label
    value is exported from the start, so ``rate()`` sees the first rise."""

    def __init__(self, name: str, documentation: str, label: str, values: Sequence[str],
                 buckets: Sequence[float], registry: CollectorRegistry) -> None:
        self._name = name
        self._documentation = documentation
        self._label = label
        self._bounds = tuple(float(bound) for bound in buckets)
        created = time.time()
        self._children = {value: HotHistogramChild(self._bounds, created) for value in values}
        registry.register(self)

    def labels(self, value: str) -> HotHistogramChild:
        """The series for ``value`` (one of those given when it was made)."""
        return self._children[value]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=[self._label])
        for value, child in self._children.items():
            counts = list(child.counts)  # one copy, so the buckets and _count agree
            cumulative, buckets = 0, []
            for bound, count in zip((*self._bounds, float("inf")), counts, strict=True):
                cumulative += count
                buckets.append((_le(bound), float(cumulative)))
            family.add_metric([value], buckets, child.sum)
        for value, child in self._children.items():
            family.add_sample(f"{self._name}_created", {self._label: value}, child.created)
        yield family


class HotHistogramChild:
    """One labelled series of a :class:`HotHistogram`."""

    __slots__ = ("_bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...], created: float) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last: +Inf
        self.sum = 0.0
        self.created = created

    def observe(self, amount: float) -> None:
        # A bucket's bound is inclusive (le): bisect_left puts an amount equal to it there.
        self.counts[bisect.bisect_left(self._bounds, amount)] += 1
        self.sum += amount


def _le(bound: float) -> str:
    """A bucket bound as prometheus_client writes it."""
    return "+Inf" if bound == float("inf") else repr(bound)


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
        self.frames_sent = HotCounter(f"{_NS}_frames_sent", "Frames sent to clients", r)
        self.commands_appended = HotCounter(f"{_NS}_commands_appended",
                                            "Client commands appended to input logs", r)
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
        self.re_placements = Counter(
            f"{_NS}_re_placements",
            "Sessions of lost workers this reaper offered to live workers, by outcome: moved"
            " (re-placed from its checkpoint), no_checkpoint, no_room, not_owned, failed (all"
            " but moved end worker_lost)", ["outcome"], registry=r)
        for outcome in ReplaceStatus:  # each exported at 0 from the start
            self.re_placements.labels(outcome)
        self.worker_reaps = Counter(
            f"{_NS}_worker_reaps",
            "Reaps of one worker this reaper ran (only the workers of its share:"
            " REAPERS_PER_WORKER of the live gateways reap each)", registry=r)
        self.lease_renewals = Counter(
            f"{_NS}_lease_renewals",
            "Attachment lease renewals sent (one per worker this gateway serves, per round)",
            registry=r)
        self.lease_lapse_closes = Counter(
            f"{_NS}_lease_lapse_closes",
            "Connections closed 1012 lease_lapsed: no renewal of the lease holding their"
            " session was answered for a whole ATTACH_LEASE_S (this gateway cut off from Redis,"
            " or paused); the session is resumable", registry=r)
        self.lapsed_detached = Counter(
            f"{_NS}_sessions_lease_detached",
            "Sessions this reaper detached because their gateway's attachment lease lapsed",
            registry=r)
        self.paced_seconds = Counter(
            f"{_NS}_paced_seconds",
            "Time client reads were held back because a connection was over its frame, byte"
            " or audio rate", registry=r)
        # DESIGN §6: relay and resume latency as the gateway itself adds them.
        self.relay_seconds = HotHistogram(
            f"{_NS}_relay_seconds",
            "Time a relayed message spends in this gateway: direction=in, from a client "
            "command read to its append acknowledged by Redis; direction=out, from a push "
            "taken to its events written to the client", "direction", ("in", "out"),
            (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512,
             1.024), r)
        self.resume_seconds = Histogram(
            f"{_NS}_resume_seconds",
            "From session.resume read to the replay read from the log (or the refusal)",
            registry=r, buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
        # runtime/heap.py: the collector's passes stop every thread; what startup built is
        # frozen out of them.
        self.gc_pause_seconds = Histogram(
            f"{_NS}_gc_pause_seconds",
            "Length of each pass of Python's cyclic garbage collector, which stops the"
            " process, by generation (2: a full pass)", ["generation"], registry=r,
            buckets=PAUSE_BUCKETS)
        # Bound now: observed from inside a pass, which may have started under the lock
        # that labels() takes (runtime.heap.CollectorPauses says why that would deadlock).
        self._gc_pause_by_generation = tuple(
            self.gc_pause_seconds.labels(generation=str(generation))
            for generation in GENERATIONS)
        # runtime/loop_lag.py: a step that holds the event loop delays every connection.
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
        """One collector pass (:class:`runtime.heap.CollectorPauses`): no ``labels()`` here."""
        self._gc_pause_by_generation[generation].observe(seconds)
