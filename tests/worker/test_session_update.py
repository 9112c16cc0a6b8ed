"""The session object's rules: what each backend's sessions accept, report and refuse.

The payloads named after a framework are what that framework sends by default, as read in its
source (openai-agents 0.24 ``OpenAIRealtimeWebSocketModel._get_session_config``, LiveKit
Agents 1.8.9 ``_create_session_update_event`` and ``generate_reply``, pipecat 1.14
``_send_session_update``), with ``model`` set to the deployment's.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from contract import messages as msg
from inference_worker.audio_formats import Encoding
from inference_worker.conversation.profiles import (
    GA_TURN_DETECTION,
    LOOPBACK,
    NATIVE_RESPONSE_OPTIONS,
    SessionProfile,
    default_session,
    frame_profile,
)
from inference_worker.conversation.refusals import Refusal
from inference_worker.conversation.response_options import ResponseOptions, parse_response_options
from inference_worker.conversation.session_update import (
    apply_session_patch,
    check_session_patch,
    effective_turn_detection,
)
from tests.worker.realtime_render import validate_strict

PCM = {"type": "audio/pcm", "rate": 24000}
MOSHI = frame_profile("moshi")
CASCADE = frame_profile("cascade", voices=("joe", "amy"), transcription_model="whisper-tiny.en")
TELEPHONE = SessionProfile(model="phone", voices=("alloy",),
                           audio_formats=frozenset(Encoding))
#: A backend that takes pcm16 24 kHz only (every real profile takes G.711 too: the core
#: converts it).
PCM_ONLY = SessionProfile(model="pcm", voices=("alloy",),
                          audio_formats=frozenset({Encoding.PCM16}))

AGENTS_DEFAULT: dict[str, Any] = {
    "type": "realtime",
    "audio": {
        "input": {"format": {"rate": 24000, "type": "audio/pcm"},
                  "transcription": {"model": "gpt-4o-mini-transcribe"},
                  "turn_detection": {"type": "semantic_vad", "interrupt_response": True}},
        "output": {"format": {"rate": 24000, "type": "audio/pcm"}, "voice": "ash"},
    },
    "instructions": "Be brief.",
    "model": "loopback",
    "output_modalities": ["audio"],
    "tools": [{"description": "Current time.", "name": "get_time", "type": "function",
               "parameters": {"properties": {}, "title": "get_time_args", "type": "object",
                              "additionalProperties": False, "required": []}}],
}
# Sent by openai-agents once session.created arrives.
AGENTS_TRACING = {"type": "realtime", "model": "loopback", "tracing": "auto"}
LIVEKIT_DEFAULT: dict[str, Any] = {
    "type": "realtime",
    "model": "loopback",
    "output_modalities": ["audio"],
    "audio": {
        "input": {"format": PCM, "noise_reduction": None,
                  "transcription": {"model": "gpt-4o-mini-transcribe"},
                  "turn_detection": {"type": "semantic_vad", "create_response": True,
                                     "eagerness": "medium", "interrupt_response": True}},
        "output": {"format": PCM, "speed": 1.0, "voice": "marin"},
    },
    "max_output_tokens": "inf",
    "tool_choice": "auto",
    "tracing": None,
}
LIVEKIT_REPLY = {"instructions": None, "metadata": {"client_event_id": "response_create_1"}}
PIPECAT_DEFAULT = {"type": "realtime", "model": "loopback", "tools": []}


def session_of(profile: SessionProfile = LOOPBACK) -> dict[str, Any]:
    return default_session("sess_1", profile)


def updated(patch: dict[str, Any], profile: SessionProfile = LOOPBACK,
            current: dict[str, Any] | None = None) -> dict[str, Any]:
    """The effective session after ``patch``, which must be accepted and strictly valid."""
    current = session_of(profile) if current is None else current
    assert check_session_patch(patch, current, profile) is None
    session = apply_session_patch(patch, current, profile)
    validate_strict(msg.SessionUpdated(session=session))
    return session


def refused(patch: Any, profile: SessionProfile = LOOPBACK) -> tuple[str, str | None]:
    """The (code, param) of the refusal of ``patch``."""
    refusal = check_session_patch(patch, session_of(profile), profile)
    assert isinstance(refusal, Refusal), f"{patch!r} was accepted"
    return refusal.code, refusal.param


def options(request: Any, profile: SessionProfile = LOOPBACK,
            config: dict[str, Any] | None = None) -> ResponseOptions:
    parsed = parse_response_options(request, config or session_of(profile), profile)
    assert isinstance(parsed, ResponseOptions), parsed
    return parsed


def response_refused(request: Any, profile: SessionProfile = LOOPBACK) -> tuple[str, str | None]:
    parsed = parse_response_options(request, session_of(profile), profile)
    assert isinstance(parsed, Refusal), f"{request!r} was accepted"
    return parsed.code, parsed.param


# --------------------------------------------------------------------------- defaults


SERVER_VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
              "silence_duration_ms": 500, "idle_timeout_ms": None, "create_response": True,
              "interrupt_response": True}


@pytest.mark.parametrize(("profile", "voice", "turn_detection", "extra"), [
    (LOOPBACK, "marin", SERVER_VAD, {"loopback_mode": "turn", "auto_response": False}),
    (MOSHI, "moshi", None, {"end_of_turn_silence_ms": 800}),
    (CASCADE, "joe", None, {"end_of_turn_silence_ms": 800}),
])
def test_a_new_session_reports_its_backend(profile: SessionProfile, voice: str,
                                           turn_detection: dict[str, Any] | None,
                                           extra: dict[str, Any]) -> None:
    """A new session names its backend's model, its default voice and its extension knobs,
    takes GA's formats, and is a strictly valid GA session object. Where the worker detects
    turns (the loopback) it starts with GA's server_vad and voice marin; a frame backend's
    model takes turns itself, so none of the worker's runs there."""
    session = session_of(profile)
    validate_strict(msg.SessionUpdated(session=session))
    assert (session["id"], session["model"]) == ("sess_1", profile.model)
    assert session["audio"]["input"]["format"] == session["audio"]["output"]["format"] == PCM
    assert session["audio"]["output"]["voice"] == voice
    assert session["audio"]["input"]["turn_detection"] == turn_detection
    assert session["extra_body"] == extra


def test_the_ga_turn_detection_is_server_vad_with_every_default_filled_in() -> None:
    """The default a new loopback session shows is what the VAD's own defaults make of a bare
    ``{"type": "server_vad"}``, and OpenAI's documented server_vad defaults."""
    assert dict(GA_TURN_DETECTION) == effective_turn_detection({"type": "server_vad"})
    assert dict(GA_TURN_DETECTION) == SERVER_VAD


def test_turn_detection_null_is_push_to_talk_and_stays_so() -> None:
    """An explicit ``turn_detection: null`` (GA or beta shape) turns the default server_vad
    off, and a later update that does not name it leaves it off."""
    for patch in ({"audio": {"input": {"turn_detection": None}}}, {"turn_detection": None}):
        session = updated(patch)
        assert session["audio"]["input"]["turn_detection"] is None
        assert updated({"instructions": "x"}, current=session)["audio"]["input"][
            "turn_detection"] is None


def test_stream_mode_needs_turn_detection_turned_off_with_it() -> None:
    """Stream mode echoes every chunk inside one open response, so a session cannot switch to
    it while the default server_vad is on: the refusal says what to send, and the update that
    sends it applies."""
    refusal = check_session_patch({"extra_body": {"loopback_mode": "stream"}}, session_of())
    assert isinstance(refusal, Refusal)
    assert (refusal.code, refusal.param) == ("invalid_value",
                                             "session.audio.input.turn_detection")
    assert "turn_detection null" in refusal.message
    session = updated({"extra_body": {"loopback_mode": "stream"},
                       "audio": {"input": {"turn_detection": None}}})
    assert session["extra_body"]["loopback_mode"] == "stream"


def test_the_old_call_signatures_are_the_loopback_profile() -> None:
    """Callers that pass no profile get the loopback's rules."""
    current = default_session("s")
    assert current == default_session("s", LOOPBACK)
    assert check_session_patch({"extra_body": {"loopback_mode": "stream"},
                                "turn_detection": None}, current) is None
    patched = apply_session_patch({"audio": {"output": {"voice": "ash"}}}, current)
    assert patched["audio"]["output"]["voice"] == "marin"


def test_a_profile_needs_a_voice() -> None:
    """A profile without a voice could not say which voice its sessions speak with."""
    with pytest.raises(ValueError, match="voice"):
        SessionProfile(model="m", voices=())


# --------------------------------------------------------------------------- frameworks


def test_the_openai_agents_default_update_is_accepted_and_shown_truthfully() -> None:
    """openai-agents' default session.update applies whole: the voice it asked for (ash) is
    shown as the one the loopback really uses, transcription as null (nothing transcribes),
    semantic_vad with its defaults filled in, and its instructions and tools kept."""
    session = updated(AGENTS_DEFAULT)
    assert session["audio"]["output"]["voice"] == "marin"
    assert session["audio"]["input"]["transcription"] is None
    assert session["audio"]["input"]["turn_detection"] == {
        "type": "semantic_vad", "eagerness": "auto", "create_response": True,
        "interrupt_response": True}
    assert session["instructions"] == "Be brief."
    assert session["tools"] == AGENTS_DEFAULT["tools"]
    assert updated(AGENTS_TRACING, current=session)["tracing"] == "auto"


@pytest.mark.parametrize("patch", [LIVEKIT_DEFAULT, PIPECAT_DEFAULT])
def test_livekit_and_pipecat_default_updates_are_accepted(patch: dict[str, Any]) -> None:
    """LiveKit's and pipecat's default session.update apply, on the loopback and on a frame
    backend alike (with the backend's model name)."""
    updated(patch)
    updated({**patch, "model": "moshi"}, MOSHI)


def test_the_update_on_a_transcribing_backend_reports_what_transcribes() -> None:
    """Where the backend transcribes, the session reports its transcriber, not the model the
    client named; the voice it asked for maps to the backend's default."""
    session = updated({**AGENTS_DEFAULT, "model": "cascade"}, CASCADE)
    assert session["audio"]["input"]["transcription"] == {"model": "whisper-tiny.en"}
    assert session["audio"]["output"]["voice"] == "joe"
    off = updated({"audio": {"input": {"transcription": None}}}, CASCADE, session)
    assert off["audio"]["input"]["transcription"] is None


def test_a_checked_patch_is_not_changed_by_checking_or_applying() -> None:
    """Checking and applying copy what they keep: the client's patch and the current session
    are left as they were."""
    patch = copy.deepcopy(AGENTS_DEFAULT)
    current = session_of()
    before = copy.deepcopy(current)
    updated(patch, current=current)
    assert (patch, current) == (AGENTS_DEFAULT, before)


# --------------------------------------------------------------------------- voices


@pytest.mark.parametrize(("voice", "real"), [
    ("ash", "joe"), ("marin", "joe"), ("joe", "joe"), ("amy", "amy"),
    ({"id": "voice_123"}, "joe"),
])
def test_a_voice_the_backend_lacks_maps_to_its_default(voice: Any, real: str) -> None:
    """A voice the backend has is used; any other name, or a custom voice, is shown as the
    backend's default voice, which is what the client will hear."""
    session = updated({"audio": {"output": {"voice": voice}}}, CASCADE)
    assert session["audio"]["output"]["voice"] == real


@pytest.mark.parametrize("voice", ["", 7, {"id": 1}, {"id": "v", "name": "x"}, None])
def test_a_malformed_voice_is_refused(voice: Any) -> None:
    """A voice that is neither a name nor a custom voice object is invalid_value."""
    assert refused({"audio": {"output": {"voice": voice}}}) == (
        "invalid_value", "session.audio.output.voice")


# --------------------------------------------------------------------------- hints


@pytest.mark.parametrize(("path", "value"), [
    (("instructions",), "Talk like a pirate."),
    (("tools",), []),
    (("tools",), [{"type": "function", "name": "f", "parameters": {"type": "object"}}]),
    (("tool_choice",), "required"),
    (("tool_choice",), {"type": "function", "name": "f"}),
    (("max_output_tokens",), 4096),
    (("tracing",), None),
    (("tracing",), "auto"),
    (("tracing",), {"workflow_name": "w", "group_id": "g", "metadata": {"k": [1]}}),
    (("truncation",), "disabled"),
    (("truncation",), {"type": "retention_ratio", "retention_ratio": 0.8,
                       "token_limits": {"post_instructions": 5000}}),
    (("prompt",), {"id": "pmpt_1", "version": "2", "variables": {"city": "Paris"}}),
    (("prompt",), None),
    (("include",), ["item.input_audio_transcription.logprobs"]),
    (("parallel_tool_calls",), False),
    (("reasoning",), {"effort": "low"}),
    (("audio", "input", "noise_reduction"), {"type": "far_field"}),
    (("audio", "input", "noise_reduction"), {"type": "near_field", "strength": 0.5}),
    (("audio", "input", "noise_reduction"), None),
    (("audio", "output", "speed"), 0.25),
])
def test_each_hint_is_kept_and_echoed(path: tuple[str, ...], value: Any) -> None:
    """Settings that guide a model but change nothing a client observes are accepted and
    echoed in the effective session as sent."""
    patch: dict[str, Any] = value
    for key in reversed(path):
        patch = {key: patch}
    session = updated(patch)
    for key in path:
        session = session[key]
    assert session == value


def test_null_instructions_are_no_instructions() -> None:
    """``instructions: null`` (allowed by the SDK's types) leaves the session with none."""
    assert updated({"instructions": None})["instructions"] == ""


@pytest.mark.parametrize("transcription", [
    {"model": "whisper-1", "language": "en", "prompt": "expect names"},
    {"model": None}, {}, {"model": "gpt-transcribe", "keywords": ["Moshi"],
                          "languages": ["en", "fr"], "delay": "low"},
])
def test_any_transcription_request_is_accepted(transcription: dict[str, Any]) -> None:
    """Every GA transcription setting is accepted; the loopback, which transcribes nothing,
    reports null."""
    session = updated({"audio": {"input": {"transcription": transcription}}})
    assert session["audio"]["input"]["transcription"] is None


@pytest.mark.parametrize("field", ["id", "object", "expires_at"])
def test_read_only_fields_are_accepted_and_not_applied(field: str) -> None:
    """Fields a client echoes back from session.updated are accepted; the session keeps its
    own."""
    value = {"id": "sess_other", "object": "realtime.session", "expires_at": 0}[field]
    session = updated({field: value})
    assert session.get(field) == session_of().get(field)


# --------------------------------------------------------------------------- model


@pytest.mark.parametrize(("profile", "model"), [(LOOPBACK, "loopback"), (MOSHI, "moshi"),
                                                 (LOOPBACK, None)])
def test_the_sessions_own_model_is_accepted(profile: SessionProfile, model: Any) -> None:
    """Naming the session's model (LiveKit does in every update), or null, is accepted."""
    assert updated({"model": model}, profile)["model"] == profile.model


@pytest.mark.parametrize(("profile", "model"), [(LOOPBACK, "gpt-realtime-2.1"),
                                                 (MOSHI, "loopback")])
def test_a_session_keeps_the_model_it_was_placed_for(profile: SessionProfile,
                                                     model: str) -> None:
    """A session is placed on a worker of the model its client named (or the deployment's
    default) and named after it: any other name, even in its first update, is refused."""
    refusal = check_session_patch({"model": model}, session_of(profile), profile)
    assert isinstance(refusal, Refusal) and refusal.code == "model_update_unsupported"


@pytest.mark.parametrize(("profile", "model"), [(LOOPBACK, "gpt-realtime-2.1"),
                                                 (MOSHI, "loopback")])
def test_another_model_is_refused_once_the_session_has_one(profile: SessionProfile,
                                                            model: str) -> None:
    """Once named, a session's model never changes: another name is model_update_unsupported
    (the seed's code), and the message names the session's model; its own name again is
    fine."""
    named = apply_session_patch({"model": "deployment-model"}, session_of(profile), profile)
    refusal = check_session_patch({"model": model, "instructions": "x"}, named, profile)
    assert isinstance(refusal, Refusal)
    assert (refusal.code, refusal.param) == ("model_update_unsupported", "session.model")
    assert "'deployment-model'" in refusal.message
    assert check_session_patch({"model": "deployment-model"}, named, profile) is None


def test_a_model_that_is_not_a_string_is_invalid() -> None:
    """``model`` must be a string or null."""
    assert refused({"model": 5}) == ("invalid_value", "session.model")


# --------------------------------------------------------------------------- formats


@pytest.mark.parametrize("value", [{"type": "audio/pcm"}, {"type": "audio/pcm", "rate": 24000},
                                   {"type": "audio/pcm", "rate": None}])
def test_pcm_is_accepted_in_any_ga_spelling_and_reported_whole(value: dict[str, Any]) -> None:
    """Every GA spelling of 24 kHz pcm16 is accepted and reported with its rate."""
    session = updated({"audio": {"input": {"format": value}, "output": {"format": value}}})
    assert session["audio"]["input"]["format"] == session["audio"]["output"]["format"] == PCM


def test_every_backend_takes_g711() -> None:
    """The loopback's and the frame backends' profiles take every encoding, G.711 too."""
    for profile in (LOOPBACK, MOSHI):
        assert set(Encoding) <= profile.audio_formats


@pytest.mark.parametrize("kind", ["audio/pcmu", "audio/pcma"])
def test_a_format_a_profile_lacks_is_refused(kind: str) -> None:
    """A profile without G.711 refuses it, naming the format."""
    assert refused({"audio": {"input": {"format": {"type": kind}}}}, PCM_ONLY) == (
        "unsupported_audio_format", "session.audio.input.format")
    assert refused({"input_audio_format": "g711_ulaw"}, PCM_ONLY) == (
        "unsupported_audio_format", "session.input_audio_format")
    assert response_refused({"audio": {"output": {"format": {"type": kind}}}}, PCM_ONLY) == (
        "unsupported_audio_format", "response.audio.output.format")
    assert response_refused({"output_audio_format": "g711_alaw"}, PCM_ONLY) == (
        "unsupported_audio_format", "response.output_audio_format")


@pytest.mark.parametrize(("value", "param"), [
    ({"type": "audio/pcm", "rate": 4000}, "session.audio.input.format.rate"),
    ({"type": "audio/opus"}, "session.audio.input.format.type"),
    ("pcm16", "session.audio.input.format"),
])
def test_a_format_the_backend_cannot_take_is_refused(value: Any, param: str) -> None:
    """A format the backend does not take, or that is not a format, is unsupported_audio_format
    naming what is wrong."""
    assert refused({"audio": {"input": {"format": value}}}) == ("unsupported_audio_format",
                                                                 param)


def test_a_backend_that_takes_g711_reports_it() -> None:
    """A profile with G.711 accepts it in each direction and reports GA's object."""
    session = updated({"audio": {"input": {"format": {"type": "audio/pcmu"}},
                                 "output": {"format": {"type": "audio/pcma"}}}}, TELEPHONE)
    assert session["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    assert session["audio"]["output"]["format"] == {"type": "audio/pcma"}


# --------------------------------------------------------------------------- beta shape


def test_a_beta_session_is_mapped_onto_the_ga_object() -> None:
    """The flat beta session (what beta clients send) applies at the GA places."""
    session = updated({
        "modalities": ["text", "audio"], "voice": "verse", "instructions": "hi",
        "input_audio_format": "pcm16", "output_audio_format": "pcm16",
        "input_audio_transcription": {"model": "whisper-1"},
        "input_audio_noise_reduction": {"type": "near_field"},
        "turn_detection": {"type": "server_vad", "silence_duration_ms": 200},
        "speed": 1.2, "max_response_output_tokens": 300, "tools": [], "tool_choice": "none",
    })
    audio = session["audio"]
    assert session["output_modalities"] == ["audio"]
    assert (audio["input"]["format"], audio["output"]["format"]) == (PCM, PCM)
    assert audio["output"] == {"format": PCM, "voice": "marin", "speed": 1.2}
    assert audio["input"]["noise_reduction"] == {"type": "near_field"}
    assert audio["input"]["transcription"] is None
    assert audio["input"]["turn_detection"]["silence_duration_ms"] == 200
    assert (session["max_output_tokens"], session["tool_choice"]) == (300, "none")
    assert "modalities" not in session and "voice" not in session


@pytest.mark.parametrize(("modalities", "ga"), [(["text"], ["text"]), (["audio"], ["audio"]),
                                                (["audio", "text"], ["audio"])])
def test_beta_modalities_map_to_one_ga_modality(modalities: list[str], ga: list[str]) -> None:
    """Beta's audio-with-text is GA's audio (which carries its transcript); text alone stays
    text."""
    assert updated({"modalities": modalities})["output_modalities"] == ga


def test_the_ga_key_wins_over_its_beta_spelling() -> None:
    """A patch with both spellings of one setting takes the GA one."""
    session = updated({"speed": 0.5, "audio": {"output": {"speed": 1.5}}})
    assert session["audio"]["output"]["speed"] == 1.5


@pytest.mark.parametrize(("patch", "code", "param"), [
    ({"turn_detection": {"type": "server_vad", "threshold": 2}}, "invalid_value",
     "session.turn_detection.threshold"),
    ({"input_audio_format": "opus"}, "unsupported_audio_format",
     "session.input_audio_format"),
    ({"output_audio_format": "mp3"}, "unsupported_audio_format", "session.output_audio_format"),
    ({"modalities": ["video"]}, "invalid_value", "session.modalities"),
    ({"modalities": []}, "invalid_value", "session.modalities"),
    ({"voice": 3}, "invalid_value", "session.voice"),
    ({"speed": 9}, "invalid_value", "session.speed"),
    ({"input_audio_transcription": {"model": 1}}, "invalid_value",
     "session.input_audio_transcription"),
    ({"max_response_output_tokens": 0}, "invalid_value", "session.max_response_output_tokens"),
    ({"turn_detection": {"type": "server_vad", "idle_timeout_ms": 100}},
     "invalid_value", "session.turn_detection.idle_timeout_ms"),
])
def test_a_beta_refusal_names_the_key_the_client_sent(patch: dict[str, Any], code: str,
                                                      param: str) -> None:
    """A refused beta value is reported under the beta key, not the GA path it maps to."""
    assert refused(patch) == (code, param)


def test_a_beta_value_into_a_malformed_ga_container_is_refused_there() -> None:
    """A beta key whose GA place sits inside a malformed object leaves the refusal to it."""
    assert refused({"voice": "ash", "audio": []}) == ("invalid_type", "session.audio")


def test_applying_a_refused_beta_value_fails_loudly() -> None:
    """apply_session_patch takes accepted patches only; a beta value that maps to nothing
    raises rather than being dropped."""
    with pytest.raises(ValueError, match="refused"):
        apply_session_patch({"input_audio_format": "mp3"}, session_of())


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(("patch", "code", "param"), [
    ([], "invalid_type", "session"),
    ({"type": "transcription"}, "invalid_value", "session.type"),
    ({"temperature": 2.5}, "invalid_value", "session.temperature"),
    ({"audio": {"input": {"vad": None}}}, "unknown_parameter", "session.audio.input.vad"),
    ({"audio": []}, "invalid_type", "session.audio"),
    ({"audio": {"output": []}}, "invalid_type", "session.audio.output"),
    ({"output_modalities": ["audio", "text"]}, "invalid_value", "session.output_modalities"),
    ({"instructions": 3}, "invalid_value", "session.instructions"),
    ({"tools": [{"type": "function"}]}, "invalid_value", "session.tools"),
    ({"tools": [{"type": "mcp", "server_label": "s"}]}, "invalid_value", "session.tools"),
    ({"tool_choice": "sometimes"}, "invalid_value", "session.tool_choice"),
    ({"max_output_tokens": True}, "invalid_value", "session.max_output_tokens"),
    ({"max_output_tokens": 5000}, "invalid_value", "session.max_output_tokens"),
    ({"tracing": "on"}, "invalid_value", "session.tracing"),
    ({"tracing": {"workflow": "w"}}, "invalid_value", "session.tracing"),
    ({"truncation": {"type": "retention_ratio", "retention_ratio": 2}}, "invalid_value",
     "session.truncation"),
    ({"truncation": "sometimes"}, "invalid_value", "session.truncation"),
    ({"prompt": {"version": "1"}}, "invalid_value", "session.prompt"),
    ({"include": ["everything"]}, "invalid_value", "session.include"),
    ({"parallel_tool_calls": "yes"}, "invalid_value", "session.parallel_tool_calls"),
    ({"reasoning": {"effort": "maximal"}}, "invalid_value", "session.reasoning"),
    ({"expires_at": "soon"}, "invalid_value", "session.expires_at"),
    ({"audio": {"input": {"noise_reduction": {"type": "studio"}}}}, "invalid_value",
     "session.audio.input.noise_reduction"),
    ({"audio": {"input": {"noise_reduction": {"strength": -1}}}}, "invalid_value",
     "session.audio.input.noise_reduction"),
    ({"audio": {"input": {"transcription": {"model": "whisper-1", "temperature": 0}}}},
     "invalid_value", "session.audio.input.transcription"),
    ({"audio": {"input": {"transcription": {"delay": "never"}}}}, "invalid_value",
     "session.audio.input.transcription"),
    ({"audio": {"output": {"speed": 3}}}, "invalid_value", "session.audio.output.speed"),
    ({"audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 30001}}}},
     "invalid_value", "session.audio.input.turn_detection.idle_timeout_ms"),
    ({"audio": {"input": {"turn_detection": {"threshold": 0.5}}}}, "missing_required_parameter",
     "session.audio.input.turn_detection.type"),
    ({"extra_body": "x"}, "invalid_type", "session.extra_body"),
    ({"extra_body": {"loopback_mode": "duplex"}}, "invalid_value",
     "session.extra_body.loopback_mode"),
    ({"extra_body": {"auto_response": 1}}, "invalid_value", "session.extra_body.auto_response"),
    ({"extra_body": {"end_of_turn_silence_ms": 800}}, "invalid_duplex_runtime_config",
     "session.extra_body.end_of_turn_silence_ms"),
    ({"output_modalities": ["text"], "extra_body": {"loopback_mode": "stream"}},
     "invalid_value", "session.extra_body.loopback_mode"),
    ({"audio": {"input": {"turn_detection": {"type": "server_vad"}}},
      "extra_body": {"loopback_mode": "stream"}}, "invalid_value",
     "session.audio.input.turn_detection"),
])
def test_a_loopback_update_is_refused(patch: Any, code: str, param: str) -> None:
    """Each malformed or meaning-changing value is refused with its code and path."""
    assert refused(patch) == (code, param)


@pytest.mark.parametrize(("patch", "code", "param"), [
    ({"output_modalities": ["text"]}, "invalid_value", "session.output_modalities"),
    ({"modalities": ["text"]}, "invalid_value", "session.modalities"),
    ({"extra_body": {"loopback_mode": "stream"}}, "invalid_duplex_runtime_config",
     "session.extra_body.loopback_mode"),
    ({"extra_body": {"end_of_turn_silence_ms": 79}}, "invalid_value",
     "session.extra_body.end_of_turn_silence_ms"),
    ({"extra_body": {"end_of_turn_silence_ms": 10_001}}, "invalid_value",
     "session.extra_body.end_of_turn_silence_ms"),
    ({"extra_body": {"end_of_turn_silence_ms": True}}, "invalid_value",
     "session.extra_body.end_of_turn_silence_ms"),
])
def test_a_frame_backend_update_is_refused(patch: Any, code: str, param: str) -> None:
    """A frame backend answers in audio only and takes its own extension knob only."""
    assert refused(patch, MOSHI) == (code, param)


def test_a_frame_backend_takes_its_silence_knob() -> None:
    """end_of_turn_silence_ms applies within 80..10000 and is reported."""
    session = updated({"extra_body": {"end_of_turn_silence_ms": 80}}, MOSHI)
    assert session["extra_body"] == {"end_of_turn_silence_ms": 80}


def test_a_patch_nested_too_deep_is_refused_before_anything_reads_it() -> None:
    """A session.update deeper than the worker takes is invalid_value on ``session``."""
    deep: dict[str, Any] = {}
    for _ in range(40):
        deep = {"x": deep}
    assert refused({"tools": [{"type": "function", "name": "f", "parameters": deep}]}) == (
        "invalid_value", "session")


# --------------------------------------------------------------------------- response.create


def test_a_response_without_options_takes_the_sessions() -> None:
    """No ``response`` object: every option is the session's."""
    config = updated({**AGENTS_DEFAULT, "tool_choice": "none"})
    parsed = options(None, config=config)
    assert (parsed.output_modalities, parsed.voice, parsed.instructions) == (
        ("audio",), "marin", "Be brief.")
    assert parsed.output_format == PCM and parsed.tools == tuple(AGENTS_DEFAULT["tools"])
    assert (parsed.conversation, parsed.input, parsed.metadata) == ("auto", None, None)
    assert (parsed.tool_choice, parsed.max_output_tokens) == ("none", "inf")
    assert parsed.audio and not parsed.out_of_band


@pytest.mark.parametrize("profile", [LOOPBACK, MOSHI])
def test_livekits_reply_request_is_honoured_on_every_backend(profile: SessionProfile) -> None:
    """LiveKit's generate_reply (``instructions: null`` and metadata it waits for) is accepted
    and its metadata kept."""
    parsed = options(LIVEKIT_REPLY, profile)
    assert parsed.metadata == {"client_event_id": "response_create_1"}
    assert parsed.instructions == ""


def test_every_ga_response_option_is_honoured_by_the_loopback() -> None:
    """Each GA option is read into the options, the voice mapped as for the session."""
    items = [{"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": "hi"}]}]
    tools = [{"type": "function", "name": "f"}]
    parsed = options({
        "output_modalities": ["text"], "instructions": "Shout.", "conversation": "none",
        "input": items, "metadata": {"topic": "x"}, "max_output_tokens": 10, "tools": tools,
        "tool_choice": "required", "prompt": {"id": "pmpt_1"}, "reasoning": {"effort": "high"},
        "parallel_tool_calls": True,
        "audio": {"output": {"voice": "ash", "format": {"type": "audio/pcm"}}},
    })
    assert parsed == ResponseOptions(
        output_modalities=("text",), voice="marin", output_format=PCM, instructions="Shout.",
        conversation="none", input=tuple(items), metadata={"topic": "x"},
        max_output_tokens=10, tools=tuple(tools), tool_choice="required",
        prompt={"id": "pmpt_1"}, reasoning={"effort": "high"}, parallel_tool_calls=True)
    assert parsed.out_of_band and not parsed.audio


def test_beta_response_options_are_read() -> None:
    """Beta's response spellings apply at their GA places."""
    voiced = SessionProfile(model="voiced", voices=("joe", "amy"))
    parsed = options({"modalities": ["text", "audio"], "voice": "amy",
                      "output_audio_format": "pcm16", "max_response_output_tokens": 5}, voiced)
    assert (parsed.output_modalities, parsed.voice, parsed.output_format,
            parsed.max_output_tokens) == (("audio",), "amy", PCM, 5)


def test_the_sessions_own_values_may_be_sent_to_a_model_native_backend() -> None:
    """A native backend takes a response that restates the session's settings."""
    config = updated({"instructions": "Be kind.", "tools": []}, MOSHI)
    parsed = options({"instructions": "Be kind.", "tools": [], "tool_choice": "auto",
                      "max_output_tokens": "inf", "conversation": "auto", "input": None},
                     MOSHI, config)
    assert parsed.instructions == "Be kind." and parsed.conversation == "auto"


@pytest.mark.parametrize(("request_", "param"), [
    ({"instructions": "Shout."}, "response.instructions"),
    ({"tools": [{"type": "function", "name": "f"}]}, "response.tools"),
    ({"tool_choice": "required"}, "response.tool_choice"),
    ({"max_output_tokens": 10}, "response.max_output_tokens"),
    ({"max_response_output_tokens": 10}, "response.max_response_output_tokens"),
    ({"prompt": {"id": "pmpt_1"}}, "response.prompt"),
    ({"reasoning": {"effort": "low"}}, "response.reasoning"),
    ({"parallel_tool_calls": True}, "response.parallel_tool_calls"),
    ({"conversation": "none"}, "response.conversation"),
    ({"input": []}, "response.input"),
])
def test_what_a_model_native_backend_cannot_set_per_response_is_refused(
        request_: dict[str, Any], param: str) -> None:
    """Every option a native backend cannot honour per response is refused, never ignored."""
    assert response_refused(request_, MOSHI) == ("unsupported_native_response_options", param)
    assert NATIVE_RESPONSE_OPTIONS == MOSHI.fixed_response_options


@pytest.mark.parametrize(("request_", "code", "param"), [
    ("x", "invalid_type", "response"),
    ({"temperature": 0.8}, "invalid_duplex_runtime_config", "response.temperature"),
    ({"temperature": 9}, "invalid_value", "response.temperature"),
    ({"speed": 1.2}, "invalid_duplex_runtime_config", "response.speed"),
    ({"speed": 9}, "invalid_value", "response.speed"),
    ({"extra_body": {"loopback_mode": "stream"}}, "invalid_duplex_runtime_config",
     "response.extra_body.loopback_mode"),
    ({"extra_body": {"force_listen_count": 1}}, "invalid_duplex_runtime_config",
     "response.extra_body.force_listen_count"),
    ({"extra_body": []}, "invalid_type", "response.extra_body"),
    ({"output_modalities": ["audio", "text"]}, "invalid_value", "response.output_modalities"),
    ({"modalities": ["smell"]}, "invalid_value", "response.modalities"),
    ({"metadata": {"k": 1}}, "invalid_value", "response.metadata"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "invalid_value", "response.metadata"),
    ({"metadata": {"k" * 65: "v"}}, "invalid_value", "response.metadata"),
    ({"metadata": {"k": "v" * 513}}, "invalid_value", "response.metadata"),
    ({"conversation": "conv_2"}, "invalid_value", "response.conversation"),
    ({"input": {"type": "message"}}, "invalid_type", "response.input"),
    ({"input": [{"role": "user"}]}, "invalid_value", "response.input[0]"),
    ({"instructions": 1}, "invalid_value", "response.instructions"),
    ({"tools": [{"type": "function"}]}, "invalid_value", "response.tools"),
    ({"max_output_tokens": 0}, "invalid_value", "response.max_output_tokens"),
    ({"audio": []}, "invalid_type", "response.audio"),
    ({"audio": {"input": {}}}, "unknown_parameter", "response.audio.input"),
    ({"audio": {"output": 1}}, "invalid_type", "response.audio.output"),
    ({"audio": {"output": {"speed": 1.2}}}, "invalid_duplex_runtime_config",
     "response.audio.output.speed"),
    ({"audio": {"output": {"voice": ""}}}, "invalid_value", "response.audio.output.voice"),
    ({"voice": 2}, "invalid_value", "response.voice"),
    ({"audio": {"output": {"format": {"type": "audio/opus"}}}}, "unsupported_audio_format",
     "response.audio.output.format.type"),
    ({"output_audio_format": "mp3"}, "unsupported_audio_format",
     "response.output_audio_format"),
])
def test_a_malformed_or_unknown_response_option_is_refused(request_: Any, code: str,
                                                           param: str) -> None:
    """Each bad option is refused with its code and path, never ignored."""
    assert response_refused(request_) == (code, param)


@pytest.mark.parametrize("request_", [{"output_modalities": ["text"]}, {"modalities": ["text"]}])
def test_a_text_response_is_refused_by_an_audio_only_backend(request_: dict[str, Any]) -> None:
    """A frame backend answers in audio: a text response is invalid_value."""
    code, param = response_refused(request_, MOSHI)
    assert code == "invalid_value" and param is not None and param.endswith("modalities")
