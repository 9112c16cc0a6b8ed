"""The relay's hot path through the gateway's I/O-free core, counted in calls per chunk.

Issue 13 measures the relay's CPU targets in Python calls per chunk (``bench relay
--profile``), because on a shared machine a few microseconds never show in CPU time while the
calls repeat exactly. This holds the part that needs no socket to the same count: an audio
append parsed and turned into a store command, and an output entry turned into a client
frame. Only calls to this project's own functions are counted (not the standard library's or
a dependency's, which change with their versions). A change that adds calls per chunk fails
here: raise the budget knowingly, or find the calls elsewhere.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import contract
import gateway
import store
from contract import messages as m
from gateway.protocol.actions import AppendCommands, SendFrame
from gateway.protocol.connection import ConnectionCore
from tests.call_count import calls_into

#: Calls into the project's code per audio append, from the frame's text to the encoded log
#: entry (the codec's parse and bounds walk, the core, the store codec): 27 today.
INBOUND_BUDGET = 27
#: Calls per output audio delta, from the log entry to the client frame's text (the store
#: codec, the core's follower and delivery, the render): 12 today.
OUTBOUND_BUDGET = 12

CHUNK = bytes(960)  # 20 ms of pcm16 at 24 kHz
_PARTS: dict[str, Any] = {"response_id": "resp_1", "item_id": "item_1", "output_index": 0,
                          "content_index": 0}


def attached_core() -> ConnectionCore:
    core = ConnectionCore(max_frame_bytes=1 << 16, url_model="loopback")
    core.quiet_period_over()
    core.open_succeeded("sess_0123456789abcdefghijkl", resume_token="tok", generation=1,
                        model="loopback")
    core.actions_to_run()
    return core


def test_an_audio_append_stays_within_its_budget() -> None:
    core = attached_core()
    audio = base64.b64encode(CHUNK).decode()
    counts = []
    for client_seq in range(1, 6):
        text = json.dumps({"type": "input_audio_buffer.append", "audio": audio,
                           "client_seq": client_seq})

        def append(text: str = text) -> None:
            core.receive_frame(text)
            (action,) = core.actions_to_run()
            assert isinstance(action, AppendCommands)
            for _, command in action.entries:  # as the driver hands them to the batcher
                m.encode_message(command)

        counts.append(calls_into((gateway, store, contract), append))
    assert 0 < max(counts) <= INBOUND_BUDGET, counts


def test_an_output_delta_stays_within_its_budget() -> None:
    core = attached_core()
    entry = m.encode_message(m.AudioDelta(**_PARTS, audio=CHUNK))
    counts = []
    for seq in range(1, 6):
        def deliver(seq: int = seq) -> None:
            core.receive_log_entries(seq, [entry])
            (action,) = core.actions_to_run()
            assert isinstance(action, SendFrame) and action.seq == seq

        counts.append(calls_into((gateway, store, contract), deliver))
    assert 0 < max(counts) <= OUTBOUND_BUDGET, counts
