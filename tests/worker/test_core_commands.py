"""The conversation core's duplex commands (the seed's extensions: ``input.cancel``,
``barge_in``, ``turn.signal``, ``input.text.append``, ``playback.ack``) and its playback ledger,
on the loopback and on a frame backend alike: one core serves both."""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

import pytest

from contract import messages as msg
from inference_worker.audio_frames import FrameOutput
from inference_worker.backends.registry import frame_core, loopback_core
from inference_worker.conversation.core import COMMANDS, ConversationCore
from inference_worker.conversation.turns import TurnMode
from tests.worker.feeding import feed
from tests.worker.realtime_render import validate_strict

T0 = 100.0
FRAME_S = 0.08
LOUD = FrameOutput(audio=b"\x10\x20" * 1920, level=0.1, text="hello there ")  # 80 ms
BYTES_PER_MS = 48


def loopback() -> ConversationCore:
    """A fresh loopback session's core, push-to-talk (``turn_detection: null``), as the frame
    backend's starts: these tests commit and create responses themselves."""
    core = loopback_core("sess_cmd")
    core.receive(msg.UpdateSession(session={"audio": {"input": {"turn_detection": None}}}), T0)
    [updated] = core.events_to_send()
    assert isinstance(updated, msg.SessionUpdated)
    return core


def frames() -> ConversationCore:
    """A fresh core of a Moshi-like frame backend."""
    return frame_core("sess_cmd", model="moshi", frame_seconds=FRAME_S,
                      turns=TurnMode.AUDIO)


CORES: dict[str, Callable[[], ConversationCore]] = {"loopback": loopback, "frames": frames}


def drain(core: ConversationCore) -> list[msg.Event]:
    """The core's events, each strictly valid as the worker tests render them."""
    events = core.events_to_send()
    for event in events:
        validate_strict(event)
    return events


def kinds(events: list[msg.Event]) -> list[str]:
    """The KIND of each event."""
    return [event.KIND for event in events]


def send(core: ConversationCore, command: msg.Command, now: float = T0) -> list[msg.Event]:
    """Apply one command and return its events."""
    core.receive(command, now)
    return drain(core)


def speak(core: ConversationCore, ms: int = 400) -> str:
    """Get a response going with about ``ms`` of audio generated (still active: the
    loopback's turn is three times as long); its id."""
    core.receive(msg.AppendAudio(audio=b"\x01\x02" * (ms * 24 * 3)), T0)
    core.receive(msg.CommitInput(), T0)
    core.receive(msg.CreateResponse(), T0)
    for n in range(ms // 80):
        feed(core, LOUD, T0 + n * FRAME_S)  # the frame backend's model speaks
    core.tick(T0 + (ms - 40) / 1000)  # the loopback's playback releases what is due
    events = drain(core)
    [created] = [e for e in events if isinstance(e, msg.ResponseCreated)]
    response_id: str = created.response["id"]
    return response_id


def done_of(events: list[msg.Event]) -> msg.ResponseDone:
    """The one response.done among ``events``."""
    [done] = [e for e in events if isinstance(e, msg.ResponseDone)]
    return done


def refusal(events: list[msg.Event]) -> tuple[str, str | None]:
    """(code, param) of the one error among ``events``."""
    [error] = [e for e in events if isinstance(e, msg.ErrorEvent)]
    return error.code, error.param


def test_every_command_type_has_a_handler() -> None:
    """The core's command table covers the Command union exactly: a new command without a
    handler fails here, not in a live session."""
    assert set(COMMANDS) == set(get_args(msg.Command))


# ------------------------------------------------------------------------- input.cancel


@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_input_cancel_ends_the_response_and_drops_the_input(
        make: Callable[[], ConversationCore]) -> None:
    """input.cancel ends the active response client_cancelled, clears the input buffer
    (input_audio_buffer.cleared) and advances the epoch; the dropped input cannot be
    committed afterwards."""
    core = make()
    speak(core)
    core.receive(msg.AppendAudio(audio=b"\x01\x02" * 2400), T0 + 1)  # 100 ms pending
    drain(core)
    epoch = core.epoch
    events = send(core, msg.CancelInput(event_id="ci"), T0 + 1)
    assert kinds(events)[-1] == "input.cleared"
    done = done_of(events).response
    assert (done["status"], done["status_details"]["reason"]) == ("cancelled",
                                                                  "client_cancelled")
    assert core.epoch == epoch + 1 and core.active_response is None
    assert refusal(send(core, msg.CommitInput(), T0 + 1))[0] == "input_audio_buffer_commit_empty"


@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_input_cancel_with_nothing_running_still_fences(
        make: Callable[[], ConversationCore]) -> None:
    """With no response active, input.cancel only clears the input, and still advances the
    epoch (the seed's behaviour)."""
    core = make()
    assert kinds(send(core, msg.CancelInput())) == ["input.cleared"]
    assert core.epoch == 1


def test_input_cancel_drops_the_loopbacks_unanswered_turn() -> None:
    """On the loopback a committed turn not yet answered goes too: response.create then has
    nothing to answer."""
    core = loopback()
    core.receive(msg.AppendAudio(audio=b"\x01\x02" * 4800), T0)
    core.receive(msg.CommitInput(), T0)
    drain(core)
    send(core, msg.CancelInput())
    assert refusal(send(core, msg.CreateResponse()))[0] == "response_create_without_input"


# ------------------------------------------------------------------------- barge_in


@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_barge_in_ends_the_response_turn_detected(make: Callable[[], ConversationCore]) -> None:
    """barge_in ends the active response cancelled with reason turn_detected (as a detected
    speech start would) and drops the input buffered before it."""
    core = make()
    speak(core)
    events = send(core, msg.BargeIn(), T0 + 1)
    done = done_of(events).response
    assert done["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
    assert kinds(events)[-1] == "input.cleared"
    assert core.active_response is None


def test_barge_in_mutes_a_model_that_cannot_stop() -> None:
    """On a full-duplex model the rest of the interrupted turn never reaches the client: its
    output is dropped until the model falls silent; then it may speak again."""
    core = frames()
    speak(core)
    send(core, msg.BargeIn(), T0 + 1)
    feed(core, LOUD, T0 + 1.1)
    assert drain(core) == []
    quiet = FrameOutput(audio=bytes(3840), level=0.0)
    for n in range(10):  # 800 ms of silence ends the muted turn
        feed(core, quiet, T0 + 1.2 + n * FRAME_S)
    feed(core, LOUD, T0 + 3)
    assert kinds(drain(core))[0] == "response.created"


def test_barge_in_with_nothing_active_only_clears_input() -> None:
    """With no response active barge_in ends nothing: it clears the input."""
    assert kinds(send(loopback(), msg.BargeIn())) == ["input.cleared"]


# ------------------------------------------------------------------------- turn.signal


@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_turn_signal_is_echoed_with_the_turn_state(make: Callable[[], ConversationCore]) -> None:
    """A turn.signal no command stands for comes back as turn.event with its payload, the
    seed's turn state and the epoch: idle at first, assistant_playing while the answer
    sounds."""
    core = make()
    [event] = send(core, msg.SignalTurn(event="user.typing", payload={"n": 1}))
    assert event == msg.TurnEvent(event="user.typing", turn_state="idle", payload={"n": 1},
                                  epoch=0)
    speak(core)
    [event] = send(core, msg.SignalTurn(event="user.typing"), T0 + 0.1)
    assert isinstance(event, msg.TurnEvent) and event.turn_state == "assistant_playing"


# ------------------------------------------------------------------------- input.text.append


@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_text_append_is_refused_with_the_seeds_code(make: Callable[[], ConversationCore]) -> None:
    """No backend takes text into the user's turn: input.text.append gets the seed's
    native_text_append_unsupported, naming the command, and the session goes on."""
    core = make()
    events = send(core, msg.AppendText(text="hi", event_id="t1"))
    [error] = events
    assert isinstance(error, msg.ErrorEvent)
    assert (error.code, error.param, error.client_event_id) == (
        "native_text_append_unsupported", "text", "t1")
    assert kinds(send(core, msg.Heartbeat())) == ["heartbeat_ack"]


# ------------------------------------------------------------------------- playback.ack


@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_playback_ack_reports_the_ledger(make: Callable[[], ConversationCore]) -> None:
    """playback.ack answers playback.acknowledged with the response's ledger: what was
    generated and sent, what the client played and committed (committed defaults to played);
    values only move forward."""
    core = make()
    response_id = speak(core, 400)
    [ack] = send(core, msg.AckPlayback(played_ms=200), T0 + 0.36)
    assert isinstance(ack, msg.PlaybackAcknowledged)
    assert ack.response_id == response_id
    assert ack.played_ms == ack.committed_ms == 200
    assert ack.generated_ms == ack.sent_ms >= 200
    [ack] = send(core, msg.AckPlayback(played_ms=100, response_id=response_id), T0 + 0.36)
    assert isinstance(ack, msg.PlaybackAcknowledged) and ack.played_ms == 200


@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_playback_ack_refusals(make: Callable[[], ConversationCore]) -> None:
    """An ack naming an unknown response or item gets playback_item_not_found, an item of
    another response playback_item_mismatch, more played than generated or more committed
    than played invalid_value; none of them changes the ledger."""
    core = make()
    assert refusal(send(core, msg.AckPlayback(played_ms=0))) == ("playback_item_not_found",
                                                                 None)
    response_id = speak(core, 400)
    assert refusal(send(core, msg.AckPlayback(played_ms=10, response_id="resp_9"))) == (
        "playback_item_not_found", "response_id")
    assert refusal(send(core, msg.AckPlayback(played_ms=10, item_id="item_99"))) == (
        "playback_item_not_found", "item_id")
    assert refusal(send(core, msg.AckPlayback(played_ms=10, response_id=response_id,
                                              item_id="item_1"))) == (
        "playback_item_mismatch", "item_id")
    assert refusal(send(core, msg.AckPlayback(played_ms=60_000))) == ("invalid_value",
                                                                      "played_ms")
    assert refusal(send(core, msg.AckPlayback(played_ms=100, committed_ms=150))) == (
        "invalid_value", "committed_ms")
    [ack] = send(core, msg.AckPlayback(played_ms=0))
    assert isinstance(ack, msg.PlaybackAcknowledged) and ack.played_ms == 0


@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_a_cancelled_answer_keeps_only_what_was_acknowledged(
        make: Callable[[], ConversationCore]) -> None:
    """Acked playback, then a cancel: the answer's item in the history is cut to the
    committed milliseconds, and its transcript in proportion."""
    core = make()
    response_id = speak(core, 400)
    send(core, msg.AckPlayback(played_ms=200, committed_ms=120), T0 + 0.3)
    events = send(core, msg.CancelResponse(), T0 + 0.3)
    item_id = done_of(events).response["output"][0]["id"]
    item = core.history_item(item_id)
    assert item is not None and item.audio_ms == 120
    assert response_id == done_of(events).response["id"]


def test_an_ack_after_the_cancel_cuts_the_history_too() -> None:
    """A client that reports what it played only after the cancel still gets a truthful
    history: the late ack cuts the cancelled answer."""
    core = frames()
    speak(core, 400)
    events = send(core, msg.CancelResponse(), T0 + 0.5)
    item_id = done_of(events).response["output"][0]["id"]
    before = core.history_item(item_id)
    assert before is not None and before.audio_ms == 400
    send(core, msg.AckPlayback(played_ms=80), T0 + 0.6)
    after = core.history_item(item_id)
    assert after is not None and after.audio_ms == 80
    transcript = after.content[0]["transcript"]
    assert len(transcript) < len("hello there " * 5)


def test_a_completed_answer_stays_whole_whatever_was_acked() -> None:
    """Only an interrupted answer is cut: a completed one was heard to its end."""
    core = frames()
    speak(core, 400)
    send(core, msg.AckPlayback(played_ms=80), T0 + 0.5)
    quiet = FrameOutput(audio=bytes(3840), level=0.0)
    for n in range(10):
        feed(core, quiet, T0 + 0.5 + n * FRAME_S)
    done = done_of(drain(core)).response
    assert done["status"] == "completed"
    item = core.history_item(done["output"][0]["id"])
    assert item is not None and item.audio_ms == 400 + 800


# ------------------------------------------------------------------------- out-of-band responses


def test_an_out_of_band_response_answers_without_joining_the_conversation() -> None:
    """response.create with conversation "none" answers the committed turn but stays out of
    the history: no conversation.item.* names its item, its conversation_id is null, and the
    turn is still there for the next in-band response."""
    core = loopback()
    turn = bytes(range(256)) * 19  # ~100 ms
    core.receive(msg.AppendAudio(audio=turn), T0)
    core.receive(msg.CommitInput(), T0)
    drain(core)
    core.receive(msg.CreateResponse(response={"conversation": "none",
                                              "metadata": {"purpose": "summary"}}), T0)
    core.tick(T0 + 1)
    events = drain(core)
    assert kinds(events) == ["response.created", "output_item.added", "content_part.added",
                             *["audio.delta"] * 3, "audio.done",
                             "transcript.done",
                             "content_part.done", "output_item.done", "response.done",
                             "rate_limits.updated"]
    done = done_of(events).response
    assert done["conversation_id"] is None and done["metadata"] == {"purpose": "summary"}
    assert b"".join(e.audio for e in events if isinstance(e, msg.AudioDelta)) == turn
    assert [item.role for item in core.history] == ["user"]
    core.receive(msg.CreateResponse(), T0 + 1)
    core.tick(T0 + 2)
    events = drain(core)
    assert "item.added" in kinds(events)
    assert [item.role for item in core.history] == ["user", "assistant"]


def test_a_response_with_input_answers_those_items() -> None:
    """response.create with input items answers them instead of the conversation: the
    loopback plays back their input_audio."""
    import base64

    core = loopback()
    audio = bytes(range(200)) * 24
    item = {"type": "message", "role": "user",
            "content": [{"type": "input_audio", "audio": base64.b64encode(audio).decode()}]}
    core.receive(msg.CreateResponse(response={"conversation": "none", "input": [item]}), T0)
    core.tick(T0 + 1)
    events = drain(core)
    assert b"".join(e.audio for e in events if isinstance(e, msg.AudioDelta)) == audio
    assert core.history == []


def test_bad_input_items_are_refused_naming_the_item() -> None:
    """An input item the server cannot read is refused with its path in response.input."""
    core = loopback()
    events = send(core, msg.CreateResponse(response={"input": [
        {"type": "message", "role": "robot", "content": [{"type": "input_text", "text": "x"}]}
    ]}))
    assert refusal(events) == ("invalid_value", "response.input[0].role")


def test_a_model_native_backend_refuses_out_of_band_responses() -> None:
    """A full-duplex model answers from what it heard: conversation "none" is refused with
    the seed's unsupported_native_response_options."""
    assert refusal(send(frames(), msg.CreateResponse(response={"conversation": "none"}))) == (
        "unsupported_native_response_options", "response.conversation")


# ------------------------------------------------------------------------- output backpressure


@pytest.mark.parametrize("make", CORES.values(), ids=CORES.keys())
def test_output_backpressure_fails_the_active_response(
        make: Callable[[], ConversationCore]) -> None:
    """The gateway's word that the client does not read: the active response ends failed with
    the seed's output_backpressure (a GA-valid failed status), the model is told to stop, and
    the session goes on (a new response may open)."""
    core = make()
    speak(core)
    epoch = core.epoch
    events = send(core, msg.OutputBackpressure(pending_events=600, pending_bytes=3 << 20),
                  T0 + 0.36)
    done = done_of(events).response
    assert done["status"] == "failed"
    assert done["status_details"] == {"type": "failed", "error": {
        "type": "server_error", "code": "output_backpressure"}}
    assert core.epoch == epoch + 1 and core.active_response is None
    assert kinds(send(core, msg.OutputBackpressure(pending_events=600, pending_bytes=0),
                      T0 + 0.4)) == []  # nothing active: nothing to do
