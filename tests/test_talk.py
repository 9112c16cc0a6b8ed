"""``duplex-gateway talk`` without a gateway: reading and converting WAVs (rates, channels,
bit depths, what is refused), writing the answer, and when an answer counts as complete."""

from __future__ import annotations

import argparse
import base64
import struct
import subprocess
import sys
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from duplex_gateway.cli import _parser
from duplex_gateway.talk import Exit
from duplex_gateway.talk_answer import AnswerState, Output, Played, Said
from duplex_gateway.wav import RATE, WavError, convert_wav, parse_wav, write_wav

PCM, FLOAT, EXTENSIBLE = 0x0001, 0x0003, 0xFFFE
GUID_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"


def fmt_chunk(tag: int, channels: int, rate: int, bits: int, *, sub_tag: int | None = None,
              block_align: int | None = None, guid_tail: bytes = GUID_TAIL) -> bytes:
    """A ``fmt `` chunk; with ``sub_tag`` a WAVE_FORMAT_EXTENSIBLE one."""
    align = channels * bits // 8 if block_align is None else block_align
    body = struct.pack("<HHIIHH", tag, channels, rate, rate * align, align, bits)
    if sub_tag is not None:
        body += struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", sub_tag) + guid_tail
    return b"fmt " + struct.pack("<I", len(body)) + body


def chunk(chunk_id: bytes, body: bytes) -> bytes:
    """A RIFF chunk, padded to an even length."""
    return chunk_id + struct.pack("<I", len(body)) + body + b"\0" * (len(body) & 1)


def riff(*chunks: bytes, magic: bytes = b"RIFF") -> bytes:
    body = b"WAVE" + b"".join(chunks)
    return magic + struct.pack("<I", len(body)) + body


def wav_file(tag: int, channels: int, rate: int, bits: int, payload: bytes, *,
             sub_tag: int | None = None) -> bytes:
    return riff(fmt_chunk(tag, channels, rate, bits, sub_tag=sub_tag), chunk(b"data", payload))


def encode(samples: np.ndarray, bits: int, *, is_float: bool = False) -> bytes:
    """Float samples in [-1, 1] as a WAV's sample bytes (interleaved when 2-D)."""
    flat = np.asarray(samples, dtype=np.float64).reshape(-1)
    if is_float:
        return flat.astype("<f4" if bits == 32 else "<f8").tobytes()
    if bits == 8:
        return np.clip(np.round(flat * 128 + 128), 0, 255).astype(np.uint8).tobytes()
    scale = float(1 << (bits - 1))
    ints = np.clip(np.round(flat * scale), -scale, scale - 1).astype(np.int64)
    if bits == 24:
        raw = (ints & 0xFFFFFF).astype("<u4").view(np.uint8).reshape(-1, 4)[:, :3]
        return raw.tobytes()
    return ints.astype("<i2" if bits == 16 else "<i4").tobytes()


def pcm_values(pcm16: bytes) -> np.ndarray:
    return np.frombuffer(pcm16, "<i2").astype(np.float64) / 32768


def tone(freq: float, rate: int, seconds: float = 1.0, amplitude: float = 0.5) -> np.ndarray:
    return amplitude * np.sin(2 * np.pi * freq * np.arange(round(rate * seconds)) / rate)


def rms(values: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(values))))


def amplitude_at(values: np.ndarray, freq: float, rate: int) -> float:
    """The amplitude of the ``freq`` component of ``values`` (a whole number of its cycles
    long), by correlation with a sine and a cosine."""
    t = np.arange(len(values)) / rate
    return float(2 * np.hypot(np.mean(values * np.sin(2 * np.pi * freq * t)),
                              np.mean(values * np.cos(2 * np.pi * freq * t))))


def test_16_bit_mono_24k_passes_through_bit_exact() -> None:
    """A WAV already in the session's format is streamed as it is: not a sample changed."""
    payload = np.random.default_rng(7).integers(-32768, 32767, 4800).astype("<i2").tobytes()
    converted = convert_wav(wav_file(PCM, 1, RATE, 16, payload))
    assert converted.pcm16 == payload
    assert converted.duration_s == pytest.approx(0.2)


@pytest.mark.parametrize("rate", [8000, 11025, 16000, 22050, 32000, 44100, 48000, 96000])
def test_any_rate_becomes_24k_with_the_tone_kept(rate: int) -> None:
    """A 1 kHz tone at any rate comes out at 24 kHz: as many seconds, the same frequency, the
    same level (the resampler's delay removed: it starts where the input starts)."""
    converted = convert_wav(wav_file(PCM, 1, rate, 16, encode(tone(1000, rate), 16)))
    out = pcm_values(converted.pcm16)
    assert len(out) == RATE
    spectrum = np.abs(np.fft.rfft(out))
    assert np.argmax(spectrum) == 1000  # 1 Hz per bin over one second
    assert rms(out[2400:-2400]) == pytest.approx(rms(tone(1000, RATE)), rel=0.01)
    expected = tone(1000, RATE)
    assert np.max(np.abs(out[2400:-2400] - expected[2400:-2400])) < 0.01


@pytest.mark.parametrize("rate", [44100, 48000, 96000])
def test_downsampling_filters_out_what_24k_cannot_carry(rate: int) -> None:
    """A 15 kHz tone (above 24 kHz's 12 kHz Nyquist) is removed, not folded back to 9 kHz at
    full level as picking every other sample would do; a 4 kHz tone beside it is kept."""
    mixed = tone(15000, rate, amplitude=0.4) + tone(4000, rate, amplitude=0.4)
    out = pcm_values(convert_wav(wav_file(PCM, 1, rate, 16, encode(mixed, 16))).pcm16)
    middle = out[2400:-2400]  # 0.8 s: whole cycles of both tones, the filter's edges left out
    assert amplitude_at(middle, 4000, RATE) == pytest.approx(0.4, rel=0.02)
    assert amplitude_at(middle, 9000, RATE) < 0.4 / 1000  # the alias, at least 60 dB down


def test_channels_are_averaged() -> None:
    """Stereo is mixed to mono by averaging: opposite channels cancel, one silent channel
    halves the level, and six channels of one signal give that signal."""
    signal = tone(440, RATE, seconds=0.1)
    opposite = np.stack([signal, -signal], axis=1)
    one_sided = np.stack([signal, np.zeros_like(signal)], axis=1)
    surround = np.repeat(signal[:, None], 6, axis=1)
    cancelled = pcm_values(convert_wav(wav_file(PCM, 2, RATE, 16, encode(opposite, 16))).pcm16)
    halved = pcm_values(convert_wav(wav_file(PCM, 2, RATE, 16, encode(one_sided, 16))).pcm16)
    same = pcm_values(convert_wav(wav_file(PCM, 6, RATE, 16, encode(surround, 16))).pcm16)
    assert np.max(np.abs(cancelled)) <= 1 / 32768
    assert np.max(np.abs(halved - signal / 2)) <= 1 / 32768
    assert np.max(np.abs(same - signal)) <= 1 / 32768
    assert len(cancelled) == len(halved) == len(same) == len(signal)


LEVELS = np.array([0.0, 0.25, -0.25, 0.5, -0.5, -1.0, 0.9, -0.75])


@pytest.mark.parametrize(("bits", "is_float", "tolerance"), [
    (8, False, 1 / 128), (16, False, 1 / 32768), (24, False, 1 / 32768), (32, False, 1 / 32768),
    (32, True, 1 / 32768), (64, True, 1 / 32768)])
def test_every_bit_depth_decodes_to_the_same_levels(bits: int, is_float: bool,
                                                    tolerance: float) -> None:
    """Known levels, positive and negative, in every supported depth (8-bit unsigned, 24-bit
    sign-extended, float) come out as those levels, to the depth's precision."""
    tag = FLOAT if is_float else PCM
    out = pcm_values(convert_wav(wav_file(tag, 1, RATE, bits,
                                          encode(LEVELS, bits, is_float=is_float))).pcm16)
    assert np.max(np.abs(out - LEVELS)) <= tolerance


def test_float_out_of_range_and_nan_are_clipped() -> None:
    """Float samples beyond full scale are clipped, and NaN becomes silence."""
    payload = np.array([2.0, -3.0, np.nan, 0.5], dtype="<f4").tobytes()
    out = np.frombuffer(convert_wav(wav_file(FLOAT, 1, RATE, 32, payload)).pcm16, "<i2")
    assert out.tolist() == [32767, -32768, 0, 16384]


def test_extensible_pcm_is_read() -> None:
    """WAVE_FORMAT_EXTENSIBLE (what many tools write for 24-bit or more than two channels)
    with a PCM sub-format reads like plain PCM."""
    payload = encode(np.stack([LEVELS, LEVELS], axis=1), 24)
    data = riff(fmt_chunk(EXTENSIBLE, 2, RATE, 24, sub_tag=PCM), chunk(b"data", payload))
    assert np.max(np.abs(pcm_values(convert_wav(data).pcm16) - LEVELS)) <= 1 / 32768


def test_chunks_around_the_audio_are_skipped() -> None:
    """Other chunks (LIST metadata of odd length, padded) before and after the audio are
    skipped; a data chunk whose size runs past the end of the file (a writer that was
    stopped) is read as far as it goes, in whole frames."""
    payload = encode(LEVELS, 16)
    data = riff(chunk(b"LIST", b"INFOISFT\x03\x00\x00\x00ab\x00"), fmt_chunk(PCM, 1, RATE, 16),
                chunk(b"data", payload), chunk(b"id3 ", b"xyz"))
    assert parse_wav(data)[1] == payload
    cut = riff(fmt_chunk(PCM, 1, RATE, 16), b"data" + struct.pack("<I", 1 << 30) + payload + b"x")
    assert parse_wav(cut)[1] == payload


@pytest.mark.parametrize(("data", "says"), [
    (b"ID3\x04\x00\x00\x00\x00\x00\x00" + bytes(100), "not a WAV file"),
    (b"RIFF", "shorter than a RIFF header"),
    (riff(fmt_chunk(PCM, 1, RATE, 16), magic=b"RIFX"), "big-endian"),
    (riff(fmt_chunk(0x0011, 1, 8000, 4, block_align=256), chunk(b"data", bytes(256))),
     "compressed WAV (format 0x0011, IMA ADPCM)"),
    (riff(fmt_chunk(0x0007, 1, 8000, 8), chunk(b"data", bytes(80))),
     "compressed WAV (format 0x0007, mu-law)"),
    (riff(fmt_chunk(0x0055, 2, 44100, 0, block_align=1), chunk(b"data", bytes(80))), "MP3"),
    (riff(fmt_chunk(PCM, 1, RATE, 12, block_align=2), chunk(b"data", bytes(80))),
     "12-bit PCM WAV is not supported"),
    (riff(fmt_chunk(FLOAT, 1, RATE, 16), chunk(b"data", bytes(80))),
     "16-bit float WAV is not supported"),
    (riff(fmt_chunk(EXTENSIBLE, 1, RATE, 16, sub_tag=0x0002), chunk(b"data", bytes(80))),
     "compressed WAV (format 0x0002, Microsoft ADPCM)"),
    (riff(fmt_chunk(EXTENSIBLE, 1, RATE, 16, sub_tag=PCM, guid_tail=bytes(14)),
          chunk(b"data", bytes(80))), "unknown sub-format"),
    (riff(fmt_chunk(PCM, 0, RATE, 16, block_align=0), chunk(b"data", bytes(80))),
     "no channels"),
    (riff(fmt_chunk(PCM, 2, RATE, 16, block_align=2), chunk(b"data", bytes(80))),
     "its header says 2"),
    (riff(fmt_chunk(PCM, 1, 500, 16), chunk(b"data", bytes(80))), "500 Hz is not supported"),
    (riff(fmt_chunk(PCM, 1, RATE, 16)), "no data chunk"),
    (riff(chunk(b"data", bytes(80))), "data chunk comes before its fmt chunk"),
    (riff(chunk(b"LIST", b"abcd")), "no fmt chunk"),
    (riff(fmt_chunk(PCM, 1, RATE, 16), chunk(b"data", b"")), "holds no audio"),
    (riff(fmt_chunk(PCM, 2, RATE, 16), chunk(b"data", b"\x01\x02")), "holds no audio"),
])
def test_what_is_refused_is_named(data: bytes, says: str) -> None:
    """Each file talk cannot read is refused with a reason that names what it is."""
    with pytest.raises(WavError) as refused:
        convert_wav(data)
    assert says in str(refused.value)


def test_the_answer_is_written_as_24k_mono_pcm16(tmp_path: Path) -> None:
    """The answer file is a WAV any reader opens: 24 kHz, mono, 16-bit, the bytes received,
    and no temporary file left beside it."""
    pcm = np.arange(-2400, 2400, dtype="<i2").tobytes()
    path = tmp_path / "answer.wav"
    write_wav(path, pcm)
    with wave.open(str(path), "rb") as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (RATE, 1, 2)
        assert wav.readframes(wav.getnframes()) == pcm
    assert [p.name for p in tmp_path.iterdir()] == ["answer.wav"]


def audio_delta(pcm: bytes) -> dict[str, Any]:
    return {"type": "response.output_audio.delta", "delta": base64.b64encode(pcm).decode()}


def turn(state: AnswerState, response_id: str, pcm: bytes, status: str = "completed",
         details: dict[str, Any] | None = None) -> list[Output]:
    """One spoken turn and its answer, as the server reports them; what the state returned."""
    outputs: list[Output] = []
    events: list[dict[str, Any]] = [
        {"type": "input_audio_buffer.speech_started"},
        {"type": "input_audio_buffer.speech_stopped"},
        {"type": "conversation.item.input_audio_transcription.completed", "transcript": "Hi."},
        {"type": "response.created", "response": {"id": response_id}},
        {"type": "response.output_audio_transcript.delta", "delta": "Hello"},
        audio_delta(pcm),
        {"type": "response.output_audio_transcript.done", "transcript": "Hello"},
        {"type": "response.done", "response": {"id": response_id, "status": status,
                                               "status_details": details}},
    ]
    for event in events:
        outputs += state.apply(event)
    return outputs


def test_an_answered_turn_finishes_once_the_question_is_sent() -> None:
    """A turn heard and answered: done, but only once the whole question was sent; the
    answer's audio is kept, both sides are printed and the response is acknowledged."""
    state = AnswerState()
    assert not state.finished(question_sent=True)
    outputs = turn(state, "resp_1", bytes(960))
    assert not state.finished(question_sent=False)
    assert state.finished(question_sent=True)
    assert bytes(state.audio) == bytes(960)
    assert Said("you", "Hi.", ends_line=True) in outputs
    assert Said("assistant", "Hello", ends_line=False) in outputs
    assert Played("resp_1", 20) in outputs


def test_a_turn_still_being_heard_or_answered_is_waited_for() -> None:
    """After a first answer, speech heard again means not done: not while it is spoken, not
    after it stopped, not while its answer plays; done when that answer ends."""
    state = AnswerState()
    turn(state, "resp_1", bytes(960))
    state.apply({"type": "input_audio_buffer.speech_started"})
    assert not state.finished(question_sent=True)
    state.apply({"type": "input_audio_buffer.speech_stopped"})
    assert not state.finished(question_sent=True)
    state.apply({"type": "response.created", "response": {"id": "resp_2"}})
    assert not state.finished(question_sent=True)
    state.apply({"type": "response.done", "response": {"id": "resp_2", "status": "completed"}})
    assert state.finished(question_sent=True)


def test_a_turn_heard_as_nothing_is_not_waited_for() -> None:
    """A turn whose transcript comes back empty gets no answer: it does not keep talk
    waiting."""
    state = AnswerState()
    turn(state, "resp_1", bytes(960))
    for event in [{"type": "input_audio_buffer.speech_started"},
                  {"type": "input_audio_buffer.speech_stopped"},
                  {"type": "conversation.item.input_audio_transcription.completed",
                   "transcript": " "}]:
        state.apply(event)
    assert state.finished(question_sent=True)


def test_an_interrupted_answer_is_recorded_as_such() -> None:
    """A cancelled answer counts as ended but not completed, with its reason kept."""
    state = AnswerState()
    turn(state, "resp_1", bytes(960), status="cancelled",
         details={"type": "cancelled", "reason": "turn_detected"})
    assert state.last_status == "cancelled" and state.last_problem == "turn_detected"


def test_a_bad_wav_exits_3_with_one_line(tmp_path: Path) -> None:
    """The command refuses a compressed WAV before it connects anywhere: exit 3, one line on
    stderr naming the file and the encoding."""
    question = tmp_path / "question.wav"
    question.write_bytes(riff(fmt_chunk(0x0011, 1, 8000, 4, block_align=256),
                              chunk(b"data", bytes(256))))
    done = subprocess.run([sys.executable, "-m", "duplex_gateway", "talk", "--url",
                           "ws://127.0.0.1:9/v1/realtime", "--input", str(question),
                           "--output", str(tmp_path / "answer.wav")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(question) in lines[0] and "IMA ADPCM" in lines[0], lines


def test_help_lists_every_exit_status() -> None:
    """``talk --help`` names every exit status talk can end with, and every optional flag's
    default."""
    talk = next(action for action in _parser()._actions
                if isinstance(action, argparse._SubParsersAction)).choices["talk"]
    text = talk.format_help()
    for code in Exit:
        assert f"\n  {int(code)}  " in text, code
    for action in talk._actions:
        if action.option_strings and not action.required and action.dest != "help":
            assert action.help and "default" in action.help, action.dest
