"""Every Prometheus metric of the inference worker (namespace ``duplex_worker``, label ``backend``).

Its capacity gauges also carry ``model``: the worker's own model name (the first it serves;
aliases share its slots), so a dashboard sums sessions and free slots per model.

The engine's model thread and the asyncio driver both record here; ``prometheus_client``
metrics are thread-safe. ``serve_metrics`` exposes them on ``/metrics`` of a port of their own
(``DUPLEX_GATEWAY_METRICS_PORT`` on ``DUPLEX_GATEWAY_METRICS_HOST``; port 0 keeps them
unserved).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from runtime.heap import GENERATIONS, PAUSE_BUCKETS
from runtime.loop_lag import LAG_BUCKETS, PROBE_INTERVAL_S

__all__ = ["CHECKPOINT_OUTCOMES", "FAILURE_STAGES", "HAND_OVER_OUTCOMES", "TAKE_OVER_OUTCOMES",
           "WorkerMetrics", "serve_metrics"]

_NS = "duplex_worker"
#: Where a session can fail inside the worker (``session_failures`` ``stage`` label): applying
#: a command, a tick or timer, draining its events, encoding one, writing its output.
FAILURE_STAGES = ("receive", "tick", "events", "encode", "write")

# Tick times around an 80 ms Moshi frame: fine below the budget, coarse above it.
_TICK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09,
                 0.1, 0.12, 0.16, 0.25, 0.5, 1.0)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0, 4.0)
_TTFA_BUCKETS = (0.05, 0.1, 0.16, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
_BATCH_BUCKETS = (0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
_CHECKPOINT_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
_HAND_OVER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: What became of a session a draining worker tried to hand over (``hand_overs``).
HAND_OVER_OUTCOMES = ("moved", "late", "ended", "no_room", "no_safe_point", "failed")
#: What became of a session handed to this worker (``take_overs``).
TAKE_OVER_OUTCOMES = ("taken", "reconciled", "ended")
#: What became of a checkpoint taken (``checkpoints`` ``outcome`` label).
CHECKPOINT_OUTCOMES = ("written", "behind", "ended", "too_large", "input_gone", "unavailable")


class WorkerMetrics:
    """The worker's metrics for one backend, on a registry of their own (tests stay apart)."""

    def __init__(self, backend: str, registry: CollectorRegistry | None = None, *,
                 model: str | None = None) -> None:
        """Define every metric on ``registry`` (a fresh one by default), labelled ``backend``;
        the capacity gauges also ``model`` (None: the backend's name)."""
        self.registry = registry or CollectorRegistry()
        r, label = self.registry, ["backend"]
        self.tick_seconds = Histogram(
            f"{_NS}_tick_seconds", "Wall time of one batched model step", label,
            registry=r, buckets=_TICK_BUCKETS).labels(backend)
        self.real_time_factor = Histogram(
            f"{_NS}_real_time_factor", "Tick time over the frame period (1 = no headroom)",
            label, registry=r, buckets=_RTF_BUCKETS).labels(backend)
        self.batch_occupancy = Gauge(
            f"{_NS}_batch_occupancy", "Slots stepped in the latest tick", label,
            registry=r).labels(backend)
        self.batch_size = Histogram(
            f"{_NS}_batch_size", "Slots stepped per tick", label, registry=r,
            buckets=_BATCH_BUCKETS).labels(backend)
        self.time_to_first_audio = Histogram(
            f"{_NS}_time_to_first_audio_seconds",
            "From a turn's trigger (first input audio, commit, end of speech, response.create)"
            " to the first audible output of the response", label, registry=r,
            buckets=_TTFA_BUCKETS).labels(backend)
        self.late_ticks = Counter(
            f"{_NS}_late_ticks", "Ticks that ended after their frame's deadline", label,
            registry=r).labels(backend)
        self.skipped_ticks = Counter(
            f"{_NS}_skipped_ticks", "Ticks dropped to re-anchor a clock that fell far behind",
            label, registry=r).labels(backend)
        self.bad_input_frames = Counter(
            f"{_NS}_bad_input_frames",
            "Input frames replaced by silence (wrong length, NaN or inf)", label,
            registry=r).labels(backend)
        self.bad_output_frames = Counter(
            f"{_NS}_bad_output_frames", "Output frames with NaN/inf or too many samples, repaired",
            label, registry=r).labels(backend)
        self.underruns = Counter(
            f"{_NS}_input_underruns", "Frames padded with silence because a client was late",
            label, registry=r).labels(backend)
        self.dropped_input_frames = Counter(
            f"{_NS}_dropped_input_frames", "Oldest input frames dropped from a full backlog",
            label, registry=r).labels(backend)
        self.step_errors = Counter(
            f"{_NS}_step_errors", "Batched steps that raised (their sessions are closed)",
            label, registry=r).labels(backend)
        self._session_failures = Counter(
            f"{_NS}_session_failures",
            "Sessions this worker ended with internal_error over a failure of its own, by stage",
            ["backend", "stage"], registry=r)
        for stage in FAILURE_STAGES:  # every stage exported from the start, at 0
            self._session_failures.labels(backend, stage)
        self.stale_commands = Counter(
            f"{_NS}_stale_commands",
            "Input entries refused because they were written under an older lease generation,"
            " another store epoch, or no token (a writer that went around the store's fencing)",
            label, registry=r).labels(backend)
        self.stale_pushes = Counter(
            f"{_NS}_stale_pushes",
            "Input pushes dropped because they came under an older write fence than their"
            " session's, after the notice of its raise: Redis refused their entries (a writer"
            " that had lost its lease)",
            label, registry=r).labels(backend)
        # runtime/heap.py: the collector's passes stop every thread, the model's too; what
        # startup built (the model included) is frozen out of them.
        gc_pause_seconds = Histogram(
            f"{_NS}_gc_pause_seconds",
            "Length of each pass of Python's cyclic garbage collector, which stops the"
            " process (the model thread too), by generation (2: a full pass)",
            ["backend", "generation"], registry=r, buckets=PAUSE_BUCKETS)
        # Bound now: observed from inside a pass, which may have started under the lock
        # that labels() takes (runtime.heap.CollectorPauses says why that would deadlock).
        self._gc_pause_by_generation = tuple(
            gc_pause_seconds.labels(backend, str(generation)) for generation in GENERATIONS)
        # runtime/loop_lag.py: a step that holds the event loop delays every session's relay
        # (the model's steps run on their own thread and are timed apart).
        self.event_loop_lag_seconds = Histogram(
            f"{_NS}_event_loop_lag_seconds",
            f"How much later than due the event loop woke a probe due every"
            f" {PROBE_INTERVAL_S:g} s (the length of a step that held it)",
            label, registry=r, buckets=LAG_BUCKETS).labels(backend)
        self.gc_frozen_objects = Gauge(
            f"{_NS}_gc_frozen_objects",
            "Objects of the startup heap (the model's included) moved out of the collector's"
            " passes", label, registry=r).labels(backend)
        self._checkpoints = Counter(
            f"{_NS}_checkpoints",
            "Checkpoints taken of sessions, by outcome (written; behind: a write came between,"
            " taken again; ended: the session ended or moved first; too_large: over the bound,"
            " not written; input_gone: the input it"
            " would need read back was trimmed; unavailable: the store could not be reached)",
            ["backend", "outcome"], registry=r)
        for outcome in CHECKPOINT_OUTCOMES:
            self._checkpoints.labels(backend, outcome)
        self.checkpoint_bytes = Histogram(
            f"{_NS}_checkpoint_bytes", "Size of each checkpoint written (the encoded state)",
            label, registry=r, buckets=_CHECKPOINT_BUCKETS).labels(backend)
        self.checkpoint_age_seconds = Gauge(
            f"{_NS}_checkpoint_age_seconds",
            "Age of the oldest newest checkpoint among the sessions served (since it was"
            " written, or since the session was served here when it has none)", label,
            registry=r).labels(backend)
        self.checkpoint_forfeits = Counter(
            f"{_NS}_checkpoint_forfeits",
            "Input trims that overtook a session's checkpoint (it held input past"
            " CHECKPOINT_HOLD_ENTRIES or _BYTES): the session cannot move until its next one",
            label, registry=r).labels(backend)
        self._hand_overs = Counter(
            f"{_NS}_hand_overs",
            "Sessions a draining worker tried to hand over, by outcome (moved; late: moved off"
            " a safe point from its last checkpoint as the drain's deadline neared, an answer"
            " playing cut short; ended: it ended on its own first; no_room: no live worker of"
            " the model had a free slot; no_safe_point: none came before the drain's deadline"
            " and it had no checkpoint to move from; failed: the store refused or could not be"
            " reached)",
            ["backend", "outcome"], registry=r)
        self._take_overs = Counter(
            f"{_NS}_take_overs",
            "Sessions handed to this worker, by outcome (taken: continued from their"
            " checkpoint; reconciled: the same, after replaying what their lost worker wrote"
            " past it; ended: it could not be continued, ended worker_lost)",
            ["backend", "outcome"], registry=r)
        self.lost_responses = Counter(
            f"{_NS}_lost_responses",
            "Responses a lost worker left open that the worker taking its session over ended"
            " (response.done failed, error code worker_lost)", label, registry=r).labels(backend)
        for outcome in HAND_OVER_OUTCOMES:
            self._hand_overs.labels(backend, outcome)
        for outcome in TAKE_OVER_OUTCOMES:
            self._take_overs.labels(backend, outcome)
        self.hand_over_seconds = Histogram(
            f"{_NS}_hand_over_seconds",
            "From a session's hand-over starting (its adopter's slot reserved) to its owner"
            " changing, on the draining worker", label, registry=r,
            buckets=_HAND_OVER_BUCKETS).labels(backend)
        self._backend = backend
        capacity = ["backend", "model"]
        model = model or backend
        self.sessions = Gauge(
            f"{_NS}_sessions", "Sessions served now", capacity, registry=r).labels(backend, model)
        self.slots = Gauge(
            f"{_NS}_slots", "Sessions this worker serves at most", capacity,
            registry=r).labels(backend, model)
        self.free_slots = Gauge(
            f"{_NS}_free_slots",
            "Slots new sessions can take now (0 while the worker admits none: draining, or no"
            " spare tick budget)", capacity, registry=r).labels(backend, model)
        self.admitting = Gauge(
            f"{_NS}_admitting", "1 while the worker accepts new sessions", label,
            registry=r).labels(backend)

    def observe_gc_pause(self, generation: int, seconds: float) -> None:
        """One collector pass (:class:`runtime.heap.CollectorPauses`): no ``labels()`` here."""
        self._gc_pause_by_generation[generation].observe(seconds)

    def checkpoint(self, outcome: str) -> None:
        """Count one checkpoint's ``outcome`` (one of :data:`CHECKPOINT_OUTCOMES`)."""
        self._checkpoints.labels(self._backend, outcome).inc()

    def hand_over(self, outcome: str) -> None:
        """Count one hand-over's ``outcome`` (one of :data:`HAND_OVER_OUTCOMES`)."""
        self._hand_overs.labels(self._backend, outcome).inc()

    def take_over(self, outcome: str) -> None:
        """Count one take-over's ``outcome`` (one of :data:`TAKE_OVER_OUTCOMES`)."""
        self._take_overs.labels(self._backend, outcome).inc()

    def session_failed(self, stage: str) -> None:
        """Count one session ended by a failure at ``stage`` (one of :data:`FAILURE_STAGES`)."""
        self._session_failures.labels(self._backend, stage).inc()


def serve_metrics(metrics: WorkerMetrics, port: int, host: str) -> None:
    """Serve ``metrics`` on ``http://host:port/metrics`` from a daemon thread.

    The address is the caller's (``METRICS_HOST``, loopback by default): no listener of the
    worker is exposed unless an operator says so.

    Raises:
        OSError: the address cannot be bound (taken, or not this machine's).
    """
    start_http_server(port, addr=host, registry=metrics.registry)
