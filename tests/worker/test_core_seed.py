"""The seed's command and event semantics in the conversation core: commit's ``final``,
``create_response`` and ``is_speech``; an append's ``is_speech`` and hints;
``output_audio_buffer.clear``'s ``response_id``; the listen and speak decisions; the six turn
states and the epoch on ``turn.event``; the seed's cancel reasons beside GA's; the
``history_committed`` of a playback acknowledgement. On the loopback and on a frame backend
where both apply: one core serves both."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

from contract import messages as msg
from inference_worker.audio_frames import FrameOutput
from inference_worker.conversation.core import ConversationCore
from tests.worker.feeding import feed
from tests.worker.test_core_commands import (
    FRAME_S,
    LOUD,
    T0,
    done_of,
    drain,
    frames,
    kinds,
    loopback,
    refusal,
    send,
    speak,
)

E = TypeVar("E")
CORES: dict[str, Callable[[], ConversationCore]] = {"loopback": loopback, "frames": frames}
TURN = b"\x01\x02" * 4800  # 200 ms of pcm16 at 24 kHz
QUIET = FrameOutput(audio=bytes(3840), level=0.0)
USER_TURN = ["input.committed", "item.added", "item.created", "item.done"]


def auto_loopback() -> ConversationCore:
    """A push-to-talk loopback whose every commit is answered (``auto_response``)."""
    core = loopback()
    send(core, msg.UpdateSession(session={"extra_body": {"auto_response": True}}))
    return core


def of_type(events: list[msg.Event], kind: type[E]) -> list[E]:
    """The events of class ``kind``, in order."""
    return [event for event in events if isinstance(event, kind)]


def commit(core: ConversationCore, command: msg.CommitInput, audio: bytes = TURN,
           **append: object) -> list[msg.Event]:
    """Append ``audio`` (with the append's seed fields ``append``), then ``command``: the
    events of both."""
    core.receive(msg.AppendAudio(audio=audio, **append), T0)  # type: ignore[arg-type]
    return [*drain(core), *send(core, command)]


# ------------------------------------------------------------------------- create_response


def test_create_response_true_answers_a_session_that_does_not_answer_commits() -> None:
    """response_create true: the commit is answered as response.create would answer it, on
    a session with auto_response off."""
    events = commit(loopback(), msg.CommitInput(create_response=True))
    assert kinds(events)[:len(USER_TURN) + 1] == [*USER_TURN, "response.created"]


def test_create_response_false_leaves_an_answering_session_unanswered() -> None:
    """response_create false: no response, although the session answers every commit."""
    core = auto_loopback()
    assert kinds(commit(core, msg.CommitInput(create_response=False))) == USER_TURN
    assert core.active_response is None
    # Left unanswered, not dropped: response.create answers it later.
    assert "response.created" in kinds(send(core, msg.CreateResponse()))


def test_create_response_absent_lets_the_session_decide() -> None:
    """No response_create: the session's auto_response decides, as before."""
    assert kinds(commit(loopback(), msg.CommitInput())) == USER_TURN
    assert "response.created" in kinds(commit(auto_loopback(), msg.CommitInput()))


@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_create_response_true_during_an_answer_is_refused_its_answer(
        make: Callable[[], ConversationCore]) -> None:
    """While a response is active the commit stands, and its request for an answer is
    refused as response.create would be: never dropped in silence."""
    core = make()
    speak(core)
    core.receive(msg.AppendAudio(audio=TURN), T0 + 0.1)
    events = send(core, msg.CommitInput(create_response=True, event_id="c"), T0 + 0.1)
    assert kinds(events)[:len(USER_TURN)] == USER_TURN
    [error] = of_type(events, msg.ErrorEvent)
    assert (error.code, error.client_event_id) == ("conversation_already_has_active_response",
                                                   "c")
    assert len(of_type(events, msg.ResponseCreated)) == 0


def test_create_response_true_opens_a_response_a_frame_model_fills() -> None:
    """On a full-duplex model a commit that asks for a response opens one for the model."""
    core = frames()
    events = commit(core, msg.CommitInput(create_response=True))
    assert "response.created" in kinds(events) and core.active_response is not None
    feed(core, LOUD, T0 + 0.1)
    assert kinds(drain(core))[:1] == ["audio.delta"]


@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_final_false_still_ends_the_turn(make: Callable[[], ConversationCore]) -> None:
    """final is the seed's: its released server seals the turn whatever final says, and so
    does the core: a non-final commit is a commit."""
    core = make()
    assert kinds(commit(core, msg.CommitInput(final=False))) == USER_TURN
    assert refusal(send(core, msg.CommitInput()))[0] == "input_audio_buffer_commit_empty"


# ------------------------------------------------------------------------- silent commits


@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_is_speech_false_is_a_silent_commit(make: Callable[[], ConversationCore]) -> None:
    """is_speech false: the user item is committed marked silent, no response opens even on
    an answering session, the seed's listen decision rides the commit, and the audio is gone."""
    core = make()
    events = commit(core, msg.CommitInput(is_speech=False, event_id="c"))
    assert kinds(events) == USER_TURN
    [committed] = of_type(events, msg.InputCommitted)
    assert committed.silent
    assert (committed.listen, committed.listen_epoch) == ("silence_or_noise", core.epoch)
    assert core.active_response is None
    assert refusal(send(core, msg.CommitInput()))[0] == "input_audio_buffer_commit_empty"


def test_a_silent_commit_is_never_too_small() -> None:
    """With nothing buffered a silent commit is still answered (the seed's silent commit),
    not refused input_audio_buffer_commit_empty."""
    events = send(auto_loopback(), msg.CommitInput(is_speech=False))
    assert kinds(events) == USER_TURN


def test_a_silent_commit_overrides_the_sessions_answer() -> None:
    """auto_response answers commits; a silent one gets the listen decision instead."""
    core = auto_loopback()
    events = commit(core, msg.CommitInput(is_speech=False))
    assert "response.created" not in kinds(events) and core.active_response is None


def test_appends_that_all_said_silence_make_a_silent_commit() -> None:
    """A commit with no verdict of its own, of appends that all said is_speech false, is
    silent; one append of speech among them makes it a turn."""
    core = auto_loopback()
    core.receive(msg.AppendAudio(audio=TURN, is_speech=False), T0)
    assert kinds(commit(core, msg.CommitInput(), is_speech=False)) == USER_TURN
    core.receive(msg.AppendAudio(audio=TURN, is_speech=False), T0)
    events = commit(core, msg.CommitInput())  # this append said nothing: speech
    assert "response.created" in kinds(events)


@pytest.mark.parametrize("hints", [{"speech": False}, {"vad": {"is_speech": False}},
                                   {"vad": {"speech_probability": 0.2}},
                                   {"speech_probability": 0.1}, {"overlap_action": "drop"}],
                         ids=["speech", "vad", "vad-probability", "probability", "drop"])
def test_the_seeds_speech_hints_are_the_appends_verdict(hints: msg.JsonObject) -> None:
    """The seed's other ways to say an append is not speech count as is_speech false."""
    events = commit(auto_loopback(), msg.CommitInput(), hints=hints)
    assert kinds(events) == USER_TURN


def test_an_explicit_verdict_wins_over_the_hints() -> None:
    """is_speech true beats a hint that says silence (the seed's order)."""
    events = commit(auto_loopback(), msg.CommitInput(), is_speech=True,
                    hints={"speech_probability": 0.0})
    assert "response.created" in kinds(events)


# ------------------------------------------------------------------------- append hints


def test_force_listen_leaves_the_turn_unanswered() -> None:
    """An append that says force_listen: its turn is committed without a response, on an
    answering session, and the listen decision its commit carries says why."""
    core = auto_loopback()
    events = commit(core, msg.CommitInput(), hints={"force_listen": True})
    assert kinds(events) == USER_TURN
    [committed] = of_type(events, msg.InputCommitted)
    assert (committed.listen, committed.listen_epoch) == ("model_listen", core.epoch)
    assert core.active_response is None


def test_a_commit_that_asks_for_a_response_overrides_force_listen() -> None:
    events = commit(loopback(), msg.CommitInput(create_response=True),
                    hints={"force_listen": True})
    assert "response.created" in kinds(events)
    assert all(c.listen is None for c in of_type(events, msg.InputCommitted))


@pytest.mark.parametrize("hints", [{"force_barge_in": True}, {"overlap_action": "interrupt"},
                                   {"overlap": "barge_in"}],
                         ids=["force_barge_in", "overlap_action", "overlap"])
@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_a_barge_in_hint_ends_the_answer_and_keeps_the_audio(
        make: Callable[[], ConversationCore], hints: msg.JsonObject) -> None:
    """An append that says it barges in ends the active response as barge_in does (GA
    turn_detected, the seed's barge_in); its audio stays buffered as the new turn's."""
    core = make()
    speak(core)
    core.receive(msg.AppendAudio(audio=TURN, hints=hints), T0 + 0.5)
    done = done_of(drain(core))
    assert done.response["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
    assert done.seed_reason == "barge_in"
    assert kinds(send(core, msg.CommitInput(), T0 + 0.5))[:len(USER_TURN)] == USER_TURN


def test_hints_that_keep_listening_change_nothing() -> None:
    """overlap_action listen (the default) does not interrupt the answer."""
    core = loopback()
    speak(core)
    core.receive(msg.AppendAudio(audio=TURN, hints={"overlap_action": "listen"}), T0 + 0.1)
    assert not of_type(drain(core), msg.ResponseDone) and core.active_response is not None


def test_the_appends_transcripts_become_the_user_items() -> None:
    """transcript (else text) hints are joined into the committed item's transcript, which
    the client gets as a completed transcription, in GA order."""
    core = loopback()
    core.receive(msg.AppendAudio(audio=TURN, hints={"transcript": "What's the "}), T0)
    events = commit(core, msg.CommitInput(), hints={"text": "weather?"})
    assert kinds(events) == ["input.committed", "item.added", "item.created",
                             "input_transcription.completed", "item.done"]
    [done] = of_type(events, msg.ItemDone)
    assert done.item["content"][0]["transcript"] == "What's the weather?"
    assert core.history[-1].content[0]["transcript"] == "What's the weather?"


def test_ignored_hints_change_nothing() -> None:
    """duration_ms, audio_end_ms and the like are accepted and ignored: the same events as a
    plain append."""
    plain = commit(auto_loopback(), msg.CommitInput())
    hinted = commit(auto_loopback(), msg.CommitInput(),
                    hints={"duration_ms": 999, "audio_start_ms": 5, "audio_end_ms": 7,
                           "audio_duration_ms": 1})
    assert hinted == plain


# ------------------------------------------------------------------------- clear's response_id


@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_clear_naming_the_active_response_ends_it(make: Callable[[], ConversationCore]) -> None:
    """output_audio_buffer.clear with the active response's id: cleared, and the response
    ends client_cancelled (the seed's output_audio_buffer_clear)."""
    core = make()
    response_id = speak(core)
    events = send(core, msg.ClearOutputAudio(response_id=response_id), T0 + 0.5)
    assert events[0] == msg.OutputAudioCleared(response_id=response_id)
    done = done_of(events)
    assert done.response["status_details"]["reason"] == "client_cancelled"
    assert done.seed_reason == "output_audio_buffer_clear"


@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_clear_naming_another_response_is_refused(make: Callable[[], ConversationCore]) -> None:
    """A response_id that is not the one playing: response_cancel_not_active (the seed's
    response_not_active), and the answer goes on."""
    core = make()
    speak(core)
    events = send(core, msg.ClearOutputAudio(response_id="resp_9", event_id="x"), T0 + 0.5)
    assert refusal(events) == ("response_cancel_not_active", "response_id")
    assert core.active_response is not None


def test_clear_naming_the_newest_finished_response_is_answered() -> None:
    """With nothing active, the newest response may still be playing on the client: a clear
    naming it is answered with cleared, and nothing else."""
    core = loopback()
    response_id = speak(core)
    core.tick(T0 + 5)
    drain(core)
    assert send(core, msg.ClearOutputAudio(response_id=response_id), T0 + 5) == [
        msg.OutputAudioCleared(response_id=response_id)]


# ------------------------------------------------------------------------- cancel reasons


@pytest.mark.parametrize(("command", "reason", "seed_reason"), [
    (msg.CancelResponse(), "client_cancelled", None),
    (msg.BargeIn(), "turn_detected", "barge_in"),
    (msg.CancelInput(), "client_cancelled", "barge_in"),
    (msg.ClearOutputAudio(), "client_cancelled", "output_audio_buffer_clear"),
], ids=["response.cancel", "barge_in", "input.cancel", "clear"])
@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_cancel_reasons_stay_ga_and_carry_the_seeds(
        make: Callable[[], ConversationCore], command: msg.Command, reason: str,
        seed_reason: str | None) -> None:
    """status_details.reason stays GA's; seed_reason is the seed's word where it differs."""
    core = make()
    speak(core)
    done = done_of(send(core, command, T0 + 0.5))
    assert done.response["status_details"] == {"type": "cancelled", "reason": reason}
    assert done.seed_reason == seed_reason


# ------------------------------------------------------------------------- listen and speak


@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_speak_comes_once_before_the_first_audible_audio(
        make: Callable[[], ConversationCore]) -> None:
    """The speak decision rides the response's first audible audio delta, once."""
    core = make()
    core.receive(msg.AppendAudio(audio=TURN), T0)
    core.receive(msg.CommitInput(), T0)
    events = send(core, msg.CreateResponse())
    for n in range(4):
        feed(core, LOUD, T0 + n * FRAME_S)
    core.tick(T0 + 0.3)
    events += drain(core)
    [created] = of_type(events, msg.ResponseCreated)
    deltas = of_type(events, msg.AudioDelta)
    [speak_event] = [d for d in deltas if d.speak_epoch is not None]
    assert (speak_event.response_id, speak_event.speak_epoch) == (created.response["id"],
                                                                  core.epoch)
    assert speak_event is deltas[0]


def test_a_response_that_never_sounds_ends_with_listen() -> None:
    """A response the model leaves silent completes empty: its response.done carries the
    listen decision, and no delta carries a speak."""
    core = frames()
    send(core, msg.CreateResponse())
    for n in range(int(5.0 / FRAME_S) + 1):
        feed(core, QUIET, T0 + n * FRAME_S)
    events = drain(core)
    done = done_of(events)
    assert (done.listen, done.listen_epoch) == ("model_turn_completed_without_output",
                                                core.epoch)
    assert all(d.speak_epoch is None for d in of_type(events, msg.AudioDelta))


def test_a_cancelled_response_gets_no_listen() -> None:
    """Only a response that completed silent is a listen decision; a cancel is not one."""
    core = loopback()
    core.receive(msg.AppendAudio(audio=TURN), T0)
    core.receive(msg.CommitInput(), T0)
    core.receive(msg.CreateResponse(response={"output_modalities": ["audio"]}), T0)
    core.receive(msg.CancelResponse(), T0)
    events = drain(core)
    assert done_of(events).listen is None
    assert all(c.listen is None for c in of_type(events, msg.InputCommitted))


# ------------------------------------------------------------------------- turn states


def turn_state(core: ConversationCore, now: float = T0) -> tuple[str, int]:
    """(turn_state, epoch) as a turn.signal's turn.event reports them."""
    [event] = send(core, msg.SignalTurn(event="probe"), now)
    assert isinstance(event, msg.TurnEvent)
    return event.turn_state, event.epoch


@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_each_step_of_a_turn_sets_the_seeds_turn_state(
        make: Callable[[], ConversationCore]) -> None:
    """idle, user_speaking on speech, user_committed on commit, assistant_generating when the
    response opens, assistant_playing once it sounds, barge_in after a cancel (the epoch
    advanced), idle once an answer completes."""
    core = make()
    assert turn_state(core) == ("idle", 0)
    core.receive(msg.AppendAudio(audio=TURN, is_speech=False), T0)
    assert turn_state(core)[0] == "idle"  # declared silence is not the user speaking
    core.receive(msg.AppendAudio(audio=TURN), T0)
    assert turn_state(core)[0] == "user_speaking"
    send(core, msg.CommitInput())
    assert turn_state(core)[0] == "user_committed"
    send(core, msg.CreateResponse())
    assert turn_state(core)[0] in {"assistant_generating", "assistant_playing"}
    feed(core, LOUD, T0 + 0.1)
    core.tick(T0 + 0.1)
    drain(core)
    assert turn_state(core, T0 + 0.1)[0] == "assistant_playing"
    send(core, msg.BargeIn(), T0 + 0.2)
    assert turn_state(core, T0 + 0.2) == ("barge_in", core.epoch)
    assert core.epoch >= 1


def test_clearing_the_input_idles_the_turn() -> None:
    """input_audio_buffer.clear drops the user's turn: the turn state goes idle (the seed's
    cancel of pending input)."""
    core = loopback()
    core.receive(msg.AppendAudio(audio=TURN), T0)
    assert turn_state(core)[0] == "user_speaking"
    send(core, msg.ClearInput())
    assert turn_state(core)[0] == "idle"


def test_a_completed_answer_leaves_the_turn_idle() -> None:
    core = loopback()
    speak(core)
    core.tick(T0 + 5)
    drain(core)
    assert turn_state(core, T0 + 5)[0] == "idle"


@pytest.mark.parametrize(("signal", "state"), [
    ("user_started", "user_speaking"), ("user_committed", "user_committed"),
    ("assistant_started", "assistant_generating"), ("assistant_done", "idle"),
    ("timeout", "user_speaking"), ("close", "user_speaking"), ("user.typing", "user_speaking"),
])
def test_the_seeds_turn_signals_set_the_state(signal: str, state: str) -> None:
    """The seed's turn-event names set the turn state as the seed's do; other names leave
    it; each is echoed with its payload and the epoch."""
    core = loopback()
    core.receive(msg.AppendAudio(audio=TURN), T0)  # user_speaking
    [event] = send(core, msg.SignalTurn(event=signal, payload={"k": 1}))
    assert event == msg.TurnEvent(event=signal, turn_state=state, payload={"k": 1}, epoch=0)


def test_a_playback_ack_signal_acknowledges_playback() -> None:
    """turn.signal playback_ack applies its payload as playback.ack does, then is echoed."""
    core = frames()
    response_id = speak(core, 400)
    events = send(core, msg.SignalTurn(event="playback_ack", payload={
        "played_ms": 200, "committed_ms": 120, "response_id": response_id}), T0 + 0.4)
    assert kinds(events) == ["playback.acknowledged", "turn.event"]
    [ack] = of_type(events, msg.PlaybackAcknowledged)
    assert (ack.response_id, ack.played_ms, ack.committed_ms) == (response_id, 200, 120)


@pytest.mark.parametrize(("payload", "param"), [
    ({}, "payload.played_ms"), ({"played_ms": -1}, "payload.played_ms"),
    ({"played_ms": True}, "payload.played_ms"),
    ({"played_ms": 10, "committed_ms": "5"}, "payload.committed_ms"),
    ({"played_ms": 10, "response_id": 3}, "payload.response_id"),
])
def test_a_playback_ack_signal_with_a_bad_payload_is_refused(payload: msg.JsonObject,
                                                             param: str) -> None:
    core = frames()
    speak(core, 400)
    events = send(core, msg.SignalTurn(event="playback_ack", payload=payload, event_id="s"))
    [error] = of_type(events, msg.ErrorEvent)
    assert (error.param, error.client_event_id) == (param, "s")
    assert kinds(events) == ["error"]


# ------------------------------------------------------------------------- playback truth


def test_history_committed_says_whether_the_history_holds_the_ack() -> None:
    """While the answer plays, and for a completed answer, the history does not hold the
    ack's cut: history_committed false; after a cancel, an ack cuts the answer to what was
    heard: true. truncate stays false: no ack asks for a hard cut."""
    core = frames()
    speak(core, 400)
    [playing] = send(core, msg.AckPlayback(played_ms=80), T0 + 0.4)
    assert isinstance(playing, msg.PlaybackAcknowledged)
    assert (playing.history_committed, playing.truncate) == (False, False)
    send(core, msg.CancelResponse(), T0 + 0.5)
    [cut] = send(core, msg.AckPlayback(played_ms=160), T0 + 0.6)
    assert isinstance(cut, msg.PlaybackAcknowledged)
    assert (cut.history_committed, cut.truncate) == (True, False)
    core = frames()
    speak(core, 400)
    for n in range(10):
        feed(core, QUIET, T0 + 0.5 + n * FRAME_S)
    drain(core)
    [whole] = send(core, msg.AckPlayback(played_ms=80), T0 + 2)
    assert isinstance(whole, msg.PlaybackAcknowledged) and not whole.history_committed


def test_the_new_events_survive_the_log() -> None:
    """What the core emits for the seed comes back from the output log's codec unchanged."""
    core = auto_loopback()
    events = commit(core, msg.CommitInput(is_speech=False))
    speak(core)
    events += send(core, msg.BargeIn(), T0 + 0.5)
    events += send(core, msg.SignalTurn(event="user_started"), T0 + 0.5)
    seeds = [e for e in events if isinstance(
        e, msg.AudioDelta | msg.TurnEvent | msg.ResponseDone | msg.InputCommitted)]
    assert any(isinstance(e, msg.ResponseDone) and e.seed_reason for e in seeds)
    assert any(isinstance(e, msg.InputCommitted) and e.listen for e in seeds)
    for event in seeds:
        assert msg.decode_event(msg.encode_message(event)) == event
