"""Settings: environment variables, flags, errors, and the settings page agree with the code."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from duplex_gateway.logs import LogSettings
from gateway.settings import GatewaySettings
from inference_worker.settings import WorkerSettings
from runtime.config import (
    ENV_PREFIX,
    POSITIVE,
    POSITIVE_COUNT,
    SettingsError,
    documented_range,
    from_env,
)

SETTINGS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "settings.md"
# Every settings object a process reads; the settings page's table documents each field once.
SETTINGS_CLASSES = (GatewaySettings, WorkerSettings, LogSettings)


def test_environment_overrides_defaults_and_flags_override_environment() -> None:
    """DUPLEX_GATEWAY_* beats the default; an explicit (non-None) override beats both."""
    env = {"DUPLEX_GATEWAY_PORT": "9001", "DUPLEX_GATEWAY_API_KEYS": "a, b",
           "DUPLEX_GATEWAY_IDLE_TTL_S": "12.5"}
    settings = from_env(GatewaySettings, env, host=None)
    assert (settings.port, settings.api_keys, settings.idle_ttl_s) == (9001, ("a", "b"), 12.5)
    assert from_env(GatewaySettings, env, port=9002).port == 9002
    assert from_env(WorkerSettings, {"DUPLEX_GATEWAY_SLOTS": "3"}).slots == 3


@pytest.mark.parametrize(("name", "value"), [("PORT", "eighty"), ("PORT", "99999"),
                                             ("SLOTS", "1.5"), ("SLOTS", "0"),
                                             ("FIRST_MESSAGE_TIMEOUT_S", "nan"),
                                             ("IDLE_TTL_S", "inf"),
                                             ("TICK_BUDGET_FRACTION", "0"),
                                             ("TICK_BUDGET_FRACTION", "1.5"),
                                             ("METRICS_PORT", "70000"),
                                             ("REDIS_URL", "http://x"),
                                             ("REDIS_URL", "redis://"),
                                             ("BACKEND", "tensorrt"), ("DTYPE", "int8"),
                                             ("DISCONNECT_GRACE_S", "-1"), ("VAD", "webrtc"),
                                             ("OUTPUT_BACKPRESSURE_EVENTS", "-1"),
                                             ("OUTPUT_BACKPRESSURE_BYTES", "2MiB"),
                                             ("OUTPUT_STALL_TIMEOUT_S", "-0.5"),
                                             ("SOCKET_SEND_BUFFER_BYTES", "-4096"),
                                             ("INPUT_LOG_MAX_BYTES", "1024")])
def test_bad_values_name_the_variable(name: str, value: str) -> None:
    """A value that cannot be used is refused with the variable's name in the message."""
    worker_only = {"SLOTS", "VAD", "TICK_BUDGET_FRACTION", "METRICS_PORT", "BACKEND", "DTYPE"}
    cls = WorkerSettings if name in worker_only else GatewaySettings
    with pytest.raises(SettingsError, match=ENV_PREFIX + name):
        from_env(cls, {ENV_PREFIX + name: value})


def test_a_refusal_says_what_is_accepted_in_one_line() -> None:
    """The message names the variable with its value and the accepted range, on one line."""
    with pytest.raises(SettingsError) as refused:
        from_env(GatewaySettings, {"DUPLEX_GATEWAY_PORT": "99999"})
    assert str(refused.value) == "DUPLEX_GATEWAY_PORT=99999: expected an integer from 0 to 65535"


def test_a_flag_is_named_when_it_set_the_refused_value() -> None:
    """A refused flag value names the flag, not the variable."""
    with pytest.raises(SettingsError, match=r"^--metrics-port 70000: .*0 to 65535"):
        from_env(WorkerSettings, {}, metrics_port=70000)
    with pytest.raises(SettingsError, match=r"^--drain-timeout nan: "):
        from_env(WorkerSettings, {}, drain_timeout_s=float("nan"))


def test_a_flag_overrides_a_variable_that_would_be_refused() -> None:
    """Flags win: a bad variable the flag replaces is not read, so it is not fatal."""
    env = {"DUPLEX_GATEWAY_PORT": "99999", "DUPLEX_GATEWAY_REDIS_URL": "http://x"}
    settings = from_env(GatewaySettings, env, port=8001, redis_url="redis://127.0.0.1:1/0")
    assert (settings.port, settings.redis_url) == (8001, "redis://127.0.0.1:1/0")
    assert from_env(WorkerSettings, {"DUPLEX_GATEWAY_SLOTS": "0"}, slots=2).slots == 2


@pytest.mark.parametrize("url", ["redis://h:6379/0", "rediss://:secret@h:6380",
                                 "redis+sentinel://h:26379/mymaster",
                                 "redis+cluster://h:7000", "unix:///run/redis.sock"])
def test_every_redis_url_kind_is_accepted(url: str) -> None:
    """Each URL kind the store connects to passes the scheme check."""
    assert from_env(WorkerSettings, {"DUPLEX_GATEWAY_REDIS_URL": url}).redis_url == url


def test_a_refused_redis_url_is_shown_without_its_credentials() -> None:
    """A URL of the wrong kind is quoted by its scheme only: it may carry a password."""
    with pytest.raises(SettingsError) as refused:
        from_env(GatewaySettings, {"DUPLEX_GATEWAY_REDIS_URL": "http://user:hunter2@x"})
    assert "hunter2" not in str(refused.value) and "http://" in str(refused.value)


@pytest.mark.parametrize(("ttl", "accepted"), [(1.0, False), (0.5, False), (1.01, True)])
def test_heartbeat_ttl_must_exceed_the_interval(ttl: float, accepted: bool) -> None:
    """A TTL no longer than the heartbeat interval is refused, naming both variables."""
    env = {"DUPLEX_GATEWAY_HEARTBEAT_INTERVAL_S": "1.0", "DUPLEX_GATEWAY_HEARTBEAT_TTL_S": str(ttl)}
    if accepted:
        assert from_env(WorkerSettings, env).heartbeat_ttl_s == ttl
        return
    with pytest.raises(SettingsError, match=r"HEARTBEAT_TTL_S.*HEARTBEAT_INTERVAL_S"):
        from_env(WorkerSettings, env)


@pytest.mark.parametrize(("delay", "accepted"), [("0", True), ("9.9", True), ("10", False)])
def test_the_url_open_delay_must_be_under_the_first_message_timeout(delay: str,
                                                                     accepted: bool) -> None:
    """A quiet period as long as the first-message timeout would never open anything."""
    env = {"DUPLEX_GATEWAY_URL_OPEN_DELAY_S": delay}
    if accepted:
        assert from_env(GatewaySettings, env).url_open_delay_s == float(delay)
        return
    with pytest.raises(SettingsError, match=r"URL_OPEN_DELAY_S.*FIRST_MESSAGE_TIMEOUT_S"):
        from_env(GatewaySettings, env)


def test_served_model_names_are_model_names_each_once() -> None:
    """The worker's names: its own first; empty means its backend's name; a duplicate, a
    malformed name or too many are refused naming the flag."""
    assert WorkerSettings().models == ("loopback",)
    assert from_env(WorkerSettings, {"DUPLEX_GATEWAY_SERVED_MODEL_NAMES":
                                     "moshi, kyutai/moshiko-pytorch-bf16"}).models == (
        "moshi", "kyutai/moshiko-pytorch-bf16")
    for names in (("a", "a"), ("bad name",), tuple(f"m{i}" for i in range(17))):
        with pytest.raises(SettingsError, match="--served-model-name"):
            from_env(WorkerSettings, served_model_names=names)
    with pytest.raises(SettingsError, match="DUPLEX_GATEWAY_DEFAULT_MODEL"):
        from_env(GatewaySettings, {"DUPLEX_GATEWAY_DEFAULT_MODEL": "-x"})


@pytest.mark.parametrize("fraction", ["1", "0.01"])
def test_tick_budget_fraction_takes_its_bounds(fraction: str) -> None:
    """TICK_BUDGET_FRACTION takes 1 (the whole frame) and small fractions above 0."""
    env = {"DUPLEX_GATEWAY_TICK_BUDGET_FRACTION": fraction}
    assert from_env(WorkerSettings, env).tick_budget_fraction == float(fraction)


def test_directly_built_settings_are_checked_too() -> None:
    """A settings object built in code is held to the same ranges, naming the variable."""
    with pytest.raises(SettingsError, match="DUPLEX_GATEWAY_SLOTS=0"):
        WorkerSettings(slots=0)


@pytest.mark.parametrize("choice", ["auto", "silero", "energy"])
def test_worker_vad_takes_each_detector(choice: str) -> None:
    """The worker's turn detector is auto unless DUPLEX_GATEWAY_VAD names one of the three."""
    assert WorkerSettings().vad == "auto"
    assert from_env(WorkerSettings, {"DUPLEX_GATEWAY_VAD": choice}).vad == choice


def test_moshi_cuda_graphs_is_off_unless_asked_for_and_only_for_moshi() -> None:
    """MOSHI_CUDA_GRAPHS is off by default, read as a boolean, and refused, naming it and the
    backend, for a backend that has no CUDA graphs."""
    assert WorkerSettings().moshi_cuda_graphs is False
    env = {"DUPLEX_GATEWAY_MOSHI_CUDA_GRAPHS": "true", "DUPLEX_GATEWAY_BACKEND": "moshi"}
    assert from_env(WorkerSettings, env).moshi_cuda_graphs is True
    assert from_env(WorkerSettings, {}, backend="moshi", moshi_cuda_graphs=True).moshi_cuda_graphs
    with pytest.raises(SettingsError, match="DUPLEX_GATEWAY_MOSHI_CUDA_GRAPHS=maybe: expected"):
        from_env(WorkerSettings, {**env, "DUPLEX_GATEWAY_MOSHI_CUDA_GRAPHS": "maybe"})
    with pytest.raises(SettingsError, match=r"^DUPLEX_GATEWAY_MOSHI_CUDA_GRAPHS=true: only the"
                                            r" moshi backend .*DUPLEX_GATEWAY_BACKEND is fake$"):
        from_env(WorkerSettings, {**env, "DUPLEX_GATEWAY_BACKEND": "fake"})


# A row: variable, who uses it, default, meaning (the meaning has no "|" of its own).
_ROW = re.compile(r"^\| `(DUPLEX_GATEWAY_\w+)` \| [^|]+ \| `([^`]*)` \| (.*) \|$", re.MULTILINE)
# The parenthesized text a meaning ends with, where it ends with one.
_TRAILING = re.compile(r"\(([^()]*)\)$")


def documented_rows() -> dict[str, tuple[str, str]]:
    """The settings page's table: variable -> (default, meaning)."""
    rows = _ROW.findall(SETTINGS_PAGE.read_text())
    return {name: (default, meaning) for name, default, meaning in rows}


def range_mismatches(classes: Iterable[type[Any]], meanings: dict[str, str]) -> list[str]:
    """The variables whose documented meaning does not end with the range their field accepts.

    A field without a range must not end with a range some other field has: that is the text
    a range removed in code but not in the docs leaves behind.
    """
    fields = [f for cls in classes for f in dataclasses.fields(cls)]
    texts = {f.name: documented_range(f) for f in fields}
    known = {text for text in texts.values() if text is not None}
    wrong = []
    for f in fields:
        name, text = ENV_PREFIX + f.name.upper(), texts[f.name]
        trailing = _TRAILING.search(meanings.get(name, ""))
        ends_with = trailing.group(1) if trailing else None
        if (ends_with != text) if text is not None else (ends_with in known):
            wrong.append(name)
    return wrong


def test_settings_page_table_matches_the_settings() -> None:
    """Every field is in the settings page's table with its default, and nothing else is."""
    rows = {name: default for name, (default, _) in documented_rows().items()}
    expected: dict[str, str] = {}
    for cls in SETTINGS_CLASSES:
        for f in dataclasses.fields(cls):
            default = f.default
            shown = ",".join(default) or "(empty)" if isinstance(default, tuple) else str(default)
            expected[ENV_PREFIX + f.name.upper()] = shown
    assert rows == expected


def test_each_settings_row_ends_with_the_range_its_field_accepts() -> None:
    """A row's meaning ends with its field's range, as runtime.config words it, in parentheses."""
    meanings = {name: meaning for name, (_, meaning) in documented_rows().items()}
    assert range_mismatches(SETTINGS_CLASSES, meanings) == []


@dataclasses.dataclass(frozen=True)
class _Drifted:
    """One setting whose range the code changed: at least 1 where the docs say above 0."""

    slots: int = dataclasses.field(default=1, metadata={"accepts": POSITIVE_COUNT})
    idle_ttl_s: float = dataclasses.field(default=1.0, metadata={"accepts": POSITIVE})
    model_path: str = ""


@pytest.mark.parametrize(("meanings", "wrong"), [
    ({"DUPLEX_GATEWAY_SLOTS": "sessions (above 0)", "DUPLEX_GATEWAY_IDLE_TTL_S": "s (above 0)"},
     ["DUPLEX_GATEWAY_SLOTS"]),
    ({"DUPLEX_GATEWAY_SLOTS": "sessions", "DUPLEX_GATEWAY_IDLE_TTL_S": "s (above 0)"},
     ["DUPLEX_GATEWAY_SLOTS"]),
    ({"DUPLEX_GATEWAY_SLOTS": "(at least 1)", "DUPLEX_GATEWAY_IDLE_TTL_S": "(above 0)",
      "DUPLEX_GATEWAY_MODEL_PATH": "weights (above 0)"}, ["DUPLEX_GATEWAY_MODEL_PATH"]),
    ({"DUPLEX_GATEWAY_SLOTS": "(at least 1)", "DUPLEX_GATEWAY_IDLE_TTL_S": "(above 0)",
      "DUPLEX_GATEWAY_MODEL_PATH": "weights (a directory)"}, []),
])
def test_a_range_changed_in_code_but_not_in_the_docs_is_found(meanings: dict[str, str],
                                                                 wrong: list[str]) -> None:
    """A stale, missing or leftover range text is reported; a free field's own note is not."""
    assert range_mismatches([_Drifted], meanings) == wrong


@pytest.mark.parametrize("address", ["127.0.0.1", "0.0.0.0", "::", "::1", "localhost",
                                     "gateway-1.example.internal", "example.com."])
def test_a_bind_address_may_be_an_ip_literal_or_a_host_name(address: str) -> None:
    """HOST and METRICS_HOST take IPv4 and IPv6 literals and host names."""
    assert from_env(GatewaySettings, {"DUPLEX_GATEWAY_HOST": address}).host == address
    assert from_env(WorkerSettings, {}, metrics_host=address).metrics_host == address


@pytest.mark.parametrize("address", ["", " ", "local host", "http://127.0.0.1",
                                     "1.2.3.4:80", "[::1]", "999.1.1.1", "-gw.example",
                                     "gw_1", "a" * 64])
def test_a_bind_address_that_is_not_one_is_refused_in_one_line(address: str) -> None:
    """An empty value, spaces, a URL, a port suffix or a malformed name is refused, named."""
    with pytest.raises(SettingsError) as refused:
        from_env(GatewaySettings, {"DUPLEX_GATEWAY_HOST": address})
    message = str(refused.value)
    assert message.startswith("DUPLEX_GATEWAY_HOST=") and "\n" not in message
    assert message.endswith("expected an IPv4 or IPv6 address, or a host name (letters,"
                            " digits, hyphens, dots), without a port")
    with pytest.raises(SettingsError, match=r"^--metrics-host "):
        from_env(WorkerSettings, {}, metrics_host=address)


def test_input_log_max_bytes_may_be_zero_below_the_frame_limit() -> None:
    """0 turns the input byte limit off, so it is not held to at least MAX_FRAME_BYTES."""
    env = {"DUPLEX_GATEWAY_INPUT_LOG_MAX_BYTES": "0", "DUPLEX_GATEWAY_MAX_FRAME_BYTES": "4096"}
    assert from_env(GatewaySettings, env).input_log_max_bytes == 0
    with pytest.raises(SettingsError) as refused:
        from_env(GatewaySettings, {**env, "DUPLEX_GATEWAY_INPUT_LOG_MAX_BYTES": "4095"})
    assert str(refused.value) == ("DUPLEX_GATEWAY_INPUT_LOG_MAX_BYTES=4095: expected at least"
                                  " DUPLEX_GATEWAY_MAX_FRAME_BYTES (4096), or 0")
