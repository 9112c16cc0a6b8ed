"""Conversation items the client manages (create, retrieve, delete, truncate) and
``output_audio_buffer.clear``, on both runners: the loopback and a frame backend's.

Every event is rendered as the gateway renders it and validated strictly, as the strictest
real clients validate it.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from contract import messages as msg
from gateway.protocol.render import render_event
from inference_worker.audio_frames import FrameOutput
from inference_worker.backends.loopback import CHUNK_BYTES
from inference_worker.backends.registry import frame_core, loopback_core
from inference_worker.conversation.core import ConversationCore
from inference_worker.conversation.history import MAX_ITEMS
from inference_worker.conversation.items import Item
from inference_worker.conversation.reports import BargedIn, ResponseStarted
from inference_worker.conversation.turns import TurnMode
from tests.gateway.strict import validate_server_event
from tests.worker.feeding import feed
from tests.worker.realtime_render import validate_strict

T0 = 100.0
FRAME_S = 0.08
LOUD = FrameOutput(audio=b"\x10\x20" * 1920, level=0.1, text="hi")  # 80 ms
CLOSING = ["audio.done", "transcript.done", "content_part.done", "item.done",
           "output_item.done", "response.done", "rate_limits.updated"]
USER_TEXT = {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "hello"}]}


def loopback() -> ConversationCore:
    """A fresh loopback runner, push-to-talk (``turn_detection: null``), as the frame
    backend's starts: these tests commit and create responses themselves."""
    runner = loopback_core("sess_items")
    runner.receive(msg.UpdateSession(session={"audio": {"input": {"turn_detection": None}}}),
                   T0)
    [updated] = runner.events_to_send()
    assert isinstance(updated, msg.SessionUpdated)
    return runner


def frame_runner(explicit: bool = False) -> ConversationCore:
    """A fresh runner of a Moshi-like frame backend (or the cascade's event mode)."""
    return frame_core("sess_items", model="moshi", frame_seconds=FRAME_S,
                      turns=TurnMode.EVENTS if explicit else TurnMode.AUDIO)


RUNNERS: dict[str, Callable[[], ConversationCore]] = {"loopback": loopback, "frames": frame_runner}


def drain(runner: ConversationCore) -> list[msg.Event]:
    """The runner's events, each strictly valid both as the worker tests and as the gateway
    renders it."""
    events = runner.events_to_send()
    for seq, event in enumerate(events, start=1):
        validate_strict(event)
        validate_server_event(render_event(event, server_event_seq=seq,
                                                       event_id=f"e{seq}"))
    return events


def kinds(events: list[msg.Event]) -> list[str]:
    """The KIND of each event."""
    return [event.KIND for event in events]


def send(runner: ConversationCore, command: msg.Command, now: float = T0) -> list[msg.Event]:
    """Apply one command and return its events."""
    runner.receive(command, now)
    return drain(runner)


def refusal(events: list[msg.Event]) -> tuple[str, str | None, str | None]:
    """(code, param, client event id) of the one error event among ``events``."""
    [error] = [e for e in events if isinstance(e, msg.ErrorEvent)]
    return error.code, error.param, error.client_event_id


def create(runner: ConversationCore, item: dict[str, Any], previous: str | None = None) -> str:
    """Create ``item`` and return its id."""
    events = send(runner, msg.CreateItem(item=item, previous_item_id=previous))
    assert kinds(events) == ["item.added", "item.created", "item.done"]
    added = events[0]
    assert isinstance(added, msg.ItemAdded)
    item_id: str = added.item["id"]
    return item_id


def retrieved(runner: ConversationCore, item_id: str) -> dict[str, Any]:
    """The item ``conversation.item.retrieve`` answers with."""
    [event] = send(runner, msg.RetrieveItem(item_id=item_id))
    assert isinstance(event, msg.ItemRetrieved)
    return event.item


def played_response(runner: ConversationCore, ms: int) -> str:
    """Commit ``ms`` of audio, create a response and let its first chunk out; its item id."""
    runner.receive(msg.AppendAudio(audio=b"\x01\x02" * (ms * 24)), T0)
    runner.receive(msg.CommitInput(), T0)
    runner.receive(msg.CreateResponse(), T0)
    events = drain(runner)
    [opened] = [e for e in events if isinstance(e, msg.ResponseCreated)]
    assert opened.response["status"] == "in_progress"
    [added] = [e for e in events if isinstance(e, msg.OutputItemAdded)]
    item_id: str = added.item["id"]
    return item_id


def audio_ms(events: list[msg.Event]) -> int:
    """Milliseconds of output audio among ``events``."""
    return sum(len(e.audio) for e in events if isinstance(e, msg.AudioDelta)) // 48


# ------------------------------------------------------------------------- create


@pytest.mark.parametrize("make", RUNNERS.values(), ids=RUNNERS.keys())
def test_created_items_go_where_previous_item_id_says(
        make: Callable[[], ConversationCore]) -> None:
    """Without previous_item_id an item is appended, "root" puts it first, an id after that
    item; each create answers item.added then item.done, naming the item before it."""
    runner = make()
    runner.receive(msg.CreateItem(item=USER_TEXT), T0)
    first_events = drain(runner)
    assert kinds(first_events) == ["item.added", "item.created", "item.done"]
    assert all(isinstance(e, msg.ItemAdded | msg.ItemCreated | msg.ItemDone)
               and e.previous_item_id is None for e in first_events)
    added = first_events[0]
    assert isinstance(added, msg.ItemAdded)
    first = added.item["id"]
    second = send(runner, msg.CreateItem(item={**USER_TEXT, "id": "mine"}))
    assert [e.previous_item_id for e in second] == [first] * 3  # type: ignore[union-attr]
    root = send(runner, msg.CreateItem(item=USER_TEXT, previous_item_id="root"))
    assert [e.previous_item_id for e in root] == [None] * 3  # type: ignore[union-attr]
    middle = send(runner, msg.CreateItem(item=USER_TEXT, previous_item_id=first))
    assert [e.previous_item_id for e in middle] == [first] * 3  # type: ignore[union-attr]
    assert retrieved(runner, "mine") == {
        "id": "mine", "object": "realtime.item", "type": "message", "role": "user",
        "status": "completed", "content": [{"type": "input_text", "text": "hello"}]}


@pytest.mark.parametrize("make", RUNNERS.values(), ids=RUNNERS.keys())
def test_system_and_assistant_items_keep_their_content_without_audio_bytes(
        make: Callable[[], ConversationCore]) -> None:
    """A system text item and an assistant audio item are stored as GA shapes them, the
    audio's bytes left out and its transcript kept."""
    runner = make()
    system = create(runner, {"type": "message", "role": "system",
                             "content": [{"type": "input_text", "text": "be brief"}]})
    assert retrieved(runner, system)["content"] == [{"type": "input_text", "text": "be brief"}]
    audio = base64.b64encode(bytes(48 * 100)).decode()
    assistant = create(runner, {"type": "message", "role": "assistant", "content": [
        {"type": "output_audio", "audio": audio, "transcript": "ok"}]})
    assert retrieved(runner, assistant)["content"] == [
        {"type": "output_audio", "transcript": "ok"}]
    # The 100 ms sent count as its audio: truncating beyond them is refused.
    beyond = send(runner, msg.TruncateItem(item_id=assistant, content_index=0,
                                           audio_end_ms=101))
    assert refusal(beyond)[:2] == ("invalid_value", "audio_end_ms")
    assert kinds(send(runner, msg.TruncateItem(item_id=assistant, content_index=0,
                                               audio_end_ms=100))) == ["item.truncated"]


BAD_ITEMS: list[tuple[str, dict[str, Any], str, str]] = [
    ("no-type", {"role": "user", "content": []}, "missing_required_parameter", "item.type"),
    ("type-not-string", {**USER_TEXT, "type": 3}, "invalid_type", "item.type"),
    ("function_call_output", {"type": "function_call_output", "call_id": "c", "output": "x"},
     "invalid_value", "item.call_id"),  # no function_call "c" to answer
    ("other-type", {"type": "mcp_call", "id": "x"}, "invalid_value", "item.type"),
    ("no-role", {"type": "message", "content": []}, "missing_required_parameter", "item.role"),
    ("bad-role", {**USER_TEXT, "role": "tool"}, "invalid_value", "item.role"),
    ("no-content", {"type": "message", "role": "user"}, "missing_required_parameter",
     "item.content"),
    ("content-not-list", {**USER_TEXT, "content": "hi"}, "invalid_type", "item.content"),
    ("empty-content", {**USER_TEXT, "content": []}, "invalid_value", "item.content"),
    ("part-not-object", {**USER_TEXT, "content": ["hi"]}, "invalid_type", "item.content[0]"),
    ("part-wrong-for-role", {**USER_TEXT, "content": [{"type": "output_text", "text": "x"}]},
     "invalid_value", "item.content[0].type"),
    ("system-audio", {"type": "message", "role": "system",
                      "content": [{"type": "input_audio", "audio": ""}]},
     "invalid_value", "item.content[0].type"),
    ("text-missing", {**USER_TEXT, "content": [{"type": "input_text"}]},
     "missing_required_parameter", "item.content[0].text"),
    ("audio-not-base64", {**USER_TEXT, "content": [{"type": "input_audio", "audio": "@@"}]},
     "invalid_value", "item.content[0].audio"),
    ("audio-odd-bytes", {**USER_TEXT, "content": [{"type": "input_audio", "audio": "AA=="}]},
     "invalid_value", "item.content[0].audio"),
    ("transcript-not-string", {"type": "message", "role": "assistant", "content": [
        {"type": "output_audio", "transcript": 5}]}, "invalid_type", "item.content[0].transcript"),
    ("id-not-string", {**USER_TEXT, "id": 7}, "invalid_type", "item.id"),
    ("id-too-long", {**USER_TEXT, "id": "x" * 65}, "invalid_value", "item.id"),
]


@pytest.mark.parametrize("make", RUNNERS.values(), ids=RUNNERS.keys())
@pytest.mark.parametrize(("item", "code", "param"), [row[1:] for row in BAD_ITEMS],
                         ids=[row[0] for row in BAD_ITEMS])
def test_a_bad_item_is_refused_with_its_code_and_param(
        make: Callable[[], ConversationCore], item: dict[str, Any], code: str, param: str) -> None:
    """A malformed item gets one error naming the field at fault and adds nothing."""
    runner = make()
    events = send(runner, msg.CreateItem(item=item, event_id="evt_c"))
    assert kinds(events) == ["error"]
    assert refusal(events) == (code, param, "evt_c")
    assert kinds(send(runner, msg.RetrieveItem(item_id="item_1"))) == ["error"]


@pytest.mark.parametrize("make", RUNNERS.values(), ids=RUNNERS.keys())
def test_unknown_previous_item_and_taken_id_are_refused(
        make: Callable[[], ConversationCore]) -> None:
    """An unknown previous_item_id is item_not_found; an id already in use invalid_value."""
    runner = make()
    events = send(runner, msg.CreateItem(item=USER_TEXT, previous_item_id="nope"))
    assert refusal(events) == ("item_not_found", "previous_item_id", None)
    create(runner, {**USER_TEXT, "id": "mine"})
    assert refusal(send(runner, msg.CreateItem(item={**USER_TEXT, "id": "mine"})))[:2] == (
        "invalid_value", "item.id")


def test_a_client_id_never_collides_with_the_servers_next_one() -> None:
    """An item created as item_1 makes the next commit's user item take another id."""
    runner = loopback()
    create(runner, {**USER_TEXT, "id": "item_1"})
    runner.receive(msg.AppendAudio(audio=bytes(4800)), T0)
    runner.receive(msg.CommitInput(), T0)
    committed = [e for e in drain(runner) if isinstance(e, msg.InputCommitted)]
    assert committed[0].item_id != "item_1"
    assert committed[0].previous_item_id == "item_1"


# ------------------------------------------------------------------------- retrieve, delete


@pytest.mark.parametrize("make", RUNNERS.values(), ids=RUNNERS.keys())
def test_retrieve_and_delete_an_item_then_it_is_gone(
        make: Callable[[], ConversationCore]) -> None:
    """retrieve answers the item; delete answers item.deleted; then both are item_not_found
    naming item_id, and the next item follows the one before the deleted item."""
    runner = make()
    first = create(runner, USER_TEXT)
    second = create(runner, USER_TEXT)
    assert retrieved(runner, second)["id"] == second
    assert send(runner, msg.DeleteItem(item_id=second)) == [msg.ItemDeleted(item_id=second)]
    for command in (msg.RetrieveItem(item_id=second, event_id="evt_r"),
                    msg.DeleteItem(item_id=second, event_id="evt_r")):
        assert refusal(send(runner, command)) == ("item_not_found", "item_id", "evt_r")
    third = send(runner, msg.CreateItem(item=USER_TEXT))
    assert [e.previous_item_id for e in third] == [first] * 3  # type: ignore[union-attr]


def test_the_active_responses_item_cannot_be_deleted() -> None:
    """Deleting the item a response is still producing is refused; the response plays on."""
    runner = loopback()
    item_id = played_response(runner, 400)
    events = send(runner, msg.DeleteItem(item_id=item_id, event_id="evt_d"))
    assert refusal(events) == ("invalid_value", "item_id", "evt_d")
    runner.tick(T0 + 0.04)
    assert kinds(drain(runner)) == ["audio.delta"]


def test_deleting_the_unanswered_user_item_leaves_nothing_to_answer() -> None:
    """Loopback: a created user audio item is the turn response.create plays back; once it
    is deleted, response.create has no input."""
    runner = loopback()
    pcm = b"\x05\x06" * 2400  # 100 ms
    user = create(runner, {**USER_TEXT, "content": [
        {"type": "input_audio", "audio": base64.b64encode(pcm).decode()}]})
    send(runner, msg.DeleteItem(item_id=user))
    events = send(runner, msg.CreateResponse(event_id="evt_p"))
    assert refusal(events) == ("response_create_without_input", None, "evt_p")
    create(runner, {**USER_TEXT, "content": [
        {"type": "input_audio", "audio": base64.b64encode(pcm).decode()}]})
    events = send(runner, msg.CreateResponse())
    runner.tick(T0 + 1.0)
    events += drain(runner)
    assert b"".join(e.audio for e in events if isinstance(e, msg.AudioDelta)) == pcm


# ------------------------------------------------------------------------- truncate


def test_truncate_after_cancel_at_the_played_position() -> None:
    """Loopback: after response.cancel, truncating at what was released answers
    item.truncated and drops the transcript; the audio is then that long, not longer."""
    runner = loopback()
    item_id = played_response(runner, 400)
    runner.tick(T0 + 0.04)
    drain(runner)
    send(runner, msg.CancelResponse())
    generated = 2 * CHUNK_BYTES // 48  # two chunks were released
    events = send(runner, msg.TruncateItem(item_id=item_id, content_index=0,
                                           audio_end_ms=generated - 10))
    assert events == [msg.ItemTruncated(item_id=item_id, content_index=0,
                                        audio_end_ms=generated - 10)]
    item = retrieved(runner, item_id)
    assert item["status"] == "incomplete"
    assert item["content"] == [{"type": "output_audio", "transcript": ""}]
    beyond = send(runner, msg.TruncateItem(item_id=item_id, content_index=0,
                                           audio_end_ms=generated - 9, event_id="evt_t"))
    assert refusal(beyond) == ("invalid_value", "audio_end_ms", "evt_t")


def test_truncating_the_active_responses_item_cancels_it_first() -> None:
    """Loopback: a truncation of the playing response's item ends that response cancelled
    (client_cancelled), then truncates; no audio follows."""
    runner = loopback()
    item_id = played_response(runner, 400)
    events = send(runner, msg.TruncateItem(item_id=item_id, content_index=0, audio_end_ms=20))
    assert kinds(events) == [*CLOSING, "item.truncated"]
    [done] = [e for e in events if isinstance(e, msg.ResponseDone)]
    assert done.response["status"] == "cancelled"
    assert done.response["status_details"]["reason"] == "client_cancelled"
    assert runner.next_deadline() is None
    runner.tick(T0 + 1.0)
    assert drain(runner) == []


def test_truncate_after_a_barge_in_never_errors() -> None:
    """Frame backend, events mode: a barge-in cancels the response (turn_detected); the
    client's truncation at everything it got is taken and the transcript is gone."""
    runner = frame_runner(explicit=True)
    feed(runner, FrameOutput(audio=LOUD.audio, level=0.1, text="hello",
                                reports=(ResponseStarted(),)), T0)
    feed(runner, LOUD, T0 + FRAME_S)
    feed(runner, FrameOutput(audio=b"", level=0.0, reports=(BargedIn(),)),
                    T0 + 2 * FRAME_S)
    events = drain(runner)
    [done] = [e for e in events if isinstance(e, msg.ResponseDone)]
    assert done.response["status_details"]["reason"] == "turn_detected"
    item_id = done.response["output"][0]["id"]
    played = audio_ms(events)
    assert played == 160
    for position in (played, 100, 0):  # every interruption, the shorter the later
        truncated = send(runner, msg.TruncateItem(item_id=item_id, content_index=0,
                                                  audio_end_ms=position))
        assert kinds(truncated) == ["item.truncated"]
    assert retrieved(runner, item_id)["content"] == [{"type": "output_audio", "transcript": ""}]
    # History is now 0 ms long: it claims none of the 160 ms the user did not hear.
    assert refusal(send(runner, msg.TruncateItem(item_id=item_id, content_index=0,
                                                 audio_end_ms=1)))[:2] == (
        "invalid_value", "audio_end_ms")


def test_frame_backend_truncation_of_the_active_item_cancels_and_mutes() -> None:
    """Frame backend: truncating the streaming response's item cancels it (client_cancelled)
    and mutes the model: its next audible output is not sent."""
    runner = frame_runner()
    runner.receive(msg.CreateResponse(), T0)
    feed(runner, LOUD, T0)
    events = drain(runner)
    [added] = [e for e in events if isinstance(e, msg.OutputItemAdded)]
    truncated = send(runner, msg.TruncateItem(item_id=added.item["id"], content_index=0,
                                              audio_end_ms=40))
    assert kinds(truncated) == [*CLOSING, "item.truncated"]
    feed(runner, LOUD, T0 + FRAME_S)
    assert drain(runner) == []


@pytest.mark.parametrize("make", RUNNERS.values(), ids=RUNNERS.keys())
def test_only_assistant_audio_part_zero_can_be_truncated(
        make: Callable[[], ConversationCore]) -> None:
    """A user item is not truncatable (invalid_value item_id), nor another content part
    (invalid_value content_index), nor an unknown item (item_not_found)."""
    runner = make()
    user = create(runner, USER_TEXT)
    events = send(runner, msg.TruncateItem(item_id=user, content_index=0, audio_end_ms=0))
    assert refusal(events)[:2] == ("invalid_value", "item_id")
    assistant = create(runner, {"type": "message", "role": "assistant",
                                "content": [{"type": "output_audio", "transcript": "x"}]})
    events = send(runner, msg.TruncateItem(item_id=assistant, content_index=1, audio_end_ms=0))
    assert refusal(events)[:2] == ("invalid_value", "content_index")
    events = send(runner, msg.TruncateItem(item_id="nope", content_index=0, audio_end_ms=0))
    assert refusal(events)[:2] == ("item_not_found", "item_id")


# ------------------------------------------------------------------------- output_audio_buffer


def test_loopback_clear_drops_the_unreleased_audio() -> None:
    """Loopback: output_audio_buffer.clear answers cleared naming the response, which ends
    cancelled; the rest of its audio is never sent."""
    runner = loopback()
    played_response(runner, 400)
    events = send(runner, msg.ClearOutputAudio())
    assert kinds(events) == ["output_audio.cleared", *CLOSING]
    assert events[0] == msg.OutputAudioCleared(response_id="resp_1")
    runner.tick(T0 + 1.0)
    assert drain(runner) == []


@pytest.mark.parametrize("make", RUNNERS.values(), ids=RUNNERS.keys())
def test_clear_with_nothing_playing_still_answers_cleared(
        make: Callable[[], ConversationCore]) -> None:
    """With no response active, output_audio_buffer.clear answers cleared alone (an empty
    response_id before any response)."""
    runner = make()
    assert send(runner, msg.ClearOutputAudio()) == [msg.OutputAudioCleared(response_id="")]


def test_frame_backend_clear_mutes_the_model() -> None:
    """Frame backend: clear answers cleared, then the cancelled closing; the model's further
    audible output is not sent; with nothing active it names the last response."""
    runner = frame_runner()
    runner.receive(msg.CreateResponse(), T0)
    feed(runner, LOUD, T0)
    drain(runner)
    events = send(runner, msg.ClearOutputAudio())
    assert kinds(events) == ["output_audio.cleared", *CLOSING]
    feed(runner, LOUD, T0 + FRAME_S)
    assert drain(runner) == []
    assert send(runner, msg.ClearOutputAudio()) == [msg.OutputAudioCleared(response_id="resp_1")]


# ------------------------------------------------------------------------- bounds


def test_the_conversation_keeps_at_most_max_items_dropping_the_oldest() -> None:
    """One item more than the bound drops the oldest: it is item_not_found, the newest and
    the second oldest are still there."""
    runner = loopback()
    ids = [create(runner, USER_TEXT) for _ in range(MAX_ITEMS + 1)]
    assert refusal(send(runner, msg.RetrieveItem(item_id=ids[0])))[0] == "item_not_found"
    assert retrieved(runner, ids[1])["id"] == ids[1]
    assert retrieved(runner, ids[-1])["id"] == ids[-1]


# ------------------------------------------------------------------------- function items

CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather",
        "arguments": '{"city": "Paris"}'}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": '{"temp_c": 21}'}


@pytest.mark.parametrize("make", RUNNERS.values(), ids=RUNNERS.keys())
def test_a_function_call_round_trip_goes_into_the_history(
        make: Callable[[], ConversationCore]) -> None:
    """A function_call a client replays into the history and its function_call_output are
    added in order, strictly valid, and retrieved as sent."""
    runner = make()
    call_id = create(runner, CALL)
    output_id = create(runner, OUTPUT)
    call, output = retrieved(runner, call_id), retrieved(runner, output_id)
    assert {k: call[k] for k in ("type", "call_id", "name", "arguments")} == CALL
    assert {k: output[k] for k in ("type", "call_id", "output")} == OUTPUT
    assert [item.kind for item in runner.history] == ["function_call", "function_call_output"]


@pytest.mark.parametrize(("items", "code", "param"), [
    ([OUTPUT], "invalid_value", "item.call_id"),  # nothing to answer
    ([CALL, CALL], "invalid_value", "item.call_id"),  # the call exists
    ([CALL, OUTPUT, OUTPUT], "invalid_value", "item.call_id"),  # answered once only
    ([{"type": "function_call", "call_id": "c"}], "missing_required_parameter", "item.name"),
    ([{"type": "function_call_output", "call_id": 5, "output": ""}], "invalid_type",
     "item.call_id"),
])
def test_bad_function_items_are_refused(items: list[dict[str, Any]], code: str,
                                        param: str) -> None:
    """A function_call_output answers one function_call of the conversation, once; a call_id
    is unique; the fields are strings."""
    runner = loopback()
    *before, last = items
    for item in before:
        create(runner, item)
    assert refusal(send(runner, msg.CreateItem(item=last, event_id="f"))) == (code, param, "f")


def test_with_audio_bytes_is_replace_of_audio_bytes() -> None:
    """Item.with_audio_bytes names every field: a field added to Item without it fails here."""
    item = Item(id="item_9", role="assistant", status="incomplete",
                content=({"type": "output_audio", "transcript": "hi"},), audio_bytes=10,
                kind="function_call", fields=(("call_id", "c"),))
    # Every field differs from its default, so one the method forgot would show.
    assert all(getattr(item, f.name) != f.default for f in dataclasses.fields(Item))
    assert item.with_audio_bytes(96) == dataclasses.replace(item, audio_bytes=96)
