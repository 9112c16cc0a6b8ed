"""Audio in every encoding and rate the seed accepts: the names and format objects, the
streaming converters to and from the core's pcm16 24 kHz (exact in length, chunking-invariant,
faithful), the per-append override, the seed's session keys, and each refusal's code."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings, strategies as st

from contract import messages as msg
from inference_worker.audio_formats import (
    MAX_RATE,
    MIN_RATE,
    AppendDecoder,
    AudioFormat,
    Encoding,
    InputDecoder,
    OutputEncoder,
    alaw_decode,
    alaw_encode,
    append_format,
    encoding_named,
    parse_format,
    ulaw_decode,
    ulaw_encode,
)
from inference_worker.backends.registry import loopback_core
from inference_worker.conversation.core import ConversationCore
from inference_worker.conversation.profiles import LOOPBACK, default_session
from inference_worker.conversation.refusals import Refusal
from inference_worker.conversation.session_update import apply_session_patch, check_session_patch

RATES = (8000, 11025, 16000, 22050, 24000, 44100, 48000, 96000, 192000)
EVERY_FORMAT = [AudioFormat(encoding, rate) for encoding in Encoding for rate in RATES]
SPLITS = settings(max_examples=40, deadline=None, database=None)
T0 = 100.0

# The seed client's opening session object (its SessionConfig.to_session_payload, defaults):
# pcm16 at 16 kHz in, pcm16 at 24 kHz out, each rate given apart from its encoding.
SEED_OPENING: dict[str, Any] = {
    "model": "loopback", "modalities": ["audio", "text"],
    "input_audio_format": "pcm16", "output_audio_format": "pcm16", "sample_rate_hz": 16000,
    "audio": {"input": {"sample_rate_hz": 16000}, "output": {"sample_rate_hz": 24000}},
}


def tone(hz: float, rate: int, count: int, amplitude: float = 0.3) -> npt.NDArray[np.float64]:
    return amplitude * np.sin(2 * np.pi * hz * np.arange(count) / rate)


def encoded(fmt: AudioFormat, signal: npt.NDArray[np.float64]) -> bytes:
    """``signal`` (floats in [-1, 1)) written in ``fmt``'s encoding."""
    if fmt.encoding is Encoding.PCM_F32LE:
        return signal.astype("<f4").tobytes()
    pcm = np.round(signal * 32767).astype("<i2").tobytes()
    if fmt.encoding is Encoding.PCM16:
        return pcm
    return ulaw_encode(pcm) if fmt.encoding is Encoding.PCMU else alaw_encode(pcm)


def pcm_samples(data: bytes) -> npt.NDArray[np.float64]:
    return np.frombuffer(data, dtype="<i2").astype(np.float64) / 32768


def whole_sample_pieces(data: bytes, size: int, cuts: list[int]) -> list[bytes]:
    """``data`` cut at ``cuts`` sample positions (repeats giving empty pieces)."""
    count = len(data) // size
    bounds = [0, *sorted(min(cut, count) for cut in cuts), count]
    return [data[a * size:b * size] for a, b in itertools.pairwise(bounds)]


# --------------------------------------------------------------------------- names and objects


@pytest.mark.parametrize(("name", "encoding"), [
    ("pcm16", Encoding.PCM16), ("PCM16", Encoding.PCM16), ("pcm_s16le", Encoding.PCM16),
    ("s16le", Encoding.PCM16), ("pcm", Encoding.PCM16), ("audio/pcm", Encoding.PCM16),
    ("pcm_f32le", Encoding.PCM_F32LE), ("f32le", Encoding.PCM_F32LE),
    ("audio/pcm_f32le", Encoding.PCM_F32LE),
    ("g711_ulaw", Encoding.PCMU), ("ulaw", Encoding.PCMU), ("mulaw", Encoding.PCMU),
    ("audio/pcmu", Encoding.PCMU), ("audio/g711_ulaw", Encoding.PCMU),
    ("g711_alaw", Encoding.PCMA), ("alaw", Encoding.PCMA), ("audio/pcma", Encoding.PCMA),
    ("wav", None), ("audio/wav", None), ("opus", None), ("", None), (16, None), (None, None),
])
def test_every_seed_name_of_an_encoding_is_read(name: Any, encoding: Encoding | None) -> None:
    """The seed's names and spellings, in any case, name their encoding; `wav` and the rest
    name none."""
    assert encoding_named(name) is encoding


@pytest.mark.parametrize("fmt", EVERY_FORMAT, ids=str)
def test_every_format_shows_as_an_object_with_its_rate_that_parses_back(
        fmt: AudioFormat) -> None:
    """The effective object of every format parses back to it; G.711 at 8 kHz is GA's own
    (no rate), pcm16 at 24 kHz GA's ``{"type": "audio/pcm", "rate": 24000}``."""
    shown = fmt.as_object()
    assert parse_format(shown, "f") == fmt
    if fmt.encoding in (Encoding.PCMU, Encoding.PCMA) and fmt.rate == 8000:
        assert shown == {"type": fmt.encoding.value}
    else:
        assert shown == {"type": fmt.encoding.value, "rate": fmt.rate}


def test_a_format_object_takes_the_seed_spellings() -> None:
    """A seed name as the type, and ``sample_rate_hz`` for the rate, are read too."""
    assert parse_format({"type": "pcm16", "sample_rate_hz": 16000}, "f") == AudioFormat(
        Encoding.PCM16, 16000)
    assert parse_format({"type": "audio/pcm_f32le"}, "f") == AudioFormat(
        Encoding.PCM_F32LE, 24000)


# --------------------------------------------------------------------------- input


@pytest.mark.parametrize("fmt", EVERY_FORMAT, ids=str)
@SPLITS
@given(cuts=st.lists(st.integers(0, 2000), max_size=8))
def test_input_chunking_changes_no_sample(fmt: AudioFormat, cuts: list[int]) -> None:
    """Appends split anywhere on whole samples give the same pcm16 24 kHz as one append,
    and as many samples as the rate change makes (ceil(n * 24000 / rate))."""
    data = encoded(fmt, tone(440, fmt.rate, 2000) + tone(3000, fmt.rate, 2000, 0.1))
    whole = InputDecoder(fmt).decode(data)
    chunked = InputDecoder(fmt)
    pieces = whole_sample_pieces(data, fmt.bytes_per_sample, cuts)
    assert b"".join(chunked.decode(piece) for piece in pieces) == whole
    assert len(whole) // 2 == math.ceil(2000 * 24000 / fmt.rate)


@pytest.mark.parametrize("rate", [r for r in RATES if r != 8000])
@pytest.mark.parametrize("encoding", [Encoding.PCM16, Encoding.PCM_F32LE])
def test_input_at_any_rate_is_the_same_tone_at_24k(encoding: Encoding, rate: int) -> None:
    """A 440 Hz tone at any rate comes out as the same tone at 24 kHz, delayed by the
    filter's half length: within 0.1% of full scale once the filter has filled (the short
    filter ripples most at the largest ratio, 192 kHz)."""
    fmt = AudioFormat(encoding, rate)
    out = pcm_samples(InputDecoder(fmt).decode(encoded(fmt, tone(440, rate, rate // 4))))
    assert closest_delay_error(out, 24000) < 1e-3


def closest_delay_error(out: npt.NDArray[np.float64], rate: int) -> float:
    """The largest difference between ``out`` and the 440 Hz tone at ``rate``, delayed by
    whatever lag (in sixteenths of a sample) fits best, away from the filter's ramp."""
    guard = rate // 50
    t = np.arange(guard, len(out) - guard)
    return min(float(np.abs(out[guard:-guard] - 0.3 * np.sin(2 * np.pi * 440 * (t - lag) / rate)
                            ).max()) for lag in np.arange(0, 40, 1 / 16))


def test_float_input_at_24k_is_rounded_to_pcm16_exactly() -> None:
    """pcm_f32le at 24 kHz is each sample times 32768, rounded and clipped; nan is silence."""
    values = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, np.nan, 1 / 65536], dtype="<f4")
    out = np.frombuffer(InputDecoder(AudioFormat(Encoding.PCM_F32LE, 24000))
                        .decode(values.tobytes()), dtype="<i2")
    assert out.tolist() == [0, 16384, -16384, 32767, -32768, 32767, 0, 0]


@pytest.mark.parametrize("law", [Encoding.PCMU, Encoding.PCMA])
def test_g711_at_another_rate_decodes_each_code_then_resamples(law: Encoding) -> None:
    """G.711 at 16 kHz is its codes' levels, resampled as pcm16 at 16 kHz is."""
    codes = bytes(range(256)) * 8
    levels = (ulaw_decode if law is Encoding.PCMU else alaw_decode)(codes)
    out = InputDecoder(AudioFormat(law, 16000)).decode(codes)
    assert out == InputDecoder(AudioFormat(Encoding.PCM16, 16000)).decode(levels)
    assert len(out) == len(codes) * 3


# --------------------------------------------------------------------------- output


@pytest.mark.parametrize("fmt", EVERY_FORMAT, ids=str)
@SPLITS
@given(cuts=st.lists(st.integers(0, 4800), max_size=8))
def test_output_chunking_changes_no_byte(fmt: AudioFormat, cuts: list[int]) -> None:
    """Deltas split anywhere, even inside a sample, give the same bytes as one delta, and
    the client's rate's share of samples."""
    data = np.round(tone(440, 24000, 2400) * 32767).astype("<i2").tobytes()
    whole = OutputEncoder(fmt).encode(data)
    chunked = OutputEncoder(fmt)
    bounds = [0, *sorted(min(cut, len(data)) for cut in cuts), len(data)]
    assert b"".join(chunked.encode(data[a:b]) for a, b in itertools.pairwise(bounds)) == whole
    count = len(whole) // fmt.bytes_per_sample
    assert count == (800 if fmt == AudioFormat(fmt.encoding, 8000) and fmt.encoding in (
        Encoding.PCMU, Encoding.PCMA) else math.ceil(2400 * fmt.rate / 24000))


@pytest.mark.parametrize("rate", [8000, 16000, 22050, 44100, 48000])
def test_output_at_another_rate_is_the_same_tone(rate: int) -> None:
    """pcm16 24 kHz out at 22050 Hz (say) is the same 440 Hz tone at that rate."""
    data = np.round(tone(440, 24000, 6000) * 32767).astype("<i2").tobytes()
    out = pcm_samples(OutputEncoder(AudioFormat(Encoding.PCM16, rate)).encode(data))
    assert closest_delay_error(out, rate) < 3e-4


def test_float_output_is_the_pcm16_scaled() -> None:
    """pcm_f32le out at 24 kHz is each pcm16 sample over 32768, exactly."""
    pcm = np.array([0, 16384, -32768, 32767, 1], dtype="<i2")
    out = OutputEncoder(AudioFormat(Encoding.PCM_F32LE, 24000)).encode(pcm.tobytes())
    assert np.frombuffer(out, dtype="<f4").tolist() == (pcm / 32768).tolist()


# --------------------------------------------------------------------------- per append


@pytest.mark.parametrize(("name", "rate", "expected"), [
    (None, None, AudioFormat(Encoding.PCM16, 16000)),
    ("pcm16", None, AudioFormat(Encoding.PCM16, 16000)),
    (None, 48000, AudioFormat(Encoding.PCM16, 48000)),
    ("pcm_f32le", None, AudioFormat(Encoding.PCM_F32LE, 16000)),
    ("pcm_f32le", 24000, AudioFormat(Encoding.PCM_F32LE, 24000)),
    ("g711_ulaw", None, AudioFormat(Encoding.PCMU, 8000)),
    ("audio/pcma", 16000, AudioFormat(Encoding.PCMA, 16000)),
])
def test_an_append_names_its_format_over_the_sessions(
        name: str | None, rate: int | None, expected: AudioFormat) -> None:
    """An append's format and rate win; what it leaves out is the session's (16 kHz pcm16
    here), but for G.711 named alone, which is 8 kHz."""
    assert append_format(name, rate, AudioFormat(Encoding.PCM16, 16000)) == expected


@pytest.mark.parametrize(("name", "rate", "code", "param"), [
    ("wav", None, "unsupported_audio_format", "format"),
    ("opus", 48000, "unsupported_audio_format", "format"),
    ("pcm16", MIN_RATE - 1, "bad_event", "sample_rate_hz"),
    (None, MAX_RATE + 1, "bad_event", "sample_rate_hz"),
])
def test_an_append_in_a_format_or_rate_the_seed_refuses(
        name: str | None, rate: int | None, code: str, param: str) -> None:
    """The seed's codes: unsupported_audio_format for the name, bad_event for the rate."""
    refusal = append_format(name, rate, AudioFormat.PCM24K)
    assert isinstance(refusal, Refusal)
    assert (refusal.code, refusal.param) == (code, param)


@pytest.mark.parametrize(("name", "rate", "size", "code"), [
    (None, None, 3, "invalid_value"),  # GA's append in a GA session: GA's code, as before
    ("pcm16", None, 3, "bad_audio"),
    (None, 16000, 5, "bad_audio"),
    ("pcm_f32le", None, 6, "bad_audio"),
])
def test_audio_ending_inside_a_sample_is_refused_and_changes_nothing(
        name: str | None, rate: int | None, size: int, code: str) -> None:
    """An append that is not whole samples is refused with the seed's ``bad_audio`` (GA's
    ``invalid_value`` for a GA append), and the stream goes on as if it never came."""
    decoder, fresh = AppendDecoder(AudioFormat.PCM24K), AppendDecoder(AudioFormat.PCM24K)
    refusal = decoder.decode(b"\x01" * size, name, rate)
    assert isinstance(refusal, Refusal)
    assert (refusal.code, refusal.param) == (code, "audio")
    good = encoded(AudioFormat(Encoding.PCM_F32LE, 16000), tone(440, 16000, 800))
    assert decoder.decode(good, "pcm_f32le", 16000) == fresh.decode(good, "pcm_f32le", 16000)


def test_an_append_decoder_streams_until_the_format_changes() -> None:
    """Appends in one format stream through one filter; the session's format is taken from
    ``configure`` for the appends that name none."""
    data = encoded(AudioFormat(Encoding.PCM16, 16000), tone(440, 16000, 1600))
    decoder = AppendDecoder(AudioFormat.PCM24K)
    decoder.configure(AudioFormat(Encoding.PCM16, 16000))
    first, second = decoder.decode(data[:1600], None, None), decoder.decode(data[1600:],
                                                                             "pcm16", 16000)
    assert isinstance(first, bytes) and isinstance(second, bytes)
    assert first + second == InputDecoder(AudioFormat(Encoding.PCM16, 16000)
                                                        ).decode(data)


# --------------------------------------------------------------------------- the session


def apply(patch: dict[str, Any], current: dict[str, Any] | None = None) -> dict[str, Any]:
    current = current or default_session("s", LOOPBACK)
    assert check_session_patch(patch, current, LOOPBACK) is None
    return apply_session_patch(patch, current, LOOPBACK)


def refused(patch: dict[str, Any]) -> tuple[str, str | None]:
    refusal = check_session_patch(patch, default_session("s", LOOPBACK), LOOPBACK)
    assert isinstance(refusal, Refusal), f"{patch!r} was accepted"
    return refusal.code, refusal.param


def test_the_seed_clients_opening_session_is_honoured() -> None:
    """The seed client's keys set 16 kHz pcm16 in and 24 kHz out, shown as format objects."""
    session = apply(SEED_OPENING)
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 16000}
    assert session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert "sample_rate_hz" not in session and "sample_rate_hz" not in session["audio"]["input"]


@pytest.mark.parametrize(("patch", "input_format", "output_format"), [
    ({"input_audio_format": "pcm_f32le", "output_audio_format": "pcm16", "sample_rate_hz": 24000,
      "audio": {"input": {"sample_rate_hz": 24000}, "output": {"sample_rate_hz": 24000}}},
     {"type": "audio/pcm_f32le", "rate": 24000}, {"type": "audio/pcm", "rate": 24000}),
    ({"input_audio_format": "pcm_f32le", "sample_rate_hz": 16000,
      "audio": {"output": {"sample_rate_hz": 22050}}},
     {"type": "audio/pcm_f32le", "rate": 16000}, {"type": "audio/pcm", "rate": 22050}),
    ({"input_audio_format": "g711_ulaw", "output_audio_format": "g711_alaw"},
     {"type": "audio/pcmu"}, {"type": "audio/pcma"}),
    ({"response_format": "pcm", "sample_rate": 48000},
     {"type": "audio/pcm", "rate": 48000}, {"type": "audio/pcm", "rate": 24000}),
    ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 44100}}}},
     {"type": "audio/pcm", "rate": 44100}, {"type": "audio/pcm", "rate": 24000}),
])
def test_each_seed_shape_shows_its_effective_formats(
        patch: dict[str, Any], input_format: dict[str, Any],
        output_format: dict[str, Any]) -> None:
    """The presets' shapes (personaplex's float32 in, nemotron's 22050 Hz out), G.711 by
    name, the seed's aliases, and a GA object with a rate, each shown as format objects."""
    session = apply(patch)
    assert session["audio"]["input"]["format"] == input_format
    assert session["audio"]["output"]["format"] == output_format


def test_a_rate_alone_keeps_the_sessions_encoding_and_the_patch_is_not_changed() -> None:
    """``sample_rate_hz`` alone re-rates the session's input format; the client's patch
    object is left as it was."""
    current = apply({"input_audio_format": "g711_ulaw"})
    patch = {"sample_rate_hz": 16000, "audio": {"output": {"sample_rate_hz": 16000}}}
    session = apply(patch, current)
    assert session["audio"]["input"]["format"] == {"type": "audio/pcmu", "rate": 16000}
    assert session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 16000}
    assert patch == {"sample_rate_hz": 16000, "audio": {"output": {"sample_rate_hz": 16000}}}


def test_a_ga_session_is_shown_as_before() -> None:
    """A session no seed key touched shows GA's own objects."""
    session = apply({"audio": {"input": {"format": {"type": "audio/pcm"}}}})
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}


@pytest.mark.parametrize(("patch", "code", "param"), [
    ({"output_audio_format": "wav"}, "unsupported_audio_format", "session.output_audio_format"),
    ({"response_format": "wav"}, "unsupported_audio_format", "session.response_format"),
    ({"input_audio_format": "opus"}, "unsupported_audio_format", "session.input_audio_format"),
    ({"sample_rate_hz": 4000}, "bad_event", "session.sample_rate_hz"),
    ({"sample_rate_hz": 16000.5}, "bad_event", "session.sample_rate_hz"),
    ({"sample_rate": "16000"}, "bad_event", "session.sample_rate"),
    ({"audio": {"input": {"sample_rate_hz": True}}}, "bad_event",
     "session.audio.input.sample_rate_hz"),
    ({"audio": {"output": {"sample_rate_hz": 384000}}}, "bad_event",
     "session.audio.output.sample_rate_hz"),
    ({"audio": {"output": {"format": {"type": "audio/pcm", "rate": 4000}}}},
     "unsupported_audio_format", "session.audio.output.format.rate"),
])
def test_a_format_or_rate_the_seed_refuses_is_refused_with_its_code(
        patch: dict[str, Any], code: str, param: str) -> None:
    """Each refusal names the key the client sent, with the seed's code."""
    assert refused(patch) == (code, param)


# --------------------------------------------------------------------------- the core


def push_to_talk(patch: dict[str, Any]) -> ConversationCore:
    core = loopback_core("s")
    core.receive(msg.UpdateSession(session={**patch, "turn_detection": None}), T0)
    [updated] = core.events_to_send()
    assert isinstance(updated, msg.SessionUpdated)
    return core


def test_the_loopback_echoes_16k_in_at_22050_out_for_as_long() -> None:
    """One second of 16 kHz pcm16 in 20 ms appends (each naming its rate) is one second to
    the core, and comes back as one second of 22050 Hz pcm16."""
    core = push_to_talk({**SEED_OPENING, "audio": {"input": {"sample_rate_hz": 16000},
                                                   "output": {"sample_rate_hz": 22050}}})
    sent = encoded(AudioFormat(Encoding.PCM16, 16000), tone(440, 16000, 16000))
    for offset in range(0, len(sent), 640):
        core.receive(msg.AppendAudio(audio=sent[offset:offset + 640], format="pcm16",
                                     sample_rate_hz=16000), T0)
    core.receive(msg.CommitInput(), T0)
    core.receive(msg.CreateResponse(), T0)
    core.tick(T0 + 2)
    events = core.events_to_send()
    assert not [e for e in events if isinstance(e, msg.ErrorEvent)]
    out = b"".join(e.audio for e in events if isinstance(e, msg.AudioDelta))
    assert abs(len(out) // 2 - 22050) <= 2205  # within one 100 ms chunk


def test_refused_appends_leave_the_session_going() -> None:
    """A bad rate, an unknown format and a broken sample are each an error event with the
    seed's code, and the next append is taken."""
    core = push_to_talk(SEED_OPENING)
    core.receive(msg.AppendAudio(audio=b"\0\0", sample_rate_hz=4000, event_id="a"), T0)
    core.receive(msg.AppendAudio(audio=b"\0\0", format="opus", event_id="b"), T0)
    core.receive(msg.AppendAudio(audio=b"\0\0\0", format="pcm16", event_id="c"), T0)
    errors = core.events_to_send()
    assert [(e.code, e.client_event_id) for e in errors if isinstance(e, msg.ErrorEvent)] == [
        ("bad_event", "a"), ("unsupported_audio_format", "b"), ("bad_audio", "c")]
    core.receive(msg.AppendAudio(audio=b"\0\0" * 1600, format="pcm16", sample_rate_hz=16000),
                 T0)
    core.receive(msg.CommitInput(), T0)
    assert any(isinstance(e, msg.InputCommitted) for e in core.events_to_send())
