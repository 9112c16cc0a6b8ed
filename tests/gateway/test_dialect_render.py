"""The seed's ``?duplex=1`` dialect, outbound: what a duplex connection is sent, and that a GA
connection is sent exactly what it was (strictly valid, byte for byte the GA renderer's).

Everything goes through the real :class:`ConnectionCore`, as a client would receive it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from contract import messages as m
from gateway.protocol import render
from gateway.protocol.actions import SendFrame
from gateway.protocol.connection import ConnectionCore
from gateway.protocol.dialect import Dialect
from gateway.protocol.render_duplex import DuplexRenderer, output_audio_of
from tests.gateway.strict import validate_server_event
from tests.gateway.test_connection_core import EVENTS, RESPONSE

LIMIT = 1 << 16
SID = "sess_0123456789abcdefghijkl"
CAPS = {"implementation_level": "turn_based_duplex", "supports_barge_in": True}


def pcm_at(rate: int) -> dict[str, Any]:
    return {"audio": {"output": {"format": {"type": "audio/pcm", "rate": rate}}}}


def attached(dialect: Dialect, session: dict[str, Any] | None = None) -> tuple[
        ConnectionCore, dict[str, Any]]:
    """A core attached to a new session; returns it and the ``session.created`` it sent."""
    core = ConnectionCore(max_frame_bytes=LIMIT, dialect=dialect)
    core.receive_frame(json.dumps({"type": "session.update", "session": {}}))
    core.actions_to_run()
    core.open_succeeded(SID, resume_token="tok", generation=1, model="loopback",
                        session=session or {"type": "realtime", "model": "loopback"},
                        capabilities=CAPS)
    return core, sent(core)[0]


def sent(core: ConnectionCore) -> list[dict[str, Any]]:
    return [json.loads(a.text) for a in core.actions_to_run() if isinstance(a, SendFrame)]


def delivered(core: ConnectionCore, *events: m.Event, first_seq: int = 1) -> list[dict[str, Any]]:
    core.receive_log_entries(first_seq, [m.encode_message(e) for e in events])
    return sent(core)


# --------------------------------------------------------------------------- GA unchanged


def test_ga_connections_get_exactly_what_the_ga_renderer_writes() -> None:
    """Byte for byte: every event a GA core sends is render_event's, strictly valid."""
    core, created = attached(Dialect.GA)
    validate_server_event(created)
    assert "lease_generation" in created and created["capabilities"] == CAPS
    core.receive_log_entries(1, [m.encode_message(e) for e in EVENTS])
    texts = [a.text for a in core.actions_to_run() if isinstance(a, SendFrame)]
    for seq, (event, text) in enumerate(zip(EVENTS, texts, strict=True), start=1):
        expected = render.render_event(event, server_event_seq=seq, session_id=SID,
                                       event_id=f"event_{SID[-12:]}_{seq}")
        assert text == render.encode_frame(expected)
        validate_server_event(json.loads(text))


# --------------------------------------------------------------------------- notices


def test_session_created_carries_attachment_generation_and_capabilities_inside() -> None:
    _, created = attached(Dialect.DUPLEX)
    assert created["attachment_generation"] == 1 and "lease_generation" not in created
    assert "capabilities" not in created
    assert created["session"]["capabilities"] == CAPS
    assert created["session"]["id"] == SID and created["resume_token"] == "tok"


def test_session_resumed_and_replaced_name_the_attachment_generation() -> None:
    core = ConnectionCore(max_frame_bytes=LIMIT, dialect=Dialect.DUPLEX)
    core.receive_frame(json.dumps({"type": "session.resume", "session_id": SID,
                                   "resume_token": "tok"}))
    core.actions_to_run()
    core.resume_succeeded(SID, resume_token="tok2", generation=3, last_client_seq=0,
                          first_retained_seq=1, last_server_event_seq=0,
                          session={"type": "realtime", **pcm_at(16000)}, capabilities=CAPS)
    resumed = sent(core)[0]
    assert resumed["type"] == "session.resumed" and resumed["attachment_generation"] == 3
    assert "lease_generation" not in resumed and "capabilities" not in resumed
    assert resumed["session"]["capabilities"] == CAPS
    core.lease_moved(4)
    replaced = sent(core)[0]
    assert replaced == {"type": "session.replaced", "event_id": replaced["event_id"],
                        "session_id": SID, "attachment_generation": 3}


def test_resync_reasons_are_the_seeds_where_they_mean_the_same() -> None:
    """log_trimmed (events the client lacks are gone) is the seed's journal_gap; log_rewound
    has no seed counterpart and keeps its name."""
    for dialect, trimmed in ((Dialect.GA, "log_trimmed"), (Dialect.DUPLEX, "journal_gap")):
        core, _ = attached(dialect)
        core.log_trimmed(5)
        assert sent(core)[0]["reason"] == trimmed
        core.receive_log_entries(5, [m.encode_message(m.InputCleared())])
        sent(core)
        core.log_rewound(2)
        assert sent(core)[0]["reason"] == "log_rewound"


# --------------------------------------------------------------------------- events


def test_response_created_and_done_carry_a_top_level_response_id() -> None:
    created, done = m.ResponseCreated(response=RESPONSE), m.ResponseDone(response=RESPONSE)
    core, _ = attached(Dialect.DUPLEX)
    duplex = delivered(core, created, done)
    assert [e["response_id"] for e in duplex] == ["resp_1", "resp_1"]
    assert duplex[0]["response"] == RESPONSE
    core, _ = attached(Dialect.GA)
    assert all("response_id" not in e for e in delivered(core, created, done))


@pytest.mark.parametrize(("fmt", "expected"), [
    ({"type": "audio/pcm", "rate": 24000}, ("pcm16", 24000)),
    ({"type": "audio/pcm", "rate": 16000}, ("pcm16", 16000)),
    ({"type": "audio/pcm"}, ("pcm16", 24000)),
    ({"type": "audio/pcmu"}, ("g711_ulaw", 8000)),
    ({"type": "audio/pcma"}, ("g711_alaw", 8000)),
    ({"type": "audio/pcm_f32le", "rate": 48000}, ("pcm_f32le", 48000)),
])
def test_the_output_format_in_the_seeds_names(fmt: dict[str, Any],
                                              expected: tuple[str, int]) -> None:
    assert output_audio_of({"audio": {"output": {"format": fmt}}}) == expected


def test_a_session_object_without_a_known_format_keeps_the_previous_one() -> None:
    for session in ({}, {"audio": None}, {"audio": {"output": {"format": {"type": "x"}}}}):
        assert output_audio_of(session) is None


def test_audio_deltas_name_the_format_the_connection_last_saw() -> None:
    """From session.created, then from each session.updated."""
    delta = m.AudioDelta(response_id="resp_1", item_id="item_1", output_index=0,
                         content_index=0, audio=b"\x00\x00")
    core, _ = attached(Dialect.DUPLEX, session={"type": "realtime", **pcm_at(16000)})
    first = delivered(core, delta)[0]
    assert (first["format"], first["sample_rate_hz"]) == ("pcm16", 16000)
    g711 = {"audio": {"output": {"format": {"type": "audio/pcmu"}}}}
    updated, second = delivered(core, m.SessionUpdated(session=g711), delta, first_seq=2)
    assert updated["session"]["capabilities"] == CAPS
    assert (second["format"], second["sample_rate_hz"]) == ("g711_ulaw", 8000)
    core, _ = attached(Dialect.GA, session={"type": "realtime", **pcm_at(16000)})
    assert {"format", "sample_rate_hz"}.isdisjoint(delivered(core, delta)[0])


def test_a_default_session_plays_pcm16_at_24khz() -> None:
    renderer = DuplexRenderer([])
    assert (renderer.audio_format, renderer.sample_rate_hz) == ("pcm16", 24000)


def test_playback_acknowledged_nests_every_field_under_event() -> None:
    ack = m.PlaybackAcknowledged(response_id="resp_1", item_id="item_1", generated_ms=2400,
                                 sent_ms=2400, played_ms=960, committed_ms=640)
    core, _ = attached(Dialect.DUPLEX)
    rendered = delivered(core, ack)[0]
    fields = {f.name: getattr(ack, f.name) for f in dataclasses.fields(ack)}
    assert rendered == {"type": "playback.acknowledged", "event_id": rendered["event_id"],
                        "server_event_seq": 1, "event": fields}
    core, _ = attached(Dialect.GA)
    assert delivered(core, ack)[0]["played_ms"] == 960


@pytest.mark.parametrize(("ga", "seed"), [
    ("input_audio_buffer_commit_empty", "input_audio_buffer_empty"),
    ("conversation_already_has_active_response", "response_already_active"),
    ("response_cancel_not_active", "response_not_active"),
    ("item_not_found", "item_not_found"),
])
def test_worker_errors_carry_the_seed_codes(ga: str, seed: str) -> None:
    error = m.ErrorEvent(code=ga, message="no", client_event_id="c1")
    for dialect, code in ((Dialect.GA, ga), (Dialect.DUPLEX, seed)):
        core, _ = attached(dialect)
        rendered = delivered(core, error)[0]["error"]
        assert rendered["code"] == code and rendered["event_id"] == "c1"


def test_a_seed_reason_becomes_the_status_details_reason() -> None:
    """A response-end event that carries the seed's cancel reason shows it in
    ``status_details.reason`` (only on duplex connections: the GA renderer copies the
    response alone)."""
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class WithSeedReason(m.ResponseDone):
        seed_reason: str | None = None

    details = {"type": "cancelled", "reason": "turn_detected"}
    cancelled = {**RESPONSE, "status": "cancelled", "status_details": details}
    rendered = DuplexRenderer([])._patches[m.ResponseDone](
        {"response": cancelled}, WithSeedReason(response=cancelled, seed_reason="barge_in"))
    assert rendered["response"]["status_details"] == {"type": "cancelled", "reason": "barge_in"}
    assert rendered["response_id"] == "resp_1"
    assert details["reason"] == "turn_detected"  # not mutated


def test_duplex_decisions_become_frames_of_their_own() -> None:
    """The listen/speak decisions an event carries: on a duplex connection a frame of the
    seed's shape around that event's (speak and a response's listen before it, a commit's
    listen after it), with a gateway event id and no server_event_seq; a GA connection gets
    only the events, numbered 1, 2, 3 without holes."""
    events: list[m.Event] = [
        m.InputCommitted(item_id="item_1", listen="silence_or_noise", listen_epoch=1),
        m.AudioDelta(response_id="resp_1", item_id="item_2", output_index=0, content_index=0,
                     audio=b"\x00\x01", speak_epoch=3),
        m.ResponseDone(response={"id": "resp_1", "status": "completed"},
                       listen="model_turn_completed_without_output", listen_epoch=0),
    ]
    core, _ = attached(Dialect.GA)
    ga = delivered(core, *events)
    assert [e["type"] for e in ga] == ["input_audio_buffer.committed",
                                       "response.output_audio.delta", "response.done"]
    assert [e["server_event_seq"] for e in ga] == [1, 2, 3]
    core, _ = attached(Dialect.DUPLEX)
    core.receive_log_entries(1, [m.encode_message(e) for e in events])
    actions = [a for a in core.actions_to_run() if isinstance(a, SendFrame)]
    frames = [json.loads(a.text) for a in actions]
    assert [f["type"] for f in frames] == [
        "input_audio_buffer.committed", "response.listen", "response.speak",
        "response.output_audio.delta", "response.listen", "response.done"]
    assert [a.seq for a in actions] == [1, 0, 0, 2, 0, 3]
    assert [f.get("server_event_seq") for f in frames] == [1, None, None, 2, None, 3]
    extra = [frames[i] for i in (1, 2, 4)]
    assert all(f["event_id"].startswith("event_gw_") for f in extra)
    assert len({f["event_id"] for f in frames}) == len(frames)
    assert {k: v for k, v in frames[1].items() if k != "event_id"} == {
        "type": "response.listen", "epoch": 1, "session_id": SID,
        "response": {"object": "realtime.response", "status": "listening",
                     "metadata": {"reason": "silence_or_noise", "epoch": 1}}}
    assert {k: v for k, v in frames[2].items() if k != "event_id"} == {
        "type": "response.speak", "response_id": "resp_1", "item_id": "item_2",
        "output_index": 0, "content_index": 0, "metadata": {"epoch": 3, "model_speak": True}}
    assert {k: v for k, v in frames[4].items() if k != "event_id"} == {
        "type": "response.listen", "epoch": 0, "response_id": "resp_1", "session_id": SID,
        "response": {"object": "realtime.response", "status": "listening", "id": "resp_1",
                     "metadata": {"reason": "model_turn_completed_without_output",
                                  "epoch": 0}}}
    # Without a decision, the same events bring no extra frame.
    core, _ = attached(Dialect.DUPLEX)
    plain: list[m.Event] = [m.InputCommitted(item_id="item_1"),
             m.ResponseDone(response={"id": "resp_1", "status": "completed"})]
    assert [f["type"] for f in delivered(core, *plain)] == [
        "input_audio_buffer.committed", "response.done"]
