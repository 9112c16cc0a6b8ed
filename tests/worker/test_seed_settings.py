"""The seed's session settings on every backend: the released presets' session objects,
honoured or refused with the seed's code (never ``unknown_parameter``), the per-backend
refusals, and the slot configuration a frame backend receives at open and on update.

The presets' payloads are copied from vLLM-Omni 0.30.0's ``SessionConfig.to_session_payload``
(``clients/minicpmo_4_5.py``, ``personaplex.py``, ``nemotron_voicechat.py``) as literal data.
Their audio keys (``sample_rate_hz``, ``audio.*.sample_rate_hz``, the format names) are held
by the audio formats' own tests, and left out here (:func:`without_audio`).
"""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest

from contract import messages as msg
from inference_worker.audio_frames import FrameOutput
from inference_worker.backends.fake import FakeBackend
from inference_worker.backends.loopback import LoopbackModel
from inference_worker.backends.registry import backend_entry, frame_core, loopback_core
from inference_worker.conversation.core import ConversationCore
from inference_worker.conversation.profiles import SessionProfile, frame_profile
from inference_worker.conversation.seed_settings import (
    MAX_REF_AUDIO_CHARS,
    Applies,
    ConfigSupport,
    SlotConfig,
    VoicePrompt,
    parse_ref_audio,
    slot_config_of,
)
from inference_worker.engine import Engine
from tests.worker.feeding import feed
from tests.worker.realtime_render import validate_strict
from tests.worker.test_core_commands import FRAME_S, done_of, drain, frames, speak

T0 = 100.0
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(28)
REF_AUDIO = "data:audio/wav;base64," + base64.b64encode(WAV).decode()
AUDIO_KEYS = ("input_audio_format", "output_audio_format", "sample_rate_hz")

#: ``minicpmo_4_5.create_duplex_session_config()``, model M.
MINICPMO: dict[str, Any] = {
    "model": "M", "modalities": ["audio", "text"],
    "input_audio_format": "pcm16", "output_audio_format": "pcm16", "sample_rate_hz": 16000,
    "audio": {"input": {"sample_rate_hz": 16000}, "output": {"sample_rate_hz": 24000}},
    "turn_detection": None,
    "overlap_policy": "listen_only", "playback_commit_policy": "ack_only",
    "extra_body": {"auto_response": True, "force_listen_count": 0},
}
#: The same with ``ref_audio=audio_data_url(wav)`` (the client's documented example).
MINICPMO_REF: dict[str, Any] = {**MINICPMO, "ref_audio": REF_AUDIO}
#: ``personaplex.create_duplex_session_config()``.
PERSONAPLEX: dict[str, Any] = {
    "model": "M", "modalities": ["audio", "text"],
    "input_audio_format": "pcm_f32le", "output_audio_format": "pcm16", "sample_rate_hz": 24000,
    "audio": {"input": {"sample_rate_hz": 24000}, "output": {"sample_rate_hz": 24000}},
    "turn_detection": None, "instructions": "", "voice": "NATF2.pt",
    "extra_body": {"auto_response": True},
}
#: ``nemotron_voicechat.create_duplex_session_config()``.
NEMOTRON: dict[str, Any] = {
    "model": "M", "modalities": ["audio", "text"],
    "input_audio_format": "pcm_f32le", "output_audio_format": "pcm16", "sample_rate_hz": 16000,
    "audio": {"input": {"sample_rate_hz": 16000}, "output": {"sample_rate_hz": 22050}},
    "turn_detection": None,
    "extra_body": {"auto_response": True},
}
#: ``nemotron_voicechat.create_duplex_session_config(instructions=..., idle_timeout_s=120)``.
NEMOTRON_SET: dict[str, Any] = {**NEMOTRON, "instructions": "Be brief.", "idle_timeout_s": 120}

BACKENDS = ("loopback", "fake", "moshi", "cascade")
FORCE_LISTEN = ("invalid_duplex_runtime_config", "session.extra_body.force_listen_count")
#: preset -> backend -> None (honoured) or the (code, param) of its refusal.
ANSWERS: dict[str, tuple[dict[str, Any], dict[str, tuple[str, str] | None]]] = {
    "minicpmo": (MINICPMO, {"loopback": None, "fake": FORCE_LISTEN, "moshi": FORCE_LISTEN,
                            "cascade": FORCE_LISTEN}),
    "minicpmo_ref_audio": (MINICPMO_REF, {"loopback": None, "fake": FORCE_LISTEN,
                                          "moshi": FORCE_LISTEN, "cascade": FORCE_LISTEN}),
    "personaplex": (PERSONAPLEX, dict.fromkeys(BACKENDS)),
    "nemotron": (NEMOTRON, dict.fromkeys(BACKENDS)),
    "nemotron_set": (NEMOTRON_SET, dict.fromkeys(BACKENDS)),
}


def without_audio(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` without its audio format keys (see the module's docstring)."""
    patch = {k: copy.deepcopy(v) for k, v in payload.items() if k not in AUDIO_KEYS}
    patch.pop("audio", None)
    return patch


def core_of(backend: str, profile: SessionProfile | None = None) -> ConversationCore:
    if backend == "loopback":
        return loopback_core("sess_1")
    entry = backend_entry(backend)
    return frame_core("sess_1", model=backend, frame_seconds=0.08, turns=entry.turns,
                      profile=profile or entry.profile)


def update(core: ConversationCore, patch: dict[str, Any], now: float = T0) -> msg.Event:
    """Apply one session.update; its one answer, strictly valid."""
    core.receive(msg.UpdateSession(session=patch, event_id="evt_u"), now)
    [event] = core.events_to_send()
    validate_strict(event)
    return event


def refusal(event: msg.Event) -> tuple[str, str | None]:
    assert isinstance(event, msg.ErrorEvent), event
    assert event.client_event_id == "evt_u"
    return event.code, event.param


# ------------------------------------------------------------------------- the presets


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("preset", sorted(ANSWERS))
def test_a_preset_is_honoured_or_refused_with_the_seeds_code(preset: str, backend: str) -> None:
    """Each released preset's session object, on each backend: session.updated, or the
    refusal the table says; never unknown_parameter."""
    payload, answers = ANSWERS[preset]
    core = core_of(backend)
    patch = {**without_audio(payload), "model": core.session["model"]}
    event = update(core, patch)
    expected = answers[backend]
    if expected is not None:
        assert refusal(event) == expected
        return
    assert isinstance(event, msg.SessionUpdated), event
    session = event.session
    assert session["audio"]["input"]["turn_detection"] == (
        core.session["audio"]["input"]["turn_detection"])
    assert session["extra_body"]["auto_response"] is True
    assert "ref_audio" not in session  # carried to the backend, never echoed
    for key in ("overlap_policy", "playback_commit_policy", "idle_timeout_s"):
        assert session.get(key) == payload.get(key)
    if "instructions" in payload:
        assert session["instructions"] == payload["instructions"]


def test_the_documented_example_gives_the_loopback_its_voice_prompt() -> None:
    """The MiniCPM-o preset with ref_audio: the loopback's model gets the decoded prompt."""
    core = loopback_core("sess_1")
    assert isinstance(update(core, without_audio({**MINICPMO_REF, "model": "loopback"})),
                      msg.SessionUpdated)
    model = core._model
    assert isinstance(model, LoopbackModel)
    assert model.slot_config.ref_audio == VoicePrompt("audio/wav", WAV)
    assert model.auto_respond  # auto_response true, force_listen_count 0


def test_a_voice_prompt_rides_a_frame_backends_next_input() -> None:
    """On the fake (which takes one), the slot configuration goes to the engine with the
    session's next input: instructions, voice, prompt and knobs."""
    core = core_of("fake")
    patch = {"instructions": "Hi.", "ref_audio": base64.b64encode(WAV).decode(),
             "extra_body": {"end_of_turn_silence_ms": 400}}
    assert isinstance(update(core, patch), msg.SessionUpdated)
    config = core.take_input().config
    assert config is not None
    assert (config.instructions, config.voice) == ("Hi.", "fake")
    assert config.ref_audio == VoicePrompt("", WAV)
    assert dict(config.extra_body) == {"end_of_turn_silence_ms": 400}
    assert core.take_input().config is None  # handed over once
    assert isinstance(update(core, {"instructions": "Bye."}), msg.SessionUpdated)
    later = core.take_input().config
    assert later is not None and later.instructions == "Bye." and later.ref_audio == (
        VoicePrompt("", WAV))


@pytest.mark.parametrize("backend", ["moshi", "cascade"])
def test_a_backend_with_its_own_voice_refuses_a_voice_prompt(backend: str) -> None:
    """Moshi and the cascade speak with their own voice: invalid_duplex_runtime_config."""
    assert refusal(update(core_of(backend), {"ref_audio": REF_AUDIO})) == (
        "invalid_duplex_runtime_config", "session.ref_audio")


@pytest.mark.parametrize("value", [
    "https://example.com/voice.wav", "data:audio/wav;base64,@@@", "data:text/plain;base64,AA==",
    "", 7, "A" * (MAX_REF_AUDIO_CHARS + 4),
])
def test_a_malformed_voice_prompt_is_refused(value: Any) -> None:
    """A URL the worker would have to fetch, bad base64, another media type, too long."""
    assert refusal(update(loopback_core("s"), {"ref_audio": value})) == (
        "invalid_value", "session.ref_audio")


def test_a_voice_prompt_is_read_as_sent() -> None:
    assert parse_ref_audio(REF_AUDIO) == VoicePrompt("audio/wav", WAV)
    assert parse_ref_audio("data:audio/x-wav;codecs=1;base64,AAE=") == VoicePrompt(
        "audio/x-wav", b"\x00\x01")
    assert parse_ref_audio("AAE=") == VoicePrompt("", b"\x00\x01")


# ------------------------------------------------------------------------- the seed's keys


@pytest.mark.parametrize(("patch", "code", "param"), [
    ({"idle_timeout_s": 9}, "invalid_value", "session.idle_timeout_s"),
    ({"idle_timeout_s": 3601}, "invalid_value", "session.idle_timeout_s"),
    ({"idle_timeout_s": True}, "invalid_value", "session.idle_timeout_s"),
    ({"overlap_policy": "shout"}, "invalid_value", "session.overlap_policy"),
    ({"playback_commit_policy": "never"}, "invalid_value", "session.playback_commit_policy"),
    ({"temperature": -1}, "invalid_value", "session.temperature"),
    ({"temperature": 0.7}, "invalid_duplex_runtime_config", "session.temperature"),
    ({"session_id": 3}, "invalid_value", "session.session_id"),
    # The loopback's default server_vad interrupts: listen_only contradicts it.
    ({"overlap_policy": "listen_only"}, "unsupported_turn_detection", "session.overlap_policy"),
    ({"overlap_policy": "barge_in_on_speech", "turn_detection": None},
     "unsupported_turn_detection", "session.overlap_policy"),
    ({"extra_body": {"force_listen_count": -1}}, "invalid_value",
     "session.extra_body.force_listen_count"),
    ({"extra_body": {"duplex_initial_user_text": "hi"}}, "invalid_duplex_runtime_config",
     "session.extra_body.duplex_initial_user_text"),
    ({"initial_user_text": "Hello?"}, "text_only_turn_unsupported", "session.initial_user_text"),
    ({"overlap_short_ack_ms": 700}, "invalid_duplex_runtime_config",
     "session.overlap_short_ack_ms"),
    ({"overlap_barge_in_ms": 1200}, "invalid_duplex_runtime_config",
     "session.overlap_barge_in_ms"),
    ({"overlap_silence_rms": 0.003}, "invalid_duplex_runtime_config",
     "session.overlap_silence_rms"),
    ({"use_tts_template": True}, "invalid_duplex_runtime_config", "session.use_tts_template"),
    ({"metadata": {"k": 1}}, "invalid_value", "session.metadata"),
    ({"max_tokens": 0}, "invalid_value", "session.max_tokens"),
])
def test_a_seed_key_is_refused_with_its_code(patch: dict[str, Any], code: str,
                                             param: str) -> None:
    assert refusal(update(loopback_core("s"), patch)) == (code, param)


def test_the_seed_keys_are_honoured_and_shown() -> None:
    """idle_timeout_s and playback_commit_policy are shown as set; overlap_policy follows
    the turn detection once set; session_id is ignored."""
    core = loopback_core("s")
    event = update(core, {"idle_timeout_s": 60, "playback_commit_policy": "ack_only",
                          "overlap_policy": "barge_in_on_speech", "session_id": "other"})
    assert isinstance(event, msg.SessionUpdated)
    session = event.session
    assert (session["idle_timeout_s"], session["playback_commit_policy"],
            session["overlap_policy"], session["id"]) == (
                60, "ack_only", "barge_in_on_speech", "s")
    assert "session_id" not in session
    # Turn detection off: the session now only listens while the model speaks.
    event = update(core, {"turn_detection": None})
    assert isinstance(event, msg.SessionUpdated)
    assert event.session["overlap_policy"] == "listen_only"
    # interrupt_response false is listen_only too (an extension of the seed's rule).
    event = update(core, {"turn_detection": {"type": "server_vad", "interrupt_response": False},
                          "overlap_policy": "listen_only"})
    assert isinstance(event, msg.SessionUpdated)


def test_the_seeds_other_spellings_are_read() -> None:
    """max_tokens is max_output_tokens; metadata is kept and echoed; a null for a key no
    backend applies is a key left out."""
    event = update(loopback_core("s"), {"max_tokens": 64, "metadata": {"user": "u1"},
                                        "initial_user_text": None})
    assert isinstance(event, msg.SessionUpdated)
    assert (event.session["max_output_tokens"], event.session["metadata"]) == (64, {"user": "u1"})
    assert "initial_user_text" not in event.session and "max_tokens" not in event.session


def test_a_ga_session_shows_none_of_the_seed_keys() -> None:
    session = loopback_core("s").session
    assert not {"idle_timeout_s", "overlap_policy", "playback_commit_policy", "temperature",
                "ref_audio"} & session.keys()
    assert session["extra_body"] == {"loopback_mode": "turn", "auto_response": False}


def test_frame_backends_take_auto_response_true_only() -> None:
    """A model-native backend answers when it decides: auto_response false is beyond it."""
    core = core_of("moshi")
    assert refusal(update(core, {"extra_body": {"auto_response": False}})) == (
        "invalid_value", "session.extra_body.auto_response")
    assert isinstance(update(core, {"extra_body": {"auto_response": True}}), msg.SessionUpdated)


def test_force_listen_count_leaves_the_first_turns_unanswered() -> None:
    """The loopback honours the MiniCPM-o knob: with auto_response, the first N committed
    turns get no answer, the next one does."""
    core = loopback_core("s")
    assert isinstance(update(core, {"turn_detection": None, "extra_body": {
        "auto_response": True, "force_listen_count": 1}}), msg.SessionUpdated)
    audio = bytes(range(256)) * 30
    for turn in range(2):
        core.receive(msg.AppendAudio(audio=audio), T0 + turn)
        core.receive(msg.CommitInput(), T0 + turn)
        created = [e for e in core.events_to_send() if isinstance(e, msg.ResponseCreated)]
        assert len(created) == turn  # none for the first, one for the second


@pytest.mark.parametrize(("policy", "kept_ms"), [("ack_only", 80),
                                                 ("commit_all_on_done", 400 + 800)])
def test_ack_only_keeps_only_what_was_acknowledged(policy: str, kept_ms: int) -> None:
    """playback_commit_policy ack_only: a completed answer keeps what the client acknowledged
    playing; commit_all_on_done keeps it whole."""
    core = frames()
    core.receive(msg.UpdateSession(session={"playback_commit_policy": policy}), T0)
    drain(core)
    speak(core, 400)
    core.receive(msg.AckPlayback(played_ms=80), T0 + 0.5)
    quiet = FrameOutput(audio=bytes(3840), level=0.0)
    for n in range(10):
        feed(core, quiet, T0 + 0.5 + n * FRAME_S)
    done = done_of(drain(core)).response
    assert done["status"] == "completed"
    item = core.history_item(done["output"][0]["id"])
    assert item is not None and item.audio_ms == kept_ms


# ------------------------------------------------------------------------- per-backend refusals

#: A backend shaped like MiniCPM-o's plugin: instructions and voice prompt at open only, a
#: voice prompt required, no voice change once it spoke.
MINICPM_LIKE = frame_profile("minicpm", voices=("a", "b"), config=ConfigSupport(
    instructions=Applies.AT_OPEN, voice_after_audio=False, ref_audio=Applies.AT_OPEN,
    ref_audio_required=True))


def test_a_required_voice_prompt_is_asked_for_at_open() -> None:
    core = core_of("fake", MINICPM_LIKE)
    assert refusal(update(core, {"instructions": "x"})) == (
        "ref_audio_required", "session.ref_audio")
    assert isinstance(update(core, {"instructions": "x", "ref_audio": REF_AUDIO}),
                      msg.SessionUpdated)


def test_what_applies_at_open_only_is_refused_after() -> None:
    core = core_of("fake", MINICPM_LIKE)
    assert isinstance(update(core, {"instructions": "x", "ref_audio": REF_AUDIO}),
                      msg.SessionUpdated)
    assert refusal(update(core, {"ref_audio": REF_AUDIO})) == (
        "ref_audio_update_unsupported", "session.ref_audio")
    assert refusal(update(core, {"instructions": "y"})) == (
        "instructions_update_unsupported", "session.instructions")
    # The same instructions again change nothing, and other keys still apply.
    assert isinstance(update(core, {"instructions": "x", "extra_body": {
        "end_of_turn_silence_ms": 200}}), msg.SessionUpdated)


def test_a_voice_change_after_audio_is_refused() -> None:
    core = core_of("fake", MINICPM_LIKE)
    assert isinstance(update(core, {"ref_audio": REF_AUDIO, "voice": "b"}), msg.SessionUpdated)
    assert isinstance(update(core, {"voice": "a"}), msg.SessionUpdated)  # not spoken yet
    loud = FrameOutput(audio=b"\x10\x20" * 1920, level=0.1)
    for n in range(3):
        feed(core, loud, T0 + n * 0.08)
    core.events_to_send()
    assert refusal(update(core, {"voice": "b"}, T0 + 1)) == (
        "voice_update_after_audio_unsupported", "session.audio.output.voice")
    assert isinstance(update(core, {"voice": "a"}, T0 + 1), msg.SessionUpdated)


# ------------------------------------------------------------------------- response.create


@pytest.mark.parametrize(("backend", "request_", "code", "param"), [
    ("moshi", {"temperature": 0.7}, "unsupported_native_response_options",
     "response.temperature"),
    ("loopback", {"temperature": 0.7}, "invalid_duplex_runtime_config", "response.temperature"),
    ("moshi", {"speed": 1.2}, "invalid_duplex_runtime_config", "response.speed"),
    ("moshi", {"extra_body": {"force_listen_count": 1}}, "invalid_duplex_runtime_config",
     "response.extra_body.force_listen_count"),
    ("moshi", {"extra_body": {"end_of_turn_silence_ms": 200}},
     "invalid_duplex_runtime_config", "response.extra_body.end_of_turn_silence_ms"),
])
def test_the_seeds_response_options_are_refused_with_its_codes(
        backend: str, request_: dict[str, Any], code: str, param: str) -> None:
    core = core_of(backend)
    core.receive(msg.CreateResponse(response=request_, event_id="evt_u"), T0)
    [event] = core.events_to_send()
    assert refusal(event) == (code, param)


def test_the_seeds_response_options_with_the_sessions_values_are_taken() -> None:
    """speed and extra_body equal to the session's change nothing: the response is created."""
    core = loopback_core("s")
    assert isinstance(update(core, {"turn_detection": None}), msg.SessionUpdated)
    core.receive(msg.AppendAudio(audio=bytes(range(256)) * 30), T0)
    core.receive(msg.CommitInput(), T0)
    core.events_to_send()
    core.receive(msg.CreateResponse(response={"speed": 1.0, "extra_body": {
        "loopback_mode": "turn"}}, event_id="evt_c"), T0)
    assert any(isinstance(e, msg.ResponseCreated) for e in core.events_to_send())


# ------------------------------------------------------------------------- the engine


def test_a_frame_backend_gets_its_config_at_open_and_on_update() -> None:
    """Engine.open hands the backend the session's config; Engine.configure a new one (a
    configure queued before the open was applied rides the open)."""
    backend = FakeBackend(max_slots=2)
    engine = Engine(backend)
    first = SlotConfig(instructions="a")
    handle = engine.open("s1", first)
    assert handle is not None
    ridden = SlotConfig(instructions="b")
    engine.configure(handle, ridden)
    engine.tick_once()
    assert backend.slot_configs[handle.slot] == [ridden]
    later = slot_config_of(loopback_core("x").session)
    engine.configure(handle, later)
    engine.tick_once()
    assert backend.slot_configs[handle.slot] == [ridden, later]
    engine.close(handle)
    engine.configure(handle, first)  # closed: nothing happens
    engine.tick_once()
    assert backend.slot_configs[handle.slot] == [ridden, later]
