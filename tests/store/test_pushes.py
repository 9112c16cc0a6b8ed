"""store.pushes: every push shape the scripts publish decodes to its type, and anything else
is refused with PushDecodeError alone (the subscriber then tells its handlers to read the log).
The pushes the real scripts publish are decoded in tests/store/test_pubsub.py."""

from __future__ import annotations

from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest

from store.logs import InputEntry, WriteToken
from store.pushes import (
    InputBatch,
    InputPushed,
    LeaseMoved,
    OutputPushed,
    Push,
    PushDecodeError,
    SessionEnded,
    SessionPlaced,
    decode_push,
)


def packed(push: list[Any]) -> bytes:
    data: bytes = msgpack.packb(push)
    return data


@pytest.mark.parametrize(("push", "decoded"), [
    ([b"e", 3, [b"a", b"b"]], OutputPushed(3, [b"a", b"b"])),
    ([b"r", 4], LeaseMoved(4)),
    ([b"i", b"s1", 7, [b"x"], b"ep", 2], InputPushed("s1", 7, [b"x"], WriteToken("ep", 2))),
    ([b"i", b"s1", 7, [b"x"]], InputPushed("s1", 7, [b"x"], None)),
    ([b"I", b"s1", [[b"s1", 1, [b"x"], b"ep", 2], [b"s2", 5, [b"y", b"z"], b"ep", 3]]],
     InputBatch((InputPushed("s1", 1, [b"x"], WriteToken("ep", 2)),
                 InputPushed("s2", 5, [b"y", b"z"], WriteToken("ep", 3))))),
    ([b"o", b"s1"], SessionPlaced("s1")),
    ([b"c", b"s1"], SessionEnded("s1")),
])
def test_every_script_shape_decodes_to_its_type(push: list[Any], decoded: Push) -> None:
    assert decode_push(packed(push)) == decoded


def test_an_input_push_names_its_entries_under_its_token() -> None:
    token = WriteToken("ep", 2)
    pushed = InputPushed("s1", 7, [b"x", b"y"], token)
    assert pushed.entries() == [InputEntry(7, b"x", token), InputEntry(8, b"y", token)]


@pytest.mark.parametrize("push", [
    [], [b"e"], [b"e", b"x", []], [b"e", 1, 5], [b"e", 1, [7]], [b"r"], [b"r", b"x"],
    [b"i"], [b"i", b"sess_x", b"not-a-number", []], [b"i", b"s", 1, [b"x"], b"\xff", 1],
    [b"o"], [b"o", 5], [b"c", b"\xff"], [None, 1], [b"z", 1], [b"I", b"s", [[b"s"]]], {"a": 1}, 5,
])
def test_anything_else_is_refused_as_malformed(push: Any) -> None:
    with pytest.raises(PushDecodeError):
        decode_push(packed(push))


@pytest.mark.parametrize("data", [b"\xc1", b"\x01\x02", b""])
def test_bytes_that_are_no_single_messagepack_value_are_refused(data: bytes) -> None:
    with pytest.raises(PushDecodeError):
        decode_push(data)
