"""The seed's ``?duplex=1`` dialect, inbound: the URL, the handshake and the client aliases.

Every difference is checked on both dialects: a duplex connection gets the seed's behaviour, a
GA connection keeps GA's. Rendering is tests/gateway/test_dialect_render.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from contract import messages as m
from gateway.protocol.actions import AppendCommands, OpenSession, ResumeSession, SendFrame
from gateway.protocol.connection import ConnectionCore
from gateway.protocol.dialect import (
    DUPLEX_PATH,
    SEED_ERROR_CODES,
    Dialect,
    Handshake,
    parse_handshake,
    seed_error_code,
)
from gateway.protocol.errors import ClientProtocolError, ErrorCode
from gateway.protocol.parse import (
    CLIENT_EVENT_TYPES,
    DUPLEX_CLIENT_EVENT_ALIASES,
    DUPLEX_CLIENT_EVENT_TYPES,
    parse_client_frame,
)

LIMIT = 1 << 16
REALTIME = "/v1/realtime"


def frame(type_: str, **fields: Any) -> str:
    return json.dumps({"type": type_, **fields})


def parse(text: str, dialect: Dialect) -> m.Command:
    parsed = parse_client_frame(text, max_frame_bytes=LIMIT, dialect=dialect)
    assert parsed.command is not None
    return parsed.command


# --------------------------------------------------------------------------- the URL


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "on", "yes"])
def test_duplex_true_picks_the_duplex_dialect(value: str) -> None:
    assert parse_handshake(REALTIME, {"duplex": value}).dialect is Dialect.DUPLEX


@pytest.mark.parametrize("query", [{}, {"duplex": "0"}, {"duplex": "false"}, {"duplex": "off"}])
def test_without_duplex_true_a_connection_speaks_ga(query: dict[str, str]) -> None:
    assert parse_handshake(REALTIME, query).dialect is Dialect.GA


def test_the_duplex_path_always_speaks_the_duplex_dialect() -> None:
    """``/v1/duplex`` is the seed's alias of ``/v1/realtime?duplex=1``."""
    assert parse_handshake(DUPLEX_PATH, {}).dialect is Dialect.DUPLEX
    assert parse_handshake(DUPLEX_PATH, {"duplex": "0"}).dialect is Dialect.DUPLEX


@pytest.mark.parametrize("name", ["duplex", "autostart"])
def test_a_flag_that_is_neither_true_nor_false_is_refused(name: str) -> None:
    with pytest.raises(ClientProtocolError) as refused:
        parse_handshake(REALTIME, {name: "maybe"})
    assert refused.value.code == ErrorCode.INVALID_VALUE and refused.value.param == name


def test_autostart_0_and_resume_1_open_nothing_before_the_first_event() -> None:
    """The seed reads both as "the first client event decides"; the model is kept for it."""
    seed = parse_handshake(REALTIME, {"duplex": "1", "model": "M", "autostart": "0"})
    assert seed == Handshake(dialect=Dialect.DUPLEX, model="M", autostart=False)
    for query in ({"resume": "1"}, {"resume": "on"}, {"autostart": "no"}):
        assert not parse_handshake(REALTIME, {"model": "M", **query}).autostart
    for query in ({}, {"autostart": "1"}, {"resume": "0"}, {"resume": "later"}):
        assert parse_handshake(REALTIME, {"model": "M", **query}).autostart
    assert parse_handshake(REALTIME, {"model": ""}).model is None


# --------------------------------------------------------------------------- the handshake


def no_autostart(dialect: Dialect = Dialect.DUPLEX, model: str = "M") -> ConnectionCore:
    return ConnectionCore(max_frame_bytes=LIMIT, url_model=model, autostart=False,
                          dialect=dialect)


def test_autostart_0_waits_for_the_first_event_and_opens_the_urls_model() -> None:
    """No quiet-period open; a first ``session.update`` without a model opens the URL's model
    and is the session's first command."""
    core = no_autostart()
    assert not core.awaits_quiet_period
    core.quiet_period_over()  # the driver never calls it then; it would change nothing
    assert core.actions_to_run() == []
    update = frame("session.update", session={"instructions": "Be brief."})
    core.receive_frame(update)
    assert core.actions_to_run() == [OpenSession(model="M")]
    core.open_succeeded("sess_1", resume_token="t", generation=1, model="M")
    appended = [a for a in core.actions_to_run() if isinstance(a, AppendCommands)]
    assert appended == [AppendCommands(entries=(
        (None, m.UpdateSession(session={"instructions": "Be brief."})),))]


def test_autostart_0_opens_the_model_the_first_update_names() -> None:
    core = no_autostart()
    core.receive_frame(frame("session.update", session={"model": "other"}))
    assert core.actions_to_run() == [OpenSession(model="other")]


def test_autostart_0_another_first_command_opens_the_default_session_then_runs() -> None:
    core = no_autostart()
    core.receive_frame(frame("input.commit"))
    assert core.actions_to_run() == [OpenSession(model="M")]
    core.open_succeeded("sess_1", resume_token="t", generation=1, model="M")
    appended = [a for a in core.actions_to_run() if isinstance(a, AppendCommands)]
    assert appended == [AppendCommands(entries=((None, m.CommitInput(create_response=True)),))]


def test_autostart_0_lets_the_first_event_resume() -> None:
    core = no_autostart()
    core.receive_frame(frame("session.resume", session_id="sess_1", resume_token="t"))
    assert [type(a) for a in core.actions_to_run()] == [ResumeSession]


def test_a_model_url_with_autostart_still_opens_after_the_quiet_period() -> None:
    core = ConnectionCore(max_frame_bytes=LIMIT, url_model="M", dialect=Dialect.DUPLEX)
    assert core.awaits_quiet_period
    core.quiet_period_over()
    assert core.actions_to_run() == [OpenSession(model="M")]


# --------------------------------------------------------------------------- the aliases


def test_the_duplex_aliases_are_new_names_for_existing_events() -> None:
    assert DUPLEX_CLIENT_EVENT_TYPES == frozenset(DUPLEX_CLIENT_EVENT_ALIASES)
    assert not DUPLEX_CLIENT_EVENT_TYPES & CLIENT_EVENT_TYPES
    assert set(DUPLEX_CLIENT_EVENT_ALIASES.values()) <= CLIENT_EVENT_TYPES


@pytest.mark.parametrize("alias", sorted(DUPLEX_CLIENT_EVENT_TYPES))
def test_ga_connections_refuse_the_duplex_aliases(alias: str) -> None:
    with pytest.raises(ClientProtocolError) as refused:
        parse_client_frame(frame(alias), max_frame_bytes=LIMIT)
    assert refused.value.code == ErrorCode.UNKNOWN_EVENT


def test_input_commit_asks_for_a_response_unless_it_says_otherwise() -> None:
    duplex = Dialect.DUPLEX
    assert parse(frame("input.commit"), duplex) == m.CommitInput(create_response=True)
    said_no = parse(frame("input.commit", response_create=False, final=False), duplex)
    assert said_no == m.CommitInput(final=False, create_response=False)
    assert parse(frame("input.commit", create_response=False), duplex) == m.CommitInput(
        create_response=False)
    # The GA name keeps "not said" on both dialects.
    assert parse(frame("input_audio_buffer.commit"), duplex) == m.CommitInput()


@pytest.mark.parametrize("alias", ["close", "close_session"])
def test_close_aliases_close_the_session(alias: str) -> None:
    duplex = Dialect.DUPLEX
    assert parse(frame(alias), duplex) == m.CloseSession()
    assert parse(frame(alias, reason="bye", event_id="e"), duplex) == m.CloseSession(
        reason="bye", event_id="e")
    with pytest.raises(ClientProtocolError) as refused:
        parse_client_frame(frame(alias, reason=7), max_frame_bytes=LIMIT, dialect=duplex)
    assert refused.value.param == "reason"


def test_every_ga_event_parses_alike_on_both_dialects() -> None:
    text = frame("input_audio_buffer.commit", final=False, is_speech=True)
    assert parse(text, Dialect.GA) == parse(text, Dialect.DUPLEX)


# --------------------------------------------------------------------------- error codes


def error_sent(core: ConnectionCore) -> dict[str, Any]:
    frames = [json.loads(a.text) for a in core.actions_to_run() if isinstance(a, SendFrame)]
    assert len(frames) == 1 and frames[0]["type"] == "error"
    error: dict[str, Any] = frames[0]["error"]
    return error


@pytest.mark.parametrize(("text", "ga", "seed"), [
    ("[]", "invalid_event", "bad_event"),
    (frame("conversation.item.delete"), "missing_required_parameter", "missing_item_id"),
    (frame("response.create", response=3), "invalid_type", "bad_event"),
    (frame("input_audio_buffer.append", audio="***"), "invalid_value", "bad_audio"),
    (frame("input_audio_buffer.append", audio="", video_frames=["***"]), "invalid_value",
     "invalid_video_frames"),
    (frame("nope"), "unknown_event", "unknown_event"),
])
def test_gateway_errors_carry_the_seed_codes_on_duplex_connections(
        text: str, ga: str, seed: str) -> None:
    for dialect, code in ((Dialect.GA, ga), (Dialect.DUPLEX, seed)):
        core = ConnectionCore(max_frame_bytes=LIMIT, dialect=dialect)
        core.receive_frame(text)
        assert error_sent(core)["code"] == code


def test_the_code_table_prefers_the_param_then_the_code() -> None:
    assert seed_error_code("missing_required_parameter", "item_id") == "missing_item_id"
    assert seed_error_code("missing_required_parameter", "text") == "bad_event"
    assert seed_error_code("invalid_value", "video_frames[3]") == "invalid_video_frames"
    assert seed_error_code("invalid_value", "played_ms") == "invalid_value"
    assert seed_error_code("item_not_found", None) == "item_not_found"
    assert all(code != seed for (code, _), seed in SEED_ERROR_CODES.items())
