"""The log codec: whatever JSON a command or event carries comes back equal.

encode_message writes the header with orjson where orjson's bytes read back the same, and with
the standard library where they would not (an integer beyond 64 bits, a lone surrogate, NaN and
the infinities, which orjson writes as ``null``): these tests pin both writers to one reader.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from contract.messages import (
    AppendAudio,
    MessageDecodeError,
    UpdateSession,
    decode_message,
    encode_message,
    load_header,
)

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()  # far past 64 bits too
    | st.floats(allow_nan=False)  # the infinities included
    | st.text()  # lone surrogates included
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None, database=None)
@given(session=st.dictionaries(st.text(), _JSON, max_size=6), event_id=st.none() | st.text())
def test_any_json_header_round_trips(session: dict[str, Any], event_id: str | None) -> None:
    message = UpdateSession(session=session, event_id=event_id)
    assert decode_message(encode_message(message)) == message


@pytest.mark.parametrize("value", [
    2**64, -(2**63) - 1, 10**40,  # orjson refuses them; read back as floats they would change
    "\ud800",  # a lone surrogate (the standard library's json reads one from "\\ud800")
    math.inf, -math.inf,  # orjson would write null
    {"nested": None},  # a null the header keeps: written by the standard library
    "h\u00e9llo \u4f60\u597d \U0001f600",  # orjson's UTF-8, not the standard library's escapes
])
def test_values_orjson_cannot_write_as_json_reads_them_round_trip(value: Any) -> None:
    message = UpdateSession(session={"v": value})
    decoded = decode_message(encode_message(message))
    assert decoded == message
    assert isinstance(decoded, UpdateSession)
    assert type(decoded.session["v"]) is type(value)


def test_nan_survives_as_nan() -> None:
    decoded = decode_message(encode_message(UpdateSession(session={"v": math.nan})))
    assert isinstance(decoded, UpdateSession)
    assert math.isnan(decoded.session["v"])


def test_a_value_json_cannot_carry_is_refused_as_before() -> None:
    @dataclasses.dataclass
    class NotJson:
        x: int = 1

    for value in (NotJson(), b"raw", {1, 2}):
        with pytest.raises(TypeError):
            encode_message(UpdateSession(session={"v": value}))


def test_audio_stays_raw_bytes_after_the_header() -> None:
    audio = bytes(range(256)) * 4
    data = encode_message(AppendAudio(audio=audio))
    assert data.endswith(b"\0" + audio)
    assert decode_message(data) == AppendAudio(audio=audio)


def test_a_corrupt_header_is_a_decode_error() -> None:
    for data in (b'{"k":"update"', b"no separator", b'{"k":"nope"}\0', b"\xff\xfe\0"):
        with pytest.raises(MessageDecodeError):
            decode_message(data)


def same_json(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (``2**64 == float(2**64)``), NaN alike."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def outcome(load: Any, text: bytes) -> tuple[str, Any]:
    try:
        return "value", load(text)
    except (ValueError, RecursionError) as exc:
        return "error", type(exc)


_NAN_TOO = st.recursive(
    _SCALARS | st.floats() | st.integers(min_value=-(2**70), max_value=2**70),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, database=None)
@given(value=_NAN_TOO, ascii_only=st.booleans())
def test_load_header_reads_what_the_standard_library_reads(value: Any,
                                                            ascii_only: bool) -> None:
    """Whatever either writer wrote (integers past 64 bits, NaN, lone surrogates included),
    the fast reader returns the standard library's value, types and all."""
    text = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    expected, got = outcome(json.loads, text), outcome(load_header, text)
    assert expected[0] == got[0]
    assert same_json(expected[1], got[1]) if expected[0] == "value" else expected == got


@settings(max_examples=300, deadline=None, database=None)
@given(text=st.one_of(
    st.binary(max_size=40),
    st.text(alphabet='{}[]",:0123456789.eE+-tfnrul \\u', max_size=40).map(str.encode)))
def test_load_header_fails_where_the_standard_library_fails(text: bytes) -> None:
    """Not JSON (or not UTF-8) to one is not JSON to the other, and valid text reads alike."""
    expected, got = outcome(json.loads, text), outcome(load_header, text)
    assert expected[0] == got[0]
    if expected[0] == "value":
        assert same_json(expected[1], got[1])


@pytest.mark.parametrize("text", [
    b"18446744073709551616", b"-9223372036854775809", b"[123456789012345678901234567890]",
    b'{"a":1e400}', b"NaN", b'"\\ud800"', b"[" * 2000 + b"]" * 2000,
])
def test_load_header_where_orjson_alone_would_differ(text: bytes) -> None:
    expected, got = outcome(json.loads, text), outcome(load_header, text)
    assert expected[0] == got[0]
    assert same_json(expected[1], got[1]) if expected[0] == "value" else expected == got
