"""turn_detection server_vad / semantic_vad on the loopback and frame runners, I/O-free.

The runners are driven directly with synthetic audio: silence, a loud tone burst, silence,
appended in 30 ms chunks (not a whole number of the VAD's 20 ms frames, so frames straddle
chunks). Every event is rendered by the gateway's real codec and validated strictly.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from contract import messages as msg
from gateway.protocol.render import render_event
from inference_worker.audio_frames import FrameOutput
from inference_worker.backends.fake import FakeBackend
from inference_worker.backends.registry import frame_core, loopback_core
from inference_worker.conversation.core import ConversationCore
from tests.gateway.strict import validate_server_event
from tests.worker.feeding import feed
from tests.worker.realtime_render import validate_strict

T0 = 100.0
RATE = 24_000
BYTES_PER_MS = 48
CHUNK_MS = 30
SERVER_VAD = {"type": "server_vad"}
TURN_DETECTION = ("audio", "input", "turn_detection")

USER_TURN = ["input.committed", "item.added", "item.created", "item.done"]
OPENING = ["response.created", "output_item.added", "item.added", "item.created",
           "content_part.added"]
CLOSING = ["audio.done", "transcript.done", "content_part.done", "item.done",
           "output_item.done", "response.done", "rate_limits.updated"]


def silence(ms: int) -> bytes:
    """Digital silence, pcm16 24 kHz mono."""
    return bytes(ms * BYTES_PER_MS)


def tone(ms: int) -> bytes:
    """A 440 Hz tone at a third of full scale (about -13 dBFS: speech to any threshold)."""
    t = np.arange(ms * RATE // 1000) / RATE
    return (0.33 * 32767 * np.sin(2 * math.pi * 440 * t)).astype("<i2").tobytes()


def utterance(before_ms: int = 1000, speech_ms: int = 1000, after_ms: int = 1000) -> bytes:
    """Silence, a tone burst, silence."""
    return silence(before_ms) + tone(speech_ms) + silence(after_ms)


def chunks(audio: bytes) -> list[bytes]:
    """``audio`` cut into 30 ms appends."""
    size = CHUNK_MS * BYTES_PER_MS
    return [audio[i:i + size] for i in range(0, len(audio), size)]


def drain(runner: ConversationCore) -> list[msg.Event]:
    """The runner's events, each strictly valid as the worker's and as the gateway's render."""
    events = runner.events_to_send()
    for n, event in enumerate(events):
        validate_strict(event)
        validate_server_event(render_event(event, server_event_seq=n + 1,
                                                       event_id=f"e{n}"))
    return events


def kinds(events: list[msg.Event]) -> list[str]:
    """The KIND of each event."""
    return [e.KIND for e in events]


def turn_detection(patch: Any) -> dict[str, Any]:
    """A session.update patch setting ``audio.input.turn_detection``."""
    return {"audio": {"input": {"turn_detection": patch}}}


def update(runner: ConversationCore, value: Any, now: float = T0) -> msg.Event:
    """Apply a turn_detection update; its one answer."""
    runner.receive(msg.UpdateSession(session=turn_detection(value), event_id="evt_u"), now)
    [answer] = drain(runner)
    return answer


def append(runner: ConversationCore, audio: bytes, now: float = T0) -> list[msg.Event]:
    """Append ``audio`` in 30 ms chunks at ``now``; the events it caused."""
    for chunk in chunks(audio):
        runner.receive(msg.AppendAudio(audio=chunk), now)
    return drain(runner)


def of_type(events: list[msg.Event], cls: type[Any]) -> list[Any]:
    """The events of class ``cls``."""
    return [e for e in events if isinstance(e, cls)]


def played(events: list[msg.Event]) -> bytes:
    """The output audio among ``events``."""
    return b"".join(e.audio for e in of_type(events, msg.AudioDelta))


def play_out(runner: ConversationCore, start: float) -> list[msg.Event]:
    """Tick the loopback until its response has played out."""
    events: list[msg.Event] = []
    deadline = runner.next_deadline()
    while deadline is not None:
        assert deadline < start + 60, "the response never ended"
        runner.tick(deadline)
        events += drain(runner)
        deadline = runner.next_deadline()
    return events


def loopback() -> ConversationCore:
    """A fresh loopback session."""
    return loopback_core("sess_vad")


def frame_runner() -> ConversationCore:
    """A fresh session of the fake frame backend, ticking at its own frame period."""
    return frame_core("sess_vad", model="fake",
                      frame_seconds=FakeBackend(max_slots=1).spec.frame_seconds)


LOUD = FrameOutput(audio=tone(80), level=0.3)
QUIET = FrameOutput(audio=silence(80), level=0.0)


# ------------------------------------------------------------------------- session.update


@pytest.mark.parametrize(("make", "default"), [
    (loopback, {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                "silence_duration_ms": 500, "idle_timeout_ms": None, "create_response": True,
                "interrupt_response": True}),
    (frame_runner, None),
])
def test_a_new_session_starts_with_its_backends_turn_detection(
        make: Any, default: dict[str, Any] | None) -> None:
    """Where the worker detects turns (the loopback) a new session starts with OpenAI's
    default server_vad; a frame backend's model takes turns itself, so null there."""
    assert make().session["audio"]["input"]["turn_detection"] == default


@pytest.mark.parametrize("make", [loopback, frame_runner])
@pytest.mark.parametrize(("value", "effective"), [
    (SERVER_VAD, {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                  "silence_duration_ms": 500, "idle_timeout_ms": None,
                  "create_response": True, "interrupt_response": True}),
    ({"type": "server_vad", "threshold": 1, "prefix_padding_ms": 0, "silence_duration_ms": 200,
      "idle_timeout_ms": None, "create_response": False, "interrupt_response": False},
     {"type": "server_vad", "threshold": 1.0, "prefix_padding_ms": 0,
      "silence_duration_ms": 200, "idle_timeout_ms": None, "create_response": False,
      "interrupt_response": False}),
    ({"type": "semantic_vad"}, {"type": "semantic_vad", "eagerness": "auto",
                                "create_response": True, "interrupt_response": True}),
    ({"type": "semantic_vad", "eagerness": "low", "interrupt_response": False},
     {"type": "semantic_vad", "eagerness": "low", "create_response": True,
      "interrupt_response": False}),
])
def test_session_updated_shows_the_effective_turn_detection(make: Any, value: dict[str, Any],
                                                           effective: dict[str, Any]) -> None:
    """session.updated carries GA's full turn_detection object, defaults filled in."""
    runner = make()
    answer = update(runner, value)
    assert isinstance(answer, msg.SessionUpdated)
    assert answer.session["audio"]["input"]["turn_detection"] == effective
    assert runner.session == answer.session


def test_an_update_replaces_the_whole_turn_detection_object() -> None:
    """Keys a new turn_detection leaves out take their defaults, not the old values."""
    runner = loopback()
    update(runner, {"type": "server_vad", "silence_duration_ms": 900, "threshold": 0.8})
    answer = update(runner, {"type": "server_vad", "threshold": 0.2})
    assert isinstance(answer, msg.SessionUpdated)
    detection = answer.session["audio"]["input"]["turn_detection"]
    assert (detection["threshold"], detection["silence_duration_ms"]) == (0.2, 500)


_REFUSALS = [
    ({"type": "server_vad", "threshold": 2}, "invalid_value", ".threshold"),
    ({"type": "server_vad", "threshold": "high"}, "invalid_type", ".threshold"),
    ({"type": "server_vad", "silence_duration_ms": 1.5}, "invalid_type", ".silence_duration_ms"),
    ({"type": "server_vad", "prefix_padding_ms": -1}, "invalid_value", ".prefix_padding_ms"),
    ({"type": "server_vad", "create_response": "yes"}, "invalid_type", ".create_response"),
    ({"type": "server_vad", "eagerness": "high"}, "unknown_parameter", ".eagerness"),
    ({"type": "semantic_vad", "threshold": 0.5}, "unknown_parameter", ".threshold"),
    ({"type": "semantic_vad", "eagerness": "eager"}, "invalid_value", ".eagerness"),
    ({"type": "near_field"}, "unsupported_turn_detection", ".type"),  # the seed's code
    ({"threshold": 0.5}, "missing_required_parameter", ".type"),
    ("server_vad", "invalid_type", ""),
    ({"type": "server_vad", "idle_timeout_ms": 40000}, "invalid_value", ".idle_timeout_ms"),
    ({"type": "semantic_vad", "idle_timeout_ms": 5000}, "unknown_parameter", ".idle_timeout_ms"),
]


@pytest.mark.parametrize("make", [loopback, frame_runner])
@pytest.mark.parametrize(("value", "code", "param"), _REFUSALS)
def test_refused_turn_detection_names_code_and_param_and_changes_nothing(
        make: Any, value: Any, code: str, param: str) -> None:
    """A turn_detection the VAD cannot take is refused with its code and the offending key's
    path, and nothing of the patch applies (the instructions next to it included)."""
    runner = make()
    before = runner.session
    patch = {"instructions": "changed", **turn_detection(value)}
    runner.receive(msg.UpdateSession(session=patch, event_id="evt_9"), T0)
    [error] = drain(runner)
    assert isinstance(error, msg.ErrorEvent)
    assert (error.code, error.param, error.client_event_id) == (
        code, "session.audio.input.turn_detection" + param, "evt_9")
    assert runner.session == before


def test_loopback_stream_mode_takes_no_turn_detection() -> None:
    """Stream mode echoes every chunk at once: turning the VAD on there is invalid_value."""
    runner = loopback()
    runner.receive(msg.UpdateSession(session={"extra_body": {"loopback_mode": "stream"},
                                              **turn_detection(SERVER_VAD)}), T0)
    [error] = drain(runner)
    assert isinstance(error, msg.ErrorEvent)
    assert (error.code, error.param) == ("invalid_value", "session.audio.input.turn_detection")


# ------------------------------------------------------------------------- loopback turns


def test_loopback_server_vad_turn_is_committed_and_answered() -> None:
    """speech_started, speech_stopped, the commit and an automatic response, in GA order;
    the response plays back the turn's audio from audio_start_ms to audio_end_ms."""
    runner = loopback()
    update(runner, SERVER_VAD)
    audio = utterance()
    events = append(runner, audio)
    assert kinds(events) == ["input.speech_started", "input.speech_stopped", *USER_TURN,
                             *OPENING, "audio.delta"]
    started, stopped, committed = events[0], events[1], events[2]
    assert isinstance(started, msg.InputSpeechStarted)
    assert isinstance(stopped, msg.InputSpeechStopped)
    assert isinstance(committed, msg.InputCommitted)
    # The burst starts at 1000 ms: 300 ms of prefix padding before it. It ends at 2000 ms;
    # 500 ms of silence later the turn stops.
    assert (started.audio_start_ms, stopped.audio_end_ms) == (700, 2500)
    assert started.item_id == stopped.item_id == committed.item_id
    events += play_out(runner, T0)
    assert kinds(events)[-len(CLOSING):] == CLOSING
    assert played(events) == audio[700 * BYTES_PER_MS:2500 * BYTES_PER_MS]
    [done] = of_type(events, msg.ResponseDone)
    assert done.response["status"] == "completed"


def test_loopback_audio_after_the_turn_stays_for_the_next_one() -> None:
    """The chunk that ends a turn may carry the next turn's first audio: it stays buffered,
    and the second turn's timeline goes on from the first."""
    runner = loopback()
    update(runner, {"type": "server_vad", "create_response": False})
    events = append(runner, utterance(after_ms=600) + utterance(before_ms=400))
    started = of_type(events, msg.InputSpeechStarted)
    stopped = of_type(events, msg.InputSpeechStopped)
    assert [(s.audio_start_ms, e.audio_end_ms) for s, e in zip(started, stopped, strict=True)] \
        == [(700, 2500), (2700, 4500)]
    assert started[0].item_id != started[1].item_id
    runner.receive(msg.CreateResponse(), T0)
    answer = drain(runner) + play_out(runner, T0)
    assert len(played(answer)) == 1800 * BYTES_PER_MS  # the second turn alone


def test_loopback_create_response_false_commits_without_answering() -> None:
    """With create_response false the turn is committed and waits for response.create."""
    runner = loopback()
    update(runner, {"type": "server_vad", "create_response": False})
    audio = utterance()
    events = append(runner, audio)
    assert kinds(events) == ["input.speech_started", "input.speech_stopped", *USER_TURN]
    runner.receive(msg.CreateResponse(), T0 + 5)
    answer = drain(runner) + play_out(runner, T0 + 5)
    assert kinds(answer)[:len(OPENING)] == OPENING
    assert played(answer) == audio[700 * BYTES_PER_MS:2500 * BYTES_PER_MS]


def test_loopback_barge_in_cancels_the_playing_response() -> None:
    """Speech while a response plays: speech_started, then that response ends cancelled with
    reason turn_detected; the new turn is answered in its turn."""
    runner = loopback()
    update(runner, SERVER_VAD)
    first = append(runner, utterance())
    [created] = of_type(first, msg.ResponseCreated)
    events = append(runner, tone(200))  # the loopback is still playing the first turn back
    assert kinds(events) == ["input.speech_started", *CLOSING]
    [done] = of_type(events, msg.ResponseDone)
    assert done.response["id"] == created.response["id"]
    assert done.response["status"] == "cancelled"
    assert done.response["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
    events = append(runner, silence(600))
    assert kinds(events) == ["input.speech_stopped", *USER_TURN, *OPENING,
                             "audio.delta"]


def test_loopback_interrupt_response_false_lets_the_response_play() -> None:
    """With interrupt_response false speech does not cancel; the turn it makes waits for a
    response.create, since one is still active."""
    runner = loopback()
    update(runner, {"type": "server_vad", "interrupt_response": False})
    append(runner, utterance())
    events = append(runner, tone(200) + silence(600))
    assert kinds(events) == ["input.speech_started", "input.speech_stopped", *USER_TURN]
    rest = play_out(runner, T0)
    assert [d.response["status"] for d in of_type(rest, msg.ResponseDone)] == ["completed"]
    runner.receive(msg.CreateResponse(), T0 + 10)
    assert kinds(drain(runner))[:len(OPENING)] == OPENING


@pytest.mark.parametrize(("eagerness", "silence_ms"), [
    ("high", 300), ("medium", 700), ("auto", 700), ("low", 1500),
])
def test_semantic_vad_eagerness_sets_the_end_of_turn_silence(eagerness: str,
                                                              silence_ms: int) -> None:
    """semantic_vad ends a turn after the silence its eagerness maps to."""
    runner = loopback()
    update(runner, {"type": "semantic_vad", "eagerness": eagerness})
    events = append(runner, utterance(after_ms=2000))
    [stopped] = of_type(events, msg.InputSpeechStopped)
    assert stopped.audio_end_ms == 2000 + silence_ms


def test_manual_commit_still_works_with_vad_on() -> None:
    """A commit mid-speech commits the buffer as the item speech_started announced, and the
    detector starts over (no speech_stopped for the committed audio)."""
    runner = loopback()
    update(runner, {"type": "server_vad", "create_response": False})
    [started] = append(runner, silence(500) + tone(400))
    assert isinstance(started, msg.InputSpeechStarted)
    runner.receive(msg.CommitInput(), T0)
    events = drain(runner)
    assert kinds(events) == USER_TURN
    [committed] = of_type(events, msg.InputCommitted)
    assert committed.item_id == started.item_id
    events = append(runner, silence(1000))
    assert events == []


def test_turn_detection_back_to_null_is_push_to_talk_again() -> None:
    """After turn_detection null, speech makes no events and only a commit makes a turn."""
    runner = loopback()
    update(runner, SERVER_VAD)
    append(runner, utterance())
    play_out(runner, T0)
    answer = update(runner, None, T0 + 10)
    assert isinstance(answer, msg.SessionUpdated)
    assert answer.session["audio"]["input"]["turn_detection"] is None
    assert append(runner, utterance(), T0 + 10) == []
    runner.receive(msg.CommitInput(), T0 + 10)
    assert kinds(drain(runner)) == USER_TURN


def test_vad_turned_on_later_counts_from_the_session_audio() -> None:
    """Times are on the session's input timeline, including audio sent before the VAD was on."""
    runner = loopback()
    append(runner, silence(990))
    runner.receive(msg.ClearInput(), T0)
    drain(runner)
    update(runner, {"type": "server_vad", "create_response": False})
    events = append(runner, utterance())
    [started] = of_type(events, msg.InputSpeechStarted)
    assert started.audio_start_ms == 990 + 700


# ------------------------------------------------------------------------- frame runner


def test_frame_runner_server_vad_turn_opens_a_response_the_model_fills() -> None:
    """On the fake frame backend's runner: the detected turn is committed, a response opens
    at once (as response.create opens one) and the model's next audible output fills it."""
    runner = frame_runner()
    update(runner, SERVER_VAD)
    audio = utterance()
    events = append(runner, audio)
    assert kinds(events) == ["input.speech_started", "input.speech_stopped", *USER_TURN,
                             *OPENING]
    started, stopped = events[0], events[1]
    assert isinstance(started, msg.InputSpeechStarted)
    assert isinstance(stopped, msg.InputSpeechStopped)
    assert (started.audio_start_ms, stopped.audio_end_ms) == (700, 2500)
    assert runner.take_input().audio == audio  # the model heard all of it, as it arrived
    feed(runner, LOUD, T0 + 1)
    assert kinds(drain(runner)) == ["audio.delta"]
    for n in range(10):  # 800 ms of quiet ends the model's turn
        feed(runner, QUIET, T0 + 1.1 + n * 0.1)
    assert kinds(drain(runner))[-len(CLOSING):] == CLOSING
    assert runner.take_first_audio_latencies() == [pytest.approx(1.0)]


def test_frame_runner_barge_in_cancels_and_mutes_the_model() -> None:
    """Speech during a response: speech_started, the response ends cancelled turn_detected,
    the model's rest is muted; the new turn opens the next response."""
    runner = frame_runner()
    update(runner, SERVER_VAD)
    append(runner, utterance())
    feed(runner, LOUD, T0 + 1)
    drain(runner)
    events = append(runner, tone(200), T0 + 1.1)
    assert kinds(events) == ["input.speech_started", *CLOSING]
    [done] = of_type(events, msg.ResponseDone)
    assert done.response["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
    feed(runner, LOUD, T0 + 1.2)
    assert drain(runner) == []  # muted: the client never hears the interrupted rest
    events = append(runner, silence(600), T0 + 1.3)
    assert kinds(events) == ["input.speech_stopped", *USER_TURN, *OPENING]
    feed(runner, LOUD, T0 + 1.4)
    assert kinds(drain(runner)) == ["audio.delta"]


def test_frame_runner_create_response_false_leaves_answering_to_the_model() -> None:
    """With create_response false the turn is committed and no response is opened for it."""
    runner = frame_runner()
    update(runner, {"type": "semantic_vad", "eagerness": "high", "create_response": False})
    events = append(runner, utterance())
    assert kinds(events) == ["input.speech_started", "input.speech_stopped", *USER_TURN]
    assert runner.active_response is None


def test_frame_runner_turn_detection_back_to_null() -> None:
    """Back to null, speech makes no events on the frame runner either."""
    runner = frame_runner()
    update(runner, SERVER_VAD)
    update(runner, None)
    assert append(runner, utterance()) == []


# ------------------------------------------------------------------------- property

_STEPS = st.sampled_from([
    msg.AppendAudio(audio=tone(200)), msg.AppendAudio(audio=silence(300)),
    msg.AppendAudio(audio=silence(30) + tone(130)), msg.CommitInput(), msg.ClearInput(),
    msg.CreateResponse(), msg.CancelResponse(),
    msg.UpdateSession(session=turn_detection({"type": "server_vad", "silence_duration_ms": 200})),
    msg.UpdateSession(session=turn_detection({"type": "semantic_vad", "eagerness": "high",
                                              "interrupt_response": False})),
    msg.UpdateSession(session=turn_detection(None)),
    LOUD, QUIET,
])


@settings(max_examples=100, deadline=None)
@given(st.booleans(), st.lists(_STEPS, max_size=50))
def test_any_sequence_keeps_speech_events_paired_and_responses_nested(
        on_frames: bool, steps: list[Any]) -> None:
    """Whatever the interleaving, every event is strictly valid, a speech_stopped names the
    turn its speech_started announced and is followed by that item's commit, and responses
    open and close in turn."""
    runner: ConversationCore = frame_runner() if on_frames else loopback()
    events: list[msg.Event] = []
    for n, step in enumerate(steps):
        if isinstance(step, FrameOutput):
            if isinstance(runner, ConversationCore):
                feed(runner, step, T0 + n)
        else:
            runner.receive(step, T0 + n)
        runner.tick(T0 + n)
        events += drain(runner)
    announced: str | None = None
    active: str | None = None
    for n, event in enumerate(events):
        if isinstance(event, msg.InputSpeechStarted):
            announced = event.item_id
        elif isinstance(event, msg.InputSpeechStopped):
            assert event.item_id == announced
            following = events[n + 1]
            assert isinstance(following, msg.InputCommitted)
            assert following.item_id == event.item_id
        elif isinstance(event, msg.ResponseCreated):
            assert active is None
            active = event.response["id"]
        elif isinstance(event, msg.ResponseDone):
            assert event.response["id"] == active
            active = None


# ------------------------------------------------------------------------- idle timeout

IDLE_VAD = {"type": "server_vad", "idle_timeout_ms": 5000}


@pytest.mark.parametrize("make", [loopback, frame_runner])
def test_idle_timeout_answers_a_silent_user_after_a_response(make: Any) -> None:
    """server_vad with idle_timeout_ms: once a response ended, 5 s of input without speech
    gives input_audio_buffer.timeout_triggered over the silent range, the silent segment is
    committed as the user item it names, and a response opens."""
    runner = make()
    assert isinstance(update(runner, IDLE_VAD), msg.SessionUpdated)
    runner.receive(msg.AppendAudio(audio=tone(300)), T0)
    runner.receive(msg.CommitInput(), T0)
    runner.receive(msg.CreateResponse(), T0)
    runner.receive(msg.CancelResponse(), T0)  # a response ended: the idle clock starts
    ended_at = 300  # ms of input on the timeline when it ended
    events = drain(runner)
    assert "input.timeout_triggered" not in kinds(events)
    events = append(runner, silence(4980))
    assert "input.timeout_triggered" not in kinds(events)
    events = append(runner, silence(60))
    assert kinds(events)[:1 + len(USER_TURN)] == ["input.timeout_triggered", *USER_TURN]
    timeout, committed = events[0], events[1]
    assert isinstance(timeout, msg.InputTimeoutTriggered)
    assert isinstance(committed, msg.InputCommitted)
    assert timeout.audio_start_ms == ended_at
    assert timeout.audio_end_ms - timeout.audio_start_ms >= 5000
    assert timeout.item_id == committed.item_id
    assert "response.created" in kinds(events)
    again = append(runner, silence(6000))
    assert "input.timeout_triggered" not in kinds(again), "one timeout per response"


@pytest.mark.parametrize("make", [loopback, frame_runner])
def test_speech_holds_off_the_idle_timeout(make: Any) -> None:
    """Speech after the response resets the idle clock: the user is not idle."""
    runner = make()
    update(runner, {**IDLE_VAD, "create_response": False})
    runner.receive(msg.AppendAudio(audio=tone(300)), T0)
    runner.receive(msg.CommitInput(), T0)
    runner.receive(msg.CreateResponse(), T0)
    runner.receive(msg.CancelResponse(), T0)
    drain(runner)
    events = append(runner, silence(3000) + tone(500) + silence(4000))
    assert "input.speech_started" in kinds(events)
    assert "input.timeout_triggered" not in kinds(events)


def test_without_idle_timeout_silence_never_answers() -> None:
    """With idle_timeout_ms null, silence after a response is only silence."""
    runner = loopback()
    update(runner, {"type": "server_vad"})
    runner.receive(msg.AppendAudio(audio=tone(300)), T0)
    runner.receive(msg.CommitInput(), T0)
    runner.receive(msg.CreateResponse(), T0)
    runner.receive(msg.CancelResponse(), T0)
    drain(runner)
    assert kinds(append(runner, silence(31000))) == []
