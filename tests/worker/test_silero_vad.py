"""The Silero turn detector: the energy VAD's timeline with Silero's judgement, its selection.

Real Silero weights (faster-whisper's bundled ONNX export, the default) and real speech
(Piper, noiseless, so the same text always gives the same audio); the rules of the timeline
are also checked exactly with scripted probabilities standing in for the model.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings, strategies as st

from contract import messages as msg
from inference_worker.audio_frames import float_to_pcm16
from inference_worker.backends.registry import loopback_core
from inference_worker.turn_detection.silero import (
    HYSTERESIS,
    SILERO_MODULES,
    WINDOW_BYTES,
    WINDOW_MS,
    SileroTurnDetector,
    SileroUnavailable,
    VadState,
    detector_factory,
    missing_silero_module,
    shared_model,
)
from inference_worker.turn_detection.vad import (
    EnergyVad,
    SpeechStarted,
    SpeechStopped,
    Vad,
    VadConfig,
    VadEvent,
)
from runtime.config import SettingsError
from tests.worker.speech import padded, synthesize
from tests.worker.test_server_vad import append, of_type, play_out, played, update

ROOT = Path(__file__).resolve().parents[2]
RATE = 24000
BYTES_PER_MS = 48
T0 = 100.0
LOUD_DBFS = -20.0  # well above the energy VAD's default start level (-40 dBFS)
ABSENT = "duplex_gateway_test_no_such_module"
# Sentences whose start both detectors time alike with the default 100 ms minimum speech
# (in some others, "The quick brown fox", a dip after the first word makes the energy VAD's
# first loud run too short, and it starts at the second word).
SENTENCES = (
    "What is the weather like today?",
    "Hello there, how are you doing?",
    "Please call me back tomorrow morning.",
)


# ------------------------------------------------------------------------------- signals


@cache
def spoken(text: str) -> bytes:
    """``text`` spoken by Piper between 1 s of silence before and 1.5 s after, pcm16 24 kHz."""
    speech, rate = synthesize(text, RATE)
    return float_to_pcm16(padded(speech, rate, before_s=1.0, after_s=1.5))


def silence(ms: int) -> bytes:
    """Digital silence."""
    return bytes(ms * BYTES_PER_MS)


def white_noise(ms: int, dbfs: float = LOUD_DBFS) -> bytes:
    """Gaussian white noise whose RMS level is ``dbfs``."""
    rng = np.random.default_rng(3)
    return float_to_pcm16(rng.normal(0.0, 10 ** (dbfs / 20), ms * RATE // 1000)
                          .astype(np.float32))


def tone(ms: int, dbfs: float = LOUD_DBFS, hz: float = 440.0) -> bytes:
    """A sine whose RMS level is ``dbfs``."""
    t = np.arange(ms * RATE // 1000) / RATE
    return float_to_pcm16((math.sqrt(2) * 10 ** (dbfs / 20) * np.sin(2 * np.pi * hz * t))
                          .astype(np.float32))


def run(vad: Vad, pieces: Iterable[bytes]) -> list[VadEvent]:
    """Every event ``vad`` gives for ``pieces`` fed in order."""
    return [event for piece in pieces for event in vad.feed(piece)]


def pieces_of(data: bytes, size: int) -> list[bytes]:
    """``data`` in pieces of ``size`` bytes (the last one shorter)."""
    return [data[i:i + size] for i in range(0, len(data), size)]


def times(events: Sequence[VadEvent]) -> list[tuple[type[VadEvent], int]]:
    """Each event's kind and time."""
    return [(SpeechStarted, e.audio_start_ms) if isinstance(e, SpeechStarted)
            else (SpeechStopped, e.audio_end_ms) for e in events]


def shifted(events: Sequence[VadEvent], ms: int) -> list[VadEvent]:
    """``events`` moved ``ms`` later on the timeline."""
    return [SpeechStarted(e.audio_start_ms + ms) if isinstance(e, SpeechStarted)
            else SpeechStopped(e.audio_end_ms + ms) for e in events]


class ScriptedProbabilities:
    """Stands in for Silero with a fixed probability per window, in order, to check the
    timeline rules exactly; it checks that every window reaches it whole and, like Silero,
    leaves its mark on the stream's state (``fresh`` says, per window, whether the state it
    was handed was still untouched)."""

    def __init__(self, values: Iterable[float]) -> None:
        self._values = iter(values)
        self.fresh: list[bool] = []

    def probabilities(self, windows: npt.NDArray[np.float32], states: Sequence[VadState]
                      ) -> npt.NDArray[np.float32]:
        assert windows.shape == (1, 512) and len(states) == 1
        [state] = states
        self.fresh.append(not state.lstm.any())
        state.lstm = np.ones_like(state.lstm)
        return np.array([next(self._values)], dtype=np.float32)


def scripted(values: Sequence[float], config: VadConfig | None = None) -> list[VadEvent]:
    """The events of a detector whose windows have the probabilities ``values``."""
    vad = SileroTurnDetector(config, model=ScriptedProbabilities(values))
    return vad.feed(silence(len(values) * WINDOW_MS))


# ---------------------------------------------------------------------------- real audio


@pytest.mark.parametrize("text", SENTENCES)
def test_spoken_sentence_is_timed_like_the_energy_vad(text: str) -> None:
    """On clean speech both detectors find one turn; Silero's start is within two windows of
    the energy VAD's, and its stop is later by at most three: Silero's probability decays
    over a window or two after the last sound, and the hangover rounds up to whole 32 ms
    windows (512 ms for 500)."""
    audio = spoken(text)
    energy, silero = EnergyVad().feed(audio), SileroTurnDetector().feed(audio)
    assert [type(e) for e in silero] == [type(e) for e in energy] == [SpeechStarted,
                                                                    SpeechStopped]
    (_, energy_start), (_, energy_stop) = times(energy)
    (_, silero_start), (_, silero_stop) = times(silero)
    assert abs(silero_start - energy_start) <= 2 * WINDOW_MS, (silero, energy)
    assert 0 <= silero_stop - energy_stop <= 3 * WINDOW_MS, (silero, energy)


@pytest.mark.parametrize("text", SENTENCES[:1])
def test_the_turn_holds_the_whole_sentence(text: str) -> None:
    """The padded start is before the first audible sample and the stop, less the hangover,
    after the last one."""
    audio = spoken(text)
    samples = np.abs(np.frombuffer(audio, dtype="<i2").astype(np.int64))
    audible = np.flatnonzero(samples >= 32768 * 10 ** (-40 / 20))
    onset, offset = audible[0] * 1000 / RATE, audible[-1] * 1000 / RATE
    config = VadConfig()
    [(_, start), (_, stop)] = times(SileroTurnDetector(config).feed(audio))
    assert start <= onset - config.prefix_padding_ms + WINDOW_MS
    assert stop - config.silence_duration_ms >= offset


@pytest.mark.parametrize("sound", [white_noise, tone], ids=["white_noise", "tone_440hz"])
def test_loud_non_speech_starts_nothing_where_the_energy_vad_fires(sound: Any) -> None:
    """Three seconds of white noise or a 440 Hz tone at -20 dBFS: speech to the energy VAD,
    nothing to Silero (the reason to prefer it)."""
    audio = sound(3000)
    assert [type(e) for e in EnergyVad().feed(audio)] == [SpeechStarted]
    vad = SileroTurnDetector()
    assert vad.feed(audio) == []
    assert not vad.speaking


@settings(max_examples=8, deadline=None)
@given(st.lists(st.integers(min_value=0), min_size=1, max_size=25))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    """Speech cut anywhere, odd bytes and partial windows included, gives the events and the
    fed time of one whole feed."""
    audio = spoken(SENTENCES[0])
    whole = SileroTurnDetector().feed(audio)
    bounds = sorted({0, len(audio), *(cut % (len(audio) + 1) for cut in cuts)})
    vad = SileroTurnDetector()
    assert run(vad, [audio[a:b] for a, b in itertools.pairwise(bounds)]) == whole
    assert vad.fed_ms == len(audio) // BYTES_PER_MS


def test_reset_keeps_the_timeline_counting() -> None:
    """After 1010 ms of silence (a partial window pending) and a reset, a sentence gives a
    fresh detector's events, moved 1010 ms later: the timeline counts on from the reset."""
    audio = spoken(SENTENCES[1])
    vad = SileroTurnDetector()
    assert vad.feed(silence(1010)) == []
    vad.reset()
    assert vad.fed_ms == 1010
    assert vad.feed(audio) == shifted(SileroTurnDetector().feed(audio), 1010)


def test_reset_mid_turn_forgets_it_and_may_switch_config() -> None:
    """A reset while speaking ends the turn without a stop event and bounds the padding of
    the next one; a reset with a config switches to it."""
    audio = spoken(SENTENCES[1])
    vad = SileroTurnDetector()
    events = vad.feed(audio[:1500 * BYTES_PER_MS])
    assert [type(e) for e in events] == [SpeechStarted] and vad.speaking
    vad.reset(VadConfig(prefix_padding_ms=0))
    assert not vad.speaking and vad.config.prefix_padding_ms == 0
    assert vad.feed(silence(1000)) == []
    [started, _] = vad.feed(audio)
    assert isinstance(started, SpeechStarted) and started.audio_start_ms >= 2500


def test_reset_gives_the_model_a_fresh_state() -> None:
    """The window after a reset reaches the model with a new recurrent state, not the one
    the audio before it left."""
    model = ScriptedProbabilities([0.0] * 3)
    vad = SileroTurnDetector(model=model)
    vad.feed(silence(2 * WINDOW_MS))
    vad.reset()
    vad.feed(silence(WINDOW_MS))
    assert model.fresh == [True, False, True]


def test_two_detectors_share_the_model_but_not_their_state() -> None:
    """Fed in turns, window by window, one detector hears a sentence exactly as it would
    alone and the other, fed silence, hears nothing: both run on the one shared session."""
    audio = spoken(SENTENCES[2])
    alone = SileroTurnDetector().feed(audio)
    speaker, listener = SileroTurnDetector(), SileroTurnDetector()
    heard: list[VadEvent] = []
    for piece in pieces_of(audio, WINDOW_BYTES):
        heard += speaker.feed(piece)
        assert listener.feed(silence(WINDOW_MS)) == []
    assert heard == alone
    assert shared_model() is shared_model()


# --------------------------------------------------------------------- rules, scripted


def test_minimum_speech_starts_a_turn_with_its_padding() -> None:
    """Three windows at the threshold start nothing (100 ms needs four); four do, and the
    start is the run's first window less 300 ms of padding, in ms of 24 kHz audio."""
    assert scripted([0.0] * 10 + [0.5] * 3 + [0.0] * 20) == []
    # The run starts at window 10: 320 ms; 300 ms of padding before it.
    assert times(scripted([0.0] * 10 + [0.5] * 4)) == [(SpeechStarted, 20)]
    # Padding never reaches before the start of the audio.
    assert times(scripted([0.9] * 4)) == [(SpeechStarted, 0)]


def test_hysteresis_holds_the_turn_down_to_threshold_less_0_15() -> None:
    """Once speaking, windows down to threshold - 0.15 are speech; below it, 500 ms of
    windows (16 of 32 ms) stop the turn at the end of the last one."""
    config = VadConfig(threshold=0.6)
    held = [0.0] * 5 + [0.9] * 4 + [0.6 - HYSTERESIS + 0.01] * 30
    assert times(scripted(held, config)) == [(SpeechStarted, 0)]
    dropped = [0.0] * 5 + [0.9] * 4 + [0.6 - HYSTERESIS - 0.01] * 16
    # Windows 9..24 are silent: the stop is at the end of window 24, 25 * 32 ms.
    assert times(scripted(dropped, config)) == [(SpeechStarted, 0), (SpeechStopped, 800)]


def test_a_pause_shorter_than_the_hangover_keeps_one_turn() -> None:
    """Fifteen silent windows (480 ms) inside speech do not stop it; the next turn's padding
    never reaches back into the previous one."""
    pause = [0.0] * 5 + [0.9] * 4 + [0.0] * 15 + [0.9] * 4 + [0.0] * 16
    assert times(scripted(pause)) == [(SpeechStarted, 0), (SpeechStopped, 44 * WINDOW_MS)]
    # Stop at 25 windows (800 ms); the next run starts at window 26 (832 ms): padding stops
    # at the stop.
    two = [0.0] * 5 + [0.9] * 4 + [0.0] * 16 + [0.0] + [0.9] * 4
    assert times(scripted(two)) == [(SpeechStarted, 0), (SpeechStopped, 800),
                                    (SpeechStarted, 800)]


def test_events_come_with_the_window_that_decides_them() -> None:
    """A partial window decides nothing; the byte that completes it returns the event."""
    vad = SileroTurnDetector(VadConfig(min_speech_ms=0),
                             model=ScriptedProbabilities([0.9]))
    assert vad.feed(silence(WINDOW_MS)[:-1]) == []
    assert vad.fed_ms == WINDOW_MS - 1
    assert vad.feed(b"\x00") == [SpeechStarted(0)]


# ------------------------------------------------------------------------------ selection


def test_factory_picks_silero_where_installed_and_energy_on_request() -> None:
    """With onnxruntime and faster_whisper installed, auto and silero are Silero; energy is the
    energy VAD."""
    assert missing_silero_module() is None
    assert detector_factory("auto") is SileroTurnDetector
    assert detector_factory("silero") is SileroTurnDetector
    assert detector_factory("energy") is EnergyVad


def test_factory_falls_back_to_energy_when_silero_cannot_run() -> None:
    """auto without one of Silero's modules is the energy VAD; silero refuses, a settings
    error naming the variable and what is missing."""
    requires = (*SILERO_MODULES, ABSENT)
    assert missing_silero_module(requires) == ABSENT
    assert detector_factory("auto", requires=requires) is EnergyVad
    with pytest.raises(SileroUnavailable, match=f"DUPLEX_GATEWAY_VAD=silero.*{ABSENT}"):
        detector_factory("silero", requires=requires)
    assert issubclass(SileroUnavailable, SettingsError)


def test_factory_refuses_an_unknown_choice() -> None:
    """A vad that names no detector is an error listing the choices."""
    with pytest.raises(ValueError, match="auto, silero, energy"):
        detector_factory("webrtc")


def test_the_model_loads_on_the_first_detector_not_at_import() -> None:
    """In a fresh interpreter, importing the module and choosing Silero load no onnxruntime;
    the first detector does."""
    probe = ("import json, sys; import inference_worker.turn_detection.silero as s; "
             "f = s.detector_factory('silero'); before = 'onnxruntime' in sys.modules; "
             "f(s.VadConfig()); print(json.dumps([before, 'onnxruntime' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=ROOT, timeout=60)
    assert json.loads(out.stdout) == [False, True]


# ---------------------------------------------------------------------------- the core


def test_loopback_core_with_silero_commits_a_spoken_turn() -> None:
    """A server_vad loopback session heard by Silero: speech_started and speech_stopped name
    the user item the commit adds, and the automatic answer plays the turn's audio back,
    from audio_start_ms to audio_end_ms."""
    core = loopback_core("sess_silero", detector=SileroTurnDetector)
    update(core, {"type": "server_vad"})
    audio = spoken(SENTENCES[0])
    events = append(core, audio)
    [started] = of_type(events, msg.InputSpeechStarted)
    [stopped] = of_type(events, msg.InputSpeechStopped)
    [committed] = of_type(events, msg.InputCommitted)
    assert started.item_id == stopped.item_id == committed.item_id
    assert of_type(events, msg.ResponseCreated)
    events += play_out(core, T0)
    assert played(events) == audio[started.audio_start_ms * BYTES_PER_MS:
                                   stopped.audio_end_ms * BYTES_PER_MS]
