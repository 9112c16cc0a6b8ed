"""Golden conversations: one per scenario, each asserting the exact sequence of server events
(their wire ``type``, as the gateway renders them) that the conversation core sends, on the
loopback and on the fake frame backend where the scenario applies to both.

The store adds the terminal event and the gateway the connection's own notices; the
end-to-end tests cover those (idle expiry: ``tests/e2e/test_lease_lapse.py``, resync after a
trimmed log: ``tests/e2e/test_client_resume.py``, a client that stops reading:
``tests/e2e/test_input_backpressure.py`` and ``tests/e2e/test_output_backpressure.py``).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from contract import messages as msg
from inference_worker.audio_frames import FrameOutput
from inference_worker.backends.registry import frame_core, loopback_core
from inference_worker.conversation.core import ConversationCore
from inference_worker.conversation.turns import TurnMode
from tests.worker.feeding import feed
from tests.worker.realtime_render import validate_strict

T0 = 100.0
FRAME_S = 0.08
RATE = 24000
LOUD = FrameOutput(audio=b"\x10\x20" * 1920, level=0.1, text="hi ")  # 80 ms
QUIET = FrameOutput(audio=bytes(3840), level=0.0)
SILENCE_FRAMES = 10  # 800 ms of quiet end the model's turn

#: A created item: GA's name, then its beta and seed name, then its completion.
ITEM = ["conversation.item.added", "conversation.item.created", "conversation.item.done"]
OPENING = ["response.created", "response.output_item.added", "conversation.item.added",
           "conversation.item.created", "response.content_part.added"]
AUDIO_CLOSING = ["response.output_audio.done", "response.output_audio_transcript.done",
                 "response.content_part.done", "conversation.item.done",
                 "response.output_item.done", "response.done", "rate_limits.updated"]
USER_TURN = ["input_audio_buffer.committed", *ITEM]
DELTA = "response.output_audio.delta"
TRANSCRIPT = "response.output_audio_transcript.delta"


def tone(ms: int) -> bytes:
    """A 440 Hz tone at a third of full scale: speech to the VAD."""
    t = np.arange(ms * RATE // 1000) / RATE
    return (0.33 * 32767 * np.sin(2 * math.pi * 440 * t)).astype("<i2").tobytes()


def silence(ms: int) -> bytes:
    """``ms`` of silence."""
    return bytes(ms * 48)


class Session:
    """A core under test and the wire types of what it sent, strictly validated."""

    def __init__(self, core: ConversationCore) -> None:
        self.core = core
        self.now = T0

    def send(self, command: msg.Command) -> list[str]:
        self.core.receive(command, self.now)
        return self.drain()

    def append(self, audio: bytes, chunk_ms: int = 20) -> list[str]:
        size = chunk_ms * 48
        for offset in range(0, len(audio), size):
            self.core.receive(msg.AppendAudio(audio=audio[offset:offset + size]), self.now)
        return self.drain()

    def model(self, *outputs: FrameOutput) -> list[str]:
        for output in outputs:
            self.now += FRAME_S
            feed(self.core, output, self.now)
        return self.drain()

    def play(self, seconds: float) -> list[str]:
        self.now += seconds
        self.core.tick(self.now)
        return self.drain()

    def drain(self) -> list[str]:
        return [validate_strict(event)["type"] for event in self.core.events_to_send()]


def loopback() -> Session:
    """A loopback session."""
    return Session(loopback_core("sess_gold"))


def fake() -> Session:
    """A session of the fake frame backend (a full-duplex model's turns)."""
    return Session(frame_core("sess_gold", model="fake", frame_seconds=FRAME_S,
                              turns=TurnMode.AUDIO))


BACKENDS: dict[str, Callable[[], Session]] = {"loopback": loopback, "fake": fake}


def answer(session: Session, name: str) -> list[str]:
    """What the model says next: the loopback plays the turn out, the fake model speaks
    three frames, then falls silent."""
    if name == "loopback":
        return session.play(1.0)
    return session.model(LOUD, LOUD, LOUD, *[QUIET] * SILENCE_FRAMES)


@pytest.mark.parametrize("name", BACKENDS)
def test_push_to_talk_turn(name: str) -> None:
    """turn_detection null, then append, commit, response.create: the user item, then the
    answer, then its end."""
    s = BACKENDS[name]()
    assert s.send(msg.UpdateSession(session={"audio": {"input": {"turn_detection": None}}})) \
        == ["session.updated"]
    assert s.append(tone(200)) == []
    assert s.send(msg.CommitInput()) == USER_TURN
    opened = s.send(msg.CreateResponse())
    if name == "loopback":  # the first 40 ms chunk is due at once
        assert opened == [*OPENING, DELTA]
        assert answer(s, name) == [DELTA] * 4 + AUDIO_CLOSING
    else:
        assert opened == OPENING
        assert answer(s, name) == [DELTA, TRANSCRIPT] * 3 \
            + [DELTA] * SILENCE_FRAMES + AUDIO_CLOSING


@pytest.mark.parametrize("name", BACKENDS)
def test_server_vad_turn_with_an_automatic_response(name: str) -> None:
    """server_vad: speech_started, speech_stopped, the commit and the automatic answer."""
    s = BACKENDS[name]()
    assert s.send(msg.UpdateSession(session={"audio": {"input": {"turn_detection": {
        "type": "server_vad", "silence_duration_ms": 300}}}})) == ["session.updated"]
    heard = s.append(silence(500) + tone(600) + silence(400))
    expected = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                *USER_TURN, *OPENING]
    assert heard == ([*expected, DELTA] if name == "loopback" else expected)


@pytest.mark.parametrize("name", BACKENDS)
def test_barge_in_by_speech_during_the_answer(name: str) -> None:
    """Speech while the answer plays: speech_started, then the answer ends cancelled
    (turn_detected), then the new turn's stop and commit."""
    s = BACKENDS[name]()
    s.send(msg.UpdateSession(session={"audio": {"input": {"turn_detection": {
        "type": "server_vad", "silence_duration_ms": 300, "create_response": False}}}}))
    s.append(tone(600) + silence(400))
    s.send(msg.CreateResponse())
    if name == "fake":
        s.model(LOUD)
    heard = s.append(tone(600) + silence(400))
    assert heard == ["input_audio_buffer.speech_started", *AUDIO_CLOSING,
                     "input_audio_buffer.speech_stopped", *USER_TURN]


@pytest.mark.parametrize("name", BACKENDS)
def test_the_barge_in_command(name: str) -> None:
    """barge_in: the answer ends cancelled (turn_detected), the input buffer is cleared."""
    s = BACKENDS[name]()
    s.append(tone(200))
    s.send(msg.CommitInput())
    s.send(msg.CreateResponse())
    if name == "fake":
        s.model(LOUD)
    assert s.send(msg.BargeIn()) == [*AUDIO_CLOSING, "input_audio_buffer.cleared"]


@pytest.mark.parametrize("name", BACKENDS)
def test_cancel(name: str) -> None:
    """response.cancel ends the answer cancelled; a second cancel is the benign refusal."""
    s = BACKENDS[name]()
    s.append(tone(200))
    s.send(msg.CommitInput())
    s.send(msg.CreateResponse())
    assert s.send(msg.CancelResponse()) == AUDIO_CLOSING
    assert s.send(msg.CancelResponse()) == ["error"]


@pytest.mark.parametrize("name", BACKENDS)
def test_clear_output(name: str) -> None:
    """output_audio_buffer.clear: cleared first, then the answer's cancelled end."""
    s = BACKENDS[name]()
    s.append(tone(200))
    s.send(msg.CommitInput())
    s.send(msg.CreateResponse())
    assert s.send(msg.ClearOutputAudio()) == ["output_audio_buffer.cleared", *AUDIO_CLOSING]


@pytest.mark.parametrize("name", BACKENDS)
def test_truncate_after_partial_playback_shortens_the_history(name: str) -> None:
    """The client heard 40 ms of the answer: the truncation cancels it, cuts its item to 40
    ms and drops its transcript."""
    s = BACKENDS[name]()
    s.append(tone(400))
    s.send(msg.CommitInput())
    s.send(msg.CreateResponse())
    if name == "fake":
        s.model(LOUD, LOUD)
    else:
        s.play(0.05)
    [item] = [i for i in s.core.history if i.truncatable]
    assert s.send(msg.TruncateItem(item_id=item.id, content_index=0, audio_end_ms=40)) == [
        *AUDIO_CLOSING, "conversation.item.truncated"]
    cut = s.core.history_item(item.id)
    assert cut is not None and cut.audio_ms == 40
    assert cut.content[0]["transcript"] == ""


def test_text_turn_in_and_out() -> None:
    """A text message in, a text response out (the loopback's answer to text is empty)."""
    s = loopback()
    assert s.send(msg.CreateItem(item={"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "hello"}]})) == ITEM
    assert s.send(msg.CreateResponse(response={"output_modalities": ["text"]})) == [
        *OPENING, "response.output_text.done", "response.content_part.done",
        "conversation.item.done", "response.output_item.done", "response.done",
        "rate_limits.updated"]


def test_out_of_band_response() -> None:
    """conversation "none": the answer's events without any conversation.item.*."""
    s = loopback()
    s.append(tone(100))
    s.send(msg.CommitInput())
    assert s.send(msg.CreateResponse(response={"conversation": "none"})) == [
        "response.created", "response.output_item.added", "response.content_part.added",
        DELTA]
    assert s.play(1.0) == [DELTA, DELTA, "response.output_audio.done",
                           "response.output_audio_transcript.done",
                           "response.content_part.done", "response.output_item.done",
                           "response.done", "rate_limits.updated"]


@pytest.mark.parametrize("name", BACKENDS)
def test_item_create_retrieve_delete(name: str) -> None:
    """Create, retrieve, delete, and retrieve again: the last is item_not_found."""
    s = BACKENDS[name]()
    audio = base64.b64encode(tone(100)).decode()
    assert s.send(msg.CreateItem(item={"type": "message", "role": "user", "id": "mine",
                                       "content": [{"type": "input_audio", "audio": audio}]})
                  ) == ITEM
    assert s.send(msg.RetrieveItem(item_id="mine")) == ["conversation.item.retrieved"]
    assert s.send(msg.DeleteItem(item_id="mine")) == ["conversation.item.deleted"]
    assert s.send(msg.RetrieveItem(item_id="mine")) == ["error"]


@pytest.mark.parametrize("name", BACKENDS)
def test_function_call_round_trip(name: str) -> None:
    """A replayed function_call and its output join the history; a second output is refused."""
    s = BACKENDS[name]()
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    result = {"type": "function_call_output", "call_id": "c1", "output": "42"}
    assert s.send(msg.CreateItem(item=call)) == ITEM
    assert s.send(msg.CreateItem(item=result)) == ITEM
    assert s.send(msg.CreateItem(item=result)) == ["error"]


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("patch", [
    {"temperature": 0.8}, {"audio": {"input": {"format": {"type": "audio/opus"}}}},
    {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 3}}}},
    {"output_modalities": ["audio", "text"]},
])
def test_session_update_refusals(name: str, patch: dict[str, Any]) -> None:
    """A refused update answers one error and changes nothing."""
    s = BACKENDS[name]()
    before = s.core.session
    assert s.send(msg.UpdateSession(session=patch)) == ["error"]
    assert s.core.session == before


@pytest.mark.parametrize("name", BACKENDS)
def test_heartbeat(name: str) -> None:
    """session.heartbeat answers session.heartbeat_ack, in order with everything else."""
    s = BACKENDS[name]()
    assert s.send(msg.Heartbeat()) == ["session.heartbeat_ack"]
