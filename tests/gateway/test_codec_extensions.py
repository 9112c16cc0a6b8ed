"""The seed's duplex extensions at the wire: ``input.cancel``, ``input.text.append``,
``barge_in``, ``turn.signal`` and ``playback.ack`` in (with the seed's aliases and the
``turn.signal`` routing), and the server events added with them out.

Frames go through the real codec and, where the session's survival is the point, the real
connection core; every rendered event is validated as the strictest real client validates it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from contract import messages as m
from gateway.protocol.actions import AppendCommands, SendFrame
from gateway.protocol.bounds import (
    MAX_APPEND_TEXT_CHARS,
    MAX_PLAYBACK_MS,
    MAX_SIGNAL_EVENT_CHARS,
    MAX_STRING_CHARS,
)
from gateway.protocol.connection import ConnectionCore
from gateway.protocol.envelope import ParsedFrame
from gateway.protocol.errors import PARSE_ERROR_CODES, ClientProtocolError
from gateway.protocol.parse import CLIENT_EVENT_ALIASES, ROUTED_SIGNAL_EVENTS, parse_client_frame
from gateway.protocol.render import render_event
from tests.gateway.strict import validate_server_event

LIMIT = 1 << 20
SID = "sess_w0123456789ab.0123456789abcdef0123456789abcdef"
MISSING, TYPE, VALUE = "missing_required_parameter", "invalid_type", "invalid_value"


def f(type_: str, **fields: Any) -> str:
    """A client frame of the given type and fields."""
    return json.dumps({"type": type_, **fields})


def parse(data: str) -> ParsedFrame:
    """Parse as the gateway does, with a generous frame limit."""
    return parse_client_frame(data, max_frame_bytes=LIMIT)


def refusal(data: str) -> ClientProtocolError:
    """The error ``data`` is refused with; the refusal keeps the session (no close code)."""
    with pytest.raises(ClientProtocolError) as info:
        parse(data)
    assert info.value.code in PARSE_ERROR_CODES
    assert info.value.close_code is None
    return info.value


# --------------------------------------------------------------------------- aliases


@pytest.mark.parametrize(("alias", "canonical"), sorted(CLIENT_EVENT_ALIASES.items()))
def test_each_alias_is_parsed_as_its_event(alias: str, canonical: str) -> None:
    """The seed's other spellings parse to exactly what the canonical event parses to, and
    are refused exactly as it is."""
    fields: dict[str, Any] = {"event_id": "c1", "client_seq": 4, "text": "hi",
                              "event": "user.typing", "payload": {"n": 1}, "played_ms": 40}
    assert parse(f(alias, **fields)) == parse(f(canonical, **fields))
    bad = {"text": 1, "event": 1, "played_ms": -1}
    error, expected = refusal(f(alias, **bad)), refusal(f(canonical, **bad))
    assert (error.code, error.param) == (expected.code, expected.param)


def test_the_aliases_are_the_seeds() -> None:
    """The alias table is the seed's (seed_behaviour.md §2), each naming an event we parse."""
    assert CLIENT_EVENT_ALIASES == {
        "input_text.append": "input.text.append",
        "push_text": "input.text.append",
        "signal_turn": "turn.signal",
        "audio.playback_ack": "playback.ack",
    }


# --------------------------------------------------------------------------- turn.signal routing

# A valid payload for each routed event: the fields its own client event takes.
ROUTED_PAYLOADS: dict[str, dict[str, Any]] = {
    "input.cancel": {},
    "barge_in": {},
    "response.cancel": {"response_id": "resp_1"},
    "session.update": {"session": {"type": "realtime", "instructions": "Be brief."}},
    "conversation.item.create": {
        "item": {"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": "hi"}]},
        "previous_item_id": "item_1",
    },
    "conversation.item.delete": {"item_id": "item_1"},
    "conversation.item.truncate": {"item_id": "item_2", "content_index": 0,
                                   "audio_end_ms": 640},
    "conversation.item.retrieve": {"item_id": "item_2"},
}


def test_the_routed_signals_are_the_seeds() -> None:
    """turn.signal routes the seed's events (seed_behaviour.md §2) and retrieve, no more."""
    assert set(ROUTED_PAYLOADS) == ROUTED_SIGNAL_EVENTS


@pytest.mark.parametrize("signal", ["turn.signal", "signal_turn"])
@pytest.mark.parametrize("key", ["payload", "signal_payload"])
@pytest.mark.parametrize("event", sorted(ROUTED_PAYLOADS))
def test_a_routed_signal_is_its_event(event: str, key: str, signal: str) -> None:
    """turn.signal with a routed event is decoded as that event with the payload as its
    fields, under either payload key, with the signal's event_id and client_seq."""
    payload = ROUTED_PAYLOADS[event]
    routed = parse(f(signal, event=event, event_id="c2", client_seq=3, **{key: payload}))
    assert routed == parse(f(event, event_id="c2", client_seq=3, **payload))
    assert not isinstance(routed.command, m.SignalTurn)


# A bad payload for each routed event that takes fields, with the refusal of its direct form.
ROUTED_BAD: list[tuple[str, dict[str, Any], str, str]] = [
    ("response.cancel", {"response_id": 5}, TYPE, "response_id"),
    ("session.update", {}, MISSING, "session"),
    ("session.update", {"session": []}, TYPE, "session"),
    ("conversation.item.create", {"item": "x"}, TYPE, "item"),
    ("conversation.item.create", {"item": {}, "previous_item_id": 1}, TYPE, "previous_item_id"),
    ("conversation.item.delete", {}, MISSING, "item_id"),
    ("conversation.item.truncate", {"item_id": "i", "content_index": 0, "audio_end_ms": -1},
     VALUE, "audio_end_ms"),
    ("conversation.item.truncate", {"item_id": "i", "audio_end_ms": 1}, MISSING,
     "content_index"),
    ("conversation.item.retrieve", {"item_id": None}, TYPE, "item_id"),
]


@pytest.mark.parametrize("key", ["payload", "signal_payload"])
@pytest.mark.parametrize(("event", "payload", "code", "param"), ROUTED_BAD,
                         ids=[f"{c[0]}-{c[3]}" for c in ROUTED_BAD])
def test_a_routed_signal_is_refused_as_its_event_naming_the_payload_field(
    event: str, payload: dict[str, Any], code: str, param: str, key: str
) -> None:
    """A routed signal's payload is validated by its event's own parser: the same code and
    message as the direct event, the param inside the payload key the client used, the
    signal's event_id echoed, and the session kept."""
    direct = refusal(f(event, event_id="c4", **payload))
    assert (direct.code, direct.param) == (code, param)
    error = refusal(f("turn.signal", event=event, event_id="c4", **{key: payload}))
    assert (error.code, error.message) == (direct.code, direct.message)
    assert (error.param, error.client_event_id) == (f"{key}.{param}", "c4")


def test_a_routed_signal_without_a_payload_is_its_event_without_fields() -> None:
    """No payload is an empty one: a cancel needs none; a delete misses its item_id, named
    under payload."""
    assert parse(f("turn.signal", event="barge_in")).command == m.BargeIn()
    assert parse(f("turn.signal", event="response.cancel")).command == m.CancelResponse()
    assert refusal(f("turn.signal", event="conversation.item.delete")).param == "payload.item_id"


def test_payload_wins_over_signal_payload() -> None:
    """With both keys the Python API's payload is used; a bad signal_payload is still refused
    (every field read is checked)."""
    both = f("turn.signal", event="conversation.item.delete", payload={"item_id": "a"},
             signal_payload={"item_id": "b"})
    assert parse(both).command == m.DeleteItem(item_id="a")
    bad_seed_key = refusal(f("turn.signal", event="x", payload={}, signal_payload=[]))
    assert (bad_seed_key.code, bad_seed_key.param) == (TYPE, "signal_payload")


@pytest.mark.parametrize("event", ["user.typing", "session.close", "input_audio_buffer.commit",
                                   "turn.signal", "response.create", "x" * MAX_SIGNAL_EVENT_CHARS])
def test_any_other_signal_stays_a_signal_turn(event: str) -> None:
    """Only the routed events become commands; any other event, a client event's name
    included, is a SignalTurn carrying the payload as sent."""
    parsed = parse(f("signal_turn", event=event, signal_payload={"k": [1]}, event_id="c5"))
    assert parsed.command == m.SignalTurn(event=event, payload={"k": [1]}, event_id="c5")
    assert parse(f("turn.signal", event=event)).command == m.SignalTurn(event=event)


def test_a_routed_item_keeps_its_audio_exemption() -> None:
    """An item created through turn.signal is bounded as a direct one: its input_audio part's
    audio by the frame size alone, its text by the string limit."""
    audio = "A" * (MAX_STRING_CHARS + 4)
    item = {"type": "message", "role": "user",
            "content": [{"type": "input_audio", "audio": audio}]}
    for key in ("payload", "signal_payload"):
        routed = parse(f("turn.signal", event="conversation.item.create", **{key: {"item": item}}))
        assert routed.command == m.CreateItem(item=item)
    long_text = {"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": "x" * (MAX_STRING_CHARS + 1)}]}
    error = refusal(f("turn.signal", event="conversation.item.create",
                      payload={"item": long_text}))
    assert (error.code, error.param) == (VALUE, "payload.item.content[0].text")
    elsewhere = refusal(f("turn.signal", event="x", payload={"audio": audio}))
    assert (elsewhere.code, elsewhere.param) == (VALUE, "payload.audio")


# --------------------------------------------------------------------------- fields and bounds

ACCEPTED: list[tuple[str, str, m.Command]] = [
    ("cancel-input", f("input.cancel", event_id="c1"), m.CancelInput(event_id="c1")),
    ("barge-in", f("barge_in", event_id="c2"), m.BargeIn(event_id="c2")),
    ("text", f("input.text.append", text="héllo"), m.AppendText(text="héllo")),
    ("text-empty", f("input.text.append", text=""), m.AppendText(text="")),
    ("text-at-cap", f("input.text.append", text="é" * MAX_APPEND_TEXT_CHARS),
     m.AppendText(text="é" * MAX_APPEND_TEXT_CHARS)),
    ("signal-null-payload", f("turn.signal", event="e", payload=None), m.SignalTurn(event="e")),
    ("ack-zero", f("playback.ack", played_ms=0), m.AckPlayback(played_ms=0)),
    ("ack-at-cap", f("playback.ack", played_ms=MAX_PLAYBACK_MS, committed_ms=MAX_PLAYBACK_MS),
     m.AckPlayback(played_ms=MAX_PLAYBACK_MS, committed_ms=MAX_PLAYBACK_MS)),
    ("ack-nulls", f("playback.ack", played_ms=5, committed_ms=None, response_id=None,
                    item_id=None), m.AckPlayback(played_ms=5)),
    ("ack-full", f("playback.ack", played_ms=960, committed_ms=0, response_id="resp_1",
                   item_id="item_2", event_id="c3"),
     m.AckPlayback(played_ms=960, committed_ms=0, response_id="resp_1", item_id="item_2",
                   event_id="c3")),
]


@pytest.mark.parametrize(("data", "expected"), [c[1:] for c in ACCEPTED],
                         ids=[c[0] for c in ACCEPTED])
def test_valid_extension_frames(data: str, expected: m.Command) -> None:
    """Each valid extension frame parses to its typed command."""
    assert parse(data).command == expected


# (id, frame, code, param)
REJECTED: list[tuple[str, str, str, str]] = [
    ("text-missing", f("input.text.append"), MISSING, "text"),
    ("text-null", f("input.text.append", text=None), TYPE, "text"),
    ("text-int", f("push_text", text=3), TYPE, "text"),
    ("text-too-long", f("input_text.append", text="x" * (MAX_APPEND_TEXT_CHARS + 1)), VALUE,
     "text"),
    ("event-missing", f("turn.signal"), MISSING, "event"),
    ("event-int", f("turn.signal", event=1), TYPE, "event"),
    ("event-empty", f("turn.signal", event=""), VALUE, "event"),
    ("event-too-long", f("signal_turn", event="x" * (MAX_SIGNAL_EVENT_CHARS + 1)), VALUE,
     "event"),
    ("payload-array", f("turn.signal", event="e", payload=[]), TYPE, "payload"),
    ("payload-string", f("turn.signal", event="e", signal_payload="x"), TYPE, "signal_payload"),
    ("played-missing", f("playback.ack"), MISSING, "played_ms"),
    ("played-null", f("playback.ack", played_ms=None), TYPE, "played_ms"),
    ("played-bool", f("playback.ack", played_ms=True), TYPE, "played_ms"),
    ("played-float", f("playback.ack", played_ms=1.5), TYPE, "played_ms"),
    ("played-string", f("audio.playback_ack", played_ms="40"), TYPE, "played_ms"),
    ("played-negative", f("playback.ack", played_ms=-1), VALUE, "played_ms"),
    ("played-over-a-day", f("playback.ack", played_ms=MAX_PLAYBACK_MS + 1), VALUE, "played_ms"),
    ("committed-negative", f("playback.ack", played_ms=1, committed_ms=-1), VALUE,
     "committed_ms"),
    ("committed-over-a-day", f("playback.ack", played_ms=1, committed_ms=MAX_PLAYBACK_MS + 1),
     VALUE, "committed_ms"),
    ("committed-bool", f("playback.ack", played_ms=1, committed_ms=False), TYPE, "committed_ms"),
    ("response-id-int", f("playback.ack", played_ms=1, response_id=1), TYPE, "response_id"),
    ("item-id-list", f("playback.ack", played_ms=1, item_id=[]), TYPE, "item_id"),
]


@pytest.mark.parametrize(("data", "code", "param"), [c[1:] for c in REJECTED],
                         ids=[c[0] for c in REJECTED])
def test_bad_extension_frames(data: str, code: str, param: str) -> None:
    """Each bad field is refused with its documented code, naming the field, echoing the
    event_id, keeping the session."""
    tagged = json.dumps({**json.loads(data), "event_id": "c9"})
    error = refusal(tagged)
    assert (error.code, error.param, error.client_event_id) == (code, param, "c9")
    assert error.error_type == "invalid_request_error"


def attached_core() -> ConnectionCore:
    """The real connection core, attached to an opened session, its actions drained."""
    core = ConnectionCore(max_frame_bytes=LIMIT, url_model="loopback")
    core.quiet_period_over()
    core.open_succeeded(SID, resume_token="token", generation=1, model="loopback")
    core.actions_to_run()
    return core


@pytest.mark.parametrize(("data", "code", "param"), [c[1:] for c in REJECTED],
                         ids=[c[0] for c in REJECTED])
def test_the_session_survives_a_bad_extension_frame(data: str, code: str, param: str) -> None:
    """The connection core answers a bad extension frame with its error alone, appends
    nothing for it and closes nothing; the next command goes upstream as usual."""
    core = attached_core()
    core.receive_frame(data)
    (answer,) = core.actions_to_run()
    assert isinstance(answer, SendFrame)
    error = json.loads(answer.text)
    validate_server_event(error)
    assert (error["error"]["code"], error["error"]["param"]) == (code, param)
    core.receive_frame(f("barge_in", client_seq=1))
    assert core.actions_to_run() == [AppendCommands(entries=((1, m.BargeIn()),))]


# --------------------------------------------------------------------------- server events

NEW_EVENTS: list[m.Event] = [
    m.TextDelta(response_id="resp_1", item_id="item_2", output_index=0, content_index=0,
                delta="Hi"),
    m.TextDone(response_id="resp_1", item_id="item_2", output_index=0, content_index=0,
               text="Hi"),
    m.FunctionCallArgumentsDelta(response_id="resp_1", item_id="item_3", output_index=1,
                                 call_id="call_1", delta="{"),
    m.FunctionCallArgumentsDone(response_id="resp_1", item_id="item_3", output_index=1,
                                call_id="call_1", name="lookup", arguments="{}"),
    m.InputTranscriptionDelta(item_id="item_1", content_index=0, delta="He"),
    m.InputTranscriptionCompleted(item_id="item_1", content_index=0, transcript="Hello"),
    m.InputTranscriptionFailed(item_id="item_1", content_index=0, code="model_error",
                               message="no speech model", error_type="invalid_request_error",
                               param="session.audio.input.transcription"),
    m.InputTimeoutTriggered(audio_start_ms=0, audio_end_ms=5000, item_id="item_4"),
    m.RateLimitsUpdated(rate_limits=[]),
    m.PlaybackAcknowledged(response_id="resp_1", item_id="item_2", generated_ms=3000,
                           sent_ms=3000, played_ms=1200, committed_ms=1000),
    m.TurnEvent(event="user.typing", turn_state="listening"),
]


@pytest.mark.parametrize("event", NEW_EVENTS, ids=lambda e: type(e).__name__)
def test_new_events_are_delivered_strictly_valid(event: m.Event) -> None:
    """Each new event, written to the output log and delivered by the real connection core,
    reaches the client as JSON that validates strictly: against the SDK's GA type, or the
    extension schema of tests/gateway/strict.py."""
    core = attached_core()
    core.receive_log_entries(1, [m.encode_message(event)])
    (delivered,) = [json.loads(a.text) for a in core.actions_to_run() if isinstance(a, SendFrame)]
    validate_server_event(delivered)
    assert delivered == render_event(event, server_event_seq=1, event_id=delivered["event_id"],
                                     session_id=SID)


def test_turn_event_names_its_session_as_the_seed_does() -> None:
    """turn.event carries session_id (seed_behaviour.md §3.1); playback.acknowledged does
    not."""
    turn = render_event(m.TurnEvent(event="e", turn_state="s"), server_event_seq=1,
                        event_id="e1", session_id=SID)
    ack = render_event(NEW_EVENTS[-2], server_event_seq=2, event_id="e2", session_id=SID)
    assert turn["session_id"] == SID
    assert "session_id" not in ack


def test_transcription_failed_renders_the_error_object() -> None:
    """input_audio_transcription.failed carries its error as GA's {type, code, message,
    param}, with the event's own type by default (server_error)."""
    failed = m.InputTranscriptionFailed(item_id="item_1", content_index=0, code="model_error",
                                        message="boom")
    rendered = render_event(failed, server_event_seq=1, event_id="e")
    assert rendered["error"] == {"type": "server_error", "code": "model_error",
                                 "message": "boom", "param": None}


PLAYBACK = render_event(NEW_EVENTS[-2], server_event_seq=3, event_id="e3")


@pytest.mark.parametrize("spoiled", [
    {**PLAYBACK, "playback": {**PLAYBACK["playback"], "extra": 1}},
    {**PLAYBACK, "playback": {k: v for k, v in PLAYBACK["playback"].items() if k != "sent_ms"}},
    {**PLAYBACK, "playback": {**PLAYBACK["playback"], "played_ms": "1200"}},
    {**PLAYBACK, "committed_ms": None},
    {k: v for k, v in PLAYBACK.items() if k != "item_id"},
], ids=["extra-ledger-key", "missing-ledger-key", "ledger-string", "null-committed",
        "no-item-id"])
def test_the_playback_validator_is_strict(spoiled: dict[str, Any]) -> None:
    """The extension schema of playback.acknowledged refuses a malformed ledger, so the
    tests above could fail."""
    validate_server_event(PLAYBACK)
    with pytest.raises(AssertionError):
        validate_server_event(spoiled)
