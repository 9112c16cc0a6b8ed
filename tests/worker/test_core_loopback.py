"""ConversationCore: the worker's I/O-free per-session state machine with the loopback backend."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from contract import messages as msg
from inference_worker.backends.loopback import CHUNK_BYTES
from inference_worker.backends.registry import loopback_core
from inference_worker.conversation.core import ConversationCore
from inference_worker.conversation.profiles import MAX_BUFFER_BYTES, MIN_COMMIT_BYTES
from tests.worker.realtime_render import validate_strict

T0 = 100.0


def pcm(ms: int, seed: int = 1) -> bytes:
    """Deterministic, non-silent pcm16 audio of ``ms`` milliseconds at 24 kHz."""
    return bytes((i * seed + 7) % 251 for i in range(ms * 48))


def drain(runner: ConversationCore) -> list[msg.Event]:
    """Drain the runner's events, proving each one renders as a strictly valid Realtime event."""
    events = runner.events_to_send()
    for event in events:
        validate_strict(event)
    return events


def kinds(events: list[msg.Event]) -> list[str]:
    """The KIND of each event, for order assertions."""
    return [event.KIND for event in events]


def audio_of(events: list[msg.Event]) -> bytes:
    """The concatenated audio of the AudioDelta events."""
    return b"".join(e.audio for e in events if isinstance(e, msg.AudioDelta))


def committed(runner: ConversationCore, audio: bytes, now: float = T0) -> None:
    """Append ``audio`` and commit it, discarding the events."""
    runner.receive(msg.AppendAudio(audio=audio), now)
    runner.receive(msg.CommitInput(), now)
    drain(runner)


def update(runner: ConversationCore, patch: dict[str, Any]) -> list[msg.Event]:
    """Apply one session.update and return its events."""
    runner.receive(msg.UpdateSession(session=patch, event_id="evt_u"), T0)
    return drain(runner)


#: ``turn_detection: null``: the client commits and creates responses itself.
PUSH_TO_TALK = {"audio": {"input": {"turn_detection": None}}}


def push_to_talk() -> ConversationCore:
    """A loopback session turned push-to-talk: the tests that use it commit and answer turns
    themselves, with loud audio that the default server_vad would cut into turns of its own."""
    runner = loopback_core("s")
    [event] = update(runner, PUSH_TO_TALK)
    assert isinstance(event, msg.SessionUpdated)
    return runner


OPENING = ["response.created", "output_item.added", "item.added", "item.created",
           "content_part.added"]
AUDIO_CLOSING = ["audio.done", "transcript.done", "content_part.done", "item.done",
                 "output_item.done", "response.done", "rate_limits.updated"]
TEXT_CLOSING = ["text.done", "content_part.done", "item.done", "output_item.done",
                "response.done", "rate_limits.updated"]
COMMIT = ["input.committed", "item.added", "item.created", "item.done"]


# ------------------------------------------------------------------------- session config


def test_default_session_is_a_valid_ga_session() -> None:
    """The effective session object validates as session.updated and carries GA's defaults:
    server_vad, pcm16 24 kHz both ways, voice marin."""
    runner = loopback_core("sess_a")
    [event] = update(runner, {})
    assert isinstance(event, msg.SessionUpdated)
    assert event.session == runner.session
    assert event.session["id"] == "sess_a"
    assert event.session["model"] == "loopback"
    audio = event.session["audio"]
    assert audio["input"]["turn_detection"] == {
        "type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
        "silence_duration_ms": 500, "idle_timeout_ms": None, "create_response": True,
        "interrupt_response": True}
    assert audio["input"]["format"] == audio["output"]["format"] == {"type": "audio/pcm",
                                                                     "rate": 24000}
    assert audio["output"]["voice"] == "marin"
    assert event.session["extra_body"] == {"loopback_mode": "turn", "auto_response": False}


def test_a_new_session_answers_a_spoken_turn_without_any_update() -> None:
    """What a client that never sends session.update gets: the default server_vad hears the
    turn, commits it at the end of speech and answers it (the loopback plays it back)."""
    runner = loopback_core("s")
    speech = pcm(400)
    runner.receive(msg.AppendAudio(audio=speech), T0)
    runner.receive(msg.AppendAudio(audio=bytes(48 * 600)), T0)  # 600 ms of silence
    events = drain(runner)
    assert kinds(events)[:3] == ["input.speech_started", "input.speech_stopped",
                                 "input.committed"]
    assert "response.created" in kinds(events)
    runner.tick(T0 + 10)
    answer = audio_of(events + drain(runner))
    assert speech in answer


def test_turn_detection_null_keeps_push_to_talk() -> None:
    """With ``turn_detection: null`` nothing answers the same audio until the client commits
    and creates the response itself."""
    runner = push_to_talk()
    speech = pcm(400)
    runner.receive(msg.AppendAudio(audio=speech), T0)
    runner.receive(msg.AppendAudio(audio=bytes(48 * 600)), T0)
    runner.tick(T0 + 10)
    assert drain(runner) == []
    runner.receive(msg.CommitInput(), T0 + 10)
    runner.receive(msg.CreateResponse(), T0 + 10)
    runner.tick(T0 + 20)
    events = drain(runner)
    assert kinds(events)[0] == "input.committed" and "response.created" in kinds(events)
    assert speech in audio_of(events)


def test_update_deep_merges_known_keys() -> None:
    """A nested patch changes only the keys it names (a voice the loopback does not have
    shows as the one it speaks with)."""
    runner = loopback_core("s")
    [event] = update(runner, {"instructions": "hi", "audio": {"output": {"voice": "ash",
                                                                         "speed": 1.25}},
                              "extra_body": {"auto_response": True}})
    assert isinstance(event, msg.SessionUpdated)
    session = event.session
    assert session["instructions"] == "hi"
    assert session["audio"]["output"] == {"format": {"type": "audio/pcm", "rate": 24000},
                                          "voice": "marin", "speed": 1.25}
    assert session["extra_body"] == {"loopback_mode": "turn", "auto_response": True}


def test_update_names_the_model_once_and_ignores_read_only_keys() -> None:
    """The session's name (the model it was placed for) may be repeated (LiveKit sends it in
    every update); ``id`` is read-only; another name is model_update_unsupported."""
    runner = loopback_core("s")
    runner.name("gpt-realtime")
    [event] = update(runner, {"type": "realtime", "model": "gpt-realtime", "id": "other"})
    assert isinstance(event, msg.SessionUpdated)
    assert (event.session["model"], event.session["id"]) == ("gpt-realtime", "s")
    [event] = update(runner, {"model": "gpt-realtime"})
    assert isinstance(event, msg.SessionUpdated)
    [event] = update(runner, {"model": "other-model"})
    assert isinstance(event, msg.ErrorEvent) and event.code == "model_update_unsupported"


@pytest.mark.parametrize(
    ("patch", "code", "param"),
    [
        ({"type": "transcription"}, "invalid_value", "session.type"),
        ({"audio": {"input": {"format": {"type": "audio/opus"}}}}, "unsupported_audio_format",
         "session.audio.input.format.type"),
        ({"audio": {"output": {"format": {"type": "audio/pcm", "rate": 4000}}}},
         "unsupported_audio_format", "session.audio.output.format.rate"),
        ({"output_modalities": ["audio", "text"]}, "invalid_value", "session.output_modalities"),
        ({"audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 4999}}}},
         "invalid_value", "session.audio.input.turn_detection.idle_timeout_ms"),
        ({"extra_body": {"loopback_mode": "duplex"}}, "invalid_value",
         "session.extra_body.loopback_mode"),
        ({"extra_body": {"auto_response": 1}}, "invalid_value", "session.extra_body.auto_response"),
        ({"temperature": 0.8}, "invalid_duplex_runtime_config", "session.temperature"),
        ({"audio": {"input": {"vad": None}}}, "unknown_parameter", "session.audio.input.vad"),
        ({"audio": []}, "invalid_type", "session.audio"),
        ({"audio": {"output": {"speed": 3}}}, "invalid_value", "session.audio.output.speed"),
        ({"max_output_tokens": True}, "invalid_value", "session.max_output_tokens"),
        ({"tools": [{"type": "function"}]}, "invalid_value", "session.tools"),
        ({"output_modalities": ["text"], "extra_body": {"loopback_mode": "stream"}},
         "invalid_value", "session.extra_body.loopback_mode"),
        ({"extra_body": {"loopback_mode": "stream"}}, "invalid_value",
         "session.audio.input.turn_detection"),
    ],
)
def test_refused_update(patch: dict[str, Any], code: str, param: str) -> None:
    """An invalid patch gets an error naming code and param, attributed to the client event."""
    runner = loopback_core("s")
    [event] = update(runner, patch)
    assert isinstance(event, msg.ErrorEvent)
    assert (event.code, event.param, event.client_event_id) == (code, param, "evt_u")
    assert event.error_type == "invalid_request_error"


def test_refused_update_changes_nothing() -> None:
    """A patch with one bad key is refused whole: its valid keys do not apply either."""
    runner = loopback_core("s")
    before = runner.session
    update(runner, {"instructions": "changed", "audio": {"input": {"format": {"type": "x"}}}})
    assert runner.session == before


def test_update_accepts_every_known_key() -> None:
    """Each knob the loopback accepts round-trips into a strictly valid session object."""
    runner = loopback_core("s")
    patch = {
        "type": "realtime", "output_modalities": ["text"], "instructions": "x",
        "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function",
                                                                      "name": "f"},
        "max_output_tokens": 100,
        "audio": {"input": {"transcription": {"model": "whisper-1"},
                            "noise_reduction": {"type": "far_field"}},
                  "output": {"voice": {"id": "voice_1"}, "speed": 1.5}},
    }
    [event] = update(runner, patch)
    assert isinstance(event, msg.SessionUpdated)
    assert event.session["audio"]["output"]["voice"] == "marin"  # the voice it really has
    assert event.session["tools"] == [{"type": "function", "name": "f"}]


# ------------------------------------------------------------------------- input buffer


def test_short_commit_is_refused() -> None:
    """Less than 100 ms buffered: input_audio_buffer_commit_empty, and the audio is kept."""
    runner = push_to_talk()
    runner.receive(msg.AppendAudio(audio=pcm(100)[: MIN_COMMIT_BYTES - 48]), T0)
    runner.receive(msg.CommitInput(event_id="evt_c"), T0)
    [error] = drain(runner)
    assert isinstance(error, msg.ErrorEvent)
    assert (error.code, error.client_event_id) == ("input_audio_buffer_commit_empty", "evt_c")
    assert "99.00ms" in error.message
    runner.receive(msg.AppendAudio(audio=pcm(1)), T0)
    runner.receive(msg.CommitInput(), T0)
    assert kinds(drain(runner)) == COMMIT


def test_commit_makes_user_items_in_a_chain() -> None:
    """Each commit becomes a completed user item whose previous_item_id is the conversation tail."""
    runner = push_to_talk()
    runner.receive(msg.AppendAudio(audio=pcm(100)), T0)
    runner.receive(msg.CommitInput(), T0)
    first = drain(runner)
    assert kinds(first) == COMMIT
    assert first[0] == msg.InputCommitted(item_id="item_1", previous_item_id=None)
    assert isinstance(first[1], msg.ItemAdded)
    assert first[1].item["content"] == [{"type": "input_audio", "transcript": None}]
    committed(runner, pcm(100))
    runner.receive(msg.AppendAudio(audio=pcm(100)), T0)
    runner.receive(msg.CommitInput(), T0)
    assert drain(runner)[0] == msg.InputCommitted(item_id="item_3", previous_item_id="item_2")


def test_clear_empties_the_buffer() -> None:
    """input_audio_buffer.clear answers cleared; a commit afterwards has nothing to commit."""
    runner = push_to_talk()
    runner.receive(msg.AppendAudio(audio=pcm(200)), T0)
    runner.receive(msg.ClearInput(), T0)
    runner.receive(msg.CommitInput(), T0)
    assert kinds(drain(runner)) == ["input.cleared", "error"]


def test_input_buffer_keeps_only_the_newest_audio() -> None:
    """A turn longer than the buffer cap keeps its newest part, so memory stays bounded."""
    runner = push_to_talk()
    old, new = pcm(1000, seed=3), pcm(60_000, seed=5)
    assert len(new) == MAX_BUFFER_BYTES
    runner.receive(msg.AppendAudio(audio=old), T0)
    runner.receive(msg.AppendAudio(audio=new), T0)
    runner.receive(msg.CommitInput(), T0)
    runner.receive(msg.CreateResponse(), T0)
    runner.tick(T0 + 61)
    assert audio_of(runner.events_to_send()) == new


def test_empty_append_is_ignored() -> None:
    """An append without audio changes nothing and emits nothing, even in stream mode."""
    runner = push_to_talk()
    update(runner, {"extra_body": {"loopback_mode": "stream"}})
    runner.receive(msg.AppendAudio(audio=b""), T0)
    assert drain(runner) == []


def test_heartbeat_is_acknowledged() -> None:
    """session.heartbeat gets a heartbeat ack."""
    runner = push_to_talk()
    runner.receive(msg.Heartbeat(event_id="hb"), T0)
    assert drain(runner) == [msg.HeartbeatAck()]


# ------------------------------------------------------------------------- turn responses


def test_full_turn_in_ga_order_at_real_time_pace() -> None:
    """A 200 ms turn plays back in five 40 ms chunks, each released at start + its offset."""
    runner = push_to_talk()
    audio = pcm(200)
    committed(runner, audio)
    runner.receive(msg.CreateResponse(response={"metadata": {"client_event_id": "lk"}}), T0)
    opening = drain(runner)
    assert kinds(opening) == [*OPENING, "audio.delta"]
    created, added, item_added, _item_created, part_added, delta = opening
    assert isinstance(delta, msg.AudioDelta) and delta.speak_epoch == 0
    assert isinstance(created, msg.ResponseCreated)
    assert created.response["status"] == "in_progress"
    assert created.response["output"] == []
    assert created.response["metadata"] == {"client_event_id": "lk"}
    assert isinstance(added, msg.OutputItemAdded)
    assert (added.response_id, added.output_index) == ("resp_1", 0)
    assert added.item == {"id": "item_2", "object": "realtime.item", "type": "message",
                          "role": "assistant", "status": "in_progress", "content": []}
    assert isinstance(item_added, msg.ItemAdded)
    assert item_added.previous_item_id == "item_1"
    assert item_added.item["status"] == "in_progress"
    assert isinstance(part_added, msg.ContentPartAdded)
    assert part_added.part == {"type": "audio", "transcript": ""}
    assert isinstance(delta, msg.AudioDelta)
    assert delta.audio == audio[:CHUNK_BYTES]
    assert runner.next_deadline() == T0 + 0.04

    runner.tick(T0 + 0.039)
    assert drain(runner) == []
    runner.tick(T0 + 0.04)
    assert audio_of(drain(runner)) == audio[CHUNK_BYTES : 2 * CHUNK_BYTES]
    runner.tick(100.12)  # written as a literal: the tolerance absorbs float rounding
    assert audio_of(drain(runner)) == audio[2 * CHUNK_BYTES : 4 * CHUNK_BYTES]
    runner.tick(T0 + 0.16)
    rest = drain(runner)
    assert kinds(rest) == ["audio.delta", *AUDIO_CLOSING]
    assert audio_of(rest) == audio[4 * CHUNK_BYTES :]
    done = rest[-2]
    assert isinstance(done, msg.ResponseDone)
    assert done.response["status"] == "completed"
    assert done.response["metadata"] == {"client_event_id": "lk"}
    assert [item["status"] for item in done.response["output"]] == ["completed"]
    assert runner.next_deadline() is None


def test_late_tick_releases_every_due_chunk_in_order() -> None:
    """A tick long after the start releases all due audio at once, never dropping any."""
    runner = push_to_talk()
    audio = pcm(130)  # three full chunks and a partial one
    committed(runner, audio)
    runner.receive(msg.CreateResponse(), T0)
    runner.tick(T0 + 10)
    events = drain(runner)
    assert audio_of(events) == audio
    assert kinds(events)[-2:] == ["response.done", "rate_limits.updated"]


def test_create_refusals() -> None:
    """No unanswered turn, or a response already active, refuses response.create."""
    runner = push_to_talk()
    runner.receive(msg.CreateResponse(event_id="c1"), T0)
    [error] = drain(runner)
    assert isinstance(error, msg.ErrorEvent)
    assert (error.code, error.client_event_id) == ("response_create_without_input", "c1")
    committed(runner, pcm(200))
    committed(runner, pcm(200))
    runner.receive(msg.CreateResponse(), T0)
    runner.receive(msg.CreateResponse(event_id="c2"), T0)
    error = drain(runner)[-1]
    assert isinstance(error, msg.ErrorEvent)
    assert (error.code, error.client_event_id) == ("conversation_already_has_active_response",
                                                   "c2")
    assert "resp_1" in error.message


def test_each_turn_is_answered_once() -> None:
    """The last committed turn is answered once; a second create has no input left."""
    runner = push_to_talk()
    committed(runner, pcm(100, seed=1))
    committed(runner, pcm(100, seed=2))
    runner.receive(msg.CreateResponse(), T0)
    runner.tick(T0 + 1)
    assert audio_of(drain(runner)) == pcm(100, seed=2)
    runner.receive(msg.CreateResponse(event_id="c"), T0 + 1)
    assert kinds(drain(runner)) == ["error"]


@pytest.mark.parametrize(
    ("response", "param"),
    [({"output_modalities": ["audio", "text"]}, "response.output_modalities"),
     ({"metadata": {"k": 1}}, "response.metadata")],
)
def test_invalid_response_options(response: dict[str, Any], param: str) -> None:
    """Overrides that could not be echoed validly are refused with invalid_value and a param."""
    runner = push_to_talk()
    committed(runner, pcm(100))
    runner.receive(msg.CreateResponse(response=response, event_id="c"), T0)
    [error] = drain(runner)
    assert isinstance(error, msg.ErrorEvent)
    assert (error.code, error.param, error.client_event_id) == ("invalid_value", param, "c")


def test_text_response_completes_at_once() -> None:
    """A text-modality response has a text part and no audio events."""
    runner = push_to_talk()
    committed(runner, pcm(100))
    runner.receive(msg.CreateResponse(response={"output_modalities": ["text"]}), T0)
    events = drain(runner)
    # Nothing sounded in it: its response.done carries the seed's listen decision.
    assert kinds(events) == [*OPENING, *TEXT_CLOSING]
    done = events[-2]
    assert isinstance(done, msg.ResponseDone)
    assert (done.listen, done.listen_epoch) == ("model_turn_completed_without_output", 0)
    assert done.response["output"][0]["content"] == [{"type": "output_text", "text": ""}]
    assert runner.next_deadline() is None


def test_auto_response_answers_each_commit() -> None:
    """With extra_body.auto_response in turn mode, a commit also creates the response."""
    runner = push_to_talk()
    update(runner, {"extra_body": {"auto_response": True}})
    runner.receive(msg.AppendAudio(audio=pcm(100)), T0)
    runner.receive(msg.CommitInput(), T0)
    assert kinds(drain(runner)) == [*COMMIT, *OPENING, "audio.delta"]


# ------------------------------------------------------------------------- cancel


def test_cancel_mid_response_drops_unreleased_audio() -> None:
    """response.cancel ends the response cancelled, items incomplete, and drops unsent audio."""
    runner = push_to_talk()
    committed(runner, pcm(200))
    runner.receive(msg.CreateResponse(), T0)
    drain(runner)
    runner.receive(msg.CancelResponse(), T0 + 0.01)
    events = drain(runner)
    assert kinds(events) == AUDIO_CLOSING
    done = events[-2]
    assert isinstance(done, msg.ResponseDone)
    assert done.response["status"] == "cancelled"
    assert done.response["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    assert [item["status"] for item in done.response["output"]] == ["incomplete"]
    assert runner.next_deadline() is None
    runner.tick(T0 + 1)
    assert drain(runner) == []


def test_cancel_refusals() -> None:
    """Cancel with nothing active, or naming another response, is response_cancel_not_active."""
    runner = push_to_talk()
    runner.receive(msg.CancelResponse(event_id="x1"), T0)
    errors = drain(runner)
    committed(runner, pcm(200))
    runner.receive(msg.CreateResponse(), T0)
    runner.receive(msg.CancelResponse(response_id="resp_9", event_id="x2"), T0)
    errors += [e for e in drain(runner) if isinstance(e, msg.ErrorEvent)]
    assert [(e.code, e.param, e.client_event_id) for e in errors
            if isinstance(e, msg.ErrorEvent)] == [
        ("response_cancel_not_active", None, "x1"),
        ("response_cancel_not_active", "response_id", "x2"),
    ]
    runner.receive(msg.CancelResponse(response_id="resp_1"), T0)
    assert kinds(drain(runner))[-2:] == ["response.done", "rate_limits.updated"]


# ------------------------------------------------------------------------- stream mode


def test_stream_mode_echoes_each_append_at_once() -> None:
    """Stream mode opens a response on the first append and echoes exactly the appended bytes."""
    runner = push_to_talk()
    update(runner, {"extra_body": {"loopback_mode": "stream"}})
    runner.receive(msg.AppendAudio(audio=pcm(20, seed=1)), T0)
    first = drain(runner)
    assert kinds(first) == [*OPENING, "audio.delta"]
    assert audio_of(first) == pcm(20, seed=1)
    runner.receive(msg.AppendAudio(audio=pcm(100, seed=2)), T0)
    second = drain(runner)
    assert kinds(second) == ["audio.delta"]
    assert audio_of(second) == pcm(100, seed=2)
    assert runner.next_deadline() is None  # no pacing


def test_stream_commit_completes_the_streamed_response() -> None:
    """A commit in stream mode makes the user item and completes the open response."""
    runner = push_to_talk()
    update(runner, {"extra_body": {"loopback_mode": "stream"}})
    runner.receive(msg.AppendAudio(audio=pcm(120)), T0)
    drain(runner)
    runner.receive(msg.CommitInput(), T0)
    events = drain(runner)
    assert kinds(events) == [*COMMIT, *AUDIO_CLOSING]
    assert events[0] == msg.InputCommitted(item_id="item_2", previous_item_id="item_1")
    done = events[-2]
    assert isinstance(done, msg.ResponseDone)
    assert done.response["status"] == "completed"
    runner.receive(msg.CreateResponse(event_id="c"), T0)  # the turn was answered by the echo
    assert kinds(drain(runner)) == ["error"]
    runner.receive(msg.AppendAudio(audio=pcm(20)), T0)
    reopened = drain(runner)
    assert isinstance(reopened[0], msg.ResponseCreated)
    assert reopened[0].response["id"] == "resp_2"


def test_stream_append_during_playback_is_buffered_not_echoed() -> None:
    """While a played-back turn owns the output, stream appends are only buffered."""
    runner = push_to_talk()
    committed(runner, pcm(200))
    runner.receive(msg.CreateResponse(), T0)
    update(runner, {"extra_body": {"loopback_mode": "stream"}})
    runner.receive(msg.AppendAudio(audio=pcm(100)), T0)
    assert drain(runner) == []
    runner.receive(msg.CommitInput(), T0)
    assert kinds(drain(runner)) == COMMIT


# ------------------------------------------------------------------------- close


def test_close_cancels_the_active_response_then_ignores_everything() -> None:
    """session.close ends the response cancelled, sets close_requested, then nothing more."""
    runner = push_to_talk()
    committed(runner, pcm(200))
    runner.receive(msg.CreateResponse(), T0)
    drain(runner)
    assert runner.close_requested is None
    runner.receive(msg.CloseSession(reason="bye"), T0)
    events = drain(runner)
    assert kinds(events) == AUDIO_CLOSING
    done = events[-2]
    assert isinstance(done, msg.ResponseDone)
    assert done.response["status"] == "cancelled"
    assert runner.close_requested == "bye"
    for command in (msg.Heartbeat(), msg.AppendAudio(audio=pcm(200)), msg.CommitInput(),
                    msg.CreateResponse(), msg.CancelResponse(), msg.UpdateSession(session={})):
        runner.receive(command, T0 + 1)
    runner.tick(T0 + 2)
    assert drain(runner) == []
    assert runner.next_deadline() is None


def test_close_when_idle_emits_nothing() -> None:
    """Closing an idle session emits no event: the store writes the terminal one."""
    runner = push_to_talk()
    runner.receive(msg.CloseSession(), T0)
    assert drain(runner) == []
    assert runner.close_requested == "client_close"


# ------------------------------------------------------------------------- properties

_PATCHES = st.sampled_from([
    {}, {"extra_body": {"loopback_mode": "stream"}}, {"extra_body": {"loopback_mode": "turn"}},
    PUSH_TO_TALK, {**PUSH_TO_TALK, "extra_body": {"loopback_mode": "stream"}},
    {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}},
    {"extra_body": {"auto_response": True}}, {"output_modalities": ["text"]},
    {"output_modalities": ["audio"]}, {"audio": {"input": {"format": {"type": "audio/pcmu"}}}},
    {"bogus": 1},
])
_Step = msg.Command | float  # a command, or seconds to advance the clock before a tick
_APPEND = st.builds(msg.AppendAudio,
                    audio=st.sampled_from([pcm(100), pcm(130), pcm(60), pcm(20), b"\x01", b""]))
_COMMIT = st.builds(msg.CommitInput, event_id=st.just("c"))
_CREATE = st.builds(msg.CreateResponse, event_id=st.just("r"), response=st.sampled_from(
    [None, None, {"metadata": {"a": "b"}}, {"output_modalities": ["text"]}, {"metadata": 1}]))
_TICK = st.floats(min_value=0, max_value=0.15)
_SINGLE: st.SearchStrategy[_Step] = st.one_of(
    _APPEND, _COMMIT, _CREATE, _TICK,
    st.builds(msg.UpdateSession, session=_PATCHES, event_id=st.just("u")),
    st.builds(msg.ClearInput),
    st.builds(msg.CancelResponse, event_id=st.just("x"),
              response_id=st.sampled_from([None, None, "resp_1", "resp_2"])),
    st.builds(msg.Heartbeat),
    st.just(msg.CloseSession()),
)
# Random single commands rarely line up a whole turn (100 ms, commit, create, then ticks), so a
# macro step supplies complete turns that the single steps then interrupt.
_TURN = st.tuples(st.just(msg.AppendAudio(audio=pcm(100))), _APPEND, _COMMIT, _CREATE, _TICK)
_STEPS = st.lists(st.one_of(_TURN, st.tuples(_SINGLE)), min_size=1, max_size=30).map(
    lambda groups: [step for group in groups for step in group])

_AUDIO_RE = re.compile(r"^(?:created added item icreated content)(?: delta)*"
                       r" (?:adone tdone |xdone )"
                       r"pdone idone odone done$")
_SHORT = {"response.created": "created", "output_item.added": "added", "item.added": "item",
          "item.created": "icreated", "content_part.added": "content", "audio.delta": "delta",
          "audio.done": "adone",
          "transcript.done": "tdone", "content_part.done": "pdone", "item.done": "idone",
          "output_item.done": "odone", "response.done": "done", "text.done": "xdone"}


class _Checker:
    """Tracks the event stream and asserts the response invariants as events arrive."""

    def __init__(self) -> None:
        self.open_response: str | None = None
        self.item_owner: dict[str, str] = {}
        self.trace: dict[str, list[str]] = {}

    def owner(self, event: msg.Event) -> str | None:
        if isinstance(event, msg.ResponseCreated | msg.ResponseDone):
            return str(event.response["id"])
        if isinstance(event, msg.ItemAdded | msg.ItemCreated | msg.ItemDone):
            return self.item_owner.get(event.item["id"])
        return getattr(event, "response_id", None)

    def see(self, event: msg.Event) -> None:
        validate_strict(event)
        assert not msg.is_terminal(event), "the runner never writes the terminal event"
        if isinstance(event, msg.ResponseCreated):
            assert self.open_response is None, "two responses active at once"
            self.open_response = event.response["id"]
        if isinstance(event, msg.OutputItemAdded):
            self.item_owner[event.item["id"]] = event.response_id
        owner = self.owner(event)
        if owner is not None:
            assert owner == self.open_response, f"{event.KIND} outside its response"
            self.trace.setdefault(owner, []).append(_SHORT[event.KIND])
        if isinstance(event, msg.ResponseDone):
            self.open_response = None


@settings(max_examples=300, deadline=None)
@given(steps=_STEPS)
def test_random_sessions_keep_the_invariants(steps: list[_Step]) -> None:
    """Any command/tick sequence: no exception, valid events, one response at a time, all ended."""
    runner = loopback_core("s")
    checker = _Checker()
    now = T0
    for step in [*steps, msg.CloseSession()]:
        closed_before = runner.close_requested is not None
        if isinstance(step, float):
            now += step
            runner.tick(now)
        else:
            runner.receive(step, now)
        events = runner.events_to_send()
        for event in events:
            checker.see(event)
            if isinstance(event, msg.ErrorEvent):
                assert not isinstance(step, float)
                assert event.client_event_id == step.event_id
        assert not (closed_before and events), "events after session.close"
        deadline = runner.next_deadline()
        assert deadline is None or deadline > now
    assert checker.open_response is None
    assert runner.close_requested is not None
    for trace in checker.trace.values():
        assert _AUDIO_RE.match(" ".join(trace)), trace
