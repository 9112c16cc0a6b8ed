"""The conversation core on a frame backend: its output cut into Realtime responses, strictly
valid."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from contract import messages as msg
from inference_worker.audio_frames import FrameOutput
from inference_worker.backends.registry import frame_core
from inference_worker.conversation.core import ConversationCore
from inference_worker.conversation.reports import (
    BargedIn,
    Failed,
    ResponseStarted,
    TurnEnded,
    UserSpeechStarted,
    UserSpeechStopped,
    UserTranscript,
    UserTranscriptFailed,
)
from inference_worker.conversation.turns import TurnMode
from tests.worker.feeding import feed
from tests.worker.realtime_render import validate_strict

T0 = 50.0
FRAME_S = 0.08
LOUD = FrameOutput(audio=b"\x10\x20" * 1920, level=0.1)
QUIET = FrameOutput(audio=bytes(3840), level=0.0)
EMPTY = FrameOutput(audio=b"", level=0.0)

OPENING = ["response.created", "output_item.added", "item.added", "item.created",
           "content_part.added"]
CLOSING = ["audio.done", "transcript.done", "content_part.done", "item.done",
           "output_item.done", "response.done", "rate_limits.updated"]
SILENCE_TICKS = 10  # 800 ms of 80 ms frames


def runner(explicit: bool = False) -> ConversationCore:
    """A fresh runner for a Moshi-like model (or the cascade's event mode)."""
    return frame_core("sess_x", model="cascade" if explicit else "moshi",
                      frame_seconds=0.032 if explicit else FRAME_S,
                      turns=TurnMode.EVENTS if explicit else TurnMode.AUDIO)


def drain(r: ConversationCore) -> list[msg.Event]:
    """The runner's events, each proven strictly valid as a Realtime GA event."""
    events = r.events_to_send()
    for event in events:
        assert not msg.is_terminal(event)
        validate_strict(event)
    return events


def kinds(events: list[msg.Event]) -> list[str]:
    """The KIND of each event."""
    return [e.KIND for e in events]


def frames(r: ConversationCore, *outputs: FrameOutput, now: float = T0) -> list[msg.Event]:
    """Feed outputs one tick each and return the events."""
    for n, output in enumerate(outputs):
        feed(r, output, now + n * FRAME_S)
    return drain(r)


def done_of(events: list[msg.Event]) -> dict[str, Any]:
    """The response object of the response.done among ``events``."""
    [done] = [e for e in events if isinstance(e, msg.ResponseDone)]
    return done.response


# ------------------------------------------------------------------------- session


def test_default_session_names_the_model_and_validates() -> None:
    """session.updated carries the model name and the silence knob, strictly valid."""
    r = runner()
    r.receive(msg.UpdateSession(session={}), T0)
    [event] = drain(r)
    assert isinstance(event, msg.SessionUpdated)
    assert event.session["model"] == "moshi" and event.session["id"] == "sess_x"
    assert event.session["extra_body"] == {"end_of_turn_silence_ms": 800}
    assert event.session == r.session


@pytest.mark.parametrize(("patch", "code", "param"), [
    ({"extra_body": {"loopback_mode": "stream"}}, "invalid_duplex_runtime_config",
     "session.extra_body.loopback_mode"),
    ({"extra_body": {"end_of_turn_silence_ms": 5}}, "invalid_value",
     "session.extra_body.end_of_turn_silence_ms"),
    ({"extra_body": {"end_of_turn_silence_ms": True}}, "invalid_value",
     "session.extra_body.end_of_turn_silence_ms"),
    ({"extra_body": "x"}, "invalid_type", "session.extra_body"),
    ({"output_modalities": ["text"]}, "invalid_value", "session.output_modalities"),
    ({"audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 1}}}},
     "invalid_value", "session.audio.input.turn_detection.idle_timeout_ms"),
    ({"bogus": 1}, "unknown_parameter", "session.bogus"),
])
def test_bad_updates_are_refused_and_change_nothing(patch: dict[str, Any], code: str,
                                                    param: str) -> None:
    """A refused session.update answers error with its code and param, config unchanged."""
    r = runner()
    before = r.session
    r.receive(msg.UpdateSession(session=patch, event_id="evt_1"), T0)
    [event] = drain(r)
    assert isinstance(event, msg.ErrorEvent)
    assert (event.code, event.param, event.client_event_id) == (code, param, "evt_1")
    assert r.session == before


def test_update_sets_silence_and_merges() -> None:
    """A valid patch merges (extra_body included) and answers the full session."""
    r = runner()
    r.receive(msg.UpdateSession(session={"instructions": "hi", "model": "moshi",
                                         "extra_body": {"end_of_turn_silence_ms": 160}}), T0)
    [event] = drain(r)
    assert isinstance(event, msg.SessionUpdated)
    assert event.session["instructions"] == "hi" and event.session["model"] == "moshi"
    assert event.session["extra_body"] == {"end_of_turn_silence_ms": 160}
    frames(r, LOUD)
    events = frames(r, QUIET, QUIET)
    assert kinds(events)[-len(CLOSING):] == CLOSING  # 160 ms = two quiet frames end the turn


# ------------------------------------------------------------------------- input


def test_audio_goes_to_the_engine_and_clear_drops_it() -> None:
    """Appended audio is handed over as it arrives; clear asks the engine to drop its queue."""
    r = runner()
    r.receive(msg.AppendAudio(audio=b"ab"), T0)
    r.receive(msg.AppendAudio(audio=b""), T0)
    r.receive(msg.AppendAudio(audio=b"cd"), T0)
    pending = r.take_input()
    assert (pending.audio, pending.clear) == (b"abcd", False)
    assert r.take_input().audio == b""
    r.receive(msg.AppendAudio(audio=b"ef"), T0)
    r.receive(msg.ClearInput(), T0)
    pending = r.take_input()
    assert (pending.audio, pending.clear) == (b"", True)
    assert kinds(drain(r)) == ["input.cleared"]


def test_commit_needs_100ms_and_adds_a_user_item() -> None:
    """commit of < 100 ms is refused; then committed, item.added, item.done."""
    r = runner()
    r.receive(msg.AppendAudio(audio=bytes(4000)), T0)
    r.receive(msg.CommitInput(event_id="c1"), T0)
    [error] = drain(r)
    assert isinstance(error, msg.ErrorEvent)
    assert error.code == "input_audio_buffer_commit_empty" and error.client_event_id == "c1"
    r.receive(msg.AppendAudio(audio=bytes(800)), T0)
    r.receive(msg.CommitInput(), T0)
    events = drain(r)
    assert kinds(events) == ["input.committed", "item.added", "item.created", "item.done"]
    committed = events[0]
    assert isinstance(committed, msg.InputCommitted) and committed.previous_item_id is None


def test_heartbeat_is_acknowledged() -> None:
    """session.heartbeat answers heartbeat_ack in order."""
    r = runner()
    r.receive(msg.Heartbeat(), T0)
    assert kinds(drain(r)) == ["heartbeat_ack"]


# ------------------------------------------------------------------------- audio turns


def test_silence_is_dropped_and_speech_opens_a_response() -> None:
    """Quiet and empty frames emit nothing; the first audible frame opens and streams."""
    r = runner()
    assert frames(r, EMPTY, QUIET, QUIET) == []
    events = frames(r, LOUD)
    assert kinds(events) == [*OPENING, "audio.delta"]
    delta = events[-1]
    assert isinstance(delta, msg.AudioDelta) and delta.audio == LOUD.audio
    assert r.active_response is not None


def test_sustained_silence_completes_the_response_with_its_transcript() -> None:
    """Text held before the audio leads the transcript; 800 ms of quiet completes it."""
    r = runner()
    frames(r, FrameOutput(audio=bytes(10), level=0.0, text="Hel"))
    events = frames(r, FrameOutput(audio=LOUD.audio, level=0.1, text="lo"))
    assert kinds(events) == [*OPENING, "audio.delta", "transcript.delta"]
    delta = events[-1]
    assert isinstance(delta, msg.TranscriptDelta) and delta.delta == "Hello"
    events = frames(r, *[QUIET] * (SILENCE_TICKS - 1))
    assert kinds(events) == ["audio.delta"] * (SILENCE_TICKS - 1)  # pauses are part of it
    events = frames(r, QUIET)
    assert kinds(events) == ["audio.delta", *CLOSING]
    done = done_of(events)
    assert done["status"] == "completed"
    assert done["output"][0]["content"][0]["transcript"] == "Hello"
    transcript = events[2]
    assert isinstance(transcript, msg.TranscriptDone) and transcript.transcript == "Hello"
    assert r.active_response is None


def test_held_text_without_speech_is_forgotten() -> None:
    """Text followed by a long silence is not put in front of a later response."""
    r = runner()
    frames(r, FrameOutput(audio=b"", level=0.0, text="thought"), *[QUIET] * SILENCE_TICKS)
    events = frames(r, LOUD)
    assert "transcript.delta" not in kinds(events)


def test_end_of_turn_signal_completes_at_once() -> None:
    """The model's TurnEnded ends the response after that frame's audio."""
    r = runner()
    frames(r, LOUD)
    events = frames(r, FrameOutput(audio=LOUD.audio, level=0.1, reports=(TurnEnded(),)))
    assert kinds(events) == ["audio.delta", *CLOSING]
    events = frames(r, LOUD)
    assert kinds(events)[:len(OPENING)] == OPENING
    created = events[0]
    assert isinstance(created, msg.ResponseCreated) and created.response["id"] == "resp_2"


def test_cancel_ends_the_response_and_mutes_the_rest_of_the_turn() -> None:
    """response.cancel: cancelled (client_cancelled); the model's turn stays unheard."""
    r = runner()
    frames(r, LOUD)
    r.receive(msg.CancelResponse(response_id="resp_1"), T0)
    events = drain(r)
    assert kinds(events) == CLOSING
    done = done_of(events)
    assert done["status"] == "cancelled"
    assert done["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    assert done["output"][0]["status"] == "incomplete"
    assert frames(r, LOUD, LOUD, *[QUIET] * (SILENCE_TICKS - 1)) == []
    assert frames(r, QUIET) == []  # the turn is over now
    assert kinds(frames(r, LOUD))[:len(OPENING)] == OPENING


def test_cancel_mute_also_ends_on_end_of_turn() -> None:
    """While muted, the model's TurnEnded ends the mute."""
    r = runner()
    frames(r, LOUD)
    r.receive(msg.CancelResponse(), T0)
    drain(r)
    assert frames(r, FrameOutput(audio=LOUD.audio, level=0.1, reports=(TurnEnded(),))) == []
    assert kinds(frames(r, LOUD))[:len(OPENING)] == OPENING


@pytest.mark.parametrize("response_id", [None, "resp_9"])
def test_cancel_without_that_active_response_is_refused(response_id: str | None) -> None:
    """Cancelling nothing (or another id) answers response_cancel_not_active."""
    r = runner()
    if response_id is not None:
        frames(r, LOUD)
    r.receive(msg.CancelResponse(response_id=response_id, event_id="x"), T0)
    [error] = drain(r)
    assert isinstance(error, msg.ErrorEvent) and error.code == "response_cancel_not_active"
    assert error.param == ("response_id" if response_id else None)


def test_create_opens_a_response_the_model_fills() -> None:
    """response.create opens at once; the model's next audio streams into it."""
    r = runner()
    r.receive(msg.CreateResponse(response={"metadata": {"k": "v"}}), T0)
    events = drain(r)
    assert kinds(events) == OPENING
    created = events[0]
    assert isinstance(created, msg.ResponseCreated) and created.response["metadata"] == {"k": "v"}
    assert kinds(frames(r, QUIET, LOUD)) == ["audio.delta", "audio.delta"]
    r.receive(msg.CreateResponse(event_id="again"), T0)
    [error] = drain(r)
    assert isinstance(error, msg.ErrorEvent)
    assert error.code == "conversation_already_has_active_response"


def test_created_response_the_model_never_fills_completes_empty() -> None:
    """With no audible output for 5 s, a requested response completes empty."""
    r = runner()
    r.receive(msg.CreateResponse(), T0)
    drain(r)
    events = frames(r, *[QUIET] * 62)
    assert "response.done" not in kinds(events)
    events = frames(r, QUIET)
    assert kinds(events)[-len(CLOSING):] == CLOSING and done_of(events)["status"] == "completed"


@pytest.mark.parametrize(("response", "param"), [
    ({"output_modalities": ["text"]}, "response.output_modalities"),
    ({"metadata": {"k": 1}}, "response.metadata"),
])
def test_create_refuses_bad_options(response: dict[str, Any], param: str) -> None:
    """Text-only responses and bad metadata are refused."""
    r = runner()
    r.receive(msg.CreateResponse(response=response), T0)
    [error] = drain(r)
    assert isinstance(error, msg.ErrorEvent)
    assert (error.code, error.param) == ("invalid_value", param)


def test_close_cancels_and_then_ignores_everything() -> None:
    """session.close cancels the active response, records the reason, then ignores input."""
    r = runner()
    frames(r, LOUD)
    r.receive(msg.CloseSession(reason="bye"), T0)
    assert kinds(drain(r)) == CLOSING
    assert r.close_requested == "bye"
    r.receive(msg.Heartbeat(), T0)
    assert frames(r, LOUD) == []
    assert r.next_deadline() is None
    r.tick(T0)


# ------------------------------------------------------------------------- latency


def test_time_to_first_audio_from_first_input_and_from_commit() -> None:
    """The first reply is timed from the session's first audio, later ones from commit."""
    r = runner()
    r.receive(msg.AppendAudio(audio=bytes(4800)), 10.0)
    feed(r, QUIET, 10.3)
    feed(r, LOUD, 10.5)
    assert r.take_first_audio_latencies() == [pytest.approx(0.5)]
    feed(r, LOUD, 10.6)
    assert r.take_first_audio_latencies() == []
    feed(r, FrameOutput(audio=LOUD.audio, level=0.1, reports=(TurnEnded(),)), 10.7)
    r.receive(msg.AppendAudio(audio=bytes(4800)), 11.0)
    r.receive(msg.CommitInput(), 11.0)
    feed(r, LOUD, 11.25)
    assert r.take_first_audio_latencies() == [pytest.approx(0.25)]
    drain(r)


# ------------------------------------------------------------------------- event turns


def test_cascade_events_drive_turns() -> None:
    """speech_started/stopped are surfaced, naming the item speech_stopped commits; the
    transcript completes the item (input_audio_transcription.completed, then item.done),
    response_* bound the answer."""
    r = runner(explicit=True)
    r.receive(msg.AppendAudio(audio=bytes(4800)), T0)  # 100 ms of input on the timeline
    [started] = frames(r, FrameOutput(audio=b"", level=0.0, reports=(UserSpeechStarted(),)))
    assert isinstance(started, msg.InputSpeechStarted) and started.audio_start_ms == 100
    events = frames(r, FrameOutput(audio=b"", level=0.0, reports=(UserSpeechStopped(),)))
    assert kinds(events) == ["input.speech_stopped", "input.committed", "item.added",
                             "item.created"]
    stopped, committed = events[0], events[1]
    assert isinstance(stopped, msg.InputSpeechStopped)
    assert isinstance(committed, msg.InputCommitted)
    assert stopped.item_id == committed.item_id == started.item_id
    events = frames(r, FrameOutput(audio=b"", level=0.0, reports=(
        UserTranscript(text="hi there"), ResponseStarted())))
    assert kinds(events) == ["input_transcription.completed", "item.done", *OPENING]
    transcribed, item = events[0], events[1]
    assert transcribed == msg.InputTranscriptionCompleted(
        item_id=started.item_id, content_index=0, transcript="hi there")
    assert isinstance(item, msg.ItemDone)
    assert item.item["content"][0]["transcript"] == "hi there"
    events = frames(r, QUIET, FrameOutput(audio=LOUD.audio, level=0.1, text="Hi."))
    assert kinds(events) == ["audio.delta", "audio.delta",
                             "transcript.delta"]
    events = frames(r, *[QUIET] * 40)  # silence does not end an event-mode response
    assert "response.done" not in kinds(events)
    events = frames(r, FrameOutput(audio=LOUD.audio, level=0.1,
                                   reports=(TurnEnded(),)))
    assert kinds(events) == ["audio.delta", *CLOSING]
    assert done_of(events)["output"][0]["content"][0]["transcript"] == "Hi."


def test_a_failed_transcription_is_reported_on_its_item() -> None:
    """A transcript that comes with an error is the transcription's failure:
    input_audio_transcription.failed names the item, which completes without a transcript;
    no model_error is raised for it."""
    r = runner(explicit=True)
    [started] = frames(r, FrameOutput(audio=b"", level=0.0, reports=(UserSpeechStarted(),)))
    frames(r, FrameOutput(audio=b"", level=0.0, reports=(UserSpeechStopped(),)))
    events = frames(r, FrameOutput(audio=b"", level=0.0, reports=(
        UserTranscriptFailed(message="whisper ran out of memory"),)))
    assert kinds(events) == ["input_transcription.failed", "item.done"]
    failed, item = events
    assert isinstance(failed, msg.InputTranscriptionFailed) and isinstance(item, msg.ItemDone)
    assert isinstance(started, msg.InputSpeechStarted)
    assert failed.item_id == item.item["id"] == started.item_id
    assert failed.message == "whisper ran out of memory"
    assert item.item["content"][0]["transcript"] is None


def test_cascade_barge_in_cancels_with_turn_detected() -> None:
    """BargedIn (with UserSpeechStarted and TurnEnded) cancels as turn_detected."""
    r = runner(explicit=True)
    frames(r, FrameOutput(audio=b"", level=0.0, reports=(ResponseStarted(),)))
    events = frames(r, FrameOutput(audio=b"", level=0.0, reports=(
        UserSpeechStarted(), BargedIn(), TurnEnded())))
    assert kinds(events) == ["input.speech_started", *CLOSING]  # GA: speech_started first
    done = done_of(events)
    assert done["status_details"] == {"type": "cancelled", "reason": "turn_detected"}


def test_cascade_errors_and_close_complete_the_pending_item() -> None:
    """A backend error without a transcript becomes a server_error event (model_error); a
    transcript with an error is the transcription's failure, on its item; close completes
    a pending user item."""
    r = runner(explicit=True)
    events = frames(r, FrameOutput(audio=b"", level=0.0, reports=(Failed(message="tts failed"),)))
    [error] = events
    assert isinstance(error, msg.ErrorEvent)
    assert (error.code, error.error_type) == ("model_error", "server_error")
    events = frames(r, FrameOutput(audio=b"", level=0.0, reports=(
        UserSpeechStopped(), UserTranscriptFailed(message="asr failed"))))
    assert kinds(events) == ["input.speech_stopped", "input.committed", "item.added",
                             "item.created", "input_transcription.failed", "item.done"]
    frames(r, FrameOutput(audio=b"", level=0.0, reports=(UserSpeechStopped(),)))
    r.receive(msg.CloseSession(), T0)
    assert kinds(drain(r)) == ["item.done"]


def test_cascade_audio_without_a_start_signal_still_opens() -> None:
    """Audible output with no response_started opens a response anyway."""
    r = runner(explicit=True)
    frames(r, FrameOutput(audio=b"", level=0.0, text="early "))
    events = frames(r, LOUD)
    assert kinds(events) == [*OPENING, "audio.delta", "transcript.delta"]


# ------------------------------------------------------------------------- property

_COMMANDS = st.sampled_from([
    msg.AppendAudio(audio=bytes(4800)), msg.CommitInput(), msg.ClearInput(),
    msg.CreateResponse(), msg.CancelResponse(), msg.Heartbeat(),
    msg.UpdateSession(session={"extra_body": {"end_of_turn_silence_ms": 160}}),
])
_FRAMES = st.sampled_from([
    LOUD, QUIET, EMPTY, FrameOutput(audio=LOUD.audio, level=0.1, text="a"),
    FrameOutput(audio=b"", level=0.0, reports=(TurnEnded(),)),
    FrameOutput(audio=b"", level=0.0, reports=(UserSpeechStopped(), UserTranscript(text="x"))),
    FrameOutput(audio=b"", level=0.0, reports=(ResponseStarted(),)),
    FrameOutput(audio=b"", level=0.0, reports=(BargedIn(), TurnEnded())),
])


@settings(max_examples=150, deadline=None)
@given(st.booleans(), st.lists(st.one_of(_COMMANDS, _FRAMES), max_size=60))
def test_any_sequence_gives_valid_well_nested_responses(explicit: bool,
                                                        steps: list[Any]) -> None:
    """Every event is strictly valid; responses open and close in turn, deltas inside."""
    r = runner(explicit)
    events: list[msg.Event] = []
    for n, step in enumerate(steps):
        if isinstance(step, FrameOutput):
            feed(r, step, T0 + n)
        else:
            r.receive(step, T0 + n)
        events += drain(r)
    r.receive(msg.CloseSession(), T0 + len(steps))
    events += drain(r)
    active: str | None = None
    for event in events:
        if isinstance(event, msg.ResponseCreated):
            assert active is None
            active = event.response["id"]
        elif isinstance(event, msg.ResponseDone):
            assert event.response["id"] == active
            active = None
        elif isinstance(event, msg.AudioDelta | msg.TranscriptDelta):
            assert event.response_id == active
    assert active is None


def test_a_response_the_cascade_never_takes_up_completes_empty() -> None:
    """On the cascade (it answers speech only) a response.create with nothing to answer does
    not wait forever: after 5 s in which the model neither spoke nor started its turn, it
    completes empty."""
    r = runner(explicit=True)
    r.receive(msg.CreateResponse(), T0)
    assert kinds(drain(r))[:len(OPENING)] == OPENING
    assert "response.done" not in kinds(frames(r, *[QUIET] * 156))  # 4.99 s of 32 ms ticks
    events = frames(r, QUIET)
    assert kinds(events)[-len(CLOSING):] == CLOSING and done_of(events)["status"] == "completed"


def test_a_response_the_cascade_took_up_waits_for_its_end() -> None:
    """A response the cascade started its turn in (response_started while it was open) is the
    model's to end: a slow synthesis longer than 5 s does not end it, TurnEnded does."""
    r = runner(explicit=True)
    r.receive(msg.CreateResponse(), T0)
    drain(r)
    frames(r, FrameOutput(audio=b"", level=0.0, reports=(ResponseStarted(),)))
    assert "response.done" not in kinds(frames(r, *[QUIET] * 250))  # 8 s
    events = frames(r, LOUD, FrameOutput(audio=b"", level=0.0, reports=(TurnEnded(),)))
    assert kinds(events)[-len(CLOSING):] == CLOSING


def test_the_cascades_speech_times_are_where_the_model_heard_them() -> None:
    """A client that sends a whole turn at once is ahead of the model: the cascade's
    speech_started / speech_stopped are placed where the engine says the model was on the
    input timeline when it heard them, not at the end of what was appended."""
    r = runner(explicit=True)
    r.receive(msg.AppendAudio(audio=bytes(2400 * 48)), T0)  # 2.4 s appended in one go
    drain(r)
    [started] = frames(r, FrameOutput(audio=b"", level=0.0, input_ms=480,
                                      reports=(UserSpeechStarted(),)))
    events = frames(r, FrameOutput(audio=b"", level=0.0, input_ms=1536,
                                   reports=(UserSpeechStopped(),)))
    stopped = events[0]
    assert isinstance(started, msg.InputSpeechStarted) and started.audio_start_ms == 480
    assert isinstance(stopped, msg.InputSpeechStopped) and stopped.audio_end_ms == 1536
