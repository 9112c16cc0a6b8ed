"""Hypothesis stateful tests of the conversation core: random commands, model outputs and
time, on the loopback and on both frame turn modes, against the invariants of the protocol.

After every step: the core never writes a terminal event (the store writes the one terminal,
after everything the core wrote: ``tests/worker/test_session_isolation.py`` and the e2e
counts hold the numbering and the terminal), each response ends exactly once
(``response.created`` .. one ``response.done``), no event of a response follows its
``response.done`` (a cancelled answer never resurfaces), the history never holds more of an
interrupted answer than the client acknowledged, every event is strictly valid, and once the
session is closing the core says nothing more. At the end the session closes and every
response has ended.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from contract import messages as msg
from inference_worker.audio_frames import FrameOutput
from inference_worker.backends.registry import frame_core, loopback_core
from inference_worker.conversation.core import ConversationCore
from inference_worker.conversation.reports import (
    BargedIn,
    ResponseStarted,
    TurnEnded,
    UserSpeechStarted,
    UserSpeechStopped,
    UserTranscript,
)
from inference_worker.conversation.turns import TurnMode
from tests.worker.feeding import feed
from tests.worker.realtime_render import validate_strict

T0 = 100.0
FRAME_S = 0.08
LOUD = FrameOutput(audio=b"\x10\x20" * 1920, level=0.1, text="word ")
QUIET = FrameOutput(audio=bytes(3840), level=0.0)
# By name: a strategy over the frames themselves would print their audio in every report.
FRAMES = {
    "loud": LOUD, "quiet": QUIET, "text": FrameOutput(audio=b"", level=0.0, text="early "),
    "end_of_turn": FrameOutput(audio=b"\x10\x20" * 1920, level=0.1, reports=(TurnEnded(),)),
    "barge_in": FrameOutput(audio=b"", level=0.0,
                            reports=(UserSpeechStarted(), BargedIn())),
    "speech_stopped": FrameOutput(audio=b"", level=0.0, reports=(UserSpeechStopped(),)),
    "transcript": FrameOutput(audio=b"", level=0.0, reports=(UserTranscript(text='hi'),)),
    "response_started": FrameOutput(audio=b"", level=0.0, reports=(ResponseStarted(),)),
    "response_done": FrameOutput(audio=b"", level=0.0, reports=(TurnEnded(),)),
}
_SPEECH = bytes((i * 7 + 3) % 251 for i in range(4800)) * 2  # 100 ms, loud enough for the VAD
_TURN_DETECTION = st.sampled_from([
    None, {"type": "server_vad", "silence_duration_ms": 200},
    {"type": "semantic_vad", "eagerness": "high"},
    {"type": "server_vad", "create_response": False, "interrupt_response": False}])


def _response_ids(event: msg.Event) -> set[str]:
    """The response ids an event of the response names (its own ``response_id``, or the
    response object's). The client's playback of a response outlives its ``response.done``,
    so the answers about playback (``output_audio_buffer.cleared``,
    ``playback.acknowledged``) may name it later."""
    if isinstance(event, msg.OutputAudioCleared | msg.PlaybackAcknowledged):
        return set()
    names = set()
    response_id = getattr(event, "response_id", None)
    if isinstance(response_id, str) and response_id:
        names.add(response_id)
    if isinstance(event, msg.ResponseCreated | msg.ResponseDone):
        names.add(event.response["id"])
    return names


class CoreMachine(RuleBasedStateMachine):
    """One session's core driven at random."""

    def __init__(self) -> None:
        super().__init__()
        self.core: ConversationCore | None = None
        self.now = T0
        self.mode = TurnMode.LOOPBACK
        self.open: str | None = None  # the response created and not done yet
        self.ended: set[str] = set()
        self.acked: dict[str, int] = {}  # item id -> committed ms acknowledged
        self.cancelled_items: set[str] = set()
        self.closed = False

    # ------------------------------------------------------------------ set-up

    @rule(mode=st.sampled_from(list(TurnMode)))
    @precondition(lambda self: self.core is None)
    def start(self, mode: TurnMode) -> None:
        self.mode = mode
        if mode is TurnMode.LOOPBACK:
            self.core = loopback_core("sess_fuzz")
        else:
            self.core = frame_core("sess_fuzz", model="fake",
                                   frame_seconds=FRAME_S, turns=mode)

    def _send(self, command: msg.Command) -> None:
        assert self.core is not None
        self.core.receive(command, self.now)
        self._check(self.core.events_to_send())

    # ------------------------------------------------------------------ commands

    @rule(chunks=st.integers(min_value=1, max_value=4), loud=st.booleans())
    @precondition(lambda self: self.core is not None)
    def append(self, chunks: int, loud: bool) -> None:
        audio = _SPEECH if loud else bytes(len(_SPEECH))
        for _ in range(chunks):
            self._send(msg.AppendAudio(audio=audio))
            self.now += 0.1

    @rule(command=st.sampled_from([
        msg.CommitInput(), msg.ClearInput(), msg.CreateResponse(), msg.CancelResponse(),
        msg.ClearOutputAudio(), msg.CancelInput(), msg.BargeIn(), msg.Heartbeat(),
        msg.SignalTurn(event="user.typing"), msg.AppendText(text="hi"),
        msg.CreateResponse(response={"output_modalities": ["text"]}),
        msg.CreateItem(item={"type": "message", "role": "user",
                             "content": [{"type": "input_text", "text": "hello"}]}),
    ]))
    @precondition(lambda self: self.core is not None)
    def command(self, command: msg.Command) -> None:
        self._send(command)

    @rule(value=_TURN_DETECTION)
    @precondition(lambda self: self.core is not None)
    def turn_detection(self, value: dict[str, Any] | None) -> None:
        self._send(msg.UpdateSession(session={"audio": {"input": {"turn_detection": value}}}))

    @rule(played=st.floats(0, 1.2), committed=st.floats(0, 1))
    @precondition(lambda self: self.core is not None)
    def ack(self, played: float, committed: float) -> None:
        """Acknowledge a share of the newest answer (more than all of it, sometimes)."""
        assert self.core is not None
        answers = [item for item in self.core.history if item.truncatable]
        played_ms = int(answers[-1].audio_ms * played) if answers else 0
        self._send(msg.AckPlayback(played_ms=played_ms,
                                   committed_ms=int(played_ms * committed)))

    @rule(played=st.floats(0, 1), committed=st.floats(0, 1), ack_first=st.booleans())
    @precondition(lambda self: self.core is not None)
    def interrupt_after_hearing(self, played: float, committed: float, ack_first: bool) -> None:
        """What a client does on an interruption: say how much it played, and cancel (in
        either order)."""
        if ack_first:
            self.ack(played, committed)
        self._send(msg.CancelResponse())
        if not ack_first:
            self.ack(played, committed)

    @rule(ms=st.integers(min_value=0, max_value=3000))
    @precondition(lambda self: self.core is not None)
    def truncate_newest_answer(self, ms: int) -> None:
        assert self.core is not None
        answers = [item for item in self.core.history if item.truncatable]
        if answers:
            self._send(msg.TruncateItem(item_id=answers[-1].id, content_index=0,
                                        audio_end_ms=ms))

    # ------------------------------------------------------------------ the model and time

    @rule(names=st.lists(st.sampled_from(sorted(FRAMES)), min_size=1, max_size=12),
          stale=st.booleans())
    @precondition(lambda self: self.core is not None and self.mode is not TurnMode.LOOPBACK)
    def model_output(self, names: list[str], stale: bool) -> None:
        """Ticks of the model; ``stale``: of steps that ran before the engine applied the
        last stop (what the model said in them belonged to the cancelled response)."""
        assert self.core is not None
        for name in names:
            self.now += FRAME_S
            if stale and self.core.epoch:
                frame = dataclasses.replace(FRAMES[name], epoch=self.core.epoch - 1)
                responding = self.core.active_response is not None
                self.core.on_frame(frame, self.now)
                events = self.core.events_to_send()
                assert not (not responding and any(isinstance(e, msg.ResponseCreated)
                                                   for e in events)), "a stale frame answered"
                assert not any(isinstance(e, msg.AudioDelta) for e in events), (
                    "a cancelled response's audio resurfaced")
                self._check(events)
            else:
                feed(self.core, FRAMES[name], self.now)
                self._check(self.core.events_to_send())

    @rule(seconds=st.floats(min_value=0.0, max_value=3.0))
    @precondition(lambda self: self.core is not None)
    def time_passes(self, seconds: float) -> None:
        assert self.core is not None
        self.now += seconds
        self.core.tick(self.now)
        self._check(self.core.events_to_send())

    @rule()
    @precondition(lambda self: self.core is not None and not self.closed)
    def close(self) -> None:
        self._send(msg.CloseSession(reason="bye"))
        self.closed = True
        assert self.core is not None and self.core.close_requested == "bye"
        assert self.open is None, "the close left a response open"

    # ------------------------------------------------------------------ invariants

    def _check(self, events: list[msg.Event]) -> None:
        if self.closed:
            assert events == [] or all(isinstance(e, msg.ResponseDone | msg.RateLimitsUpdated)
                                       for e in events[-2:]), events
        for event in events:
            validate_strict(event)
            # The one terminal event is the store's to write, after all of these.
            assert not msg.is_terminal(event), "the core wrote a terminal event"
            names = _response_ids(event)
            assert not names & self.ended, f"{event} names a response that ended"
            if isinstance(event, msg.ResponseCreated):
                assert self.open is None, "a second response opened while one was active"
                self.open = event.response["id"]
            elif isinstance(event, msg.ResponseDone):
                assert event.response["id"] == self.open, "response.done of no open response"
                self.ended.add(event.response["id"])
                self.open = None
                if event.response["status"] == "cancelled":
                    self.cancelled_items.add(event.response["output"][0]["id"])
            elif isinstance(event, msg.PlaybackAcknowledged):
                self.acked[event.item_id] = event.committed_ms
        if self.closed:
            assert self.open is None

    @invariant()
    def history_holds_no_more_than_was_heard(self) -> None:
        if self.core is None:
            return
        for item_id in self.cancelled_items & set(self.acked):
            item = self.core.history_item(item_id)
            if item is not None:
                assert item.audio_ms <= self.acked[item_id], (item, self.acked[item_id])

    @invariant()
    def one_response_at_most(self) -> None:
        assert self.core is None or (
            (self.core.active_response is not None) == (self.open is not None))

    def teardown(self) -> None:
        if self.core is not None and not self.closed:
            self.close()
        if self.core is not None:
            self.core.receive(msg.Heartbeat(), self.now + 1)
            self.core.tick(self.now + 10)
            assert self.core.events_to_send() == [], "the core spoke after the close"


TestCore = CoreMachine.TestCase
TestCore.settings = settings(max_examples=200, stateful_step_count=40, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])

pytestmark = pytest.mark.timeout(300)
