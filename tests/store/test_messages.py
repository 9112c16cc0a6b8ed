"""The log codec: whatever JSON a command or event carries comes back equal.

encode_message writes the header with orjson where orjson's bytes read back the same, and with
the standard library where they would not (an integer beyond 64 bits, a lone surrogate, NaN and
the infinities, which orjson writes as ``null``): these tests pin both writers to one reader.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from store.messages import (
    AppendAudio,
    MessageDecodeError,
    UpdateSession,
    decode_message,
    encode_message,
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
