"""What each backend publishes as its capabilities: every field the seed's ``DuplexCapabilities``
reports, each answered for what the backend does, and the flags of ours."""

from __future__ import annotations

import pytest

from inference_worker.backends.registry import BACKENDS, backend_entry, capabilities_of

# The keys of the seed's DuplexCapabilities.as_dict(), and its two fields that method leaves
# out (supports_chat_completions, text_turn_priming_units): what its clients may read.
SEED_FIELDS = frozenset({
    "supports_session_adapter", "supports_model_native_turn_policy",
    "supports_external_turn_signal", "supports_client_commit", "supports_barge_in",
    "supports_playback_ack", "supports_input_append", "supports_replace_latest_chunk",
    "supports_reencode_context", "supports_rollback_to_checkpoint", "supports_turn_commit_only",
    "supports_kv_lease", "supports_core_kv_lease", "supports_model_internal_state",
    "supports_stage_resumption", "supports_scheduler_native_append",
    "supports_core_resumable_request", "supports_concurrent_turn_requests",
    "required_input_modalities", "optional_input_modalities",
    "supports_stage_connector_handoff", "supports_independent_io_streams",
    "supports_realtime_endpoint", "supports_multi_session", "supports_multi_session_same_replica",
    "supports_session_lease", "supports_session_resume", "session_admission_mode",
    "supports_audio_truncate", "supports_image_input", "supports_text_only_turn",
    "requires_model_runner_kv", "requires_native_stage_role", "implementation_level",
    "adapter_patterns", "input_modes", "signal_sources", "stage_handoff_transport",
    "chunk_period_ms", "target_barge_in_latency_ms", "supports_chat_completions",
    "text_turn_priming_units",
})
OURS = frozenset({"supports_server_vad", "supports_text_input_append",
                  "supports_input_transcription"})


@pytest.mark.parametrize("name", BACKENDS)
def test_every_backend_answers_every_seed_field_with_the_seeds_types(name: str) -> None:
    """Each backend publishes exactly the seed's fields and ours, typed as the seed's are."""
    capabilities = capabilities_of(name, frame_seconds=0.08, slots=4)
    assert set(capabilities) == SEED_FIELDS | OURS
    for key, value in capabilities.items():
        if key.startswith(("supports_", "requires_")):
            assert type(value) is bool, key
    for key in ("required_input_modalities", "optional_input_modalities", "adapter_patterns",
                "input_modes", "signal_sources"):
        assert isinstance(capabilities[key], list) and all(
            isinstance(v, str) for v in capabilities[key])
    assert capabilities["input_modes"] == ["append_audio_chunk"]
    assert capabilities["chunk_period_ms"] == 80
    assert capabilities["session_admission_mode"] == "serving_managed"


def test_the_loopback_is_turn_based_and_the_frame_models_are_native() -> None:
    """The loopback plays committed turns back (the worker's detector and the client signal
    them); frame models hear as they speak and take turns themselves; the cascade detects
    speech itself, so the worker's VAD does not run on it."""
    loopback = capabilities_of("loopback", frame_seconds=0.04, slots=16)
    assert loopback["implementation_level"] == "turn_based_duplex"
    assert loopback["supports_turn_commit_only"] is True
    assert loopback["supports_independent_io_streams"] is False
    assert loopback["signal_sources"] == ["client_event", "server_policy"]
    assert loopback["supports_text_only_turn"] is True
    for name in ("fake", "moshi", "recording"):
        native = capabilities_of(name, frame_seconds=0.08, slots=16)
        assert native["implementation_level"] == "model_native_duplex"
        assert native["supports_input_append"] is native["supports_model_internal_state"] is True
        assert native["supports_independent_io_streams"] is True
        assert native["signal_sources"] == ["model_native", "client_event", "server_policy"]
        assert native["supports_text_only_turn"] is False
    cascade = capabilities_of("cascade", frame_seconds=0.08, slots=16)
    assert (cascade["supports_server_vad"], cascade["supports_input_transcription"]) == (
        False, True)
    assert cascade["signal_sources"] == ["model_native", "client_event"]


def test_only_the_recording_backend_sees_video() -> None:
    """Video is optional on the backend whose model takes it, absent everywhere else; audio
    is required everywhere, as the seed's audio-primary models have it."""
    for name in BACKENDS:
        capabilities = capabilities_of(name, frame_seconds=0.08)
        assert capabilities["required_input_modalities"] == ["audio"]
        sees = name == "recording"
        assert capabilities["optional_input_modalities"] == (["video"] if sees else [])
        assert backend_entry(name).profile.sees_video is sees


def test_one_slot_is_not_many_sessions_on_one_replica() -> None:
    """A worker of one slot serves one session at a time; the fleet still serves many."""
    one = capabilities_of("fake", frame_seconds=0.08, slots=1)
    many = capabilities_of("fake", frame_seconds=0.08, slots=2)
    assert (one["supports_multi_session"], one["supports_multi_session_same_replica"]) == (
        True, False)
    assert many["supports_multi_session_same_replica"] is True
