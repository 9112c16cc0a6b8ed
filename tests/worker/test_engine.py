"""Engine: the frame clock and model thread of a frame backend, with the torch-free fake."""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from inference_worker.audio_frames import (
    LinearResampler,
    float_to_pcm16,
    level,
    pcm16_to_float,
)
from inference_worker.backend import NO_SLOT_CONFIG, FrameSpec, SlotConfig, SlotResult, SlotStep
from inference_worker.backends.fake import FakeBackend, FakeOptions
from inference_worker.conversation.reports import TurnEnded
from inference_worker.engine import Engine, SlotHandle, TickReport
from inference_worker.metrics import WorkerMetrics

FRAME = 1920  # 80 ms at 24 kHz


def pcm(samples: int, seed: int = 1, amplitude: float = 0.3) -> bytes:
    """Deterministic noise as pcm16 24 kHz bytes."""
    rng = np.random.default_rng(seed)
    return float_to_pcm16((amplitude * rng.uniform(-1, 1, samples)).astype(np.float32))


def counter(metrics: WorkerMetrics, name: str) -> float:
    """A counter's value for the fake backend."""
    value = metrics.registry.get_sample_value(f"duplex_worker_{name}_total", {"backend": "fake"})
    return value or 0.0


def make(options: FakeOptions | None = None, slots: int = 4,
         **kwargs: Any) -> tuple[Engine, FakeBackend, WorkerMetrics]:
    """An engine over a fake backend, with metrics."""
    backend = FakeBackend(max_slots=slots, options=options)
    metrics = WorkerMetrics("fake")
    return Engine(backend, metrics=metrics, **kwargs), backend, metrics


class FakeClock:
    """A monotonic clock tests move by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """A backend that records its inputs and costs ``cost`` seconds of a fake clock."""

    def __init__(self, clock: FakeClock, slots: int = 4, cost: float = 0.01) -> None:
        self.spec = FrameSpec(in_rate=24000, in_samples=FRAME, out_rate=24000,
                              out_samples=FRAME, max_slots=slots)
        self.clock, self.cost = clock, cost
        self.inputs: list[list[SlotStep]] = []
        self.opened: list[int] = []
        self.closed: list[int] = []
        #: Every slot call, in order: ("open" | "close" | "stop", slot).
        self.calls: list[tuple[str, int]] = []
        self.fail = False
        self.refuse_stop: set[int] = set()  # slots whose stop_response raises
        self.output: Any = None
        self.during_step: Callable[[], None] | None = None  # run inside the next step
        #: Every configuration a slot got (at open, then on configure), in order.
        self.configs: list[tuple[int, SlotConfig]] = []

    def open_slot(self, slot: int, config: SlotConfig = NO_SLOT_CONFIG) -> None:
        self.opened.append(slot)
        self.calls.append(("open", slot))
        self.configs.append((slot, config))

    def configure_slot(self, slot: int, config: SlotConfig) -> None:
        self.calls.append(("configure", slot))
        self.configs.append((slot, config))

    def close_slot(self, slot: int) -> None:
        self.closed.append(slot)
        self.calls.append(("close", slot))

    def stop_response(self, slot: int) -> None:
        self.calls.append(("stop", slot))
        if slot in self.refuse_stop:
            raise RuntimeError("cannot stop")

    def step(self, inputs: list[SlotStep]) -> list[SlotResult]:
        self.clock.now += self.cost
        self.inputs.append(inputs)
        during, self.during_step = self.during_step, None
        if during is not None:
            during()
        if self.fail:
            raise RuntimeError("boom")
        pcm = self.output if self.output is not None else np.zeros(FRAME, dtype=np.float32)
        return [SlotResult(slot=s.slot, pcm=pcm) for s in inputs]


# ------------------------------------------------------------------------- audio helpers


def test_pcm16_round_trip_and_level() -> None:
    """pcm16 -> float -> pcm16 is exact; levels are RMS; NaN/inf encode as silence."""
    data = pcm(FRAME)
    assert float_to_pcm16(pcm16_to_float(data)) == data
    assert level(np.zeros(0, dtype=np.float32)) == 0.0
    assert level(np.full(10, 0.5, dtype=np.float32)) == pytest.approx(0.5)
    bad = np.array([np.nan, np.inf, -np.inf, 2.0, -2.0], dtype=np.float32)
    assert np.frombuffer(float_to_pcm16(bad), "<i2").tolist() == [0, 0, 0, 32767, -32768]


@pytest.mark.parametrize(("src", "dst"), [(24000, 16000), (16000, 24000), (24000, 22050)])
def test_resampler_is_chunking_invariant(src: int, dst: int) -> None:
    """Resampling in uneven chunks gives the samples of resampling at once."""
    signal = np.sin(np.arange(9000) / 7).astype(np.float32)
    whole = LinearResampler(src, dst).process(signal)
    chunked = LinearResampler(src, dst)
    cuts = [0, 1, 480, 481, 2000, 5555, 9000]
    parts = [chunked.process(signal[a:b]) for a, b in itertools.pairwise(cuts)]
    joined = np.concatenate(parts)
    assert np.allclose(joined, whole, atol=1e-6)
    assert abs(len(whole) - len(signal) * dst / src) <= 1


def test_resampler_identity_and_bad_rates() -> None:
    """Equal rates pass chunks through; non-positive rates are refused."""
    chunk = np.ones(5, dtype=np.float32)
    assert LinearResampler(24000, 24000).process(chunk) is chunk
    with pytest.raises(ValueError, match="positive"):
        LinearResampler(0, 24000)


# ------------------------------------------------------------------------- frames in


def test_audio_is_cut_into_exact_frames_and_echoed_a_tick_later() -> None:
    """Odd-sized pcm16 pushes become whole frames; the fake echoes each one tick later."""
    engine, _, _ = make()
    handle = engine.open()
    assert handle is not None
    data = pcm(2 * FRAME)
    for start, end in [(0, 1001), (1001, 1002), (1002, 3000), (3000, len(data))]:
        engine.push_audio(handle, data[start:end])  # odd byte counts included
    first = engine.tick_once()
    second = engine.tick_once()
    third = engine.tick_once()
    assert first is not None and second is not None and third is not None
    assert first.outputs[handle.serial].audio == b""  # the model's warm-up tick
    assert second.outputs[handle.serial].audio == data[: 2 * FRAME]
    assert third.outputs[handle.serial].audio == data[2 * FRAME:]


def test_late_client_gets_silence_and_is_counted() -> None:
    """A slot with no queued frame is stepped with zeros; the clock never waits."""
    engine, backend, metrics = make()
    handle = engine.open()
    assert handle is not None
    engine.tick_once()
    engine.tick_once()
    report = engine.tick_once()
    assert report is not None
    assert report.outputs[handle.serial].audio == bytes(2 * FRAME)
    assert len(backend.batches) == 3
    assert counter(metrics, "input_underruns") == 3


def test_bad_frames_become_silence_for_their_slot_only() -> None:
    """NaN, inf, wrong length, wrong type: that slot gets silence, the others their input."""
    clock = FakeClock()
    backend = Recorder(clock)
    metrics = WorkerMetrics("fake")
    engine = Engine(backend, metrics=metrics, clock=clock)
    handles = [engine.open() for _ in range(4)]
    assert all(h is not None for h in handles)
    good = np.full(FRAME, 0.25, dtype=np.float32)
    nan = good.copy()
    nan[7] = np.nan
    inf = good.copy()
    inf[0] = np.inf
    frames: list[Any] = [nan, inf, good[:100], good]
    for handle, frame in zip(handles, frames, strict=True):
        assert handle is not None
        engine.push_frame(handle, frame)
    engine.tick_once()
    [steps] = backend.inputs
    assert [s.slot for s in steps] == [0, 1, 2, 3]
    for step in steps[:3]:
        assert step.pcm.shape == (FRAME,) and not step.pcm.any()
    assert np.array_equal(steps[3].pcm, good)
    assert counter(metrics, "bad_input_frames") == 3
    handle = handles[0]
    assert handle is not None
    engine.push_frame(handle, "not audio")
    engine.push_frame(handle, np.ones(FRAME, dtype=np.complex64))
    engine.tick_once()
    engine.tick_once()
    assert counter(metrics, "bad_input_frames") == 5


def test_loud_frames_are_clipped_to_unit_range() -> None:
    """Finite values outside [-1, 1] are clipped before the model sees them."""
    clock = FakeClock()
    backend = Recorder(clock)
    engine = Engine(backend, clock=clock)
    handle = engine.open()
    assert handle is not None
    engine.push_frame(handle, np.full(FRAME, 7.0, dtype=np.float64))
    engine.tick_once()
    assert backend.inputs[0][0].pcm.dtype == np.float32
    assert backend.inputs[0][0].pcm.max() == 1.0


def test_input_is_resampled_to_the_backend_rate() -> None:
    """A 16 kHz backend gets 16 kHz frames of exactly in_samples from 24 kHz audio."""
    engine, backend, _ = make(FakeOptions(in_rate=16000))
    assert backend.spec.in_samples == 1280
    handle = engine.open()
    assert handle is not None
    tone = (0.5 * np.sin(2 * np.pi * 300 * np.arange(3 * FRAME) / 24000)).astype(np.float32)
    engine.push_audio(handle, float_to_pcm16(tone))
    engine.tick_once()
    report = engine.tick_once()
    assert report is not None
    echoed = pcm16_to_float(report.outputs[handle.serial].audio)
    # 1280 samples at 16 kHz come back as 1920 at 24 kHz, less the one sample the
    # interpolation holds back until the next frame.
    assert FRAME - 1 <= len(echoed) <= FRAME
    assert np.abs(echoed[10:-10] - tone[10:len(echoed) - 10]).max() < 0.02


def test_backlog_keeps_the_newest_audio() -> None:
    """Input beyond the backlog drops the oldest frames, counted."""
    engine, _, metrics = make(backlog_s=0.16)  # two frames
    handle = engine.open()
    assert handle is not None
    frames = [pcm(FRAME, seed=n) for n in range(4)]
    engine.push_audio(handle, b"".join(frames))
    assert counter(metrics, "dropped_input_frames") == 2
    engine.tick_once()
    report = engine.tick_once()
    assert report is not None
    assert report.outputs[handle.serial].audio == frames[2]


def test_clear_drops_queued_input() -> None:
    """clear_input drops whole and partial frames not consumed yet."""
    engine, _, _ = make()
    handle = engine.open()
    assert handle is not None
    engine.push_audio(handle, pcm(FRAME + 100))
    engine.clear_input(handle)
    engine.push_audio(handle, pcm(FRAME - 100, seed=2))
    engine.tick_once()
    report = engine.tick_once()
    assert report is not None
    assert report.outputs[handle.serial].audio == bytes(2 * FRAME)


# ------------------------------------------------------------------------- slots


def test_slots_fill_lowest_first_and_serials_never_repeat() -> None:
    """open takes the lowest free slot; a reused slot gets a new serial; full -> None."""
    engine, backend, _ = make(slots=2)
    a, b = engine.open(), engine.open()
    assert a is not None and b is not None
    assert (a.slot, b.slot) == (0, 1)
    assert engine.open() is None and engine.free_slots == 0
    engine.close(a)
    engine.close(a)  # idempotent
    c = engine.open()
    assert c is not None and c.slot == 0 and c.serial not in (a.serial, b.serial)
    report = engine.tick_once()
    assert report is not None
    assert set(report.outputs) == {b.serial, c.serial}
    assert engine.open_count == 2
    assert backend.batches == [[1, 0]] or backend.batches == [[0, 1]]


def test_closed_slot_stops_being_stepped() -> None:
    """After close, the next tick no longer lists the slot; an empty engine returns None."""
    clock = FakeClock()
    backend = Recorder(clock)
    engine = Engine(backend, clock=clock)
    handle = engine.open()
    assert handle is not None
    engine.tick_once()
    engine.close(handle)
    assert engine.tick_once() is None
    assert backend.opened == [0] and backend.closed == [0]


@pytest.mark.logs_errors
def test_step_failure_fails_the_batch_not_the_engine() -> None:
    """A raising step reports every stepped serial as failed; later ticks run again."""
    clock = FakeClock()
    backend = Recorder(clock)
    metrics = WorkerMetrics("fake")
    engine = Engine(backend, metrics=metrics, clock=clock)
    a, b = engine.open(), engine.open()
    assert a is not None and b is not None
    backend.fail = True
    report = engine.tick_once()
    assert report is not None
    assert set(report.failed) == {a.serial, b.serial} and "boom" in (report.error or "")
    assert counter(metrics, "step_errors") == 1
    backend.fail = False
    report = engine.tick_once()
    assert report is not None and not report.failed


@pytest.mark.logs_errors
def test_wrong_result_slots_are_a_step_failure() -> None:
    """A backend answering for other slots than asked fails the tick."""
    clock = FakeClock()
    backend = Recorder(clock)
    engine = Engine(backend, clock=clock)
    handle = engine.open()
    assert handle is not None

    def wrong(inputs: list[SlotStep]) -> list[SlotResult]:
        return [SlotResult(slot=9, pcm=np.zeros(0, dtype=np.float32))]

    backend.step = wrong  # type: ignore[method-assign]
    report = engine.tick_once()
    assert report is not None and report.failed == (handle.serial,)


@pytest.mark.logs_errors
def test_one_slots_unusable_output_fails_that_slot_alone() -> None:
    """A result the engine cannot convert (not audio at all) fails its slot only; the other
    slot of the batch gets its frame, and the step is not counted as a batch failure."""
    clock = FakeClock()
    backend = Recorder(clock)
    metrics = WorkerMetrics("fake")
    engine = Engine(backend, metrics=metrics, clock=clock)
    good, bad = engine.open(), engine.open()
    assert good is not None and bad is not None

    def half_broken(inputs: list[SlotStep]) -> list[SlotResult]:
        return [SlotResult(slot=s.slot, pcm=np.zeros(FRAME, dtype=np.float32)
                           if s.slot == good.slot else "not audio")  # type: ignore[arg-type]
                for s in inputs]

    backend.step = half_broken  # type: ignore[method-assign]
    report = engine.tick_once()
    assert report is not None
    assert report.failed == (bad.serial,)
    assert list(report.outputs) == [good.serial]
    assert report.outputs[good.serial].audio == bytes(2 * FRAME)
    assert counter(metrics, "step_errors") == 0


@pytest.mark.logs_errors
def test_open_slot_failure_is_reported() -> None:
    """A raising open_slot reports that serial as failed; it is never stepped."""
    clock = FakeClock()
    backend = Recorder(clock)

    def refuse(slot: int, config: SlotConfig = NO_SLOT_CONFIG) -> None:
        raise RuntimeError("no memory")

    backend.open_slot = refuse  # type: ignore[method-assign]
    engine = Engine(backend, clock=clock)
    handle = engine.open()
    assert handle is not None
    report = engine.tick_once()
    assert report is not None and report.failed == (handle.serial,) and not report.outputs
    assert backend.inputs == []


def test_bad_outputs_are_repaired_and_counted() -> None:
    """NaN output becomes silence and an overlong frame is cut to out_samples."""
    clock = FakeClock()
    backend = Recorder(clock)
    metrics = WorkerMetrics("fake")
    engine = Engine(backend, metrics=metrics, clock=clock)
    handle = engine.open()
    assert handle is not None
    backend.output = np.full(FRAME + 50, np.nan, dtype=np.float32)
    report = engine.tick_once()
    assert report is not None
    assert report.outputs[handle.serial].audio == bytes(2 * FRAME)
    assert counter(metrics, "bad_output_frames") == 1


# ------------------------------------------------------------------------- stopping a response


def opened(engine: Engine) -> SlotHandle:
    """A new handle (the test's engine has a free slot)."""
    handle = engine.open()
    assert handle is not None
    return handle


def test_stops_are_applied_in_order_with_opens_and_closes() -> None:
    """A stop reaches the backend between the open and close asked for around it, before the
    next tick; a stop for a closed handle, or for one whose slot was reused, does nothing."""
    clock = FakeClock()
    backend = Recorder(clock)
    engine = Engine(backend, clock=clock)
    first = opened(engine)
    engine.stop_response(first)
    engine.tick_once()
    assert backend.calls == [("open", 0), ("stop", 0)]
    engine.stop_response(first)
    engine.close(first)
    engine.stop_response(first)  # closed: a no-op
    second = opened(engine)  # the same slot, a new session
    engine.stop_response(second)
    engine.tick_once()
    assert second.slot == first.slot == 0
    assert backend.calls[2:] == [("stop", 0), ("close", 0), ("open", 0), ("stop", 0)]
    engine.close(second)
    engine.stop_response(second)
    assert engine.tick_once() is None
    assert backend.calls[6:] == [("close", 0)]


def test_frames_carry_the_stops_applied_before_their_step() -> None:
    """A frame's epoch counts the stops applied to its handle before its step began: a stop
    asked for while a step runs counts from the next step on; other handles keep theirs."""
    clock = FakeClock()
    backend = Recorder(clock)
    engine = Engine(backend, clock=clock)
    stopped, other = opened(engine), opened(engine)

    def epochs() -> tuple[int, int]:
        report = engine.tick_once()
        assert report is not None
        return report.outputs[stopped.serial].epoch, report.outputs[other.serial].epoch

    assert epochs() == (0, 0)
    backend.during_step = lambda: engine.stop_response(stopped)  # asked for mid-step
    assert epochs() == (0, 0)
    assert epochs() == (1, 0)
    engine.stop_response(stopped)
    engine.stop_response(stopped)
    assert epochs() == (3, 0)
    assert backend.calls.count(("stop", stopped.slot)) == 3
    engine.close(stopped)
    reused = opened(engine)
    assert reused.slot == stopped.slot
    report = engine.tick_once()
    assert report is not None and report.outputs[reused.serial].epoch == 0


@pytest.mark.logs_errors
def test_a_failing_stop_fails_that_slot_alone() -> None:
    """A raising stop_response reports its serial failed and takes its slot out of the batch
    (closed in the backend once); the other slot of the batch is stepped as before."""
    clock = FakeClock()
    backend = Recorder(clock)
    engine = Engine(backend, clock=clock)
    good, bad = opened(engine), opened(engine)
    backend.refuse_stop.add(bad.slot)
    engine.stop_response(bad)
    engine.stop_response(good)
    report = engine.tick_once()
    assert report is not None
    assert report.failed == (bad.serial,)
    assert list(report.outputs) == [good.serial] and report.outputs[good.serial].epoch == 1
    assert [s.slot for s in backend.inputs[-1]] == [good.slot]
    assert backend.closed == [bad.slot]
    engine.stop_response(bad)  # moot now: the slot is out of the backend
    report = engine.tick_once()
    assert report is not None and not report.failed and list(report.outputs) == [good.serial]
    engine.close(bad)
    engine.tick_once()
    assert backend.closed == [bad.slot]  # not closed twice
    assert backend.calls.count(("stop", bad.slot)) == 1


def tone_engine(**options: Any) -> tuple[Engine, SlotHandle, SlotHandle]:
    """An engine over a tone-mode fake with two sessions open and past the warm-up tick."""
    fake = FakeBackend(max_slots=2, options=FakeOptions(mode="tone", text="hi", **options))
    engine = Engine(fake)
    a, b = opened(engine), opened(engine)
    report = engine.tick_once()
    assert report is not None and report.outputs[a.serial].audio == b""
    return engine, a, b


def levels(engine: Engine, handle: SlotHandle, ticks: int) -> list[bool]:
    """Whether each of the next ``ticks`` frames of ``handle`` is audible."""
    audible = []
    for _ in range(ticks):
        report = engine.tick_once()
        assert report is not None
        audible.append(report.outputs[handle.serial].level > 0)
    return audible


def test_fake_tone_stop_ends_the_burst_at_once() -> None:
    """A stop mid-burst makes the next frames silent for a whole gap, then a new burst starts
    from its first frame (with its text); the other slot's burst goes on untouched."""
    engine, stopped, other = tone_engine(tone_frames=4, gap_frames=3)
    assert levels(engine, stopped, 2) == [True, True]  # two frames into a four-frame burst
    engine.stop_response(stopped)
    outputs = []
    for _ in range(5):
        report = engine.tick_once()
        assert report is not None
        outputs.append((report.outputs[stopped.serial], report.outputs[other.serial]))
    assert [mine.level > 0 for mine, _ in outputs] == [False, False, False, True, True]
    assert all(mine.text == "" and not mine.reports for mine, _ in outputs[:3])
    assert outputs[3][0].text == "hi"
    # Unstopped: the last two frames of its burst (the end of its turn on the last), then its gap.
    assert [theirs.level > 0 for _, theirs in outputs] == [True, True, False, False, False]
    assert outputs[1][1].reports == (TurnEnded(),)


def test_fake_tone_stop_in_a_gap_or_before_speaking_keeps_it_quiet() -> None:
    """A stop during a gap, or before the first tick, gives a whole gap of silence next."""
    engine, stopped, _ = tone_engine(tone_frames=2, gap_frames=3)
    assert levels(engine, stopped, 3) == [True, True, False]
    engine.stop_response(stopped)
    assert levels(engine, stopped, 4) == [False, False, False, True]
    fake = FakeBackend(max_slots=1, options=FakeOptions(mode="tone", tone_frames=2,
                                                        gap_frames=2))
    fresh_engine = Engine(fake)
    fresh = opened(fresh_engine)
    fresh_engine.stop_response(fresh)
    assert levels(fresh_engine, fresh, 4) == [False, False, True, True]


def test_fake_echo_stop_drops_the_frame_it_would_echo() -> None:
    """In echo mode the frame due to be echoed next comes back as silence after a stop; the
    frames after it, and the other slot, echo as before."""
    engine, _, _ = make(slots=2)
    stopped, other = opened(engine), opened(engine)
    frames = [pcm(FRAME, seed=n) for n in range(3)]
    for handle in (stopped, other):
        engine.push_audio(handle, b"".join(frames))
    engine.tick_once()  # the warm-up tick: frames[0] is held for the next one
    engine.stop_response(stopped)
    echoed: dict[int, list[bytes]] = {stopped.serial: [], other.serial: []}
    for _ in range(2):
        report = engine.tick_once()
        assert report is not None
        for serial, got in echoed.items():
            got.append(report.outputs[serial].audio)
    assert echoed[stopped.serial] == [bytes(2 * FRAME), frames[1]]
    assert echoed[other.serial] == frames[:2]


async def test_stop_from_the_loop_fences_the_running_thread() -> None:
    """With the model thread running, a stop asked for on the loop shows in the reports:
    epochs never go back, and the first frame stamped with the stop is already silent."""
    fake = FakeBackend(max_slots=1, options=FakeOptions(mode="tone", frame_ms=10,
                                                        tone_frames=1000, gap_frames=5))
    engine = Engine(fake)
    frames: list[tuple[int, float]] = []
    speaking, stopped = asyncio.Event(), asyncio.Event()
    handle = opened(engine)

    def on_tick(report: TickReport) -> None:
        frame = report.outputs.get(handle.serial)
        if frame is not None:
            frames.append((frame.epoch, frame.level))
            if frame.level > 0:
                speaking.set()
            if frame.epoch == 1:
                stopped.set()

    engine.start(asyncio.get_running_loop(), on_tick)
    try:
        await asyncio.wait_for(speaking.wait(), 10)  # in its burst, 10 s long
        engine.stop_response(handle)
        await asyncio.wait_for(stopped.wait(), 10)
    finally:
        engine.stop()
    epochs = [epoch for epoch, _ in frames]
    assert epochs == sorted(epochs) and set(epochs) == {0, 1}
    assert frames[epochs.index(1)][1] == 0.0


def test_fake_options_refuse_a_negative_gap() -> None:
    """gap_frames below zero is refused when the options are read."""
    with pytest.raises(ValueError, match="gap_frames"):
        FakeOptions.parse({"mode": "tone", "gap_frames": "-1"})


# ------------------------------------------------------------------------- admission


def test_rolling_p99_judges_the_budget_and_idle_clears_it() -> None:
    """p99 over the window decides over_budget; with no slot open the window is cleared."""
    clock = FakeClock()
    backend = Recorder(clock, cost=0.05)
    engine = Engine(backend, clock=clock, window=20)
    handle = engine.open()
    assert handle is not None
    for _ in range(9):
        engine.tick_once()
    assert engine.tick_p99() is None  # too few ticks to judge
    engine.tick_once()
    assert engine.tick_p99() == pytest.approx(0.05)
    assert not engine.over_budget(0.8)  # 50 ms < 64 ms
    backend.cost = 0.07
    engine.tick_once()
    assert engine.over_budget(0.8)  # p99 of 11 ticks is the slowest
    engine.close(handle)
    engine.tick_once()
    assert engine.tick_p99() is None and not engine.over_budget(0.8)


def test_metrics_record_ticks() -> None:
    """Tick time, real-time factor and occupancy are recorded per tick."""
    clock = FakeClock()
    backend = Recorder(clock, cost=0.04)
    metrics = WorkerMetrics("fake")
    engine = Engine(backend, metrics=metrics, clock=clock)
    engine.open()
    engine.open()
    engine.tick_once()
    sample = metrics.registry.get_sample_value
    labels = {"backend": "fake"}
    assert sample("duplex_worker_tick_seconds_count", labels) == 1
    assert sample("duplex_worker_tick_seconds_sum", labels) == pytest.approx(0.04)
    assert sample("duplex_worker_real_time_factor_sum", labels) == pytest.approx(0.5)
    assert sample("duplex_worker_batch_occupancy", labels) == 2


# ------------------------------------------------------------------------- the thread


async def test_thread_ticks_on_an_absolute_schedule() -> None:
    """Reports arrive on the loop, due exactly one period apart (no drift)."""
    engine, _, _ = make(FakeOptions(frame_ms=10))
    reports: list[TickReport] = []
    done = asyncio.Event()
    threads: set[str] = set()

    def on_tick(report: TickReport) -> None:
        threads.add(threading.current_thread().name)
        reports.append(report)
        if len(reports) >= 20:
            done.set()

    engine.start(asyncio.get_running_loop(), on_tick)
    try:
        engine.open()
        await asyncio.wait_for(done.wait(), 10)
    finally:
        engine.stop()
    assert threads == {threading.current_thread().name}  # delivered on the loop's thread
    period = engine.spec.frame_seconds
    start = reports[0].scheduled
    for k, report in enumerate(reports):
        assert report.scheduled == pytest.approx(start + k * period, abs=1e-9)
        assert report.index == k


async def test_slow_model_never_blocks_the_loop_and_late_ticks_are_counted() -> None:
    """A step slower than the frame runs off the loop; late and skipped ticks are counted."""
    engine, _, metrics = make(FakeOptions(frame_ms=10, step_ms=60))
    ticks = asyncio.Event()
    engine.start(asyncio.get_running_loop(), lambda report: ticks.set())
    try:
        engine.open()
        await asyncio.wait_for(ticks.wait(), 10)
        # While the model thread sleeps in its 60 ms steps, the loop stays responsive.
        worst = 0.0
        for _ in range(20):
            started = time.monotonic()
            await asyncio.sleep(0)
            worst = max(worst, time.monotonic() - started)
        assert worst < 0.03
        deadline = time.monotonic() + 10
        while counter(metrics, "skipped_ticks") == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        engine.stop()
    assert counter(metrics, "late_ticks") >= 1
    assert counter(metrics, "skipped_ticks") >= 1


async def test_idle_engine_waits_and_stop_is_prompt() -> None:
    """With no slot open the thread sleeps; stop returns at once."""
    engine, backend, _ = make(FakeOptions(frame_ms=10))
    engine.start(asyncio.get_running_loop(), lambda report: None)
    with pytest.raises(RuntimeError, match="already started"):
        engine.start(asyncio.get_running_loop(), lambda report: None)
    started = time.monotonic()
    engine.stop()
    assert time.monotonic() - started < 1
    assert backend.batches == []
    assert math.isfinite(engine.spec.frame_seconds)


# ------------------------------------------------------------------------- input position


def test_each_frame_says_where_the_model_is_on_the_input_timeline() -> None:
    """input_ms counts the session's input behind the model, in whole frames: each frame it
    stepped, none for a tick it had to pad with silence, and the frames cleared or dropped
    for the backlog (they passed it by). A client that sends a burst is ahead of it; the
    model's place is not."""
    engine, _, _ = make(backlog_s=0.24)  # three 80 ms frames
    handle = engine.open()
    assert handle is not None
    engine.push_audio(handle, pcm(FRAME * 2))  # 160 ms at once

    def position() -> int | None:
        report = engine.tick_once()
        assert report is not None
        return report.outputs[handle.serial].input_ms

    assert [position(), position(), position()] == [80, 160, 160]  # the third tick: padding
    engine.push_audio(handle, pcm(FRAME * 2))
    engine.clear_input(handle)  # two frames the model never heard, gone past it
    assert position() == 320
    engine.push_audio(handle, pcm(FRAME * 5))  # two over the backlog: dropped, passed
    assert position() == 320 + 2 * 80 + 80
