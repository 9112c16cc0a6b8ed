"""Client values the worker does not trust: nesting, close reasons, quoted values, in both
runners (the loopback's ConversationCore and the frame backends' ConversationCore)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contract import messages as msg
from contract.messages import decode_command, encode_message
from inference_worker.backends.registry import frame_core, loopback_core
from inference_worker.conversation.core import ConversationCore
from inference_worker.untrusted import (
    MAX_CLOSE_REASON_BYTES,
    MAX_SESSION_DEPTH,
    close_reason,
    describe,
    nests_deeper_than,
)

T0 = 100.0
Runner = ConversationCore


def nested_objects(depth: int) -> Any:
    """``depth`` objects, each inside the one before (built without recursion)."""
    value: Any = {}
    for _ in range(depth - 1):
        value = {"properties": value}
    return value


def nested_arrays(depth: int) -> Any:
    """``depth`` arrays, each inside the one before."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def tools_nesting(parameters: Any) -> dict[str, Any]:
    """A session patch with one function tool whose ``parameters`` is the given value; the
    patch nests 3 levels above it (session object, tools array, tool object)."""
    return {"tools": [{"type": "function", "name": "f", "parameters": parameters}]}


def through_the_log(command: msg.Command) -> msg.Command:
    """The command as the worker gets it: encoded into an input entry and decoded again."""
    return decode_command(encode_message(command))


def runners() -> list[Runner]:
    """One runner of each kind."""
    return [loopback_core("sess_a"),
            frame_core("sess_a", model="fake", frame_seconds=0.08)]


@pytest.fixture(params=["loopback", "duplex"])
def runner(request: pytest.FixtureRequest) -> Runner:
    """A fresh runner of each kind in turn."""
    loopback, duplex = runners()
    return loopback if request.param == "loopback" else duplex


# ------------------------------------------------------------------------- the rules


def test_nesting_is_measured_exactly_at_the_limit() -> None:
    """Depth counts every object and array on the deepest path, the outer one included."""
    assert not nests_deeper_than(nested_objects(5), 5)
    assert nests_deeper_than(nested_objects(6), 5)
    assert not nests_deeper_than(nested_arrays(5), 5)
    assert nests_deeper_than(nested_arrays(6), 5)
    assert not nests_deeper_than({"a": [1, {"b": "x"}], "c": 2}, 3)
    assert nests_deeper_than({"a": [1, {"b": []}]}, 3)
    assert not nests_deeper_than("scalar", 0)


def test_nesting_far_past_the_recursion_limit_is_measured() -> None:
    """A value deeper than Python could recurse through is measured, not a RecursionError."""
    assert nests_deeper_than(nested_arrays(200_000), MAX_SESSION_DEPTH)


@pytest.mark.parametrize("reason", ["client_close", "user hung up", "fin \u00e9t\u00e9 \u2603",
                                    "x" * MAX_CLOSE_REASON_BYTES])
def test_a_sendable_close_reason_is_kept(reason: str) -> None:
    """A short valid UTF-8 string is the reason the session ends with."""
    assert close_reason(reason) == reason


@pytest.mark.parametrize("reason", ["a\ud800b", "\udfff", "", "x" * (MAX_CLOSE_REASON_BYTES + 1),
                                    "\u00e9" * (MAX_CLOSE_REASON_BYTES // 2 + 1), None, 7,
                                    ["bye"], {"r": "bye"}])
def test_an_unsendable_close_reason_becomes_client_close(reason: Any) -> None:
    """Lone surrogates, an empty or overlong string, or no string at all: client_close."""
    assert close_reason(reason) == "client_close"


def test_a_described_value_is_short_whatever_its_size_or_depth() -> None:
    """Quoting a client value in a message costs a few dozen characters, never its size."""
    for value in (nested_arrays(100_000), nested_objects(100_000), "x" * 10_000_000,
                  list(range(1_000_000))):
        assert len(describe(value)) < 200
    assert describe("voice") == "'voice'"


# ------------------------------------------------------------------------- in the runners


@pytest.mark.parametrize("poison", [nested_objects(500), nested_arrays(600)],
                         ids=["500 objects", "600 arrays"])
def test_a_deeply_nested_update_is_refused_and_changes_nothing(runner: Runner,
                                                               poison: Any) -> None:
    """session.update whose tools nest hundreds of levels: error invalid_value, the session
    object unchanged, and the runner serves the next update."""
    before = runner.session
    runner.receive(through_the_log(msg.UpdateSession(session=tools_nesting(poison),
                                                     event_id="evt_deep")), T0)
    [error] = runner.events_to_send()
    assert isinstance(error, msg.ErrorEvent)
    assert (error.code, error.param, error.client_event_id) == (
        "invalid_value", "session", "evt_deep")
    assert str(MAX_SESSION_DEPTH) in error.message
    assert runner.session == before
    runner.receive(msg.UpdateSession(session={"instructions": "after"}), T0)
    [updated] = runner.events_to_send()
    assert isinstance(updated, msg.SessionUpdated)
    assert updated.session["instructions"] == "after"
    json.dumps(updated.session)  # still encodable: nothing deep got in


def test_nesting_up_to_the_limit_is_accepted(runner: Runner) -> None:
    """A tool schema that brings the patch exactly to the limit applies; one level more is
    refused."""
    fits = tools_nesting(nested_objects(MAX_SESSION_DEPTH - 3))
    runner.receive(msg.UpdateSession(session=fits), T0)
    [updated] = runner.events_to_send()
    assert isinstance(updated, msg.SessionUpdated)
    assert updated.session["tools"] == fits["tools"]
    runner.receive(msg.UpdateSession(
        session=tools_nesting(nested_objects(MAX_SESSION_DEPTH - 2))), T0)
    [error] = runner.events_to_send()
    assert isinstance(error, msg.ErrorEvent) and error.code == "invalid_value"


def test_a_refusal_quotes_a_huge_value_briefly(runner: Runner) -> None:
    """A wrong value of many megabytes is refused with a short message."""
    runner.receive(msg.UpdateSession(session={"instructions": ["x" * 100_000] * 100}), T0)
    [error] = runner.events_to_send()
    assert isinstance(error, msg.ErrorEvent) and error.param == "session.instructions"
    assert len(error.message) < 300


@pytest.mark.parametrize("reason", ["a\ud800b", "x" * 1000, ""])
def test_an_unsendable_close_reason_ends_the_session_client_close(runner: Runner,
                                                                 reason: str) -> None:
    """session.close with a lone surrogate (or an overlong or empty reason) still ends the
    session, with client_close: the reason the store writes back is always encodable."""
    runner.receive(through_the_log(msg.CloseSession(reason=reason)), T0)
    assert runner.close_requested == "client_close"
    runner.receive(msg.CloseSession(reason="later"), T0)  # ignored: the session is ending
    assert runner.close_requested == "client_close"


def test_a_sendable_close_reason_is_what_the_session_ends_with(runner: Runner) -> None:
    """A normal reason is passed on unchanged."""
    runner.receive(msg.CloseSession(reason="user hung up"), T0)
    assert runner.close_requested == "user hung up"


@pytest.mark.parametrize("response", [[1, 2], "audio", 5])
def test_a_response_create_that_is_not_an_object_is_refused(runner: Runner,
                                                            response: Any) -> None:
    """response.create whose response is not an object: error invalid_type, no response."""
    runner.receive(msg.CreateResponse(response=response, event_id="evt_r"), T0)
    [error] = runner.events_to_send()
    assert isinstance(error, msg.ErrorEvent)
    assert (error.code, error.param, error.client_event_id) == ("invalid_type", "response",
                                                                "evt_r")
