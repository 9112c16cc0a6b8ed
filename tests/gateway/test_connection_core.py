"""Scenario tests for the I/O-free connection core: frames and store answers in, actions out.

No event loop and no Redis: every test builds a :class:`ConnectionCore`, feeds it inputs as
method calls and checks what :meth:`ConnectionCore.actions_to_run` drains. Every frame sent to
the client is validated as the strictest real client would (``tests/gateway/strict.py``).
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import pytest

from contract import messages as m
from gateway.protocol.actions import (
    AppendCommands,
    CloseConnection,
    DetachLease,
    FetchLog,
    GiveUpSession,
    OpenSession,
    ResumeSession,
    SendFrame,
    TrimLog,
)
from gateway.protocol.connection import ConnectionCore
from gateway.protocol.envelope import ResumeRequest
from gateway.protocol.errors import ClientProtocolError, CloseCode, ErrorCode, InternalError
from gateway.protocol.transitions import ConnectionState
from tests.gateway.strict import validate_server_event

LIMIT = 1 << 16
SID = "sess_0123456789abcdefghijkl"
TOKEN = "tok_secret"
PCM = b"\x01\x00\xff\x7f"
SECRET = "redis://:hunter2@10.0.0.7:6379"

# One event of every kind the worker writes, in a plausible order (terminal events apart).
RESPONSE = {"object": "realtime.response", "id": "resp_1", "status": "in_progress", "output": []}
ITEM = {"id": "item_1", "type": "message", "role": "assistant", "content": []}
PART = {"type": "audio", "transcript": ""}
_P: dict[str, Any] = {
    "response_id": "resp_1", "item_id": "item_1", "output_index": 0, "content_index": 0,
}
EVENTS: list[m.Event] = [
    m.SessionUpdated(session={"type": "realtime", "model": "loopback"}),
    m.ErrorEvent(code="input_audio_buffer_commit_empty", message="empty", client_event_id="c1"),
    m.HeartbeatAck(),
    m.InputCommitted(item_id="item_0"),
    m.InputCleared(),
    m.ItemAdded(item=ITEM),
    m.ResponseCreated(response=RESPONSE),
    m.OutputItemAdded(response_id="resp_1", output_index=0, item=ITEM),
    m.ContentPartAdded(**_P, part=PART),
    m.AudioDelta(**_P, audio=PCM),
    m.TranscriptDelta(**_P, delta="hi"),
    m.AudioDone(**_P),
    m.TranscriptDone(**_P, transcript="hi"),
    m.ContentPartDone(**_P, part=PART),
    m.OutputItemDone(response_id="resp_1", output_index=0, item=ITEM),
    m.ItemDone(item=ITEM, previous_item_id="item_0"),
    m.ResponseDone(response={**RESPONSE, "status": "completed"}),
]


# --------------------------------------------------------------------------- helpers


def frame(type_: str, **fields: Any) -> str:
    """A client frame of the given type and fields, as JSON text."""
    return json.dumps({"type": type_, **fields})


UPDATE = frame("session.update", session={"instructions": "Be brief."}, client_seq=1)
COMMIT = frame("input_audio_buffer.commit", event_id="c_commit")
APPEND = frame("input_audio_buffer.append", audio=base64.b64encode(PCM).decode(), client_seq=2)


def resume_frame(last: int = 0, **extra: Any) -> str:
    """A ``session.resume`` frame for :data:`SID` from ``last``."""
    return frame("session.resume", session_id=SID, resume_token=TOKEN,
                 last_received_server_event_seq=last, **extra)


def payloads(*events: m.Event) -> list[bytes]:
    """Output-log entries as the store holds them."""
    return [m.encode_message(event) for event in events]


def hb(n: int) -> list[bytes]:
    """``n`` heartbeat acks: the simplest log entries."""
    return payloads(*[m.HeartbeatAck()] * n)


def sent(actions: list[Any]) -> list[dict[str, Any]]:
    """The client frames among ``actions``, parsed and strictly validated."""
    frames = [json.loads(a.text) for a in actions if isinstance(a, SendFrame)]
    for obj in frames:
        validate_server_event(obj)
    return frames


def seqs(actions: list[Any]) -> list[int]:
    """The ``server_event_seq`` of every logged event sent."""
    return [f["server_event_seq"] for f in sent(actions) if "server_event_seq" in f]


def kinds(actions: list[Any]) -> list[type[Any]]:
    """The action classes, in order."""
    return [type(a) for a in actions]


def error_of(action: Any) -> dict[str, Any]:
    """The ``error`` object of a SendFrame holding an ``error`` event."""
    obj = sent([action])[0]
    assert obj["type"] == "error"
    return obj["error"]  # type: ignore[no-any-return]


def new_core(*, autostart: bool = False, limit: int = LIMIT) -> ConnectionCore:
    """A fresh core with nothing drained; ``autostart``: a ``?model=loopback`` URL whose
    quiet period is over (its open decided)."""
    core = ConnectionCore(max_frame_bytes=limit, url_model="loopback" if autostart else None)
    if autostart:
        core.quiet_period_over()
    return core


def opened(generation: int = 1) -> ConnectionCore:
    """A core attached to a freshly opened session, actions drained."""
    core = new_core(autostart=True)
    core.open_succeeded(SID, resume_token=TOKEN, generation=generation, model="loopback")
    core.actions_to_run()
    return core


def resumed(last: int, *, first_retained: int, last_server: int, generation: int = 2) -> tuple[
    ConnectionCore, list[Any]
]:
    """A core resumed from ``last``; returns it with the actions the resume decided."""
    core = new_core()
    core.receive_frame(resume_frame(last))
    core.actions_to_run()
    core.resume_succeeded(SID, resume_token="tok_new", generation=generation, last_client_seq=4,
                          first_retained_seq=first_retained, last_server_event_seq=last_server)
    return core, core.actions_to_run()


# --------------------------------------------------------------------------- opening


def test_autostart_opens_at_once() -> None:
    """Once a ?model= URL's quiet period is over the core asks for a session for that model,
    before any frame."""
    core = new_core(autostart=True)
    assert core.state is ConnectionState.OPENING
    assert core.actions_to_run() == [OpenSession(model="loopback")]
    assert core.actions_to_run() == []


def test_nothing_happens_before_the_first_frame() -> None:
    """Without autostart the core waits for the first frame."""
    core = new_core()
    assert core.state is ConnectionState.AWAITING_FIRST
    assert core.actions_to_run() == []
    assert core.delivered_seq == 0


def test_first_session_update_opens_then_is_appended_after_attach() -> None:
    """A first session.update opens a session and is appended, with its client_seq, once open."""
    core = new_core()
    core.receive_frame(UPDATE)
    assert core.actions_to_run() == [OpenSession()]
    core.open_succeeded(SID, resume_token=TOKEN, generation=1, model="loopback")
    actions = core.actions_to_run()
    assert kinds(actions) == [SendFrame, FetchLog, AppendCommands]
    assert actions[1] == FetchLog(after_seq=0)
    assert actions[2] == AppendCommands(
        entries=((1, m.UpdateSession(session={"instructions": "Be brief."})),))


def test_first_other_command_opens_a_default_session_then_runs() -> None:
    """Any other first command opens a default session and becomes its first command."""
    core = new_core()
    core.receive_frame(COMMIT)
    assert core.actions_to_run() == [OpenSession()]
    core.open_succeeded(SID, resume_token=TOKEN, generation=1, model="loopback")
    assert core.actions_to_run()[-1] == AppendCommands(
        entries=((None, m.CommitInput(event_id="c_commit")),))


def test_frames_while_opening_are_queued_in_order_and_errors_answered_at_once() -> None:
    """Commands wait for the lease in order; bad frames are answered immediately."""
    core = new_core(autostart=True)
    core.actions_to_run()
    core.receive_frame(UPDATE)
    core.receive_frame("{not json")
    core.receive_frame(APPEND)
    core.receive_frame(COMMIT)
    actions = core.actions_to_run()
    assert len(actions) == 1
    assert error_of(actions[0])["code"] == ErrorCode.INVALID_JSON
    assert core.state is ConnectionState.OPENING
    core.open_succeeded(SID, resume_token=TOKEN, generation=1, model="loopback")
    (append,) = [a for a in core.actions_to_run() if isinstance(a, AppendCommands)]
    assert [(seq, type(cmd)) for seq, cmd in append.entries] == [
        (1, m.UpdateSession), (2, m.AppendAudio), (None, m.CommitInput)]


def test_open_without_queued_commands_appends_nothing() -> None:
    """An autostarted open with no frames yet sends session.created and reads the log only."""
    core = new_core(autostart=True)
    core.actions_to_run()
    core.open_succeeded(SID, resume_token=TOKEN, generation=1, model="loopback")
    assert kinds(core.actions_to_run()) == [SendFrame, FetchLog]


def test_session_created_carries_the_resume_fields_and_no_seq() -> None:
    """session.created validates strictly and carries session_id, resume_token and generation."""
    core = new_core(autostart=True)
    core.actions_to_run()
    core.open_succeeded(SID, resume_token=TOKEN, generation=7, model="moshi")
    assert core.state is ConnectionState.ATTACHED
    (created,) = sent(core.actions_to_run())
    assert created["type"] == "session.created"
    assert created["session_id"] == SID
    assert created["resume_token"] == TOKEN
    assert created["lease_generation"] == 7
    assert created["session"]["id"] == SID
    assert created["session"]["model"] == "moshi"
    assert "server_event_seq" not in created
    assert core.session_id == SID and core.generation == 7


PROFILE_SESSION: dict[str, Any] = {
    "type": "realtime", "object": "realtime.session", "id": SID, "model": "gpt-realtime",
    "instructions": "", "output_modalities": ["audio"],
    "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "alloy"}},
}
CAPABILITIES = {"supports_barge_in": True, "chunk_period_ms": 40}


def test_session_created_announces_the_placed_session_and_its_capabilities() -> None:
    """With the session object and capabilities placement found, session.created carries
    them (strictly valid), in place of the minimal {type, model}."""
    core = new_core(autostart=True)
    core.actions_to_run()
    core.open_succeeded(SID, resume_token=TOKEN, generation=1, model="gpt-realtime",
                        session=PROFILE_SESSION, capabilities=CAPABILITIES)
    (created,) = sent(core.actions_to_run())
    assert created["session"] == PROFILE_SESSION
    assert created["capabilities"] == CAPABILITIES


def test_session_created_without_a_profile_is_minimal() -> None:
    """A worker that published no profile: session.created says {type, object, id, model}
    and has no capabilities."""
    core = new_core(autostart=True)
    core.actions_to_run()
    core.open_succeeded(SID, resume_token=TOKEN, generation=1, model="moshi")
    (created,) = sent(core.actions_to_run())
    assert created["session"] == {"type": "realtime", "object": "realtime.session", "id": SID,
                                  "model": "moshi"}
    assert "capabilities" not in created


def test_commands_after_attach_are_appended_at_once() -> None:
    """Once attached, each command becomes its own AppendCommands right away."""
    core = opened()
    core.receive_frame(APPEND)
    core.receive_frame(COMMIT)
    assert core.actions_to_run() == [
        AppendCommands(entries=((2, m.AppendAudio(audio=PCM)),)),
        AppendCommands(entries=((None, m.CommitInput(event_id="c_commit")),)),
    ]


def test_a_lone_append_is_taken_alone_and_anything_more_is_left_whole() -> None:
    """take_lone_append drains one AppendCommands decided on its own (what the driver queues
    without its step lock) and leaves any other set of actions as it was, in order."""
    core = opened()
    assert core.take_lone_append() is None  # nothing decided
    core.receive_frame(APPEND)
    assert core.take_lone_append() == ((2, m.AppendAudio(audio=PCM)),)
    assert not core.has_actions
    core.receive_frame(APPEND)
    core.receive_frame(COMMIT)  # two appends: the driver's step runs them, in order
    assert core.take_lone_append() is None
    assert kinds(core.actions_to_run()) == [AppendCommands, AppendCommands]
    core.receive_log_entries(1, [m.encode_message(m.AudioDelta(
        response_id="resp_1", item_id="item_1", output_index=0, content_index=0,
        audio=PCM))])
    assert core.take_lone_append() is None  # a frame to send is not an append
    assert kinds(core.actions_to_run()) == [SendFrame]


def test_open_refused_answers_the_error_and_closes_with_its_code() -> None:
    """A refused open (no slot) sends its error and closes with the error's close code."""
    core = new_core()
    core.receive_frame(UPDATE)
    core.actions_to_run()
    core.fail(ClientProtocolError(ErrorCode.RESOURCE_EXHAUSTED, "no worker slot free",
                                  close_code=CloseCode.TRY_AGAIN_LATER))
    actions = core.actions_to_run()
    assert error_of(actions[0])["type"] == "rate_limit_error"
    assert actions[1:] == [CloseConnection(code=1013, reason="resource_exhausted")]
    assert core.state is ConnectionState.CLOSED


def test_fail_without_close_code_closes_1011() -> None:
    """A client error that carries no close code still ends a failed open with 1011."""
    core = new_core(autostart=True)
    core.actions_to_run()
    core.fail(ClientProtocolError(ErrorCode.INVALID_VALUE, "bad"))
    assert core.actions_to_run()[-1] == CloseConnection(code=1011, reason="invalid_value")


def test_internal_failure_closes_1011_without_details() -> None:
    """fail(InternalError) sends a generic server_error and closes 1011, leaking nothing."""
    core = opened(generation=3)
    core.fail(InternalError(f"append failed: {SECRET}"))
    actions = core.actions_to_run()
    assert kinds(actions) == [SendFrame, CloseConnection, DetachLease]
    error = error_of(actions[0])
    assert error["type"] == "server_error"
    assert error["code"] == "internal_error"
    assert isinstance(actions[0], SendFrame)
    assert "hunter2" not in actions[0].text and "redis" not in actions[0].text
    assert actions[1] == CloseConnection(code=1011, reason="")
    assert actions[2] == DetachLease(generation=3)


# --------------------------------------------------------------------------- the output log


def test_log_entries_are_delivered_in_order() -> None:
    """Entries become frames with their server_event_seq, in order."""
    core = opened()
    core.receive_log_entries(1, hb(3))
    assert seqs(core.actions_to_run()) == [1, 2, 3]
    assert core.delivered_seq == 3


def test_duplicates_and_overlaps_are_delivered_once() -> None:
    """A replayed or overlapping batch only yields the entries not yet sent."""
    core = opened()
    core.receive_log_entries(1, hb(2))
    core.receive_log_entries(1, hb(2))
    core.receive_log_entries(2, hb(3))
    assert seqs(core.actions_to_run()) == [1, 2, 3, 4]


def test_a_gap_asks_for_the_missing_entries_then_fills() -> None:
    """An entry ahead of the next one is held back and the gap is read from the log."""
    core = opened()
    core.receive_log_entries(1, hb(2))
    core.actions_to_run()
    core.receive_log_entries(5, hb(1))
    assert core.actions_to_run() == [FetchLog(after_seq=2)]
    core.receive_log_entries(3, hb(3))
    assert seqs(core.actions_to_run()) == [3, 4, 5]
    core.receive_log_entries(5, hb(1))  # the late push of the entry that made the gap
    assert core.actions_to_run() == []


def test_out_of_order_pushes_lose_nothing() -> None:
    """Pushes in reverse order cost reads, never entries or duplicates."""
    core = opened()
    log = hb(6)
    for first in (5, 3, 1):
        core.receive_log_entries(first, log[first - 1:first + 1])
    actions = core.actions_to_run()
    assert [type(a) for a in actions if not isinstance(a, SendFrame)] == [FetchLog, FetchLog]
    core.receive_log_entries(1, log)  # the log read answering the FetchLogs
    core.receive_log_entries(3, log[2:4])
    assert seqs(actions + core.actions_to_run()) == [1, 2, 3, 4, 5, 6]


def test_every_event_kind_renders_strictly_with_seq_and_deterministic_id() -> None:
    """Each worker event validates, carries its seq and the event_id derived from (session, seq)."""
    core = opened()
    core.receive_log_entries(1, payloads(*EVENTS))
    frames = sent(core.actions_to_run())
    assert len(frames) == len(EVENTS)
    for seq, obj in enumerate(frames, start=1):
        assert obj["server_event_seq"] == seq
        assert obj["event_id"] == f"event_{SID[-12:]}_{seq}"
    assert frames[9]["delta"] == base64.b64encode(PCM).decode()


def test_replayed_events_keep_their_event_id_across_connections() -> None:
    """Two connections rendering the same seq send byte-identical frames (replay stability)."""
    first = opened(generation=1)
    first.receive_log_entries(1, payloads(*EVENTS))
    second, _ = resumed(0, first_retained=1, last_server=len(EVENTS))
    second.receive_log_entries(1, payloads(*EVENTS))
    texts = [[a.text for a in c.actions_to_run() if isinstance(a, SendFrame)]
             for c in (first, second)]
    assert texts[0] == texts[1]


def test_log_entries_before_attach_are_ignored() -> None:
    """Entries that arrive while opening are dropped; the attach reads the log anyway."""
    core = new_core(autostart=True)
    core.actions_to_run()
    core.receive_log_entries(1, hb(2))
    assert core.actions_to_run() == []
    assert core.delivered_seq == 0


def test_corrupt_entry_is_skipped_and_the_seq_advances() -> None:
    """An undecodable entry sends nothing but still counts, so replay stays exact."""
    core = opened()
    core.receive_log_entries(1, [b"garbage", b'{"k":"no.such.kind"}\0', *hb(1)])
    assert seqs(core.actions_to_run()) == [3]
    assert core.delivered_seq == 3


def test_command_in_the_output_log_is_skipped() -> None:
    """A command found in the output log is corrupt data for this reader: skipped, seq kept."""
    core = opened()
    core.receive_log_entries(1, [m.encode_message(m.CommitInput()), *hb(1)])
    assert seqs(core.actions_to_run()) == [2]


def test_unencodable_event_is_skipped_not_raised() -> None:
    """An event holding NaN (valid for the log, not for JSON) is skipped, never raised."""
    core = opened()
    bad = m.encode_message(m.SessionUpdated(session={"temperature": math.nan}))
    core.receive_log_entries(1, [bad, *hb(1)])
    assert seqs(core.actions_to_run()) == [2]
    assert core.state is ConnectionState.ATTACHED


@pytest.mark.parametrize("terminal", [m.SessionClosed(reason="client_close"),
                                      m.SessionExpired(reason="idle_timeout")])
def test_terminal_event_is_last_then_close_1000(terminal: m.Event) -> None:
    """A terminal event is sent, the socket closes 1000 and nothing follows, not even a detach."""
    core = opened()
    core.receive_log_entries(1, [*hb(1), m.encode_message(terminal), *hb(2)])
    actions = core.actions_to_run()
    reason = terminal.reason  # type: ignore[union-attr]
    assert kinds(actions) == [SendFrame, SendFrame, CloseConnection]
    assert sent(actions)[-1]["type"] == terminal.KIND
    assert actions[-1] == CloseConnection(code=1000, reason=reason)
    assert core.state is ConnectionState.CLOSED
    core.receive_log_entries(3, hb(2))
    core.connection_lost()
    assert core.actions_to_run() == []


# --------------------------------------------------------------------------- resume


def test_resume_first_asks_the_store_and_follows_from_the_clients_seq() -> None:
    """session.resume as first frame becomes ResumeSession; delivery starts after its seq."""
    core = new_core()
    core.receive_frame(resume_frame(5, control_id="ctl_1", event_id="c_res"))
    assert core.state is ConnectionState.RESUMING
    assert core.actions_to_run() == [ResumeSession(request=ResumeRequest(
        session_id=SID, resume_token=TOKEN, last_received_server_event_seq=5,
        control_id="ctl_1", event_id="c_res"))]
    assert core.delivered_seq == 5


def test_session_resumed_carries_the_records_session_and_capabilities() -> None:
    """session.resumed carries the session object and capabilities the store handed back,
    strictly valid; a resume without them leaves both out."""
    core = new_core()
    core.receive_frame(resume_frame(0))
    core.actions_to_run()
    updated = {**PROFILE_SESSION, "instructions": "Be brief."}
    core.resume_succeeded(SID, resume_token="tok_new", generation=2, last_client_seq=0,
                          first_retained_seq=1, last_server_event_seq=3, session=updated,
                          capabilities=CAPABILITIES)
    (notice,) = sent(core.actions_to_run())
    assert (notice["session"], notice["capabilities"]) == (updated, CAPABILITIES)
    _, actions = resumed(0, first_retained=1, last_server=3)
    (bare,) = sent(actions)
    assert "session" not in bare and "capabilities" not in bare


def test_resume_succeeded_announces_then_replays_after_the_clients_seq() -> None:
    """session.resumed (new token, generation, last_client_seq) then FetchLog(after=last)."""
    core, actions = resumed(5, first_retained=1, last_server=9, generation=4)
    assert core.state is ConnectionState.ATTACHED
    assert kinds(actions) == [SendFrame, FetchLog]
    (notice,) = sent(actions)
    assert notice["type"] == "session.resumed"
    assert notice["resume_token"] == "tok_new"
    assert notice["lease_generation"] == 4
    assert notice["last_client_seq"] == 4
    assert notice["replay_from"] == 6
    assert actions[1] == FetchLog(after_seq=5)
    core.receive_log_entries(1, hb(9))
    assert seqs(core.actions_to_run()) == [6, 7, 8, 9]


def test_resume_past_a_trimmed_log_requires_a_resync() -> None:
    """Events the client lacks were trimmed: resync_required, then what is still retained."""
    core, actions = resumed(2, first_retained=6, last_server=9)
    types = [f["type"] for f in sent(actions)]
    assert types == ["session.resumed", "session.resync_required"]
    assert sent(actions)[1]["reason"] == "log_trimmed"
    assert sent(actions)[1]["replay_from"] == 6
    assert actions[-1] == FetchLog(after_seq=5)
    assert core.delivered_seq == 5
    core.receive_log_entries(6, hb(5))
    assert seqs(core.actions_to_run()) == [6, 7, 8, 9, 10]


def test_a_different_event_under_a_delivered_number_is_a_rewound_log() -> None:
    """Duplicates are dropped; a new event reusing a delivered number (the log lost what was
    sent in a failover) is delivered after resync_required log_rewound."""
    core = opened()
    core.receive_log_entries(1, hb(5))
    assert seqs(core.actions_to_run()) == [1, 2, 3, 4, 5]
    core.receive_log_entries(3, hb(3))  # the same events again: a read overlapping a push
    assert core.actions_to_run() == []
    core.receive_log_entries(4, payloads(m.InputCleared(), m.InputCleared()))
    frames = sent(core.actions_to_run())
    assert [f["type"] for f in frames] == ["session.resync_required", "input_audio_buffer.cleared",
                                           "input_audio_buffer.cleared"]
    assert (frames[0]["reason"], frames[0]["replay_from"]) == ("log_rewound", 4)
    assert [f.get("server_event_seq") for f in frames[1:]] == [4, 5]
    core.receive_log_entries(5, payloads(m.InputCleared()))  # now a plain duplicate
    core.receive_log_entries(6, hb(1))
    assert seqs(core.actions_to_run()) == [6]


def test_a_log_that_ends_before_what_was_delivered_is_a_rewound_log() -> None:
    """A quiet poll found the log's end behind the client: resync from the end, then go on."""
    core = opened()
    core.receive_log_entries(1, hb(6))
    core.actions_to_run()
    core.log_rewound(6)  # not behind: nothing to say
    assert core.actions_to_run() == []
    core.log_rewound(4)
    frames = sent(core.actions_to_run())
    assert [(f["type"], f["reason"], f["replay_from"]) for f in frames] == [
        ("session.resync_required", "log_rewound", 5)]
    assert core.delivered_seq == 4
    core.receive_log_entries(5, hb(1))
    assert seqs(core.actions_to_run()) == [5]


def test_a_read_whose_overlap_changed_reads_back_to_where_the_log_differs() -> None:
    """A lossy failover took the log back to 3 and the worker numbered past 6 again before a
    read after 6: the entries after 6 look new, only the read's overlap (the entry at 6) shows
    the log changed. Nothing is delivered until a read from further back finds the first
    different entry; then resync_required log_rewound from there, every entry once."""
    core = opened()
    core.receive_log_entries(1, hb(6))
    assert seqs(core.actions_to_run()) == [1, 2, 3, 4, 5, 6]
    rewound = payloads(*[m.InputCleared()] * 5)  # what the log holds at 4, 5, 6, 7, 8 now
    core.log_read(6, [(6, rewound[2]), (7, rewound[3]), (8, rewound[4])])
    assert core.actions_to_run() == [FetchLog(after_seq=0)]
    assert core.delivered_seq == 6
    core.log_read(0, list(enumerate([*hb(3), *rewound], start=1)))
    frames = sent(core.actions_to_run())
    assert (frames[0]["reason"], frames[0]["replay_from"]) == ("log_rewound", 4)
    assert [f.get("server_event_seq") for f in frames[1:]] == [4, 5, 6, 7, 8]
    core.log_read(8, [(8, rewound[4]), (9, hb(1)[0])])  # an overlap that holds: reads on
    assert seqs(core.actions_to_run()) == [9]


def test_rewind_detection_remembers_a_bounded_window() -> None:
    """Numbers older than the window are not compared (a rewind is far shorter)."""
    core = opened()
    core.receive_log_entries(1, hb(300))
    core.actions_to_run()
    core.receive_log_entries(1, payloads(m.InputCleared()))  # forgotten: taken as a duplicate
    assert core.actions_to_run() == []
    core.receive_log_entries(300, payloads(m.InputCleared()))
    assert next(f["type"] for f in sent(core.actions_to_run())) == "session.resync_required"


def test_resume_after_the_whole_log_was_trimmed_requires_a_resync() -> None:
    """An empty stream (first_retained 0) with events the client lacks is a resync too."""
    _, actions = resumed(3, first_retained=0, last_server=7)
    assert [f["type"] for f in sent(actions)][-1] == "session.resync_required"
    assert actions[-1] == FetchLog(after_seq=7)


@pytest.mark.parametrize(("first_retained", "last_server"), [(1, 4), (0, 0), (3, 6)])
def test_resume_past_the_logs_end_requires_a_resync(first_retained: int,
                                                    last_server: int) -> None:
    """The client holds events the log lost (a lossy failover): resync, then go on from the
    log's end, where new events will be numbered."""
    core, actions = resumed(9, first_retained=first_retained, last_server=last_server)
    frames = sent(actions)
    assert [f["type"] for f in frames] == ["session.resumed", "session.resync_required"]
    assert frames[0]["replay_from"] == last_server + 1
    assert frames[1]["reason"] == "log_rewound"
    assert actions[-1] == FetchLog(after_seq=last_server)
    assert core.delivered_seq == last_server


def test_resume_past_the_end_of_an_ended_sessions_log_replays_its_terminal_event() -> None:
    """The session ended after the log went back (its worker saw its input log rewound): the
    terminal event is the log's last, under a number the client holds. Resync to it and
    deliver it, so the client learns the session is over instead of waiting in silence."""
    core = new_core()
    core.receive_frame(resume_frame(9))
    core.actions_to_run()
    core.resume_succeeded(SID, resume_token="tok", generation=2, last_client_seq=4,
                          first_retained_seq=1, last_server_event_seq=6, session_over=True)
    actions = core.actions_to_run()
    frames = sent(actions)
    assert [(f["type"], f.get("replay_from")) for f in frames] == [
        ("session.resumed", 6), ("session.resync_required", 6)]
    assert actions[-1] == FetchLog(after_seq=5)
    core.receive_log_entries(6, payloads(m.SessionClosed(reason="log_rewound")))
    closed = sent(core.actions_to_run())
    assert [(f["type"], f["server_event_seq"]) for f in closed] == [("session.closed", 6)]


@pytest.mark.parametrize(("last", "first_retained", "last_server"), [
    (0, 0, 0),  # an empty log: nothing was ever written
    (5, 0, 5),  # fully trimmed, but the client already holds everything
    (3, 4, 9),  # trimmed exactly up to what the client holds
    (9, 12, 9),  # trimmed past the end, client up to date
])
def test_resume_without_missing_events_needs_no_resync(
    last: int, first_retained: int, last_server: int
) -> None:
    """No resync when every event the client lacks is still in the log."""
    core, actions = resumed(last, first_retained=first_retained, last_server=last_server)
    assert [f["type"] for f in sent(actions)] == ["session.resumed"]
    assert actions[-1] == FetchLog(after_seq=last)
    assert core.delivered_seq == last


def test_commands_while_resuming_are_appended_after_the_resume() -> None:
    """Commands sent behind session.resume wait for the new lease."""
    core = new_core()
    core.receive_frame(resume_frame())
    core.receive_frame(APPEND)
    assert kinds(core.actions_to_run()) == [ResumeSession]
    core.resume_succeeded(SID, resume_token="t", generation=2, last_client_seq=1,
                          first_retained_seq=0, last_server_event_seq=0)
    assert core.actions_to_run()[-1] == AppendCommands(entries=((2, m.AppendAudio(audio=PCM)),))


@pytest.mark.parametrize("code", [ErrorCode.SESSION_RESUME_EXPIRED, ErrorCode.INVALID_RESUME_TOKEN,
                                  ErrorCode.SESSION_RESUME_CONFLICT])
def test_resume_refused_sends_the_error_and_closes_1008(code: ErrorCode) -> None:
    """A refused resume is answered with its code and closed with 1008, queued commands dropped."""
    core = new_core()
    core.receive_frame(resume_frame(event_id="c_res"))
    core.receive_frame(COMMIT)
    core.actions_to_run()
    core.resume_failed(ClientProtocolError(code, "no", client_event_id="c_res"))
    actions = core.actions_to_run()
    assert kinds(actions) == [SendFrame, CloseConnection]
    assert error_of(actions[0])["code"] == code
    assert error_of(actions[0])["event_id"] == "c_res"
    assert actions[1] == CloseConnection(code=1008, reason=code)
    assert core.state is ConnectionState.CLOSED


def test_resume_after_a_command_is_refused_and_the_session_survives() -> None:
    """session.resume once the client used its session is unsupported_session_resume."""
    core = opened()
    core.receive_frame(COMMIT)
    assert kinds(core.actions_to_run()) == [AppendCommands]
    core.receive_frame(resume_frame(event_id="c_r2"))
    actions = core.actions_to_run()
    assert len(actions) == 1
    error = error_of(actions[0])
    assert error["code"] == ErrorCode.UNSUPPORTED_SESSION_RESUME
    assert error["event_id"] == "c_r2"
    assert core.state is ConnectionState.ATTACHED
    core.receive_frame(COMMIT)
    assert kinds(core.actions_to_run()) == [AppendCommands]


def test_resume_first_on_a_model_url_gives_up_the_opened_session() -> None:
    """The SDK's every connection opens a session for its ?model= URL; a session.resume as the
    client's first event gives that session up (one GiveUpSession) and resumes, and what the
    given-up session still pushes is not delivered."""
    core = opened()
    core.receive_frame(resume_frame(last=7))
    assert core.actions_to_run() == [GiveUpSession(session_id=SID),
                                     ResumeSession(request=ResumeRequest(
                                         session_id=SID, resume_token=TOKEN,
                                         last_received_server_event_seq=7))]
    assert core.state is ConnectionState.RESUMING
    core.receive_log_entries(1, hb(2))  # the given-up session's own log
    assert core.actions_to_run() == []
    core.resume_succeeded("sess_other", resume_token="tok_new", generation=4, last_client_seq=0,
                          first_retained_seq=1, last_server_event_seq=9)
    actions = core.actions_to_run()
    assert sent(actions)[0]["type"] == "session.resumed"
    assert FetchLog(after_seq=7) in actions
    core.receive_log_entries(8, hb(2))
    assert seqs(core.actions_to_run()) == [8, 9]


def test_resume_while_the_url_session_opens_gives_it_up_when_it_lands() -> None:
    """session.resume behind an autostarted open that is still in flight: the open, when it
    lands, is given up without a session.created, and the resume goes on."""
    core = new_core(autostart=True)
    core.actions_to_run()
    core.receive_frame(resume_frame())
    assert kinds(core.actions_to_run()) == [ResumeSession]
    core.open_succeeded("sess_url", resume_token="t", generation=1, model="loopback")
    assert core.actions_to_run() == [GiveUpSession(session_id="sess_url")]
    core.resume_succeeded(SID, resume_token="tok_new", generation=2, last_client_seq=0,
                          first_retained_seq=0, last_server_event_seq=0)
    assert [f["type"] for f in sent(core.actions_to_run())] == ["session.resumed"]
    assert core.state is ConnectionState.ATTACHED


# --------------------------------------------------------------------------- the URL's session


def url_core(model: str = "moshi") -> ConnectionCore:
    """A ``?model=`` connection before its quiet period is over."""
    return ConnectionCore(max_frame_bytes=LIMIT, url_model=model)


def exhausted(code: str = ErrorCode.RESOURCE_EXHAUSTED) -> ClientProtocolError:
    return ClientProtocolError(code, "full", close_code=CloseCode.TRY_AGAIN_LATER)


def test_a_model_url_opens_nothing_before_a_frame_or_the_quiet_period() -> None:
    """The URL's session waits: the first command opens it, for the URL's model."""
    core = url_core()
    assert core.actions_to_run() == [] and core.awaits_quiet_period
    core.receive_frame(UPDATE)
    assert core.actions_to_run() == [OpenSession(model="moshi")]
    assert not core.awaits_quiet_period
    core.quiet_period_over()  # too late: the frame opened it
    assert core.actions_to_run() == []


def test_a_resume_before_the_quiet_period_opens_nothing() -> None:
    """A ?model= connection that resumes at once never opens the URL's session."""
    core = url_core()
    core.receive_frame(resume_frame())
    assert kinds(core.actions_to_run()) == [ResumeSession]
    core.quiet_period_over()
    core.first_message_timed_out()
    assert core.actions_to_run() == []


def test_a_quiet_open_refused_for_room_is_held_for_a_resume() -> None:
    """The quiet open found no slot: nothing is said, and the resume that follows goes on;
    no error comes before session.resumed (DESIGN §2.7)."""
    core = url_core()
    core.quiet_period_over()
    assert core.actions_to_run() == [OpenSession(model="moshi")]
    core.open_failed(exhausted())
    assert core.actions_to_run() == []
    assert core.state is ConnectionState.AWAITING_FIRST
    core.receive_frame(resume_frame(last=3))
    assert kinds(core.actions_to_run()) == [ResumeSession]
    core.resume_succeeded(SID, resume_token="tok_new", generation=2, last_client_seq=0,
                          first_retained_seq=1, last_server_event_seq=3)
    assert [f["type"] for f in sent(core.actions_to_run())] == ["session.resumed"]
    core.first_message_timed_out()
    assert core.actions_to_run() == []


def test_a_command_after_a_held_refusal_opens_again() -> None:
    """The held refusal is void once the client sends a command: that is a new try."""
    core = url_core()
    core.quiet_period_over()
    core.actions_to_run()
    core.open_failed(exhausted(ErrorCode.RATE_LIMIT_EXCEEDED))
    core.receive_frame(UPDATE)
    assert core.actions_to_run() == [OpenSession(model="moshi")]
    core.open_failed(exhausted())  # the client asked for this one: answered
    actions = core.actions_to_run()
    assert error_of(actions[0])["code"] == ErrorCode.RESOURCE_EXHAUSTED
    assert actions[1] == CloseConnection(code=1013, reason="resource_exhausted")


def test_a_held_refusal_is_the_answer_at_the_first_message_timeout() -> None:
    """A client that waits for session.created gets the refusal once the first-message
    deadline passes, with its retryable close code, not config_timeout."""
    core = url_core()
    core.quiet_period_over()
    core.actions_to_run()
    core.open_failed(exhausted())
    core.first_message_timed_out()
    actions = core.actions_to_run()
    assert error_of(actions[0])["code"] == ErrorCode.RESOURCE_EXHAUSTED
    assert actions[1] == CloseConnection(code=1013, reason="resource_exhausted")
    assert core.state is ConnectionState.CLOSED


def test_a_quiet_open_refused_for_its_model_is_answered_at_once() -> None:
    """model_not_found is not a matter of waiting: the client hears it at once."""
    core = url_core("nope")
    core.quiet_period_over()
    core.actions_to_run()
    core.open_failed(ClientProtocolError(ErrorCode.MODEL_NOT_FOUND, "not served",
                                         param="model", close_code=CloseCode.POLICY_VIOLATION))
    actions = core.actions_to_run()
    assert error_of(actions[0])["code"] == ErrorCode.MODEL_NOT_FOUND
    assert actions[1] == CloseConnection(code=1008, reason="model_not_found")


def test_a_resume_behind_a_refused_quiet_open_hears_nothing_of_it() -> None:
    """The quiet open was in flight when the resume came, and then failed: no error."""
    core = url_core()
    core.quiet_period_over()
    core.actions_to_run()
    core.receive_frame(resume_frame())
    assert kinds(core.actions_to_run()) == [ResumeSession]
    core.open_failed(InternalError("redis went away"))
    assert core.actions_to_run() == []
    assert core.state is ConnectionState.RESUMING


def test_a_command_behind_a_refused_quiet_open_gets_the_refusal() -> None:
    """The client sent a command while the quiet open was in flight: it wants that session,
    so the refusal is its answer."""
    core = url_core()
    core.quiet_period_over()
    core.actions_to_run()
    core.receive_frame(UPDATE)
    assert core.actions_to_run() == []  # queued behind the open
    core.open_failed(exhausted())
    assert error_of(core.actions_to_run()[0])["code"] == ErrorCode.RESOURCE_EXHAUSTED


def test_without_a_url_model_the_first_update_names_the_model() -> None:
    """No ?model=: the model a first session.update names is the one placed; a client
    secret's configuration names it before the client's own frame."""
    core = new_core()
    core.receive_frame(frame("session.update", session={"type": "realtime", "model": "fake"}))
    assert core.actions_to_run() == [OpenSession(model="fake")]
    core = new_core()
    core.receive_frame(APPEND)
    assert core.actions_to_run() == [OpenSession(model=None)]
    secret = ConnectionCore(max_frame_bytes=LIMIT, initial_session={"model": "moshi"})
    secret.receive_frame(frame("session.update", session={"model": "fake"}))
    assert secret.actions_to_run() == [OpenSession(model="moshi")]
    url = url_core("moshi")
    url.receive_frame(frame("session.update", session={"model": "fake"}))
    assert url.actions_to_run() == [OpenSession(model="moshi")]


def test_a_second_resume_is_refused() -> None:
    """Only the first client event may be a resume, also on a ?model= connection: once the
    URL's session was given up, the resumed one is never given up in turn."""
    core = opened()
    core.receive_frame(resume_frame())
    core.actions_to_run()
    core.receive_frame(resume_frame(event_id="again"))
    assert error_of(core.actions_to_run()[0])["code"] == ErrorCode.UNSUPPORTED_SESSION_RESUME
    core.resume_succeeded(SID, resume_token="tok_new", generation=2, last_client_seq=0,
                          first_retained_seq=0, last_server_event_seq=0)
    core.actions_to_run()
    core.receive_frame(resume_frame(event_id="third"))
    actions = core.actions_to_run()
    assert len(actions) == 1
    assert error_of(actions[0])["code"] == ErrorCode.UNSUPPORTED_SESSION_RESUME
    assert core.state is ConnectionState.ATTACHED


def test_malformed_resume_is_invalid_session_resume_and_the_connection_stays() -> None:
    """A resume without a token is refused with invalid_session_resume; no store call."""
    core = new_core()
    core.receive_frame(frame("session.resume", session_id=SID))
    actions = core.actions_to_run()
    assert error_of(actions[0])["code"] == ErrorCode.INVALID_SESSION_RESUME
    assert len(actions) == 1
    assert core.state is ConnectionState.AWAITING_FIRST


# --------------------------------------------------------------------------- acks


def test_ack_beyond_delivered_is_invalid_event_ack() -> None:
    """Acknowledging an event never sent is refused; the session survives."""
    core = opened()
    core.receive_log_entries(1, hb(2))
    core.actions_to_run()
    core.receive_frame(frame("session.event_ack", server_event_seq=3, event_id="c_ack"))
    (action,) = core.actions_to_run()
    error = error_of(action)
    assert error["code"] == ErrorCode.INVALID_EVENT_ACK
    assert error["param"] == "server_event_seq"
    assert error["event_id"] == "c_ack"
    assert core.state is ConnectionState.ATTACHED


def test_ack_of_nothing_needs_no_action() -> None:
    """Acknowledging seq 0 decides nothing: there is nothing to trim."""
    core = opened()
    core.receive_frame(frame("session.event_ack", server_event_seq=0))
    assert core.actions_to_run() == []


@pytest.mark.parametrize("seq", [1, 2])
def test_valid_ack_trims_the_log_up_to_it_on_the_timer(seq: int) -> None:
    """Acknowledging delivered events lets the log drop them, and nothing else: once per timer
    for every ack since the last (the seed's client acks each event), not once per ack."""
    core = opened()
    core.receive_log_entries(1, hb(2))
    core.actions_to_run()
    core.receive_frame(frame("session.event_ack", server_event_seq=1))
    core.receive_frame(frame("session.event_ack", server_event_seq=seq))
    assert core.actions_to_run() == []
    core.timer_fired(core.next_deadline(), taken_seq=2)
    assert core.actions_to_run() == [TrimLog(upto_seq=seq)]
    core.timer_fired(core.next_deadline(), taken_seq=2)
    assert core.actions_to_run() == [], "nothing new acknowledged: nothing to trim"
    assert core.state is ConnectionState.ATTACHED


def test_ack_while_resuming_is_checked_but_trims_nothing() -> None:
    """Before the resume lands, an ack up to the client's seq is valid but has no lease to trim."""
    core = new_core()
    core.receive_frame(resume_frame(4))
    core.actions_to_run()
    core.receive_frame(frame("session.event_ack", server_event_seq=4))
    assert core.actions_to_run() == []
    core.receive_frame(frame("session.event_ack", server_event_seq=5))
    assert error_of(core.actions_to_run()[0])["code"] == ErrorCode.INVALID_EVENT_ACK


def test_ack_as_first_frame_opens_nothing() -> None:
    """An ack of nothing before any session neither opens one nor errs."""
    core = new_core()
    core.receive_frame(frame("session.event_ack", server_event_seq=0))
    assert core.actions_to_run() == []
    assert core.state is ConnectionState.AWAITING_FIRST


# --------------------------------------------------------------------------- lease and socket


def test_lease_moved_to_a_newer_generation_replaces_this_connection() -> None:
    """A higher generation elsewhere: session.replaced, close 1000, no detach, then silence."""
    core = opened(generation=2)
    core.lease_moved(3)
    actions = core.actions_to_run()
    assert kinds(actions) == [SendFrame, CloseConnection]
    (notice,) = sent(actions)
    assert notice == {"type": "session.replaced", "event_id": notice["event_id"],
                      "session_id": SID, "lease_generation": 2}
    assert actions[1] == CloseConnection(code=1000, reason="session_replaced")
    assert core.state is ConnectionState.CLOSED
    core.connection_lost()
    core.lease_moved(4)
    assert core.actions_to_run() == []


@pytest.mark.parametrize("generation", [1, 2])
def test_lease_moved_to_an_older_or_equal_generation_is_ignored(generation: int) -> None:
    """Our own or an older generation is no replacement."""
    core = opened(generation=2)
    core.lease_moved(generation)
    assert core.actions_to_run() == []
    assert core.state is ConnectionState.ATTACHED


def test_lease_moved_before_attach_is_ignored() -> None:
    """No lease held yet, nothing to replace."""
    core = new_core(autostart=True)
    core.actions_to_run()
    core.lease_moved(9)
    assert core.actions_to_run() == []
    assert core.state is ConnectionState.OPENING


def test_connection_lost_when_attached_detaches_exactly_once() -> None:
    """A dropped socket detaches the lease it served, once, so the session stays resumable."""
    core = opened(generation=5)
    core.connection_lost()
    assert core.actions_to_run() == [DetachLease(generation=5)]
    core.connection_lost()
    assert core.actions_to_run() == []
    assert core.state is ConnectionState.CLOSED


@pytest.mark.parametrize("autostart", [False, True])
def test_connection_lost_before_attach_detaches_nothing(autostart: bool) -> None:
    """No lease, no detach; queued commands are dropped."""
    core = new_core(autostart=autostart)
    core.receive_frame(COMMIT)
    core.actions_to_run()
    core.connection_lost()
    assert core.actions_to_run() == []
    assert core.state is ConnectionState.CLOSED


def test_frame_over_the_limit_closes_1009_and_detaches() -> None:
    """A too-large frame: event_too_large, close 1009, and the lease detached (resumable)."""
    core = ConnectionCore(max_frame_bytes=64)
    core.receive_frame(COMMIT)
    core.actions_to_run()
    core.open_succeeded(SID, resume_token=TOKEN, generation=2, model="loopback")
    core.actions_to_run()
    core.receive_frame(frame("input_audio_buffer.append", audio="A" * 100))
    actions = core.actions_to_run()
    assert kinds(actions) == [SendFrame, CloseConnection, DetachLease]
    assert error_of(actions[0])["code"] == ErrorCode.EVENT_TOO_LARGE
    assert actions[1:] == [CloseConnection(code=1009, reason="event_too_large"),
                           DetachLease(generation=2)]


def test_frame_over_the_limit_as_first_frame_closes_without_detach() -> None:
    """A too-large first frame closes 1009; there is no lease to detach."""
    core = ConnectionCore(max_frame_bytes=8)
    core.receive_frame(b"x" * 9)
    assert kinds(core.actions_to_run()) == [SendFrame, CloseConnection]
    assert core.state is ConnectionState.CLOSED


def test_invalid_utf8_text_answers_invalid_json_closes_1007_and_detaches() -> None:
    """A text frame that is not UTF-8 (RFC 6455 §8.1: fail the connection): invalid_json,
    close 1007, and the lease detached so the session can be resumed."""
    core = opened(generation=3)
    core.receive_invalid_text()
    actions = core.actions_to_run()
    assert kinds(actions) == [SendFrame, CloseConnection, DetachLease]
    error = error_of(actions[0])
    assert (error["code"], error["type"]) == (ErrorCode.INVALID_JSON, "invalid_request_error")
    assert "UTF-8" in error["message"]
    assert actions[1:] == [CloseConnection(code=CloseCode.INVALID_PAYLOAD_DATA,
                                           reason="invalid_json"), DetachLease(generation=3)]
    assert int(CloseCode.INVALID_PAYLOAD_DATA) == 1007
    assert core.state is ConnectionState.CLOSED


def test_invalid_utf8_text_as_first_frame_closes_1007_and_opens_nothing() -> None:
    """Before any session: the same answer and close; no session is placed."""
    core = new_core()
    core.receive_invalid_text()
    actions = core.actions_to_run()
    assert kinds(actions) == [SendFrame, CloseConnection]
    assert actions[1] == CloseConnection(code=1007, reason="invalid_json")
    assert core.state is ConnectionState.CLOSED


def test_invalid_utf8_text_while_opening_detaches_the_session_once_placed() -> None:
    """An open in flight when the bad text arrives lands on a closed connection: its lease is
    handed back (resumable), not left attached to no one."""
    core = new_core()
    core.receive_frame(UPDATE)
    core.receive_invalid_text()
    assert kinds(core.actions_to_run()) == [OpenSession, SendFrame, CloseConnection]
    core.open_succeeded(SID, resume_token=TOKEN, generation=1, model="loopback")
    assert core.actions_to_run() == [DetachLease(generation=1)]


def test_log_trimmed_past_the_next_entry_sends_a_resync_and_jumps() -> None:
    """A read that finds undelivered entries trimmed sends session.resync_required."""
    core = opened()
    core.receive_log_entries(1, hb(2))
    core.actions_to_run()
    core.log_trimmed(6)
    (notice,) = sent(core.actions_to_run())
    assert notice["type"] == "session.resync_required"
    assert notice["session_id"] == SID
    core.receive_log_entries(6, hb(2))
    assert seqs(core.actions_to_run()) == [6, 7]


@pytest.mark.parametrize("first_available", [0, 1, 2, 3])
def test_log_trimmed_at_or_below_the_next_entry_is_ignored(first_available: int) -> None:
    """A stale read's "trim" at or below the next entry is no gap: no resync, no duplicates."""
    core = opened()
    core.receive_log_entries(1, hb(2))
    core.actions_to_run()
    core.log_trimmed(first_available)
    assert core.actions_to_run() == []
    core.receive_log_entries(1, hb(4))
    assert seqs(core.actions_to_run()) == [3, 4]


def test_log_trimmed_before_attach_is_ignored() -> None:
    """No stream followed yet, nothing to resync."""
    core = new_core(autostart=True)
    core.actions_to_run()
    core.log_trimmed(5)
    assert core.actions_to_run() == []


def test_session_gone_reads_the_log_for_its_terminal_event() -> None:
    """A fenced write found the session closed: read the log, deliver the terminal, close."""
    core = opened()
    core.receive_log_entries(1, hb(1))
    core.actions_to_run()
    core.session_gone()
    assert core.actions_to_run() == [FetchLog(after_seq=1)]
    core.receive_log_entries(2, payloads(m.SessionClosed(reason="worker_lost")))
    assert kinds(core.actions_to_run()) == [SendFrame, CloseConnection]


def test_session_gone_before_attach_is_ignored() -> None:
    """Without a lease there is no log to read."""
    core = new_core(autostart=True)
    core.actions_to_run()
    core.session_gone()
    assert core.actions_to_run() == []


# --------------------------------------------------------------------------- after close


def _closed_core() -> ConnectionCore:
    core = opened(generation=2)
    core.connection_lost()
    core.actions_to_run()
    return core


@pytest.mark.parametrize("poke", [
    lambda c: c.receive_frame(COMMIT),
    lambda c: c.receive_frame("{bad"),
    lambda c: c.receive_frame("x" * (LIMIT + 1)),
    lambda c: c.receive_invalid_text(),
    lambda c: c.receive_frame(resume_frame()),
    lambda c: c.receive_log_entries(1, hb(3)),
    lambda c: c.lease_moved(9),
    lambda c: c.log_trimmed(9),
    lambda c: c.session_gone(),
    lambda c: c.connection_lost(),
    lambda c: c.fail(InternalError("late")),
    lambda c: c.resume_failed(ClientProtocolError(ErrorCode.INVALID_RESUME_TOKEN, "late")),
    lambda c: c.open_succeeded("sess_other", resume_token="t", generation=9, model="x"),
    lambda c: c.resume_succeeded("sess_other", resume_token="t", generation=9, last_client_seq=0,
                                 first_retained_seq=0, last_server_event_seq=0),
], ids=["command", "bad_json", "too_large", "invalid_text", "resume", "log", "lease_moved",
        "log_trimmed", "session_gone", "connection_lost", "fail", "resume_failed", "open_ok",
        "resume_ok"])
def test_every_input_after_close_is_ignored(poke: Any) -> None:
    """Once closed, no input decides anything."""
    core = _closed_core()
    poke(core)
    assert core.actions_to_run() == []
    assert core.state is ConnectionState.CLOSED
    assert (core.session_id, core.generation) == (SID, 2)


def test_open_that_lands_after_the_socket_dropped_is_detached() -> None:
    """An open answered after connection_lost hands its lease back instead of raising."""
    core = new_core(autostart=True)
    core.receive_frame(COMMIT)
    core.actions_to_run()
    core.connection_lost()
    assert core.actions_to_run() == []
    core.open_succeeded(SID, resume_token=TOKEN, generation=1, model="loopback")
    assert core.actions_to_run() == [DetachLease(generation=1)]
    assert core.state is ConnectionState.CLOSED


def test_resume_that_lands_after_a_1009_close_is_detached() -> None:
    """A resume answered after the connection closed detaches the new generation, once."""
    core = ConnectionCore(max_frame_bytes=200)
    core.receive_frame(resume_frame(3))
    core.receive_frame("x" * 201)
    assert kinds(core.actions_to_run()) == [ResumeSession, SendFrame, CloseConnection]
    core.resume_succeeded(SID, resume_token="t", generation=6, last_client_seq=0,
                          first_retained_seq=1, last_server_event_seq=9)
    assert core.actions_to_run() == [DetachLease(generation=6)]
    core.resume_succeeded(SID, resume_token="t", generation=7, last_client_seq=0,
                          first_retained_seq=1, last_server_event_seq=9)
    assert core.actions_to_run() == []


def test_a_failure_after_the_socket_dropped_sends_nothing() -> None:
    """A store failure reported after close adds no frame and no second close."""
    core = new_core(autostart=True)
    core.actions_to_run()
    core.connection_lost()
    core.fail(InternalError("placement failed"))
    assert core.actions_to_run() == []


def test_answering_an_open_twice_is_a_driver_bug() -> None:
    """A second attach answer on a live connection is an illegal transition, named as such."""
    core = opened()
    with pytest.raises(AssertionError, match="can't handle attached in state attached"):
        core.open_succeeded(SID, resume_token=TOKEN, generation=2, model="loopback")


def test_session_lost_closes_1011_without_detaching() -> None:
    """A session the store forgot (Redis data loss) ends with session_lost and close 1011."""
    core = new_core(autostart=True)
    core.actions_to_run()
    core.open_succeeded("sess_w000000000000." + "0" * 32, resume_token="t", generation=1,
                        model="m")
    core.actions_to_run()
    core.session_lost()
    actions = core.actions_to_run()
    assert isinstance(actions[0], SendFrame)
    assert json.loads(actions[0].text)["error"]["code"] == "session_lost"
    assert actions[1] == CloseConnection(code=1011, reason="session_lost")
    assert not any(isinstance(a, DetachLease) for a in actions)
    core.session_lost()
    assert core.actions_to_run() == []


def test_a_lapsed_attachment_closes_1012_without_a_detach() -> None:
    """Our own lease lapsed (a reaper detached the session under our generation): close 1012
    so the client resumes; the session is detached already, so no DetachLease."""
    core = opened(generation=3)
    core.lease_lapsed()
    assert core.actions_to_run() == [CloseConnection(code=1012, reason="lease_lapsed")]
    assert core.state is ConnectionState.CLOSED
    core.connection_lost()
    assert core.actions_to_run() == []
