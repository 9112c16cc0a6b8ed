"""The backend table: every backend is one entry, and callers ask it instead of names."""

from __future__ import annotations

import pytest

from contract import messages as msg
from inference_worker.backends.fake import FakeBackend
from inference_worker.backends.registry import (
    BACKENDS,
    CASCADE_TURN_DETECTION,
    FRAME_BACKENDS,
    REGISTRY,
    BackendRequest,
    TurnMode,
    backend_entry,
    create_backend,
    explicit_turns,
    frame_core,
)
from inference_worker.conversation.profiles import GA_TURN_DETECTION, PCM_FORMAT, default_session


def test_the_table_names_every_backend_with_its_turn_mode() -> None:
    """Five backends; only loopback has no frames; only the cascade signals its own turns."""
    assert BACKENDS == ("loopback", "fake", "moshi", "cascade", "recording")
    assert FRAME_BACKENDS == ("fake", "moshi", "cascade", "recording")
    assert {name: entry.turns for name, entry in REGISTRY.items()} == {
        "loopback": TurnMode.LOOPBACK, "fake": TurnMode.AUDIO, "moshi": TurnMode.AUDIO,
        "cascade": TurnMode.EVENTS, "recording": TurnMode.AUDIO}
    assert [name for name in BACKENDS if explicit_turns(name)] == ["cascade"]
    assert [name for name in BACKENDS if backend_entry(name).needs_model_path] == ["moshi"]


def test_an_unknown_name_is_refused_with_the_names_that_exist() -> None:
    """A typo is a ValueError that lists every backend."""
    with pytest.raises(ValueError, match="unknown backend 'mosh'; available: loopback, fake"):
        backend_entry("mosh")
    with pytest.raises(ValueError, match="unknown backend"):
        create_backend(BackendRequest(name="mosh", slots=1))


def test_loopback_is_not_built_and_a_frame_backend_is() -> None:
    """Loopback has nothing to load; the fake frame backend loads from its entry."""
    with pytest.raises(ValueError, match="has no frames"):
        create_backend(BackendRequest(name="loopback", slots=1))
    backend = create_backend(BackendRequest(name="fake", slots=2))
    assert isinstance(backend, FakeBackend)


def test_moshi_without_weights_says_where_to_put_them() -> None:
    """The moshi entry refuses to load without a model path, naming the setting."""
    with pytest.raises(ValueError, match="DUPLEX_GATEWAY_MODEL_PATH"):
        create_backend(BackendRequest(name="moshi", slots=1))


@pytest.mark.parametrize(("name", "voice", "turn_detection"), [
    ("loopback", "marin", dict(GA_TURN_DETECTION)),
    ("fake", "fake", None),
    ("moshi", "moshi", None),
    ("cascade", "en_US-joe-medium", dict(CASCADE_TURN_DETECTION)),
])
def test_a_new_session_announces_what_its_backend_applies(
        name: str, voice: str, turn_detection: dict[str, object] | None) -> None:
    """What session.created announces per backend (the worker publishes its new session's
    object): GA's pcm16 24 kHz both ways everywhere; where the worker detects turns (the
    loopback) OpenAI's server_vad and default voice; the frame models' own turn taking (no
    detector of the worker's: null) and voice; the cascade's own VAD and Piper voice."""
    session = default_session("s", backend_entry(name).profile)
    audio = session["audio"]
    assert audio["input"]["format"] == audio["output"]["format"] == dict(PCM_FORMAT)
    assert audio["output"]["voice"] == voice
    assert audio["input"]["turn_detection"] == turn_detection


def test_the_cascade_shows_the_turn_detection_its_vad_applies() -> None:
    """The cascade decides its turns with its own Silero VAD: the turn detection its sessions
    show is that VAD's (CascadeConfig's defaults), from the start and whatever a client asks
    (semantic_vad, null), so session.updated never claims settings nothing applies."""
    from inference_worker.backends.cascade import CascadeConfig  # its heavy imports: here

    config = CascadeConfig()
    shown = dict(CASCADE_TURN_DETECTION)
    assert (shown["threshold"], shown["prefix_padding_ms"], shown["silence_duration_ms"]) == (
        config.threshold, config.pre_roll_ms, config.silence_ms)
    entry = backend_entry("cascade")
    core = frame_core("s", model="cascade", frame_seconds=0.032,
                      turns=TurnMode.EVENTS, profile=entry.profile)
    assert core.session["audio"]["input"]["turn_detection"] == shown
    for asked in ({"type": "semantic_vad", "eagerness": "low"}, None):
        core.receive(msg.UpdateSession(session={"audio": {"input": {"turn_detection": asked}}}),
                     0.0)
        [updated] = core.events_to_send()
        assert isinstance(updated, msg.SessionUpdated)
        assert updated.session["audio"]["input"]["turn_detection"] == shown
    core.receive(msg.UpdateSession(session={"audio": {"input": {"turn_detection": {
        "type": "server_vad", "threshold": 7}}}}), 0.0)
    [refused] = core.events_to_send()
    assert isinstance(refused, msg.ErrorEvent)  # a bad request is still refused
