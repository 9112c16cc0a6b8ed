"""Fuzzing the duplex dialect as tests/gateway/test_codec_fuzz.py fuzzes GA: whatever a duplex
client sends parses or fails with a documented code, and whatever the worker writes renders to
a frame the encoder takes."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, strategies as st

from contract import messages as m
from gateway.protocol.dialect import Dialect
from gateway.protocol.envelope import ParsedFrame
from gateway.protocol.errors import PARSE_ERROR_CODES, ClientProtocolError
from gateway.protocol.parse import DUPLEX_CLIENT_EVENT_TYPES, parse_client_frame
from gateway.protocol.render import encode_frame
from gateway.protocol.render_duplex import DuplexRenderer
from tests.gateway.test_codec_fuzz import ALL_TYPES, EVENTS, FIELDS, FUZZ, LIMIT, TEXT

DUPLEX_NEAR_VALID = st.fixed_dictionaries(
    {"type": st.sampled_from([*sorted(DUPLEX_CLIENT_EVENT_TYPES), *ALL_TYPES])},
    optional={**FIELDS, "final": st.booleans() | st.integers(),
              "create_response": st.booleans() | st.none() | st.text(max_size=3),
              "response_create": st.booleans() | st.none() | st.text(max_size=3)},
)


@FUZZ
@given(DUPLEX_NEAR_VALID)
def test_duplex_frames_parse_or_fail_with_a_parse_code(obj: dict[str, Any]) -> None:
    try:
        parsed = parse_client_frame(json.dumps(obj), max_frame_bytes=LIMIT,
                                    dialect=Dialect.DUPLEX)
    except ClientProtocolError as exc:
        assert exc.code in PARSE_ERROR_CODES, exc
        return
    assert isinstance(parsed, ParsedFrame)
    said = {obj.get("create_response"), obj.get("response_create")} - {None}
    if obj["type"] == "input.commit" and not said:
        # Saying nothing about a response asks for one.
        assert isinstance(parsed.command, m.CommitInput) and parsed.command.create_response


@FUZZ
@given(st.lists(EVENTS, max_size=4), TEXT)
def test_every_event_renders_to_a_frame_on_duplex_connections(
        events: list[m.Event], event_id: str) -> None:
    renderer = DuplexRenderer([])
    for seq, event in enumerate(events, start=1):
        rendered = renderer.event(event, server_event_seq=seq, event_id=event_id,
                                  session_id="sess_1")
        assert rendered["server_event_seq"] == seq and rendered["event_id"] == event_id
        assert json.loads(encode_frame(rendered)) == rendered
