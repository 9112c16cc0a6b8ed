"""Session audio formats: GA format objects, G.711 against an independent coder, and the
streaming converters between the client's format and pcm16 24 kHz."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings, strategies as st
from openai.types.realtime.realtime_audio_formats import (
    AudioPCM,
    AudioPCMA,
    AudioPCMU,
    RealtimeAudioFormats,
)
from pydantic import TypeAdapter

from inference_worker.audio_formats import (
    AudioFormat,
    InputDecoder,
    OutputEncoder,
    alaw_decode,
    alaw_encode,
    parse_format,
    ulaw_decode,
    ulaw_encode,
)
from inference_worker.conversation.refusals import Refusal

with warnings.catch_warnings():
    # The oracle: CPython's own G.711 coder. Python 3.11 and 3.12 ship it, deprecated; from
    # 3.13 on the audioop-lts package provides the same module.
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

ROOT = Path(__file__).resolve().parents[2]
PARAM = "session.audio.input.format"
G711 = (AudioFormat.PCMU, AudioFormat.PCMA)
GA = (AudioFormat.PCM24K, *G711)
EVERY_CODE = bytes(range(256))
EVERY_PCM16 = np.arange(-32768, 32768, dtype="<i2").tobytes()
SPLITS = settings(max_examples=150, deadline=None, database=None)
_SDK_FORMATS: TypeAdapter[Any] = TypeAdapter(RealtimeAudioFormats)


def samples(data: bytes) -> npt.NDArray[np.int64]:
    """pcm16 LE bytes as wide integers, so differences cannot overflow."""
    return np.frombuffer(data, dtype="<i2").astype(np.int64)


def pcm16(values: Any) -> bytes:
    """pcm16 LE bytes of integer sample values."""
    return np.asarray(values, dtype="<i2").tobytes()


def noise(count: int, seed: int) -> bytes:
    """``count`` bytes of reproducible noise (codes, or pcm16 halves)."""
    return np.random.default_rng(seed).integers(0, 256, count, dtype=np.uint8).tobytes()


def tone(hz: float, rate: int, count: int, amplitude: float = 8000.0) -> bytes:
    """A sine of ``hz`` at ``rate``, as pcm16."""
    return pcm16(np.round(amplitude * np.sin(2 * np.pi * hz * np.arange(count) / rate)))


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at ``cuts`` (any positions, repeats giving empty pieces)."""
    bounds = [0, *sorted(min(cut, len(data)) for cut in cuts), len(data)]
    return [data[start:end] for start, end in itertools.pairwise(bounds)]


# --------------------------------------------------------------------------- formats


@pytest.mark.parametrize(("value", "expected"), [
    ({"type": "audio/pcm", "rate": 24000}, AudioFormat.PCM24K),
    ({"type": "audio/pcm"}, AudioFormat.PCM24K),
    ({"type": "audio/pcm", "rate": None}, AudioFormat.PCM24K),
    ({"type": "audio/pcm", "rate": 24000.0}, AudioFormat.PCM24K),
    ({"type": "audio/pcmu"}, AudioFormat.PCMU),
    ({"type": "audio/pcma"}, AudioFormat.PCMA),
])
def test_every_ga_shape_of_a_format_parses(value: Any, expected: AudioFormat) -> None:
    """Each GA format object, optional keys left out or null, parses to its format."""
    assert parse_format(value, PARAM) == expected


@pytest.mark.parametrize("fmt", GA)
def test_the_effective_object_is_ga_and_parses_back(fmt: AudioFormat) -> None:
    """``as_object`` is the SDK's GA format type with every key it has, and parses to itself."""
    kind = {AudioFormat.PCM24K: AudioPCM, AudioFormat.PCMU: AudioPCMU,
            AudioFormat.PCMA: AudioPCMA}[fmt]
    model = _SDK_FORMATS.validate_python(fmt.as_object(), strict=True)
    assert type(model) is kind
    assert model.model_dump() == fmt.as_object()
    assert parse_format(fmt.as_object(), PARAM) == fmt


def test_the_effective_object_is_a_fresh_copy() -> None:
    """Changing one returned object does not change the next (sessions keep their own)."""
    first = AudioFormat.PCM24K.as_object()
    first["rate"] = 8000
    assert AudioFormat.PCM24K.as_object() == {"type": "audio/pcm", "rate": 24000}


@pytest.mark.parametrize(("value", "param"), [
    (None, PARAM),
    ("audio/pcmu", PARAM),
    (["audio/pcm"], PARAM),
    (24000, PARAM),
    ({}, f"{PARAM}.type"),
    ({"rate": 24000}, f"{PARAM}.type"),
    ({"type": None}, f"{PARAM}.type"),
    ({"type": 1}, f"{PARAM}.type"),
    ({"type": "audio/wav"}, f"{PARAM}.type"),
    ({"type": "audio/pcm", "rate": "24000"}, f"{PARAM}.rate"),
    ({"type": "audio/pcm", "rate": True}, f"{PARAM}.rate"),
    ({"type": "audio/pcm", "rate": 24000.5}, f"{PARAM}.rate"),
    ({"type": "audio/pcm", "rate": 7999}, f"{PARAM}.rate"),
    ({"type": "audio/pcm", "rate": 192001}, f"{PARAM}.rate"),
    ({"type": "audio/pcm", "rate": float("inf")}, f"{PARAM}.rate"),
    ({"type": "audio/pcm", "rate": float("nan")}, f"{PARAM}.rate"),
    ({"type": "audio/pcmu", "sample_rate_hz": 0}, f"{PARAM}.sample_rate_hz"),
    ({"type": "wav"}, f"{PARAM}.type"),
    ({"type": "audio/pcm", "channels": 1}, f"{PARAM}.channels"),
    ({"type": "audio/pcma", "law": "a"}, f"{PARAM}.law"),
])
def test_a_bad_format_is_refused_naming_what_is_wrong(value: Any, param: str) -> None:
    """Anything but a GA format object is ``unsupported_audio_format``, at the bad key's path
    under the caller's param (the object's own path when it is no object)."""
    refusal = parse_format(value, PARAM)
    assert isinstance(refusal, Refusal)
    assert (refusal.code, refusal.param) == ("unsupported_audio_format", param)
    assert refusal.message


@pytest.mark.parametrize(("fmt", "rate", "per_ms"), [
    (AudioFormat.PCM24K, 24000, 48), (AudioFormat.PCMU, 8000, 8), (AudioFormat.PCMA, 8000, 8),
])
def test_sizes_of_each_format(fmt: AudioFormat, rate: int, per_ms: int) -> None:
    """Rate and wire bytes per millisecond, on the format and on both converters."""
    assert (fmt.rate, fmt.bytes_per_ms) == (rate, per_ms)
    assert InputDecoder(fmt).bytes_per_ms == OutputEncoder(fmt).bytes_per_ms == per_ms
    assert InputDecoder(fmt).format is OutputEncoder(fmt).format is fmt


# --------------------------------------------------------------------------- G.711


def test_every_mulaw_code_decodes_as_the_reference_coder_does() -> None:
    """All 256 mu-law codes decode to the reference coder's levels."""
    assert ulaw_decode(EVERY_CODE) == audioop.ulaw2lin(EVERY_CODE, 2)


def test_every_alaw_code_decodes_as_the_reference_coder_does() -> None:
    """All 256 A-law codes decode to the reference coder's levels."""
    assert alaw_decode(EVERY_CODE) == audioop.alaw2lin(EVERY_CODE, 2)


def test_every_pcm16_value_encodes_to_mulaw_as_the_reference_coder_does() -> None:
    """All 65,536 pcm16 values get the reference coder's mu-law codes."""
    assert ulaw_encode(EVERY_PCM16) == audioop.lin2ulaw(EVERY_PCM16, 2)


def test_every_pcm16_value_encodes_to_alaw_as_the_reference_coder_does() -> None:
    """All 65,536 pcm16 values get the reference coder's A-law codes."""
    assert alaw_encode(EVERY_PCM16) == audioop.lin2alaw(EVERY_PCM16, 2)


def test_alaw_codes_survive_a_round_trip() -> None:
    """Every A-law code decodes to a level that encodes back to that code."""
    assert alaw_encode(alaw_decode(EVERY_CODE)) == EVERY_CODE


def test_mulaw_codes_survive_a_round_trip_but_negative_zero() -> None:
    """Every mu-law code round-trips, except 0x7f (minus zero), which comes back as plus
    zero (0xff): both are level 0."""
    back = ulaw_encode(ulaw_decode(EVERY_CODE))
    assert [code for code in range(256) if back[code] != code] == [0x7F]
    assert back[0x7F] == 0xFF


@pytest.mark.parametrize(("encode", "decode"), [(ulaw_encode, ulaw_decode),
                                                (alaw_encode, alaw_decode)])
def test_quantisation_is_monotonic_and_idempotent(encode: Any, decode: Any) -> None:
    """Quantising keeps the order of values, and a quantised value quantises to itself."""
    levels = decode(encode(EVERY_PCM16))
    assert np.all(np.diff(samples(levels)) >= 0)
    assert decode(encode(levels)) == levels


# --------------------------------------------------------------------------- input


@pytest.mark.parametrize("data", [b"", b"\x01\x02" * 480, b"\x01\x02\x03"])
def test_pcm_input_is_returned_as_is(data: bytes) -> None:
    """For audio/pcm the chunk itself comes back, not a copy; an odd-length one too, untouched
    (the caller refuses it)."""
    assert InputDecoder(AudioFormat.PCM24K).decode(data) is data


@pytest.mark.parametrize("fmt", G711)
def test_g711_input_is_three_times_the_samples_through_each_code(fmt: AudioFormat) -> None:
    """Each code gives three 24 kHz samples, the third being the code's level, so the
    length is exact per chunk."""
    codes = noise(400, seed=1)
    levels = samples((ulaw_decode if fmt is AudioFormat.PCMU else alaw_decode)(codes))
    out = samples(InputDecoder(fmt).decode(codes))
    assert out.size == 3 * len(codes)
    assert np.array_equal(out[2::3], levels)


@pytest.mark.parametrize("fmt", G711)
def test_g711_input_interpolates_linearly_from_silence(fmt: AudioFormat) -> None:
    """The 24 kHz samples lie on the straight lines between neighbouring 8 kHz levels,
    starting from silence before the first one (computed here with np.interp)."""
    codes = noise(300, seed=2)
    levels = samples((ulaw_decode if fmt is AudioFormat.PCMU else alaw_decode)(codes))
    times = (np.arange(3 * levels.size) - 2) / 3
    expected = np.round(np.interp(times, np.arange(-1, levels.size), [0, *levels]))
    assert np.array_equal(samples(InputDecoder(fmt).decode(codes)), expected)


@SPLITS
@given(fmt=st.sampled_from(G711), cuts=st.lists(st.integers(0, 500), max_size=12))
def test_g711_input_chunking_changes_no_sample(fmt: AudioFormat, cuts: list[int]) -> None:
    """Chunks cut anywhere (single bytes, empty chunks) decode to the same samples as the
    whole stream at once."""
    codes = noise(500, seed=3)
    chunked = InputDecoder(fmt)
    assert b"".join(map(chunked.decode, pieces(codes, cuts))) == InputDecoder(fmt).decode(codes)


@pytest.mark.parametrize("fmt", G711)
def test_a_reset_input_decoder_starts_from_silence_again(fmt: AudioFormat) -> None:
    """After ``reset`` a chunk decodes as it would on a new decoder, not interpolated from
    the sample before the reset."""
    decoder = InputDecoder(fmt)
    decoder.decode(b"\x80")  # the loudest positive code in both laws
    decoder.reset()
    assert decoder.decode(b"\x80\x01") == InputDecoder(fmt).decode(b"\x80\x01")


# --------------------------------------------------------------------------- output


@pytest.mark.parametrize("data", [b"", b"\x01\x02" * 480, b"\x01\x02\x03"])
def test_pcm_output_is_returned_as_is(data: bytes) -> None:
    """For audio/pcm the delta itself comes back, not a copy, and nothing is held back."""
    encoder = OutputEncoder(AudioFormat.PCM24K)
    assert encoder.encode(data) is data
    assert encoder.flush() == b""


@pytest.mark.parametrize(("fmt", "encode"), [(AudioFormat.PCMU, ulaw_encode),
                                             (AudioFormat.PCMA, alaw_encode)])
def test_g711_output_codes_the_mean_of_each_three_samples(fmt: AudioFormat, encode: Any) -> None:
    """Each group of three 24 kHz samples becomes the code of their rounded mean; a partial
    group waits."""
    data = noise(2 * 1000, seed=4)  # 1000 samples: 333 groups and one sample over
    means = np.round(samples(data)[:999].reshape(-1, 3).mean(axis=1))
    assert OutputEncoder(fmt).encode(data) == encode(pcm16(means))


@pytest.mark.parametrize("fmt", G711)
def test_g711_output_filters_what_would_alias(fmt: AudioFormat) -> None:
    """An 8 kHz tone, which decimation alone would fold onto DC at full level, comes out as
    silence (the quietest level of the law)."""
    cosine = pcm16([10000, -5000, -5000] * 80)
    out = samples(InputDecoder(fmt).decode(OutputEncoder(fmt).encode(cosine)))
    assert np.max(np.abs(out)) <= 8


@pytest.mark.parametrize("fmt", G711)
def test_speech_band_audio_survives_out_and_back(fmt: AudioFormat) -> None:
    """A 1 kHz tone through the encoder and a decoder keeps over 20 dB SNR (G.711's own
    noise, and the two filters' loss of level), once the one-sample delay is allowed for."""
    original = samples(tone(1000, 24000, 2400))
    out = samples(InputDecoder(fmt).decode(OutputEncoder(fmt).encode(pcm16(original))))
    assert out.size == original.size
    reference, decoded = original[2:-1], out[3:]  # past the ramp in from silence
    snr = 10 * np.log10(np.sum(reference ** 2) / np.sum((decoded - reference) ** 2))
    assert snr > 20


@SPLITS
@given(fmt=st.sampled_from(G711), cuts=st.lists(st.integers(0, 2 * 700 + 1), max_size=12))
def test_g711_output_chunking_changes_no_code(fmt: AudioFormat, cuts: list[int]) -> None:
    """Deltas cut anywhere, even inside a sample, encode to the same codes as the whole
    output at once, flushed at the end."""
    data = noise(2 * 700, seed=5)
    chunked, whole = OutputEncoder(fmt), OutputEncoder(fmt)
    got = b"".join(map(chunked.encode, pieces(data, cuts))) + chunked.flush()
    assert got == whole.encode(data) + whole.flush()
    assert len(got) == 234  # ceil(700 / 3)


@pytest.mark.parametrize(("fmt", "encode"), [(AudioFormat.PCMU, ulaw_encode),
                                             (AudioFormat.PCMA, alaw_encode)])
def test_flush_codes_the_partial_group_once(fmt: AudioFormat, encode: Any) -> None:
    """``flush`` gives the rounded mean of the one or two samples waiting, then nothing; a
    lone half sample is no sample."""
    encoder = OutputEncoder(fmt)
    assert encoder.encode(pcm16([0, 0, 0, 100, 301])) == encode(pcm16([0]))
    assert encoder.flush() == encode(pcm16([201]))
    assert encoder.flush() == b""
    assert encoder.encode(b"\x10") == b""
    assert encoder.flush() == b""


@pytest.mark.parametrize("fmt", G711)
def test_a_reset_output_encoder_drops_the_waiting_samples(fmt: AudioFormat) -> None:
    """After ``reset`` the next delta encodes as on a new encoder: the samples left over from
    the last response do not leak into the next."""
    encoder = OutputEncoder(fmt)
    assert encoder.encode(pcm16([30000, 30000])) == b""
    encoder.reset()
    delta = pcm16([0, 0, 0, 1, 2, 3])
    assert encoder.encode(delta) == OutputEncoder(fmt).encode(delta)
    assert encoder.flush() == b""


# --------------------------------------------------------------------------- purity


def test_importing_and_using_the_module_loads_no_io_or_torch() -> None:
    """In a fresh interpreter, parsing a format and converting audio leaves asyncio, Redis
    and torch unloaded."""
    probe = ("import json, sys; from inference_worker import audio_formats as af; "
             "af.parse_format({'type': 'audio/x'}, 'p'); "
             "af.OutputEncoder(af.AudioFormat.PCMU).encode(b'\\0' * 12); "
             "print(json.dumps([m for m in ('asyncio', 'redis', 'torch', 'starlette') "
             "if m in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, cwd=ROOT, timeout=50)
    assert json.loads(done.stdout) == []
