"""The client-secret request and answer, and a session that starts from a secret's config."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, strategies as st
from openai.types.realtime.client_secret_create_response import ClientSecretCreateResponse

from contract.messages import AppendAudio, UpdateSession
from gateway.protocol.actions import AppendCommands, OpenSession, ResumeSession
from gateway.protocol.client_secrets import (
    CLIENT_SECRET_PREFIX,
    DEFAULT_TTL_S,
    new_client_secret,
    parse_client_secret_request,
    render_client_secret,
)
from gateway.protocol.connection import ConnectionCore
from gateway.protocol.errors import ClientProtocolError

CONFIG = {"type": "realtime", "instructions": "be brief",
          "audio": {"output": {"voice": "alloy"}}}


def body(value: Any) -> bytes:
    return json.dumps(value).encode()


def test_empty_body_means_every_default() -> None:
    """No body: 600 s and a default realtime session."""
    for empty in (b"", b"  \n"):
        wanted = parse_client_secret_request(empty)
        assert (wanted.ttl_s, wanted.session) == (DEFAULT_TTL_S, {"type": "realtime"})
    assert parse_client_secret_request(body({})).session == {"type": "realtime"}


def test_a_full_request() -> None:
    """expires_after and session are read as the SDK sends them."""
    wanted = parse_client_secret_request(body({
        "expires_after": {"anchor": "created_at", "seconds": 10}, "session": CONFIG}))
    assert (wanted.ttl_s, wanted.session) == (10, CONFIG)
    untyped = parse_client_secret_request(body({"session": {"instructions": "x"}}))
    assert untyped.session == {"instructions": "x", "type": "realtime"}


@pytest.mark.parametrize(("payload", "code", "param"), [
    (b"{", "invalid_json", None),
    (b"\xff", "invalid_json", None),
    (body([]), "invalid_type", None),
    (body({"session": {}, "model": "x"}), "unknown_parameter", "model"),
    (body({"expires_after": 60}), "invalid_type", "expires_after"),
    (body({"expires_after": {"seconds": 9}}), "invalid_value", "expires_after.seconds"),
    (body({"expires_after": {"seconds": 7201}}), "invalid_value", "expires_after.seconds"),
    (body({"expires_after": {"seconds": True}}), "invalid_type", "expires_after.seconds"),
    (body({"expires_after": {"seconds": 60.5}}), "invalid_type", "expires_after.seconds"),
    (body({"expires_after": {"anchor": "now"}}), "invalid_value", "expires_after.anchor"),
    (body({"expires_after": {"ttl": 5}}), "unknown_parameter", "expires_after.ttl"),
    (body({"session": "realtime"}), "invalid_type", "session"),
    (body({"session": {"type": "transcription"}}), "invalid_value", "session.type"),
])
def test_bad_requests_name_the_field(payload: bytes, code: str, param: str | None) -> None:
    """Each mistake is a ClientProtocolError with its code and the field at fault."""
    with pytest.raises(ClientProtocolError) as refused:
        parse_client_secret_request(payload)
    assert (refused.value.code, refused.value.param) == (code, param)


@pytest.mark.parametrize(("payload", "code", "param"), [
    # Far deeper than the decoder can go (it raised a RecursionError: an HTTP 500).
    (b'{"session":' + b"[" * 100_000, "invalid_json", None),
    # Within what json.loads reads, beyond what a session.update frame may hold.
    (b'{"session":{"tools":' + b"[" * 600 + b"]" * 600 + b"}}", "invalid_json",
     "session.tools" + "[0]" * 30),
    (b'{"session":{"instructions":"\\ud800"}}', "invalid_value", "session.instructions"),
    (b'{"session":{"temperature":1e400}}', "invalid_value", "session.temperature"),
    (b'{"session":{"max_output_tokens":9007199254740993}}', "invalid_value",
     "session.max_output_tokens"),
])
def test_a_secrets_session_has_the_bounds_of_a_session_update(
        payload: bytes, code: str, param: str | None) -> None:
    """The session a secret carries becomes its sessions' first session.update, so it is held
    to that frame's bounds (depth, strings, numbers), and a body of any depth is an answer,
    not a crash. The answer speaks of the body's JSON, not of a websocket frame."""
    with pytest.raises(ClientProtocolError) as refused:
        parse_client_secret_request(payload)
    assert (refused.value.code, refused.value.param) == (code, param)
    assert "frame" not in refused.value.message


@given(st.binary(max_size=200) | st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["session", "expires_after", "seconds", "anchor", "type", "x"]),
        inner, max_size=3),
    max_leaves=10).map(lambda value: json.dumps(value).encode()))
def test_any_body_is_parsed_or_refused_cleanly(payload: bytes) -> None:
    """Whatever arrives, the parser answers a request or a ClientProtocolError, nothing else."""
    try:
        wanted = parse_client_secret_request(payload)
    except ClientProtocolError as exc:
        assert exc.code and exc.message
    else:
        assert 10 <= wanted.ttl_s <= 7200 and wanted.session["type"] == "realtime"


def test_answer_validates_as_the_sdk_type() -> None:
    """The answer parses strictly as ClientSecretCreateResponse, after a JSON round trip."""
    secret = new_client_secret()
    assert secret.startswith(CLIENT_SECRET_PREFIX) and len(secret) > 40
    assert new_client_secret() != secret
    answer = json.loads(json.dumps(render_client_secret(secret, expires_at=1_900_000_000,
                                                        session=CONFIG)))
    typed = ClientSecretCreateResponse.model_validate(answer, strict=True)
    assert typed.value == secret and typed.expires_at == 1_900_000_000
    assert typed.session.type == "realtime" and typed.session.object == "realtime.session"
    assert answer["session"]["instructions"] == "be brief"


def test_a_secrets_config_runs_first_in_a_new_session() -> None:
    """The secret's session.update is appended before the client's first command."""
    core = ConnectionCore(max_frame_bytes=1 << 20, url_model="loopback",
                          initial_session=CONFIG)
    core.quiet_period_over()
    assert core.actions_to_run() == [OpenSession(model="loopback")]
    core.receive_frame(json.dumps({"type": "input_audio_buffer.append", "audio": "AAA="}))
    core.open_succeeded("sess_x", resume_token="t", generation=1, model="m")
    appends = [a for a in core.actions_to_run() if isinstance(a, AppendCommands)]
    (entries,) = [a.entries for a in appends]
    assert entries[0] == (None, UpdateSession(session=CONFIG))
    assert isinstance(entries[1][1], AppendAudio)


def test_a_resume_ignores_the_secrets_config() -> None:
    """A resumed session is configured already; the secret's config is not sent again."""
    core = ConnectionCore(max_frame_bytes=1 << 20, initial_session=CONFIG)
    core.receive_frame(json.dumps({"type": "session.resume", "session_id": "sess_x",
                                   "resume_token": "t"}))
    assert [type(a) for a in core.actions_to_run()] == [ResumeSession]
    core.resume_succeeded("sess_x", resume_token="t2", generation=2, last_client_seq=0,
                          first_retained_seq=0, last_server_event_seq=0)
    assert not [a for a in core.actions_to_run() if isinstance(a, AppendCommands)]
