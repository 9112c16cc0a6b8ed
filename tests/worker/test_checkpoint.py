"""Checkpoints of the conversation core (``inference_worker/conversation/checkpoint.py``).

The property that matters: a core restored from another's checkpoint, taken at a random safe
point of a random conversation and carried through its encoding, is that core. From then on
both get the same commands, frames and time, and they must emit the same events and ask the
engine the same (its audio, stops and clears), step by step. The codec's own tests hold its
refusals: a format it does not know, a field missing or of the wrong kind, a bound.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from contract import messages as msg
from inference_worker.audio_frames import FrameOutput
from inference_worker.backends.registry import frame_core, loopback_core
from inference_worker.conversation.checkpoint import (
    CHECKPOINT_FORMAT,
    MAX_CHECKPOINT_BYTES,
    CheckpointError,
    CoreState,
    decode,
    encode,
)
from inference_worker.conversation.core import ConversationCore
from inference_worker.conversation.seed_settings import VoicePrompt
from inference_worker.conversation.turns import TurnMode
from inference_worker.conversation.user_input import UserTurn
from tests.worker.feeding import feed
from tests.worker.test_core_stateful import FRAME_S, FRAMES, T0

_SPEECH = bytes((i * 7 + 3) % 251 for i in range(4800)) * 2  # 100 ms, loud enough for the VAD
_LOOPBACK_UPDATES = [
    msg.UpdateSession(session={"extra_body": {"loopback_mode": "stream"}}),
    msg.UpdateSession(session={"extra_body": {"loopback_mode": "turn"}}),
    msg.UpdateSession(session={"extra_body": {"auto_response": True,
                                              "force_listen_count": 2}}),
]
_COMMANDS = [
    msg.CommitInput(), msg.ClearInput(), msg.CreateResponse(), msg.CancelResponse(),
    msg.ClearOutputAudio(), msg.CancelInput(), msg.BargeIn(), msg.Heartbeat(),
    msg.SignalTurn(event="user.typing"), msg.CreateResponse(response={"output_modalities":
                                                                      ["text"]}),
    msg.CreateItem(item={"type": "message", "role": "user",
                         "content": [{"type": "input_text", "text": "hello"}]}),
    msg.UpdateSession(session={"instructions": "be brief"}),
]


def _frame_core(mode: TurnMode) -> ConversationCore:
    return frame_core("sess_twin", model="fake", frame_seconds=FRAME_S, turns=mode)


def _core(mode: TurnMode) -> ConversationCore:
    return loopback_core("sess_twin") if mode is TurnMode.LOOPBACK else _frame_core(mode)


def _feeding(frame: FrameOutput, now: float) -> Callable[[ConversationCore], None]:
    return lambda core: feed(core, frame, now)


class TwinMachine(RuleBasedStateMachine):
    """A session at random; at a safe point its checkpoint restores a twin."""

    def __init__(self) -> None:
        super().__init__()
        self.cores: list[ConversationCore] = []
        self.mode = TurnMode.AUDIO
        self.now = T0
        self.heard = bytearray()  # every byte of input audio appended, in order

    @initialize(mode=st.sampled_from(list(TurnMode)))
    def start(self, mode: TurnMode) -> None:
        self.mode = mode
        self.cores = [_core(mode)]

    def _step(self, act: Callable[[ConversationCore], None]) -> None:
        for core in self.cores:
            act(core)
        events = [core.events_to_send() for core in self.cores]
        asked = [core.take_input() for core in self.cores]
        if len(self.cores) == 2:
            assert events[0] == events[1], "the restored core said something else"
            first, twin = asked
            assert (first.clear, first.audio, first.stops, first.video) == (
                twin.clear, twin.audio, twin.stops, twin.video), "the engine was asked otherwise"

    @rule(chunks=st.integers(min_value=1, max_value=4), loud=st.booleans())
    def append(self, chunks: int, loud: bool) -> None:
        audio = _SPEECH if loud else bytes(len(_SPEECH))
        for _ in range(chunks):
            self.heard += audio
            self._step(lambda core: core.receive(msg.AppendAudio(audio=audio), self.now))
            self.now += 0.1

    @rule(command=st.sampled_from(_COMMANDS))
    def command(self, command: msg.Command) -> None:
        self._step(lambda core: core.receive(command, self.now))

    @rule(update=st.sampled_from(_LOOPBACK_UPDATES))
    @precondition(lambda self: self.mode is TurnMode.LOOPBACK)
    def loopback_mode(self, update: msg.Command) -> None:
        self._step(lambda core: core.receive(update, self.now))

    @rule(value=st.sampled_from([None, {"type": "server_vad", "silence_duration_ms": 200},
                                 {"type": "server_vad", "create_response": False}]))
    def turn_detection(self, value: dict[str, Any] | None) -> None:
        update = msg.UpdateSession(session={"audio": {"input": {"turn_detection": value}}})
        self._step(lambda core: core.receive(update, self.now))

    @rule(played=st.integers(0, 2000), committed=st.integers(0, 2000))
    def ack(self, played: int, committed: int) -> None:
        ack = msg.AckPlayback(played_ms=played, committed_ms=min(played, committed))
        self._step(lambda core: core.receive(ack, self.now))

    @rule(names=st.lists(st.sampled_from(sorted(FRAMES)), min_size=1, max_size=12))
    @precondition(lambda self: self.mode is not TurnMode.LOOPBACK)
    def model_output(self, names: list[str]) -> None:
        for name in names:
            self.now += FRAME_S
            self._step(_feeding(FRAMES[name], self.now))

    @rule(seconds=st.floats(min_value=0.0, max_value=3.0))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self._step(lambda core: core.tick(self.now))

    @rule()
    @precondition(lambda self: len(self.cores) == 1)
    def checkpoint(self) -> None:
        state = self.cores[0].checkpoint()
        if state is None:
            return  # not at a safe point: nothing to continue from here
        restored = decode(encode(state))
        assert restored == state
        twin = _core(self.mode)
        # The buffer is the last bytes of the input audio: what a restorer reads back.
        size = state.buffer.size
        twin.restore(restored, bytes(self.heard[len(self.heard) - size:]) if size else b"")
        # A new engine slot is given the session's configuration before anything else.
        handed = twin.take_input()
        assert (handed.config is not None) == (self.mode is not TurnMode.LOOPBACK)
        assert twin.checkpoint() == state, "the twin's state is not the one it was given"
        assert twin.session == self.cores[0].session
        assert twin.history == self.cores[0].history
        self.cores.append(twin)


TestTwin = TwinMachine.TestCase
TestTwin.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])


def test_no_checkpoint_off_a_safe_point() -> None:
    """Events not taken, an active response, a closing session: no checkpoint; taken the
    events and ended the response, one."""
    core = _frame_core(TurnMode.AUDIO)
    core.receive(msg.Heartbeat(), T0)
    assert core.checkpoint() is None  # the heartbeat's answer is not taken
    core.events_to_send()
    core.receive(msg.CreateResponse(), T0)
    core.events_to_send()
    assert core.active_response is not None and core.checkpoint() is None
    core.receive(msg.CancelResponse(), T0)
    core.events_to_send()
    # The engine has the stop to take.
    assert core.active_response is None and core.checkpoint() is None
    assert core.take_input().stops == 1 and core.checkpoint() is not None
    core.receive(msg.CloseSession(), T0)
    core.events_to_send()
    assert core.checkpoint() is None


def test_the_loopback_restores_its_buffer_from_the_bytes_given() -> None:
    """The loopback keeps its turn's audio: its buffer comes back from the bytes the
    restorer re-reads, which must be the buffer's length; a commit then answers with them."""
    core = loopback_core("sess_loop")
    core.receive(msg.UpdateSession(session={"audio": {"input": {"turn_detection": None}}}), T0)
    core.receive(msg.AppendAudio(audio=_SPEECH), T0)
    core.events_to_send()
    state = core.checkpoint()
    assert state is not None and state.buffer.size == len(_SPEECH)
    with pytest.raises(ValueError, match="bytes given for a buffer"):
        loopback_core("sess_loop").restore(state, b"")
    twin = loopback_core("sess_loop")
    twin.restore(decode(encode(state)), _SPEECH)
    for each in (core, twin):
        each.receive(msg.CommitInput(), T0 + 1)
    assert core.events_to_send() == twin.events_to_send()


def _rich_state() -> CoreState:
    """A checkpoint with every optional part present."""
    core = _frame_core(TurnMode.AUDIO)
    core.receive(msg.CreateItem(item={"type": "message", "role": "user",
                                      "content": [{"type": "input_text", "text": "hi"}]}), T0)
    core.events_to_send()
    state = core.checkpoint()
    assert state is not None
    return dataclasses.replace(
        state, ref_audio=VoicePrompt("audio/wav", b"RIFF\x00\x01"),
        unanswered=UserTurn(item_id="item_1", audio=b"\x01\x02" * 10), idle_from_ms=1200,
        model_input_ms=800)


def test_a_checkpoint_round_trips_through_its_encoding() -> None:
    """Without a model context it is written as version 1, which a worker that knows only
    that still reads; with one, as the newest version."""
    state = _rich_state()
    data = encode(state)
    assert json.loads(data)["v"] == 1 and "model_context" not in json.loads(data)
    assert decode(data) == state
    with_context = dataclasses.replace(state, model_context=(b"\x00\x01", b"", b"\xff" * 9))
    data = encode(with_context)
    assert json.loads(data)["v"] == CHECKPOINT_FORMAT == 2
    assert decode(data) == with_context
    assert decode(encode(dataclasses.replace(state, model_context=()))).model_context == ()


def test_any_text_a_client_sent_survives_the_encoding() -> None:
    """Instructions holding a lone surrogate (valid JSON text, no valid UTF-8) and other
    scripts round trip: the encoding is ASCII."""
    core = _frame_core(TurnMode.AUDIO)
    text = "be brief \ud800 \u00e9\u4e2d \U0001f600"
    core.receive(msg.UpdateSession(session={"instructions": json.loads(f'"{text}"')}), T0)
    core.events_to_send()
    core.take_input()  # the engine takes the new slot configuration
    state = core.checkpoint()
    assert state is not None
    data = encode(state)
    assert data.isascii() and decode(data) == state


def _edited(path: list[str], value: Any) -> bytes:
    document = json.loads(encode(_rich_state()))
    target = document
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return json.dumps(document).encode()


def _with_context(path: list[str], value: Any) -> bytes:
    document = json.loads(encode(dataclasses.replace(_rich_state(), model_context=(b"ok",))))
    document[path[0]] = value
    return json.dumps(document).encode()


@pytest.mark.parametrize(("data", "reason"), [
    (b"not json", "not a checkpoint"),
    (b"[1]", "format None"),
    (_edited(["v"], CHECKPOINT_FORMAT + 1), f"format {CHECKPOINT_FORMAT + 1}"),
    (_edited(["v"], True), "format True"),
    (_edited(["v"], 2), "'model_context' is missing"),
    (_with_context(["model_context"], "AAAA"), "'model_context' is not list"),
    (_with_context(["model_context"], ["not base64!"]), "'model_context' is not base64"),
    (_edited(["model"], KeyError), "'model' is missing"),
    (_edited(["model", "epoch"], True), "'model.epoch' is not int"),
    (_edited(["timeline", "fed_bytes"], -1), "'timeline.fed_bytes' is negative"),
    (_edited(["heard_input"], 1), "'heard_input' is not bool"),
    (_edited(["responses", "gate"], "ajar"), "'responses.gate' names no state"),
    (_edited(["ref_audio", "data"], "not base64!"), "'ref_audio.data' is not base64"),
    (_edited(["history", "items"], [{"id": "x"}]), "'content' is missing"),
    (_edited(["history", "items"], [{**json.loads(encode(_rich_state()))["history"]["items"][0],
                                     "fields": [["a"]]}]), "not a checkpoint"),
])
def test_what_is_not_a_checkpoint_of_this_format_is_refused(data: bytes, reason: str) -> None:
    with pytest.raises(CheckpointError, match=reason.replace("(", r"\(")):
        decode(data)


def test_a_checkpoint_over_the_bound_is_refused_both_ways() -> None:
    big = dataclasses.replace(_rich_state(), unanswered=UserTurn(
        item_id="item_1", audio=bytes(MAX_CHECKPOINT_BYTES)))
    with pytest.raises(CheckpointError, match="over the bound"):
        encode(big)
    with pytest.raises(CheckpointError, match="over the bound"):
        decode(b" " * (MAX_CHECKPOINT_BYTES + 1))
    assert len(base64.b64encode(bytes(MAX_CHECKPOINT_BYTES))) > MAX_CHECKPOINT_BYTES
