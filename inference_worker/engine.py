"""The frame clock and the model thread of a frame backend (DESIGN §4).

One dedicated thread owns the backend: it opens and closes slots and runs one batched
``step`` for every open slot each tick, on a drift-free absolute schedule (tick ``k`` is due
at ``t0 + k * period``, so a slow tick never shifts the ones after it). The asyncio side only
queues work: :meth:`Engine.open`/:meth:`Engine.close` reserve and release slot ids at once
and the thread applies them to the backend before its next tick, in the order they were asked
for, with the response stops of :meth:`Engine.stop_response` and the new slot configurations
of :meth:`Engine.configure` (a slot opens with its session's configuration);
:meth:`Engine.push_audio` turns a session's pcm16 24 kHz audio into frames of exactly
``in_samples`` at ``in_rate``; the camera frames that rode an append go to the backend with
the frame its audio starts in (:attr:`~inference_worker.backend.SlotStep.video`).

The clock never waits for a client: a slot with no frame queued gets silence (an underrun),
and a frame that is the wrong length or carries NaN/inf is replaced by silence for that slot
alone (``bad_input_frames``); the other slots of the batch never see it. Each tick's outputs,
converted to pcm16 24 kHz, go back to the event loop with ``loop.call_soon_threadsafe``,
tagged with the handle's serial, so a slot reused by a new session never receives the
previous session's last frame, and stamped with the stops applied to the handle before their
step began (``FrameOutput.epoch``), so a session can tell the output of a step that was
already under way when it cancelled its response from what came after the stop.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Literal

import numpy as np

from inference_worker.audio_frames import (
    PCM_RATE,
    FrameOutput,
    checked_input,
    float_to_pcm16,
    level,
    repaired_output,
)
from inference_worker.backend import (
    NO_SLOT_CONFIG,
    Backend,
    Compacting,
    Resumable,
    SlotConfig,
    SlotResult,
    SlotStep,
    VideoFrame,
    silence,
)
from inference_worker.engine_slots import Marks, SlotHandle, SlotInput, SlotResume, TickReport
from inference_worker.metrics import WorkerMetrics

__all__ = ["Engine", "SlotHandle", "SlotResume", "TickReport"]

_log = logging.getLogger(__name__)

Audio = np.ndarray[Any, np.dtype[np.float32]]
#: Camera frames (image bytes) at a byte offset into the pcm16 they arrived with.
VideoMarks = tuple[tuple[int, tuple[bytes, ...]], ...]

# Ticks judged before the rolling p99 may refuse admission (one slow first tick is no trend).
_MIN_SAMPLES = 10
# A clock further behind than this many frames re-anchors instead of running every tick late.
_MAX_LAG_FRAMES = 2

# What the model thread does to a slot between ticks, and the backend call that does it.
_OpKind = Literal["open", "close", "stop", "configure"]
_BACKEND_CALL: Final[dict[_OpKind, str]] = {
    "open": "open_slot", "close": "close_slot", "stop": "stop_response",
    "configure": "configure_slot"}


class Engine:
    """Steps every open slot of one backend together, on its own thread."""

    def __init__(self, backend: Backend, *, metrics: WorkerMetrics | None = None,
                 backlog_s: float = 10.0, window: int = 250,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Wrap ``backend`` (already loaded); nothing runs until :meth:`start`.

        Args:
            backend: the model; only this engine's thread calls it from now on.
            metrics: where ticks are recorded (None: not recorded).
            backlog_s: input audio kept per slot ahead of the model; older frames are dropped.
            window: ticks in the rolling tick-time window that admission judges.
            clock: monotonic seconds (tests pass a fake one to :meth:`tick_once`).
        """
        self.backend = backend
        # Checked once: a protocol's isinstance looks at each of its methods.
        self._compact = backend.compact_record if isinstance(backend, Compacting) else None
        self.spec = backend.spec
        self.metrics = metrics
        self._clock = clock
        self._backlog = max(1, math.ceil(backlog_s / self.spec.frame_seconds))
        self._lock = threading.Lock()
        self._free = list(range(self.spec.max_slots))  # a heap: the lowest free slot first
        self._serial = 0
        self._inputs: dict[int, SlotInput] = {}  # every handle not yet closed, by serial
        # for the thread, in order; an open or configure carries the slot's configuration
        self._ops: list[tuple[_OpKind, SlotHandle, SlotConfig | None]] = []
        self._resumes: dict[int, SlotResume] = {}  # by serial: the opens that continue a slot
        self._active: dict[int, SlotHandle] = {}  # model thread only: opened in the backend
        self._epochs: dict[int, int] = {}  # model thread only: stops applied, by active serial
        # model thread only: each stepped handle's place on its input timeline, in frames
        self._positions: dict[int, int] = {}
        self._failed: list[int] = []  # model thread only: serials whose open or stop raised
        self._durations: deque[float] = deque(maxlen=window)
        self._index = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_tick: Callable[[TickReport], None] | None = None

    # ------------------------------------------------------------------ slots (any thread)

    @property
    def free_slots(self) -> int:
        """Slot ids not held by any handle."""
        with self._lock:
            return len(self._free)

    @property
    def open_count(self) -> int:
        """Handles held now."""
        with self._lock:
            return len(self._inputs)

    def open(self, session_id: str = "", config: SlotConfig = NO_SLOT_CONFIG,
             resume: SlotResume | None = None) -> SlotHandle | None:
        """Reserve the lowest free slot for session ``session_id`` (named in the log lines
        about its slot), which the backend opens with ``config``, continuing where ``resume``
        says (the backend must be :class:`~inference_worker.backend.Resumable`); None when
        every slot is held."""
        with self._lock:
            if not self._free:
                return None
            self._serial += 1
            handle = SlotHandle(self._serial, heapq.heappop(self._free), session_id)
            slot_input = SlotInput(self.spec)
            self._inputs[handle.serial] = slot_input
            if resume is None:
                self._ops.append(("open", handle, config))
        if resume is not None:
            slot_input.passed = resume.input_frames
            # Queued before the thread can see the open: its first step takes it.
            self.push_audio(handle, resume.unconsumed)
            with self._lock:
                self._resumes[handle.serial] = resume
                self._ops.append(("open", handle, config))
        self._wake.set()
        return handle

    def configure(self, handle: SlotHandle, config: SlotConfig) -> None:
        """Give ``handle``'s slot a new configuration (its session accepted a
        ``session.update``); any thread, like :meth:`close`.

        While the slot's open is still queued, the open takes ``config`` instead (a backend
        opens a session with its opening ``session.update``); else the thread applies it
        before its next tick, in order with the other slot changes. A configuration for a
        closed handle does nothing; a backend that raises fails that slot alone.
        """
        with self._lock:
            if handle.serial not in self._inputs:
                return
            for index, (kind, queued, _) in enumerate(self._ops):
                if kind == "open" and queued.serial == handle.serial:
                    self._ops[index] = ("open", handle, config)
                    return
            self._ops.append(("configure", handle, config))
        self._wake.set()

    def close(self, handle: SlotHandle) -> None:
        """Release ``handle``'s slot (idempotent); the thread closes it before its next tick."""
        with self._lock:
            if self._inputs.pop(handle.serial, None) is None:
                return
            self._ops.append(("close", handle, None))
            heapq.heappush(self._free, handle.slot)
        self._wake.set()

    def stop_response(self, handle: SlotHandle) -> None:
        """Have the backend drop what ``handle``'s slot would still say of the response its
        session cancelled (:meth:`Backend.stop_response`); any thread, like :meth:`close`.

        The thread applies it before its next tick, in order with the opens and closes asked
        for before and after it, and frames of the steps after it carry one more ``epoch``. A
        stop for a closed handle does nothing. A backend that raises fails that slot alone.
        """
        with self._lock:
            if handle.serial not in self._inputs:
                return  # closed: its slot may be someone else's already
            self._ops.append(("stop", handle, None))
        self._wake.set()

    def push_audio(self, handle: SlotHandle, pcm16: bytes, video: VideoMarks = ()) -> None:
        """Queue a session's pcm16 LE 24 kHz audio as frames of ``in_samples`` at ``in_rate``,
        each of ``video``'s camera frames with the frame holding the sample at its byte offset
        into ``pcm16`` (an offset at the end: the next frame to start).

        Only the event loop calls this (the resampler state is the loop's); whole frames are
        handed to the model thread under the lock.
        """
        slot_input = self._inputs.get(handle.serial)
        if slot_input is None:
            return
        marks = slot_input.partial_video  # each by its sample from the partial frame's start
        if video:  # resampled piece by piece, so that each frame's place is exact
            marks, pieces, start = [*marks], [], 0
            for offset, images in video:
                pieces.append(slot_input.resampled(pcm16[start:offset]))
                marks.append((slot_input.partial_len + sum(p.size for p in pieces), images))
                start = offset
            pieces.append(slot_input.resampled(pcm16[start:]))
            samples = np.concatenate(pieces)
        else:
            samples = slot_input.resampled(pcm16)
        n = self.spec.in_samples
        if slot_input.partial_len + samples.size < n:
            if samples.size:
                slot_input.partial.append(samples)
                slot_input.partial_len += samples.size
            slot_input.partial_video = marks
            return
        joined = np.concatenate([*slot_input.partial, samples])
        whole = joined.size // n
        rest = joined[whole * n:]
        slot_input.partial = [rest] if rest.size else []
        slot_input.partial_len = rest.size
        attached: Marks = []
        if marks:
            attached = [(position, images) for position, images in marks if position < whole * n]
            slot_input.partial_video = [(position - whole * n, images)
                                        for position, images in marks if position >= whole * n]
        self._enqueue(handle, [joined[i * n:(i + 1) * n] for i in range(whole)], attached)

    def push_frame(self, handle: SlotHandle, frame: Any) -> None:
        """Queue one ready-made input frame as is; it is checked when its tick takes it."""
        self._enqueue(handle, [frame])

    def clear_input(self, handle: SlotHandle) -> None:
        """Drop the input queued for ``handle`` that the model has not consumed yet."""
        slot_input = self._inputs.get(handle.serial)
        if slot_input is None:
            return
        with self._lock:
            slot_input.passed += len(slot_input.frames)
            slot_input.frames.clear()
            slot_input.video.clear()
        slot_input.partial, slot_input.partial_len, slot_input.carry = [], 0, b""
        slot_input.partial_video = []

    def unconsumed(self, handle: SlotHandle, input_ms: int | None) -> int | None:
        """The bytes of the session's pcm16 24 kHz audio that ``handle``'s slot was given and
        has not stepped yet, where its newest output the session consumed is stamped
        ``input_ms`` and the slot holds no change still to apply; None where that is not so
        (a step took input since, or a stop, configuration or open waits), or where the bytes
        cannot be told exactly (resampled input, or camera frames, waiting). With it, a
        checkpoint of a frame backend's session may be taken: those bytes, the newest the
        session heard, are what the slot that continues it must be given first. Event loop
        only."""
        with self._lock:
            slot_input = self._inputs.get(handle.serial)
            if (slot_input is None or slot_input.video or slot_input.partial_video
                    or any(queued.serial == handle.serial for _, queued, _ in self._ops)):
                return None
            passed = slot_input.passed
        if input_ms != round(passed * self.spec.frame_seconds * 1000):
            return None
        queued = self.queued_bytes(handle)
        return queued if queued == 0 or slot_input.resampler.identity else None

    def compact_record(self, record: bytes) -> bytes:
        """A step record as a checkpoint keeps it once it is no longer among the newest
        (``FrameSpec.whole_context_steps``). Any thread: it reads no slot's state."""
        return record if self._compact is None else self._compact(record)

    def queued_bytes(self, handle: SlotHandle) -> int:
        """The bytes of the session's pcm16 24 kHz audio that ``handle``'s slot holds and has
        not stepped (counted at the backend's rate where it resamples). Event loop only."""
        slot_input = self._inputs.get(handle.serial)
        if slot_input is None:
            return 0
        with self._lock:
            frames = len(slot_input.frames)
        samples = frames * self.spec.in_samples + slot_input.partial_len
        return math.ceil(samples * 2 * PCM_RATE / self.spec.in_rate) + len(slot_input.carry)

    def _enqueue(self, handle: SlotHandle, frames: list[Audio],
                 video: Marks | None = None) -> None:
        """Queue ``frames``, with ``video``'s camera frames by their sample from the first
        frame's start."""
        dropped = 0
        with self._lock:
            slot_input = self._inputs.get(handle.serial)
            if slot_input is None:
                return
            first = slot_input.passed + len(slot_input.frames)  # the first one's place
            n = self.spec.in_samples
            slot_input.video.extend((first + position // n, first * n + position, images)
                                    for position, images in video or ())
            slot_input.frames.extend(frames)
            while len(slot_input.frames) > self._backlog:
                slot_input.frames.popleft()  # the oldest audio goes: latency stays bounded
                dropped += 1
            slot_input.passed += dropped
        if dropped and self.metrics is not None:
            self.metrics.dropped_input_frames.inc(dropped)

    # ------------------------------------------------------------------ admission

    def tick_p99(self) -> float | None:
        """p99 of the recent tick times (seconds), or None before enough ticks were seen."""
        with self._lock:
            recent = sorted(self._durations)
        if len(recent) < min(_MIN_SAMPLES, self._durations.maxlen or _MIN_SAMPLES):
            return None
        return recent[max(0, math.ceil(0.99 * len(recent)) - 1)]

    def over_budget(self, fraction: float) -> bool:
        """Whether the recent p99 tick time exceeds ``fraction`` of the frame period."""
        p99 = self.tick_p99()
        return p99 is not None and p99 > fraction * self.spec.frame_seconds

    # ------------------------------------------------------------------ the thread

    def start(self, loop: asyncio.AbstractEventLoop,
              on_tick: Callable[[TickReport], None]) -> None:
        """Start the model thread; each report is handed to ``on_tick`` on ``loop``."""
        if self._thread is not None:
            raise RuntimeError("engine already started")
        self._loop, self._on_tick = loop, on_tick
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="model-thread", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread after its current tick (blocking up to ``timeout``)."""
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        period = self.spec.frame_seconds
        due: float | None = None  # when the next tick is due; None while idle
        while not self._stop.is_set():
            if not self._has_work():
                self._wake.wait()  # woken by open/close/stop
                self._wake.clear()
                due = None
                continue
            now = self._clock()
            if due is None:
                due = now  # (re)anchor the schedule: the first frame is due at once
            elif now < due:
                self._stop.wait(due - now)
                continue
            report = self.tick_once(scheduled=due)
            due += period
            behind = self._clock() - due
            if report is not None and behind > 0 and self.metrics is not None:
                self.metrics.late_ticks.inc()
            if behind > _MAX_LAG_FRAMES * period:
                skipped = int(behind // period)
                due += skipped * period
                if self.metrics is not None:
                    self.metrics.skipped_ticks.inc(skipped)
            if report is not None:
                self._deliver(report)

    def _has_work(self) -> bool:
        with self._lock:
            return bool(self._ops) or bool(self._active)

    def _deliver(self, report: TickReport) -> None:
        loop, on_tick = self._loop, self._on_tick
        if loop is None or on_tick is None:
            return
        try:
            loop.call_soon_threadsafe(on_tick, report)
        except RuntimeError:  # the loop closed under us: the worker is gone
            self._stop.set()

    # ------------------------------------------------------------------ one tick

    def tick_once(self, scheduled: float | None = None) -> TickReport | None:
        """Run one tick now, on the calling thread: apply slot changes, step, convert.

        The model thread calls this on schedule; tests and benchmarks may call it directly
        (never both). Returns None when no slot is open and nothing failed.
        """
        started = self._clock()
        due = started if scheduled is None else scheduled
        self._apply_ops()
        failed, self._failed = tuple(self._failed), []
        if not self._active:
            if not failed:
                return None
            return TickReport(index=self._next_index(), scheduled=due, seconds=0.0,
                              failed=failed)
        handles = list(self._active.values())
        frames, video = self._take_frames(handles)
        steps = [SlotStep(slot=h.slot, pcm=f) for h, f in zip(handles, frames, strict=True)]
        for index, seen in video:
            steps[index] = SlotStep(slot=steps[index].slot, pcm=steps[index].pcm, video=seen)
        try:
            results = self._step(steps)
        except Exception as exc:  # a model failure ends this batch's sessions, not the worker
            _log.exception("batched step failed")
            if self.metrics is not None:
                self.metrics.step_errors.inc()
            return TickReport(index=self._next_index(), scheduled=due,
                              seconds=self._clock() - started,
                              failed=failed + tuple(h.serial for h in handles),
                              error=repr(exc))
        outputs, unusable = self._convert_all(handles, results)
        seconds = self._clock() - started
        self._record(seconds, len(handles))
        return TickReport(index=self._next_index(), scheduled=due, seconds=seconds,
                          outputs=outputs, failed=failed + unusable)

    def _step(self, steps: list[SlotStep]) -> list[SlotResult]:
        results = self.backend.step(steps)
        if [r.slot for r in results] != [s.slot for s in steps]:
            raise RuntimeError(f"step returned slots {[r.slot for r in results]} "
                               f"for {[s.slot for s in steps]}")
        return results

    def _convert_all(self, handles: list[SlotHandle], results: list[SlotResult],
                     ) -> tuple[dict[int, FrameOutput], tuple[int, ...]]:
        """Each slot's output as a frame; a slot whose output cannot be converted fails alone
        (its serial is returned), the batch's other slots keep theirs."""
        outputs: dict[int, FrameOutput] = {}
        unusable: list[int] = []
        for handle, result in zip(handles, results, strict=True):
            try:
                outputs[handle.serial] = self._convert(handle, result)
            except Exception:  # the slot is closed after this, so this logs once per session
                _log.exception("slot %d: its output cannot be used", handle.slot,
                               extra=handle.log_ids())
                unusable.append(handle.serial)
        return outputs, tuple(unusable)

    def _next_index(self) -> int:
        self._index += 1
        return self._index - 1

    def _apply_ops(self) -> None:
        with self._lock:
            ops, self._ops = self._ops, []
        for kind, handle, config in ops:
            try:
                self._apply(kind, handle, config)
            except Exception:
                _log.exception("slot %d: %s failed", handle.slot, _BACKEND_CALL[kind],
                               extra=handle.log_ids())
                if kind != "close":
                    self._fail_slot(handle)
        if ops and not self._active:
            with self._lock:
                self._durations.clear()  # an idle engine has no recent tick time to judge

    def _apply(self, kind: _OpKind, handle: SlotHandle, config: SlotConfig | None) -> None:
        """Apply one queued slot change to the backend (model thread)."""
        if kind == "open":
            with self._lock:
                resume = self._resumes.pop(handle.serial, None)
            if resume is None:
                self.backend.open_slot(handle.slot, config or NO_SLOT_CONFIG)
            elif isinstance(self.backend, Resumable):
                self.backend.resume_slot(handle.slot, config or NO_SLOT_CONFIG, resume.context)
            else:
                raise TypeError(f"{type(self.backend).__name__} cannot continue a slot")
            self._active[handle.serial] = handle
            self._epochs[handle.serial] = 0 if resume is None else resume.epoch
        elif kind == "configure":
            if handle.serial in self._active and config is not None:
                self.backend.configure_slot(handle.slot, config)
        elif kind == "close":
            with self._lock:
                self._resumes.pop(handle.serial, None)
            self._epochs.pop(handle.serial, None)
            self._positions.pop(handle.serial, None)
            if self._active.pop(handle.serial, None) is not None:
                self.backend.close_slot(handle.slot)
        else:
            self._stop_slot(handle)

    def _stop_slot(self, handle: SlotHandle) -> None:
        """Stop the slot's response and count it in the frames of the steps after it."""
        if handle.serial not in self._active:
            return  # its open failed, or a stop before this one did: nothing to stop
        self.backend.stop_response(handle.slot)
        self._epochs[handle.serial] += 1
        slot_input = self._inputs.get(handle.serial)
        if slot_input is not None:
            # The sample it carries is the cancelled response's: the next frame starts afresh.
            slot_input.out_resampler.reset()

    def _fail_slot(self, handle: SlotHandle) -> None:
        """Report ``handle`` failed, and take its slot out of the batch: a backend whose call
        on it raised may have left it in a state that would make the whole step raise."""
        self._failed.append(handle.serial)
        self._epochs.pop(handle.serial, None)
        self._positions.pop(handle.serial, None)
        if self._active.pop(handle.serial, None) is None:
            return
        try:
            self.backend.close_slot(handle.slot)
        except Exception:
            _log.exception("slot %d: close_slot failed", handle.slot, extra=handle.log_ids())

    def _take_frames(self, handles: list[SlotHandle],
                     ) -> tuple[list[Audio], list[tuple[int, tuple[VideoFrame, ...]]]]:
        """Each handle's next frame (silence when none is queued), and the camera frames that
        go with them, by the handle's index."""
        raw: list[Any] = []
        video: list[tuple[int, tuple[VideoFrame, ...]]] = []
        with self._lock:
            for index, handle in enumerate(handles):
                slot_input = self._inputs.get(handle.serial)
                queued = slot_input.frames if slot_input is not None else None
                raw.append(queued.popleft() if queued else None)
                if slot_input is not None:
                    if slot_input.video and raw[-1] is not None:
                        seen = slot_input.video_at(slot_input.passed, self.spec.in_rate)
                        if seen:
                            video.append((index, seen))
                    slot_input.passed += raw[-1] is not None
                    self._positions[handle.serial] = slot_input.passed
        frames: list[Audio] = []
        underruns = bad = 0
        for frame in raw:
            checked = None if frame is None else checked_input(frame, self.spec.in_samples)
            underruns += frame is None
            bad += frame is not None and checked is None
            frames.append(checked if checked is not None else silence(self.spec.in_samples))
        if self.metrics is not None:
            self.metrics.underruns.inc(underruns)
            self.metrics.bad_input_frames.inc(bad)
        return frames, video

    def _convert(self, handle: SlotHandle, result: SlotResult) -> FrameOutput:
        pcm, repaired = repaired_output(result.pcm, self.spec.out_samples)
        if repaired and self.metrics is not None:
            self.metrics.bad_output_frames.inc()
        slot_input = self._inputs.get(handle.serial)
        if slot_input is not None and pcm.size:
            pcm = slot_input.out_resampler.process(pcm)
        # Stops are applied only between steps, on this thread, so the count now is the one
        # the step began with.
        position = self._positions.get(handle.serial)
        return FrameOutput(audio=float_to_pcm16(pcm), level=level(pcm), text=result.text,
                           reports=result.reports, epoch=self._epochs.get(handle.serial, 0),
                           input_ms=None if position is None
                           else round(position * self.spec.frame_seconds * 1000),
                           context=result.context)

    def _record(self, seconds: float, batch: int) -> None:
        with self._lock:
            self._durations.append(seconds)
        m = self.metrics
        if m is None:
            return
        m.tick_seconds.observe(seconds)
        m.real_time_factor.observe(seconds / self.spec.frame_seconds)
        m.batch_occupancy.set(batch)
        m.batch_size.observe(batch)

