"""G.711 sessions (``audio/pcmu``, ``audio/pcma`` at 8 kHz): the conversation core converts at
its edge, so the model, the turn detector and the playback ledger only see pcm16 24 kHz, and
the client gets its own format back."""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
import pytest

from contract import messages as msg
from inference_worker.audio_formats import alaw_decode, ulaw_decode, ulaw_encode
from inference_worker.backends.registry import frame_core, loopback_core
from inference_worker.conversation.core import ConversationCore
from inference_worker.conversation.turns import TurnMode
from tests.worker.realtime_render import validate_strict

T0 = 100.0


def drain(core: ConversationCore) -> list[msg.Event]:
    """The core's events, each strictly valid."""
    events = core.events_to_send()
    for event in events:
        validate_strict(event)
    return events


def tone_8k(ms: int) -> bytes:
    """A 440 Hz tone as pcm16 at 8 kHz."""
    t = np.arange(ms * 8) / 8000
    return (0.3 * 32767 * np.sin(2 * math.pi * 440 * t)).astype("<i2").tobytes()


def formats(input_type: str, output_type: str) -> msg.UpdateSession:
    """A session.update setting both directions' formats."""
    return msg.UpdateSession(session={"audio": {"input": {"format": {"type": input_type}},
                                                "output": {"format": {"type": output_type}}}})


def push_to_talk() -> ConversationCore:
    """A loopback session with ``turn_detection: null``: the tests that use it commit and
    create responses themselves, with a tone the default server_vad would take for a turn."""
    core = loopback_core("s")
    core.receive(msg.UpdateSession(session={"audio": {"input": {"turn_detection": None}}}), T0)
    [updated] = drain(core)
    assert isinstance(updated, msg.SessionUpdated)
    return core


def test_a_g711_session_is_accepted_and_shown() -> None:
    """audio/pcmu in and audio/pcma out are accepted and shown as the effective formats."""
    core = loopback_core("s")
    core.receive(formats("audio/pcmu", "audio/pcma"), T0)
    [updated] = drain(core)
    assert isinstance(updated, msg.SessionUpdated)
    audio = updated.session["audio"]
    assert audio["input"]["format"] == {"type": "audio/pcmu"}
    assert audio["output"]["format"] == {"type": "audio/pcma"}


def test_the_loopback_answers_a_mu_law_turn_in_a_law() -> None:
    """One second of mu-law in (8000 bytes) is 1 s of pcm16 24 kHz to the core: the commit
    takes it, the ledger counts 1000 ms, and the playback comes out as 8000 A-law bytes that
    decode to the same tone."""
    core = push_to_talk()
    core.receive(formats("audio/pcmu", "audio/pcma"), T0)
    sent = tone_8k(1000)
    for offset in range(0, 8000, 160):  # 20 ms telephony packets
        core.receive(msg.AppendAudio(audio=ulaw_encode(sent[offset * 2:(offset + 160) * 2])),
                     T0)
    core.receive(msg.CommitInput(), T0)
    core.receive(msg.CreateResponse(), T0)
    core.tick(T0 + 2)
    events = drain(core)
    out = b"".join(e.audio for e in events if isinstance(e, msg.AudioDelta))
    assert abs(len(out) - 8000) <= 1  # one byte a sample at 8 kHz (a sample may wait)
    heard = np.frombuffer(alaw_decode(out), dtype="<i2").astype(np.float64)
    original = np.frombuffer(sent, dtype="<i2").astype(np.float64)[:heard.size]
    # Companded twice and resampled there and back: the tone survives, the noise stays low.
    noise = heard[16:-16] - original[16:-16]
    assert 10 * math.log10(np.mean(original ** 2) / np.mean(noise ** 2)) > 15
    core.receive(msg.AckPlayback(played_ms=1000), T0 + 2)
    [ack] = drain(core)
    assert isinstance(ack, msg.PlaybackAcknowledged) and ack.generated_ms == 1000


@pytest.mark.parametrize("turns", [TurnMode.AUDIO, TurnMode.EVENTS])
def test_a_frame_model_hears_pcm16_at_24k(turns: TurnMode) -> None:
    """On a frame backend the engine gets the converted audio: each G.711 byte becomes three
    24 kHz samples."""
    core = frame_core("s", model="fake", frame_seconds=0.08, turns=turns)
    core.receive(formats("audio/pcmu", "audio/pcmu"), T0)
    drain(core)
    core.receive(msg.AppendAudio(audio=ulaw_encode(tone_8k(100))), T0)
    pending = core.take_input()
    assert len(pending.audio) == 800 * 6
    assert np.frombuffer(pending.audio, dtype="<i2").any()


def test_a_created_items_audio_is_read_in_the_input_format() -> None:
    """A conversation.item.create input_audio part of a mu-law session is mu-law: the loopback
    answers it with the same tone, in the output format."""
    core = loopback_core("s")
    core.receive(formats("audio/pcmu", "audio/pcmu"), T0)
    sent = ulaw_encode(tone_8k(200))
    core.receive(msg.CreateItem(item={"type": "message", "role": "user", "content": [
        {"type": "input_audio", "audio": base64.b64encode(sent).decode()}]}), T0)
    core.receive(msg.CreateResponse(), T0)
    core.tick(T0 + 1)
    out = b"".join(e.audio for e in drain(core) if isinstance(e, msg.AudioDelta))
    assert abs(len(out) - len(sent)) <= 1
    heard = np.frombuffer(ulaw_decode(out), dtype="<i2").astype(np.float64)
    original = np.frombuffer(tone_8k(200), dtype="<i2").astype(np.float64)[:heard.size]
    noise = heard[16:-16] - original[16:-16]
    assert 10 * math.log10(np.mean(original ** 2) / np.mean(noise ** 2)) > 15


def test_switching_back_to_pcm_passes_audio_through() -> None:
    """After pcmu, audio/pcm again: appended bytes are pcm16 24 kHz as sent."""
    core = frame_core("s", model="fake", frame_seconds=0.08)
    core.receive(formats("audio/pcmu", "audio/pcmu"), T0)
    core.receive(formats("audio/pcm", "audio/pcm"), T0)
    drain(core)
    audio = bytes(range(256)) * 10
    core.receive(msg.AppendAudio(audio=audio), T0)
    assert core.take_input().audio == audio


def test_a_response_may_ask_for_its_own_format() -> None:
    """response.create with audio.output.format audio/pcmu in a pcm session: that response's
    audio is mu-law (a third of the bytes per millisecond, one byte a sample) and its
    response object says so; the next response is pcm again."""
    core = push_to_talk()
    second = (bytes(range(256)) * 188)[:48000]  # 1 s of pcm16 24 kHz
    core.receive(msg.AppendAudio(audio=second), T0)
    core.receive(msg.CommitInput(), T0)
    core.receive(msg.CreateResponse(response={"audio": {"output": {
        "format": {"type": "audio/pcmu"}}}}), T0)
    core.tick(T0 + 2)
    events = drain(core)
    [created] = [e for e in events if isinstance(e, msg.ResponseCreated)]
    assert created.response["audio"]["output"]["format"] == {"type": "audio/pcmu"}
    out = b"".join(e.audio for e in events if isinstance(e, msg.AudioDelta))
    assert abs(len(out) - 8000) <= 1
    core.receive(msg.AppendAudio(audio=second), T0 + 2)
    core.receive(msg.CommitInput(), T0 + 2)
    core.receive(msg.CreateResponse(), T0 + 2)
    core.tick(T0 + 4)
    events = drain(core)
    [created] = [e for e in events if isinstance(e, msg.ResponseCreated)]
    assert created.response["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert b"".join(e.audio for e in events if isinstance(e, msg.AudioDelta)) == second


@pytest.mark.parametrize("make", [
    push_to_talk,
    lambda: frame_core("s", model="fake", frame_seconds=0.08)])
def test_an_odd_pcm16_append_is_refused_and_a_g711_one_is_not(make: Any) -> None:
    """Whole samples depend on the format: an odd-length append of pcm16 is invalid_value
    (nothing of it is buffered, so the next audio stays aligned); of G.711, one byte is one
    sample."""
    core = make()
    core.receive(msg.AppendAudio(audio=b"\x01\x02\x03", event_id="odd"), T0)
    [error] = drain(core)
    assert isinstance(error, msg.ErrorEvent)
    assert (error.code, error.param, error.client_event_id) == ("invalid_value", "audio", "odd")
    core.receive(msg.AppendAudio(audio=bytes(4800)), T0)
    core.receive(msg.CommitInput(), T0)
    assert [e.KIND for e in drain(core)] == ["input.committed", "item.added", "item.created",
                                             "item.done"]
    core.receive(formats("audio/pcmu", "audio/pcmu"), T0)
    drain(core)
    core.receive(msg.AppendAudio(audio=ulaw_encode(tone_8k(100))[:-1]), T0)
    assert [e.KIND for e in drain(core)] == []
