"""The connection core's policy that its driver only feeds: log reads and where the log ends,
the input log's numbering, the retention timer, the store's resume answers, an input refusal.
(The hypothesis machine drives them too: tests/gateway/test_connection_props.py.)"""

from __future__ import annotations

import pytest

from contract.follower import REWIND_WINDOW
from contract.reasons import CloseReason
from gateway.protocol.actions import (
    CheckLogEnd,
    CloseConnection,
    EndSession,
    FetchLog,
    SendFrame,
    TrimLog,
)
from gateway.protocol.connection import ConnectionCore
from gateway.protocol.errors import CloseCode, ErrorCode
from gateway.protocol.resume import ResumeAnswer, rotated_token
from gateway.protocol.retention import TIMER_S
from gateway.protocol.transitions import ConnectionState
from store.answers import ResumeStatus
from tests.gateway.test_connection_core import (
    LIMIT,
    SID,
    TOKEN,
    error_of,
    hb,
    kinds,
    new_core,
    opened,
    resume_frame,
    sent,
    seqs,
)


def rows(first: int, count: int) -> list[tuple[int, bytes]]:
    return [(first + offset, entry) for offset, entry in enumerate(hb(count))]


# --------------------------------------------------------------------------- log reads


def test_a_read_delivers_and_a_read_past_a_trim_says_so() -> None:
    core = opened()
    core.log_read(0, rows(1, 2))
    assert seqs(core.actions_to_run()) == [1, 2]
    core.log_read(2, rows(5, 1))
    frames = sent(core.actions_to_run())
    assert [(f["type"], f.get("reason")) for f in frames] == [
        ("session.resync_required", "log_trimmed"), ("session.heartbeat_ack", None)]
    assert core.delivered_seq == 5


def test_only_a_quiet_poll_that_finds_nothing_checks_where_the_log_ends() -> None:
    core = opened()
    core.log_read(0, rows(1, 3))
    core.actions_to_run()
    core.log_read(3, [])
    assert core.actions_to_run() == []
    core.log_read(3, [], quiet=True)
    assert core.actions_to_run() == [CheckLogEnd(after_seq=3)]
    core.log_read(0, [], quiet=True)  # nothing delivered: nothing can have gone back
    assert core.actions_to_run() == []


def test_a_log_that_ends_behind_what_was_delivered_is_read_again_around_its_end() -> None:
    core = opened()
    core.log_read(0, rows(1, 6))
    core.actions_to_run()
    core.log_end_read(6, 6)
    assert core.actions_to_run() == []
    core.log_end_read(6, 4)
    assert core.actions_to_run() == [FetchLog(after_seq=0, rewound_to=4)]
    core.log_end_read(6, REWIND_WINDOW + 3)  # (only behind counts; this is not)
    assert core.actions_to_run() == []


def test_the_re_read_of_a_rewound_log_resumes_at_its_end_and_says_so() -> None:
    core = opened()
    core.log_read(0, rows(1, 6))
    core.actions_to_run()
    core.log_read(0, rows(1, 4), rewound_to=4)  # the same entries: no difference found
    frames = sent(core.actions_to_run())
    assert [(f["type"], f["reason"], f["replay_from"]) for f in frames] == [
        ("session.resync_required", "log_rewound", 5)]
    assert core.delivered_seq == 4


# --------------------------------------------------------------------------- the input log


def test_input_numbers_that_only_grow_decide_nothing() -> None:
    core = opened()
    core.input_appended(1, 3)
    core.input_appended(4, 4)
    core.input_appended(5, 4)  # every command a duplicate: nothing new numbered
    assert core.actions_to_run() == []


def test_an_input_log_that_went_back_ends_the_session_and_reads_its_terminal_event() -> None:
    core = opened()
    core.input_appended(1, 3)
    core.input_appended(3, 3)
    assert core.actions_to_run() == [
        EndSession(session_id=SID, reason=CloseReason.LOG_REWOUND), FetchLog(after_seq=0)]
    assert core.state is ConnectionState.ATTACHED  # until the terminal event is delivered


def test_input_numbers_before_a_session_end_nothing() -> None:
    core = new_core()
    core.input_appended(1, 1)
    core.input_appended(1, 1)
    assert core.actions_to_run() == []


# --------------------------------------------------------------------------- the timer


def retained(retention_s: float) -> ConnectionCore:
    core = ConnectionCore(max_frame_bytes=LIMIT, url_model="loopback",
                          delivered_retention_s=retention_s, now=100.0)
    core.quiet_period_over()
    core.open_succeeded(SID, resume_token=TOKEN, generation=1, model="loopback")
    core.actions_to_run()
    return core


def test_the_timer_trims_what_was_taken_the_retention_ago_once() -> None:
    core = retained(2.0)
    assert core.next_deadline() == 100.0 + TIMER_S
    trims = []
    for now, taken in [(101.0, 3), (102.0, 5), (103.0, 5), (104.0, 9), (105.0, 9)]:
        core.timer_fired(now, taken_seq=taken)
        assert core.next_deadline() == now + TIMER_S
        trims.append(core.actions_to_run())
    assert trims == [[], [], [TrimLog(upto_seq=3)], [TrimLog(upto_seq=5)], []]


def test_no_retention_never_trims_and_a_detached_connection_neither() -> None:
    core = retained(0.0)
    for now in (101.0, 102.0, 103.0):
        core.timer_fired(now, taken_seq=4)
    assert core.actions_to_run() == []
    core = retained(1.0)
    core.connection_lost()
    core.actions_to_run()
    for now in (101.0, 102.0, 103.0):
        core.timer_fired(now, taken_seq=4)
    assert core.actions_to_run() == []


# --------------------------------------------------------------------------- resume answers


def resuming() -> ConnectionCore:
    core = new_core()
    core.receive_frame(resume_frame(0, event_id="c_res"))
    core.actions_to_run()
    return core


@pytest.mark.parametrize(("answer", "code"), [
    (ResumeAnswer(outcome=ResumeStatus.UNKNOWN), ErrorCode.SESSION_RESUME_EXPIRED),
    (ResumeAnswer(outcome=ResumeStatus.STALE), ErrorCode.SESSION_RESUME_CONFLICT),
    (ResumeAnswer(outcome=ResumeStatus.BAD_TOKEN), ErrorCode.INVALID_RESUME_TOKEN),
    (ResumeAnswer(outcome=ResumeStatus.OK), ErrorCode.INVALID_RESUME_TOKEN),  # no lease
])
def test_each_refusing_answer_is_its_error_and_a_close(answer: ResumeAnswer,
                                                       code: ErrorCode) -> None:
    core = resuming()
    assert core.resume_answered(answer, rotated_token="tok_new") == code.value
    actions = core.actions_to_run()
    assert kinds(actions) == [SendFrame, CloseConnection]
    error = error_of(actions[0])
    assert (error["code"], error["event_id"]) == (code.value, "c_res")
    assert actions[1] == CloseConnection(code=CloseCode.POLICY_VIOLATION, reason=code.value)
    assert core.state is ConnectionState.CLOSED


@pytest.mark.parametrize(("outcome", "token"), [(ResumeStatus.OK, "tok_new"),
                                                (ResumeStatus.CLOSED, TOKEN)])
def test_an_attaching_answer_announces_the_token_the_store_holds(outcome: ResumeStatus,
                                                                 token: str) -> None:
    core = resuming()
    answer = ResumeAnswer(outcome=outcome, generation=3, last_client_seq=2,
                          first_retained_seq=1, last_server_event_seq=0)
    assert core.resume_answered(answer, rotated_token="tok_new") == "ok"
    resumed = sent(core.actions_to_run())[0]
    assert (resumed["type"], resumed["resume_token"], resumed["lease_generation"]) == (
        "session.resumed", token, 3)
    assert core.state is ConnectionState.ATTACHED


def test_the_rotated_token_is_the_same_for_a_retry_and_secret_to_the_old_token() -> None:
    first = rotated_token("old", "ctl_1")
    assert rotated_token("old", "ctl_1") == first
    assert len({first, rotated_token("old", "ctl_2"), rotated_token("other", "ctl_1")}) == 3
    assert "=" not in first and "old" not in first


# --------------------------------------------------------------------------- input refused


def test_an_input_refusal_names_the_commands_and_closes_1013() -> None:
    core = opened()
    core.input_refused(3, "c_7")
    actions = core.actions_to_run()
    error = error_of(actions[0])
    assert (error["code"], error["event_id"]) == (ErrorCode.INPUT_BACKPRESSURE.value, "c_7")
    assert "3 command(s) starting with event c_7 were not taken" in error["message"]
    assert CloseCode.TRY_AGAIN_LATER in [a.code for a in actions if isinstance(a, CloseConnection)]
