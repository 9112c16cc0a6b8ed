"""The seed's session settings through a real gateway and worker: the MiniCPM-o preset's
session object with a voice prompt larger than any other string may be (the client's
documented example) is honoured by the loopback, and its idle_timeout_s reaches the store;
a frame backend refuses the preset's model knob by name with the seed's code."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from gateway.protocol.bounds import MAX_STRING_CHARS
from store.keys import SessionKeys
from tests.e2e.stack import Stack
from tests.e2e.test_session_profile import next_of, recv_json, sdk

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# 3 s of 16 kHz pcm16 as a WAV: more base64 than MAX_STRING_CHARS.
WAV = b"RIFF" + bytes(96_040)
#: ``minicpmo_4_5.create_duplex_session_config(ref_audio=...)``, without its audio keys (the
#: audio formats' own tests hold those) and with the session's model.
PRESET: dict[str, Any] = {
    "modalities": ["audio", "text"], "turn_detection": None,
    "overlap_policy": "listen_only", "playback_commit_policy": "ack_only",
    "ref_audio": "data:audio/wav;base64," + base64.b64encode(WAV).decode(),
    "idle_timeout_s": 120,
    "extra_body": {"auto_response": True, "force_listen_count": 0},
}


async def test_the_loopback_honours_the_minicpmo_preset(stack: Stack) -> None:
    assert len(PRESET["ref_audio"]) > MAX_STRING_CHARS
    gateway = stack.gateway()
    stack.worker()
    async with sdk(gateway) as client, client.realtime.connect(model="loopback") as conn:
        created = await recv_json(conn)
        update: Any = {"type": "session.update", "session": {**PRESET, "model": "loopback"}}
        await conn.send(update)
        session = (await next_of(conn, "session.updated"))["session"]
        assert (session["overlap_policy"], session["playback_commit_policy"],
                session["idle_timeout_s"]) == ("listen_only", "ack_only", 120)
        assert session["extra_body"]["force_listen_count"] == 0
        assert "ref_audio" not in session
        record = SessionKeys(created["session_id"]).record
        # Stored by the same call that logged session.updated.
        assert stack.reader().hget(record, "idle_ms") == b"120000"


async def test_a_frame_backend_refuses_the_presets_model_knob(stack: Stack) -> None:
    gateway = stack.gateway()
    stack.worker(backend="fake")
    async with sdk(gateway) as client, client.realtime.connect(model="fake") as conn:
        await recv_json(conn)
        update: Any = {"type": "session.update", "event_id": "evt_p",
                       "session": {**PRESET, "model": "fake"}}
        await conn.send(update)
        error = await recv_json(conn)
        assert error["type"] == "error", error
        assert (error["error"]["code"], error["error"]["param"], error["error"]["event_id"]) == (
            "invalid_duplex_runtime_config", "session.extra_body.force_listen_count", "evt_p")
