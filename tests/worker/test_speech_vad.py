"""The cascade's Silero VAD on real audio, with the default weights (the v6 export
faster-whisper ships, run with onnxruntime, no torch) and with a ``silero-vad`` export given
by path (the other interface): speech where Piper speaks, none in silence, noise or a tone,
each stream's state its own when several are judged together.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from inference_worker.backends.cascade import speech_segments
from inference_worker.turn_detection import silero
from inference_worker.turn_detection.silero import SileroVad, VadState, load_vad
from inference_worker.weights import default_path
from tests.worker.speech import padded, synthesize

ROOT = Path(__file__).resolve().parents[2]
RATE = 24000
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "What is the weather like today?",
    "Please call me back tomorrow morning.",
)
#: The two interfaces: faster-whisper's export (the default) and the silero-vad package's.
EXPORTS = ("default", "silero-vad")


def _package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.submodule_search_locations, f"{module} is not installed"
    return Path(next(iter(spec.submodule_search_locations)))


@cache
def _vad(export: str) -> SileroVad:
    """The default VAD, or the silero-vad package's main export loaded from its path."""
    if export == "default":
        return load_vad()
    return load_vad(_package_dir("silero_vad") / "data" / "silero_vad.onnx")


def _windows(pcm: np.ndarray) -> list[np.ndarray]:
    """``pcm`` (16 kHz) in whole 512-sample windows."""
    return [pcm[i * 512:(i + 1) * 512] for i in range(len(pcm) // 512)]


def test_the_default_weights_are_faster_whispers_silero_export() -> None:
    """With no path, the VAD weights are the ONNX file faster-whisper ships; no other
    package is needed for them."""
    path = default_path(silero._DEFAULT_VAD)
    assert path == _package_dir("faster_whisper") / "assets" / "silero_vad_v6.onnx"


def test_loading_and_judging_with_the_default_weights_imports_no_torch() -> None:
    """In a fresh interpreter, loading the default VAD and judging a window loads neither
    torch nor the silero_vad package."""
    probe = ("import json, sys, numpy as np; "
             "from inference_worker.turn_detection.silero import VadState, load_vad; "
             "load_vad().probabilities(np.zeros((1, 512), np.float32), [VadState()]); "
             "print(json.dumps([m for m in ('torch', 'silero_vad') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=ROOT, timeout=60)
    assert json.loads(out.stdout) == []


def test_the_default_export_is_fed_as_faster_whisper_feeds_it() -> None:
    """Window by window, the streamed probabilities equal faster-whisper's own VAD run over
    the whole recording (same context, same recurrent state)."""
    from faster_whisper.vad import SileroVADModel

    pcm, rate = synthesize(SENTENCES[0], 16000)
    audio = padded(pcm, rate, before_s=0.5, after_s=0.5)
    audio = audio[:len(audio) // 512 * 512]
    reference = SileroVADModel(str(_package_dir("faster_whisper") / "assets"
                                   / "silero_vad_v6.onnx"))(audio).reshape(-1)
    state = VadState()
    streamed = np.array([_vad("default").probabilities(window[None], [state])[0]
                         for window in _windows(audio)])
    assert reference.max() > 0.9  # the recording holds speech: the comparison means something
    np.testing.assert_allclose(streamed, reference, atol=1e-5)


@pytest.mark.parametrize("export", EXPORTS)
@pytest.mark.parametrize("text", SENTENCES)
def test_piper_speech_is_one_turn_where_it_is_spoken(export: str, text: str) -> None:
    """A sentence between 1 s of silence before and 1 s after is one turn, starting within
    0.25 s of the speech and ending within 0.3 s of its end."""
    pcm, rate = synthesize(text, RATE)
    duration = len(pcm) / rate
    segments = speech_segments(_vad(export), padded(pcm, rate, before_s=1.0, after_s=1.0), rate)
    assert len(segments) == 1, segments
    start, end = segments[0]
    assert abs(start - 1.0) < 0.25 and abs(end - (1.0 + duration)) < 0.3, segments


def _noise(level: float) -> np.ndarray:
    return (np.random.default_rng(5).standard_normal(3 * RATE) * level).astype(np.float32)


def _tone(level: float) -> np.ndarray:
    t = np.arange(3 * RATE) / RATE
    return (level * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


@pytest.mark.parametrize("export", EXPORTS)
@pytest.mark.parametrize(("sound", "make", "level"), [
    ("silence", _noise, 0.0), ("quiet noise", _noise, 0.003), ("loud noise", _noise, 0.1),
    ("tone", _tone, 0.3)])
def test_no_speech_is_heard_where_there_is_none(
        export: str, sound: str, make: Callable[[float], np.ndarray], level: float) -> None:
    """Three seconds of silence, white noise up to -20 dBFS or a loud 440 Hz tone make no
    turn."""
    assert speech_segments(_vad(export), make(level), RATE) == [], sound


@pytest.mark.parametrize("export", EXPORTS)
def test_streams_judged_together_keep_their_own_state(export: str) -> None:
    """Three streams (speech, noise, the speech half a second later) judged in one call per
    window get, each, the probabilities it gets judged alone: no state leaks between rows."""
    vad = _vad(export)
    pcm, _ = synthesize(SENTENCES[1], 16000)
    noise = np.random.default_rng(2).standard_normal(len(pcm)).astype(np.float32) * 0.05
    late = padded(pcm, 16000, before_s=0.5)[:len(pcm)]
    streams = [pcm, noise, late]
    together = [VadState() for _ in streams]
    alone = [VadState() for _ in streams]
    joint, single = [], []
    for index in range(len(pcm) // 512):
        windows = np.stack([stream[index * 512:(index + 1) * 512] for stream in streams])
        joint.append(vad.probabilities(windows, together))
        single.append([vad.probabilities(windows[row][None], [alone[row]])[0]
                       for row in range(len(streams))])
    joint_array, single_array = np.array(joint), np.array(single)
    assert joint_array[:, 0].max() > 0.9 and joint_array[:, 1].max() < 0.5
    np.testing.assert_allclose(joint_array, single_array, atol=1e-5)


def test_a_model_that_is_not_silero_is_refused() -> None:
    """An ONNX file with neither Silero interface is refused at load, naming its inputs."""
    other = _package_dir("onnxruntime") / "datasets" / "sigmoid.onnx"
    with pytest.raises(ValueError, match="not a Silero VAD model: its inputs are"):
        load_vad(other)
