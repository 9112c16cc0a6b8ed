"""Settings: environment variables, flags, errors, and the README table agree with the code."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from gateway.settings import GatewaySettings
from inference_worker.settings import WorkerSettings
from store.config import ENV_PREFIX, SettingsError, from_env

README = Path(__file__).resolve().parent.parent / "README.md"


def test_environment_overrides_defaults_and_flags_override_environment() -> None:
    """DUPLEX_GATEWAY_* beats the default; an explicit (non-None) override beats both."""
    env = {"DUPLEX_GATEWAY_PORT": "9001", "DUPLEX_GATEWAY_API_KEYS": "a, b",
           "DUPLEX_GATEWAY_IDLE_TTL_S": "12.5"}
    settings = from_env(GatewaySettings, env, host=None)
    assert (settings.port, settings.api_keys, settings.idle_ttl_s) == (9001, ("a", "b"), 12.5)
    assert from_env(GatewaySettings, env, port=9002).port == 9002
    assert from_env(WorkerSettings, {"DUPLEX_GATEWAY_SLOTS": "3"}).slots == 3


@pytest.mark.parametrize(("name", "value"), [("PORT", "eighty"), ("SLOTS", "1.5"),
                                             ("DISCONNECT_GRACE_S", "-1"), ("VAD", "webrtc"),
                                             ("OUTPUT_BACKPRESSURE_EVENTS", "-1"),
                                             ("OUTPUT_BACKPRESSURE_BYTES", "2MiB"),
                                             ("OUTPUT_STALL_TIMEOUT_S", "-0.5"),
                                             ("SOCKET_SEND_BUFFER_BYTES", "-4096"),
                                             ("INPUT_LOG_MAX_BYTES", "1024")])
def test_bad_values_name_the_variable(name: str, value: str) -> None:
    """A value that cannot be used is refused with the variable's name in the message."""
    cls = WorkerSettings if name in {"SLOTS", "VAD"} else GatewaySettings
    with pytest.raises(SettingsError, match=ENV_PREFIX + name):
        from_env(cls, {ENV_PREFIX + name: value})


@pytest.mark.parametrize("choice", ["auto", "silero", "energy"])
def test_worker_vad_takes_each_detector(choice: str) -> None:
    """The worker's turn detector is auto unless DUPLEX_GATEWAY_VAD names one of the three."""
    assert WorkerSettings().vad == "auto"
    assert from_env(WorkerSettings, {"DUPLEX_GATEWAY_VAD": choice}).vad == choice


def test_readme_table_matches_the_settings() -> None:
    """Every field is in the README's table with its default, and nothing else is."""
    rows = dict(re.findall(r"^\| `(DUPLEX_GATEWAY_\w+)` \| [^|]+ \| `([^`]*)` \|",
                           README.read_text(), re.MULTILINE))
    expected: dict[str, str] = {}
    for cls in (GatewaySettings, WorkerSettings):
        for f in dataclasses.fields(cls):
            default = f.default
            shown = ",".join(default) or "(empty)" if isinstance(default, tuple) else str(default)
            expected[ENV_PREFIX + f.name.upper()] = shown
    assert rows == expected
