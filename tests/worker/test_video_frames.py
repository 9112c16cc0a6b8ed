"""Camera frames in the worker: the core hands them to a model that sees video with the audio
of their append, or refuses the first once; the engine steps each with the frame its append's
audio starts in; the recording backend records and names what it saw."""

from __future__ import annotations

import base64
import hashlib

import numpy as np
import pytest

from contract import messages as msg
from inference_worker.audio_frames import float_to_pcm16
from inference_worker.backend import VideoFrame
from inference_worker.backends.fake import FakeOptions
from inference_worker.backends.recording import RecordingBackend, describe
from inference_worker.backends.registry import backend_entry, frame_core, loopback_core
from inference_worker.conversation.video import VideoGate
from inference_worker.engine import Engine

JPEG = b"\xff\xd8\xff\xe0" + b"jpeg one"
PNG = b"\x89PNG\r\n\x1a\n" + b"png two"
FRAME_MS = 100.0
FRAME = 2400  # 100 ms at 24 kHz


def b64(image: bytes) -> str:
    return base64.b64encode(image).decode()


def unit(value: int, samples: int = FRAME) -> bytes:
    """``samples`` of one constant pcm16 value: an audio unit a test can tell apart."""
    return np.full(samples, value, dtype="<i2").tobytes()


def engine(slots: int = 2) -> tuple[Engine, RecordingBackend]:
    backend = RecordingBackend(max_slots=slots, options=FakeOptions(frame_ms=FRAME_MS))
    return Engine(backend), backend


def seen(backend: RecordingBackend) -> list[tuple[bytes, int, float]]:
    """Each recorded frame with the first sample of the audio frame it was stepped with, and
    where its append's audio starts (ms)."""
    return [(s.frame.image, int(np.frombuffer(s.unit, dtype="<i2")[0]), s.frame.at_ms)
            for s in backend.received]


def test_each_frame_is_stepped_with_the_frame_its_appends_audio_starts_in() -> None:
    """Appends that do not line up with model frames: each camera frame still goes with the
    model frame holding its append's first sample, in order, and a frames-only append's
    frames go with the audio that follows."""
    eng, backend = engine()
    handle = eng.open()
    assert handle is not None
    # 1.5 frames of 100, then 1.5 frames of 200 (starting mid-frame 1), then frames alone,
    # then one frame of 300 starting at frame 3's start.
    eng.push_audio(handle, unit(100, FRAME * 3 // 2), ((0, (JPEG,)),))
    eng.push_audio(handle, unit(200, FRAME * 3 // 2), ((0, (PNG, JPEG)),))
    eng.push_audio(handle, b"", ((0, (PNG,)),))
    eng.push_audio(handle, unit(300), ())
    for _ in range(5):
        eng.tick_once()
    # frame 1 starts with the 100s and holds the 200 append's start (150 ms): it carries
    # the frames, each with the place of its append's first sample
    assert seen(backend) == [(JPEG, 100, 0.0), (PNG, 100, 150.0), (JPEG, 100, 150.0),
                             (PNG, 300, 300.0)]


def test_an_offset_inside_a_push_places_each_frame_exactly() -> None:
    """One push carrying two appends' audio (the driver batches what the core queued): the
    second append's frames go with the model frame its audio starts in."""
    eng, backend = engine()
    handle = eng.open()
    assert handle is not None
    audio = unit(100, FRAME * 2) + unit(200, FRAME)
    eng.push_audio(handle, audio, ((0, (JPEG,)), (FRAME * 4, (PNG,))))
    for _ in range(3):
        eng.tick_once()
    assert seen(backend) == [(JPEG, 100, 0.0), (PNG, 200, 200.0)]


def test_cleared_input_takes_its_frames_with_it() -> None:
    """input_audio_buffer.clear drops the frames queued with the audio it drops."""
    eng, backend = engine()
    handle = eng.open()
    assert handle is not None
    eng.push_audio(handle, unit(100, FRAME // 2), ((0, (JPEG,)),))
    eng.clear_input(handle)
    eng.push_audio(handle, unit(200), ((0, (PNG,)),))
    eng.tick_once()
    assert seen(backend) == [(PNG, 200, 0.0)]  # the cleared half frame never was input


def test_frames_of_audio_dropped_for_the_backlog_are_dropped_with_it() -> None:
    """The engine keeps at most its backlog of input; a frame dropped for it takes its camera
    frames along, and the frames after it stay paired."""
    backend = RecordingBackend(max_slots=1, options=FakeOptions(frame_ms=FRAME_MS))
    eng = Engine(backend, backlog_s=0.2)  # two model frames
    handle = eng.open()
    assert handle is not None
    for value, image in ((100, JPEG), (200, PNG), (300, JPEG)):
        eng.push_audio(handle, unit(value), ((0, (image,)),))
    for _ in range(3):
        eng.tick_once()
    assert seen(backend) == [(PNG, 200, 100.0), (JPEG, 300, 200.0)]


def test_the_recording_backend_says_what_it_saw_with_the_echo_of_that_audio() -> None:
    """The echo of the model frame a camera frame came with carries its description, and
    steps without frames say nothing (the fake's echo otherwise)."""
    eng, _ = engine()
    handle = eng.open()
    assert handle is not None
    eng.push_audio(handle, unit(100) + unit(200), ((FRAME * 2, (JPEG,)),))
    texts = []
    for _ in range(3):
        report = eng.tick_once()
        assert report is not None
        texts.append(report.outputs[handle.serial].text)
    assert texts == ["", "", f"<frame {hashlib.sha256(JPEG).hexdigest()[:16]} unit 100>"]
    assert describe(VideoFrame(image=PNG, at_ms=1799.6)) == (
        f"<frame {hashlib.sha256(PNG).hexdigest()[:16]} unit 1800>")


def test_the_recording_backend_echoes_only() -> None:
    with pytest.raises(ValueError, match="echo"):
        RecordingBackend(max_slots=1, options=FakeOptions(mode="tone"))


def test_the_gate_decodes_for_eyes_and_refuses_once_without() -> None:
    """A model that sees video gets the images; one that does not refuses the session's
    first frame and drops the rest without another error."""
    eyes = VideoGate(sees=True)
    assert eyes.admit((b64(JPEG), b64(PNG)), with_audio=True) == ((JPEG, PNG), None)
    assert eyes.admit((), with_audio=False) == ((), None)
    for _ in range(2):  # frames without audio: refused each time (audio is required)
        images, refusal = eyes.admit((b64(JPEG),), with_audio=False)
        assert images == () and refusal is not None
        assert (refusal.code, refusal.param) == ("invalid_input_modality", "audio")
    blind = VideoGate(sees=False)
    assert blind.admit((), with_audio=True) == ((), None)
    images, refusal = blind.admit((b64(JPEG),), with_audio=True)
    assert images == () and refusal is not None
    assert (refusal.code, refusal.param) == ("invalid_input_modality", "video_frames")
    assert blind.admit((b64(PNG),), with_audio=True) == ((), None)
    assert blind.admit((b64(PNG),), with_audio=False) == ((), None)


def errors(events: list[msg.Event]) -> list[msg.ErrorEvent]:
    return [e for e in events if isinstance(e, msg.ErrorEvent)]


def test_a_blind_backend_hears_the_audio_and_refuses_the_first_frame_once() -> None:
    """The loopback (and fake, moshi, cascade) sees no video: the first append with frames is
    answered invalid_input_modality naming video_frames, its audio still heard; later frames,
    with audio or alone, are dropped silently."""
    for core in (loopback_core("s"), frame_core("s", model="fake", frame_seconds=0.08)):
        core.receive(msg.AppendAudio(audio=unit(100), video_frames=(b64(JPEG),),
                                     event_id="e1"), 0.0)
        core.receive(msg.AppendAudio(audio=unit(100), video_frames=(b64(PNG),)), 0.0)
        core.receive(msg.AppendAudio(audio=b"", video_frames=(b64(PNG),)), 0.0)
        refused = errors(core.events_to_send())
        assert [(e.code, e.param, e.client_event_id) for e in refused] == [
            ("invalid_input_modality", "video_frames", "e1")]
    pending = core.take_input()
    assert (len(pending.audio), pending.video) == (FRAME * 4, ())


def test_a_seeing_backend_gets_each_appends_frames_at_its_audio() -> None:
    """The recording backend's sessions queue each append's images at the byte where its
    audio starts; an append of frames alone is refused (audio is required) and queues
    nothing."""
    core = frame_core("s", model="recording", frame_seconds=0.1,
                      profile=backend_entry("recording").profile)
    core.receive(msg.AppendAudio(audio=unit(100), video_frames=(b64(JPEG),)), 0.0)
    core.receive(msg.AppendAudio(audio=b"", video_frames=(b64(JPEG),), event_id="alone"),
                 0.0)
    core.receive(msg.AppendAudio(audio=unit(200), video_frames=(b64(PNG), b64(JPEG))), 0.0)
    assert [(e.code, e.param, e.client_event_id) for e in errors(core.events_to_send())] == [
        ("invalid_input_modality", "audio", "alone")]
    pending = core.take_input()
    assert pending.audio == unit(100) + unit(200)
    assert pending.video == ((0, (JPEG,)), (FRAME * 2, (PNG, JPEG)))
    core.receive(msg.AppendAudio(audio=unit(300), video_frames=(b64(JPEG),)), 0.0)
    core.receive(msg.ClearInput(), 0.0)
    assert core.take_input().video == ()


def test_pcm_levels_survive_the_engine_unchanged() -> None:
    """The recording's unit is the pcm16 the model heard: at the session's own rate it is the
    client's bytes, so a client can name the unit it sent."""
    eng, backend = engine(slots=1)
    handle = eng.open()
    assert handle is not None
    noise = float_to_pcm16(np.linspace(-0.5, 0.5, FRAME, dtype=np.float32))
    eng.push_audio(handle, noise, ((0, (JPEG,)),))
    eng.tick_once()
    assert backend.received[0].unit == noise
