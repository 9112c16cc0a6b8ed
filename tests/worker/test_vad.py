"""The energy VAD: frames, levels, turn timing on the audio timeline, config and its mapping."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from inference_worker.audio_frames import float_to_pcm16
from inference_worker.turn_detection.vad import (
    EAGERNESS_SILENCE_MS,
    FRAME_BYTES,
    FRAME_MS,
    MAX_DURATION_MS,
    EnergyVad,
    SpeechStarted,
    SpeechStopped,
    Vad,
    VadConfig,
    VadConfigError,
    VadEvent,
    level_dbfs,
    threshold_dbfs,
    vad_config_from_turn_detection,
)

# The test command installs the cascade extra (Piper and its voice); missing is a failure.
from tests.test_layering import imported_tops
from tests.worker.speech import padded, synthesize

RATE = 24000
SPEECH_DBFS = -25.0  # a tone at conversational speech level
ROOM_DBFS = -55.0  # a quiet room
ODD_CHUNKS = (1, 331, 977, 4799, 2, 959)  # byte counts: odd, sub-frame, multi-frame


# ------------------------------------------------------------------------------- signals


def silence(ms: int) -> bytes:
    """Digital silence."""
    return bytes(2 * ms * RATE // 1000)


def _pcm16(samples: np.ndarray[Any, Any]) -> bytes:
    return bytes(np.clip(np.round(samples), -32768, 32767).astype("<i2").tobytes())


def tone(ms: int, dbfs: float = SPEECH_DBFS, hz: float = 220.0) -> bytes:
    """A sine whose RMS level is ``dbfs``."""
    amplitude = 32768 * math.sqrt(2) * 10 ** (dbfs / 20)
    t = np.arange(ms * RATE // 1000) / RATE
    return _pcm16(amplitude * np.sin(2 * np.pi * hz * t))


def noise(ms: int, dbfs: float = ROOM_DBFS, seed: int = 0) -> bytes:
    """Gaussian white noise whose RMS level is ``dbfs``."""
    rng = np.random.default_rng(seed)
    return _pcm16(rng.normal(0.0, 32768 * 10 ** (dbfs / 20), ms * RATE // 1000))


def chunked(data: bytes, sizes: Iterable[int]) -> list[bytes]:
    """``data`` cut into pieces of the given sizes, cycling through them."""
    pieces: list[bytes] = []
    offset, cycle = 0, itertools.cycle(sizes)
    while offset < len(data):
        size = next(cycle)
        pieces.append(data[offset:offset + size])
        offset += size
    return pieces


def run(vad: Vad, pieces: Iterable[bytes]) -> list[VadEvent]:
    """Every event ``vad`` gives for ``pieces`` fed in order."""
    return [event for piece in pieces for event in vad.feed(piece)]


def detect(audio: bytes, config: VadConfig | None = None,
           sizes: Sequence[int] = ODD_CHUNKS) -> list[VadEvent]:
    """The events of ``audio`` fed to a fresh detector in odd-sized chunks."""
    return run(EnergyVad(config), chunked(audio, sizes))


def assert_within_frame(events: Sequence[VadEvent], expected: Sequence[VadEvent]) -> None:
    """Same kinds in the same order, each time within one frame of the expected one."""
    assert [type(e) for e in events] == [type(e) for e in expected], events
    for got, want in zip(events, expected, strict=True):
        assert abs(_time(got) - _time(want)) <= FRAME_MS, (got, want)


def _time(event: VadEvent) -> int:
    return event.audio_start_ms if isinstance(event, SpeechStarted) else event.audio_end_ms


# ---------------------------------------------------------------------- what counts as speech


def test_silence_and_room_noise_start_nothing() -> None:
    """Digital silence and noise at a quiet room's level give no events, however chunked."""
    for audio in (silence(3000), noise(3000, ROOM_DBFS), noise(3000, -48.0, seed=1)):
        vad = EnergyVad()
        assert run(vad, chunked(audio, ODD_CHUNKS)) == []
        assert not vad.speaking
        assert vad.fed_ms == 3000


def test_tone_burst_is_one_turn_with_padding_and_hangover() -> None:
    """A 1 s burst at speech level after 1 s of silence: the start is padded back 300 ms
    (1000 - 300) and the stop comes after 500 ms of silence (2000 + 500)."""
    audio = silence(1000) + tone(1000) + silence(2000)
    assert detect(audio) == [SpeechStarted(700), SpeechStopped(2500)]


def test_burst_in_noise_is_found() -> None:
    """Speech over room noise is found as over silence; the noise neither starts nor holds it."""
    room = noise(4000, ROOM_DBFS)
    burst = np.frombuffer(silence(1000) + tone(1000) + silence(2000), dtype="<i2")
    mixed = _pcm16(np.frombuffer(room, dtype="<i2").astype(np.float64) + burst)
    assert detect(mixed) == [SpeechStarted(700), SpeechStopped(2500)]


def test_unaligned_burst_is_timed_within_one_frame() -> None:
    """A burst that starts and ends mid-frame is placed within one frame of its true times."""
    audio = silence(1013) + tone(987) + silence(1000)
    assert_within_frame(detect(audio), [SpeechStarted(1013 - 300), SpeechStopped(2000 + 500)])


def test_padding_never_reaches_before_zero() -> None:
    """Speech 100 ms into the audio is padded back to 0, not to -200."""
    assert detect(silence(100) + tone(500) + silence(600)) == [
        SpeechStarted(0), SpeechStopped(1100),
    ]


def test_a_detector_resumed_at_anothers_place_hears_as_it_would() -> None:
    """Between turns (no speech, no loud run, no partial frame) a detector has a place; one
    resumed there reports what the first reports for the same audio, padding included (its
    reach back ends where the first's did, not where it was made)."""
    first = EnergyVad()
    before = silence(100) + tone(500) + silence(700) + silence(80)
    run(first, chunked(before, ODD_CHUNKS))
    place = first.place
    assert place is not None
    resumed = EnergyVad()
    resumed.resume(place)
    after = tone(600) + silence(1000)
    # The padding reaches back to the first turn's end (1100), not 300 ms before 1380.
    assert run(resumed, [after]) == run(first, [after]) == [
        SpeechStarted(1100), SpeechStopped(2480)]


def test_a_detector_has_no_place_in_the_middle_of_something() -> None:
    """While it hears speech, counts a loud run, or holds part of a frame: no place."""
    vad = EnergyVad()
    vad.feed(tone(500))
    assert vad.speaking and vad.place is None
    vad.feed(silence(1000))
    assert not vad.speaking and vad.place is not None
    vad.feed(tone(FRAME_MS))  # one loud frame: a run has begun
    assert vad.place is None
    vad.feed(silence(FRAME_MS) + bytes(FRAME_BYTES // 2))  # the run ended; half a frame waits
    assert vad.place is None
    vad.feed(bytes(FRAME_BYTES // 2))
    assert vad.place is not None


def test_short_gap_keeps_one_turn_and_long_gap_splits_it() -> None:
    """A 200 ms pause is inside the 500 ms hangover: one turn; an 800 ms pause is two."""
    short = silence(1000) + tone(600) + silence(200) + tone(600) + silence(1000)
    assert detect(short) == [SpeechStarted(700), SpeechStopped(2900)]
    long = silence(1000) + tone(600) + silence(800) + tone(600) + silence(1000)
    assert detect(long) == [
        SpeechStarted(700), SpeechStopped(2100), SpeechStarted(2100), SpeechStopped(3500),
    ]


def test_padding_never_reaches_into_the_previous_turn() -> None:
    """Speech 100 ms after a stop is padded back to the stop, not 300 ms into the audio the
    previous turn already ended with."""
    audio = silence(1000) + tone(600) + silence(600) + tone(600) + silence(1000)
    assert detect(audio) == [
        SpeechStarted(700), SpeechStopped(2100), SpeechStarted(2100), SpeechStopped(3300),
    ]


@pytest.mark.parametrize("click_at_ms", [1000, 1019])
def test_click_starts_nothing(click_at_ms: int) -> None:
    """A 2 ms full-scale click, inside one frame or straddling two, is not speech."""
    click = _pcm16(np.full(2 * RATE // 1000, 32767.0))
    audio = silence(click_at_ms) + click + silence(1000)
    assert detect(audio) == []


def test_minimum_speech_duration() -> None:
    """80 ms at speech level is too short to start a turn; 100 ms (the minimum) starts one."""
    assert detect(silence(1000) + tone(80) + silence(1000)) == []
    assert detect(silence(1000) + tone(100) + silence(1000)) == [
        SpeechStarted(700), SpeechStopped(1600),
    ]


def test_threshold_moves_the_start_level() -> None:
    """A -45 dBFS tone is below the default start level (-40) but speech at threshold 0.3
    (-52 dBFS)."""
    audio = silence(1000) + tone(1000, -45.0) + silence(1000)
    assert detect(audio) == []
    assert detect(audio, VadConfig(threshold=0.3)) == [SpeechStarted(700), SpeechStopped(2500)]


def test_threshold_maps_linearly_onto_dbfs() -> None:
    """0 -> -70 dBFS, 0.5 -> -40 dBFS, 1 -> -10 dBFS; release is 6 dB lower."""
    assert [threshold_dbfs(t) for t in (0.0, 0.5, 1.0)] == [-70.0, -40.0, -10.0]
    assert VadConfig().release_dbfs == -46.0


def test_level_dbfs_measures_rms() -> None:
    """The level of the test tone is the level asked for; silence is -inf."""
    assert level_dbfs(tone(1000, SPEECH_DBFS)) == pytest.approx(SPEECH_DBFS, abs=0.01)
    assert level_dbfs(silence(20)) == -math.inf
    assert level_dbfs(b"") == -math.inf


def test_quieter_tail_holds_the_turn() -> None:
    """Once speaking, a tail at -43 dBFS (between the release and start levels) is still
    speech: the stop comes 500 ms after the tail, not after the loud part. The tail alone
    starts nothing."""
    audio = silence(1000) + tone(500) + tone(1000, -43.0) + silence(1000)
    assert detect(audio) == [SpeechStarted(700), SpeechStopped(3000)]
    assert detect(silence(1000) + tone(1000, -43.0) + silence(1000)) == []


# ---------------------------------------------------------------------------- the timeline


def test_events_come_with_the_frame_that_decides_them() -> None:
    """The start is returned by the feed that completes the 100th ms of speech, the stop by
    the one that completes the 500th ms of silence: audio time, not calls or wall clock."""
    vad = EnergyVad()
    assert vad.feed(silence(1000)) == []
    burst = tone(1000)
    assert vad.feed(burst[:99 * 48]) == []
    assert vad.feed(burst[99 * 48:100 * 48]) == [SpeechStarted(700)]
    assert vad.speaking
    assert vad.feed(burst[100 * 48:]) == []
    assert vad.feed(silence(499)) == []
    assert vad.feed(silence(1)) == [SpeechStopped(2500)]
    assert not vad.speaking


def test_fed_ms_counts_partial_frames_and_whole_samples() -> None:
    """``fed_ms`` counts every whole sample fed, including those waiting for their frame."""
    vad = EnergyVad()
    vad.feed(b"\x00")
    assert vad.fed_ms == 0
    vad.feed(bytes(47))  # 24 samples = 1 ms
    assert vad.fed_ms == 1
    vad.feed(bytes(3 * FRAME_BYTES))
    assert vad.fed_ms == 61


def test_reset_keeps_the_timeline_and_bounds_the_padding() -> None:
    """After a reset the timeline goes on, the next frame starts at the reset point, and the
    prefix padding reaches back no further than it (that audio was cleared)."""
    vad = EnergyVad()
    vad.feed(silence(1000) + silence(10))
    vad.reset()
    assert vad.fed_ms == 1010
    assert run(vad, [tone(500), silence(600)]) == [SpeechStarted(1010), SpeechStopped(2010)]


def test_reset_mid_turn_forgets_it() -> None:
    """A reset while speaking ends the turn silently: no stop follows for it, and the next
    speech starts a new turn."""
    vad = EnergyVad()
    assert run(vad, [silence(1000), tone(300)]) == [SpeechStarted(700)]
    vad.reset()
    assert not vad.speaking
    assert vad.feed(silence(1000)) == []
    assert vad.feed(tone(200)) == [SpeechStarted(2000)]


def test_reset_with_a_config_switches_to_it() -> None:
    """``reset(config)`` applies the new settings to what follows (a ``session.update``)."""
    vad = EnergyVad()
    vad.feed(silence(1000))
    new = VadConfig(prefix_padding_ms=0, silence_duration_ms=200)
    vad.reset(new)
    assert vad.config == new
    assert run(vad, [tone(500), silence(1000)]) == [SpeechStarted(1000), SpeechStopped(1700)]


_SEGMENT = st.tuples(
    st.sampled_from(["silence", "tone", "noise"]),
    st.integers(min_value=1, max_value=400 * RATE // 1000),  # samples, not whole frames
    st.floats(min_value=-75.0, max_value=-6.0),
)
_CONFIG = st.builds(
    VadConfig,
    threshold=st.floats(min_value=0.0, max_value=1.0),
    prefix_padding_ms=st.integers(min_value=0, max_value=1000),
    silence_duration_ms=st.integers(min_value=0, max_value=600),
    min_speech_ms=st.integers(min_value=0, max_value=200),
)


def _segment_audio(kind: str, samples: int, dbfs: float, seed: int) -> np.ndarray[Any, Any]:
    if kind == "silence":
        return np.zeros(samples)
    if kind == "noise":
        return np.random.default_rng(seed).normal(0.0, 32768 * 10 ** (dbfs / 20), samples)
    amplitude = 32768 * math.sqrt(2) * 10 ** (dbfs / 20)
    return amplitude * np.sin(2 * np.pi * 180.0 * np.arange(samples) / RATE)


@settings(max_examples=150, deadline=None)
@given(st.lists(_SEGMENT, max_size=14), st.lists(st.integers(min_value=0), max_size=30),
       _CONFIG)
def test_any_chunking_gives_the_same_alternating_events(
        segments: list[tuple[str, int, float]], cuts: list[int], config: VadConfig) -> None:
    """For any audio, chunking and settings: the events equal those of one feed, alternate
    starting with a start, and lie in order on the fed timeline."""
    parts = [_segment_audio(kind, n, dbfs, seed) for seed, (kind, n, dbfs) in enumerate(segments)]
    audio = _pcm16(np.concatenate([np.zeros(0), *parts]))
    whole = EnergyVad(config).feed(audio)
    bounds = sorted({0, len(audio), *(cut % (len(audio) + 1) for cut in cuts)})
    vad = EnergyVad(config)
    pieces = [audio[a:b] for a, b in itertools.pairwise(bounds)]
    assert run(vad, pieces) == whole
    assert [type(e) for e in whole] == [SpeechStarted, SpeechStopped] * (len(whole) // 2) + (
        [SpeechStarted] if len(whole) % 2 else [])
    times = [_time(e) for e in whole]
    assert times == sorted(times)
    assert all(0 <= t <= vad.fed_ms for t in times)
    assert vad.speaking == (len(whole) % 2 == 1)


# --------------------------------------------------------------------------- real speech


def _sound_bounds_ms(audio: bytes, dbfs: float) -> tuple[float, float]:
    """First and last moment a sample's magnitude reaches ``dbfs``."""
    samples = np.abs(np.frombuffer(audio, dtype="<i2").astype(np.int64))
    loud = np.flatnonzero(samples >= 32768 * 10 ** (dbfs / 20))
    return loud[0] * 1000 / RATE, loud[-1] * 1000 / RATE


@pytest.mark.parametrize("text", [
    "The quick brown fox jumps over the lazy dog.",
    "A journey of a thousand miles begins with a single step.",
])
def test_real_speech_is_one_turn_and_its_silence_none(text: str) -> None:
    """A sentence spoken by Piper, between 1 s and 1.5 s of room noise, is one turn whose
    padded start is at or before its first loud sound (peaks at -30 dBFS) and whose speech
    ends after its last one; the room noise around it alone starts nothing."""
    speech, rate = synthesize(text, RATE)
    rng = np.random.default_rng(7)
    signal = padded(speech, rate, before_s=1.0, after_s=1.5)
    room = rng.normal(0.0, 10 ** (-60 / 20), len(signal)).astype(np.float32)
    audio = float_to_pcm16(signal + room)
    onset, offset = _sound_bounds_ms(audio, -30.0)
    config = VadConfig()
    events = detect(audio, config)
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped], events
    start, stop = _time(events[0]), _time(events[1])
    # The run starts at the frame holding the first loud sound: up to a frame before it.
    assert onset - config.prefix_padding_ms - FRAME_MS <= start <= onset
    assert offset <= stop - config.silence_duration_ms <= offset + 200
    assert detect(float_to_pcm16(room)) == []


# ------------------------------------------------------------------------------ settings


@pytest.mark.parametrize(("kwargs", "code", "param"), [
    ({"threshold": 1.5}, "invalid_value", "threshold"),
    ({"threshold": -0.01}, "invalid_value", "threshold"),
    ({"threshold": math.nan}, "invalid_value", "threshold"),
    ({"threshold": math.inf}, "invalid_value", "threshold"),
    ({"threshold": True}, "invalid_type", "threshold"),
    ({"threshold": "0.5"}, "invalid_type", "threshold"),
    ({"prefix_padding_ms": -1}, "invalid_value", "prefix_padding_ms"),
    ({"prefix_padding_ms": MAX_DURATION_MS + 1}, "invalid_value", "prefix_padding_ms"),
    ({"prefix_padding_ms": 300.0}, "invalid_type", "prefix_padding_ms"),
    ({"silence_duration_ms": -20}, "invalid_value", "silence_duration_ms"),
    ({"silence_duration_ms": None}, "invalid_type", "silence_duration_ms"),
    ({"min_speech_ms": False}, "invalid_type", "min_speech_ms"),
])
def test_config_refuses_bad_values(kwargs: dict[str, Any], code: str, param: str) -> None:
    """Each bad setting is a ValueError that names the field and says what is allowed."""
    with pytest.raises(ValueError, match=param) as caught:
        VadConfig(**kwargs)
    assert isinstance(caught.value, VadConfigError)
    assert (caught.value.code, caught.value.param) == (code, param)


def test_config_bounds_are_accepted_and_round_up_to_frames() -> None:
    """The bounds themselves are valid; durations round up to whole frames, at least one."""
    config = VadConfig(threshold=0, prefix_padding_ms=0, silence_duration_ms=MAX_DURATION_MS,
                       min_speech_ms=0)
    assert config.min_speech_frames == 1
    assert config.silence_frames == MAX_DURATION_MS // FRAME_MS
    assert VadConfig(silence_duration_ms=21).silence_frames == 2
    assert VadConfig(threshold=1).start_dbfs == -10.0


def test_server_vad_maps_its_values_and_defaults() -> None:
    """``server_vad`` carries threshold, padding and silence over; missing ones take the
    defaults; the conversation keys are accepted and left to the runner."""
    echoed = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
              "silence_duration_ms": 500, "idle_timeout_ms": None, "create_response": True,
              "interrupt_response": True}
    assert vad_config_from_turn_detection(echoed) == VadConfig()
    assert vad_config_from_turn_detection({"type": "server_vad"}) == VadConfig()
    assert vad_config_from_turn_detection({
        "type": "server_vad", "threshold": 0.7, "prefix_padding_ms": 0,
        "silence_duration_ms": 1200, "idle_timeout_ms": 6000, "create_response": False,
    }) == VadConfig(threshold=0.7, prefix_padding_ms=0, silence_duration_ms=1200)


@pytest.mark.parametrize(("eagerness", "silence_ms"), [
    ("high", 300), ("medium", 700), ("auto", 700), ("low", 1500),
])
def test_semantic_vad_eagerness_picks_the_silence(eagerness: str, silence_ms: int) -> None:
    """Higher eagerness ends the turn after a shorter silence; the rest are server defaults."""
    config = vad_config_from_turn_detection({
        "type": "semantic_vad", "eagerness": eagerness, "create_response": True,
        "interrupt_response": False,
    })
    assert config == VadConfig(silence_duration_ms=silence_ms)
    assert EAGERNESS_SILENCE_MS[eagerness] == silence_ms


def test_semantic_vad_defaults_to_auto() -> None:
    """Without ``eagerness``, ``semantic_vad`` behaves as ``auto`` (medium)."""
    assert vad_config_from_turn_detection({"type": "semantic_vad"}) == VadConfig(
        silence_duration_ms=EAGERNESS_SILENCE_MS["auto"])


@pytest.mark.parametrize(("value", "code", "param"), [
    (None, "invalid_type", ""),
    ([], "invalid_type", ""),
    ({}, "missing_required_parameter", "type"),
    ({"type": "push_to_talk"}, "unsupported_turn_detection", "type"),
    ({"type": 3}, "invalid_type", "type"),
    ({"type": "server_vad", "eagerness": "low"}, "unknown_parameter", "eagerness"),
    ({"type": "semantic_vad", "threshold": 0.5}, "unknown_parameter", "threshold"),
    ({"type": "semantic_vad", "silence_duration_ms": 100}, "unknown_parameter",
     "silence_duration_ms"),
    ({"type": "semantic_vad", "eagerness": "eager"}, "invalid_value", "eagerness"),
    ({"type": "semantic_vad", "eagerness": 1}, "invalid_type", "eagerness"),
    ({"type": "server_vad", "threshold": 2}, "invalid_value", "threshold"),
    ({"type": "server_vad", "prefix_padding_ms": "300"}, "invalid_type", "prefix_padding_ms"),
    ({"type": "server_vad", "silence_duration_ms": -1}, "invalid_value",
     "silence_duration_ms"),
    ({"type": "server_vad", "create_response": 1}, "invalid_type", "create_response"),
    ({"type": "semantic_vad", "interrupt_response": None}, "invalid_type",
     "interrupt_response"),
    ({"type": "server_vad", "idle_timeout_ms": -5}, "invalid_value", "idle_timeout_ms"),
])
def test_turn_detection_refusals_name_code_and_param(value: object, code: str,
                                                     param: str) -> None:
    """A turn_detection the VAD cannot take is refused with the Realtime error code and the
    key at fault, as a ValueError."""
    with pytest.raises(VadConfigError) as caught:
        vad_config_from_turn_detection(value)
    assert (caught.value.code, caught.value.param) == (code, param)
    assert isinstance(caught.value, ValueError)
    assert str(caught.value)


def test_long_client_values_are_quoted_short() -> None:
    """A refusal quotes a huge client value in a few dozen characters, not whole."""
    with pytest.raises(VadConfigError) as caught:
        vad_config_from_turn_detection({"type": "x" * 100_000})
    assert len(str(caught.value)) < 200


def test_vad_module_imports_no_model_runtime_or_io() -> None:
    """The detector stays torch-, onnx- and I/O-free: importable and usable anywhere."""
    path = Path(__file__).resolve().parents[2] / "inference_worker" / "turn_detection" / "vad.py"
    forbidden = {"torch", "onnxruntime", "transformers", "asyncio", "redis", "time",
                 "threading", "audioop"}
    assert imported_tops(path).isdisjoint(forbidden)
