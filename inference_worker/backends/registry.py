"""The backends, as one table: each entry says how its sessions take turns and how to build it.

Callers ask the table (:func:`backend_entry`) instead of comparing names. A backend module is
imported only when its entry's ``load`` runs. ``loopback`` has no frames: its sessions' model is
its own paced playback (:func:`loopback_core`), and the engine steps every other backend frame
by frame (:func:`frame_core`). How each
backend's sessions take turns is its :class:`~inference_worker.conversation.turns.TurnMode`, whose
policy the conversation core follows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from contract.messages import JsonObject
from inference_worker.backend import Backend
from inference_worker.backends.loopback import CHUNK_SECONDS, LoopbackModel
from inference_worker.conversation.core import ConversationCore
from inference_worker.conversation.model_port import EngineModel
from inference_worker.conversation.profiles import LOOPBACK, SessionProfile, frame_profile
from inference_worker.conversation.seed_settings import Applies, ConfigSupport
from inference_worker.conversation.turns import POLICIES, TurnMode
from inference_worker.turn_detection.vad import EnergyVad, Vad, VadConfig

__all__ = [
    "BACKENDS",
    "CASCADE_TURN_DETECTION",
    "FRAME_BACKENDS",
    "REGISTRY",
    "BackendEntry",
    "BackendRequest",
    "TurnMode",
    "backend_entry",
    "capabilities_of",
    "create_backend",
    "explicit_turns",
    "frame_core",
    "loopback_core",
    "parse_options",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendRequest:
    """What to build: the backend's name, its capacity and where its weights are."""

    name: str
    slots: int
    model_path: str = ""
    device: str = "cpu"
    dtype: str = "float32"
    options: Mapping[str, str] = field(default_factory=dict)
    cuda_graphs: bool = False


def parse_options(text: str) -> dict[str, str]:
    """Parse ``key=value,key=value`` (the ``BACKEND_OPTIONS`` setting).

    Raises:
        ValueError: an entry without ``=`` or with an empty key.
    """
    options: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"backend option {entry!r} is not key=value")
        options[key.strip()] = value.strip()
    return options


def explicit_turns(name: str) -> bool:
    """Whether the backend signals turns in its events (the cascade) rather than by audio."""
    return backend_entry(name).turns is TurnMode.EVENTS


def create_backend(request: BackendRequest) -> Backend:
    """Build (and load) the frame backend ``request.name`` names.

    This may take long (model weights): call it off the event loop.

    Raises:
        ValueError: an unknown backend, one without frames (``loopback``), or a bad option.
        ImportError: the backend's libraries are not installed (torch for ``moshi``, the
            ``cascade`` extra for ``cascade``).
    """
    load = backend_entry(request.name).load
    if load is None:
        raise ValueError(f"{request.name!r} has no frames; frame backends: {FRAME_BACKENDS}")
    return load(request)


def _fake(request: BackendRequest) -> Backend:
    from inference_worker.backends.fake import FakeBackend, FakeOptions

    return FakeBackend(max_slots=request.slots, options=FakeOptions.parse(request.options))


def _recording(request: BackendRequest) -> Backend:
    from inference_worker.backends.fake import FakeOptions
    from inference_worker.backends.recording import RecordingBackend

    return RecordingBackend(max_slots=request.slots, options=FakeOptions.parse(request.options))


def _moshi(request: BackendRequest) -> Backend:
    # Checked before importing torch: a missing path is said at once.
    if request.options:
        raise ValueError(f"the moshi backend takes no options, got {sorted(request.options)}")
    if not request.model_path:
        raise ValueError("the moshi backend needs a model path (DUPLEX_GATEWAY_MODEL_PATH): a"
                         " save_pretrained directory, e.g. from scripts/make_tiny_moshi.py")
    from inference_worker.backends.moshi import MoshiBackend

    backend: Backend = MoshiBackend.load(request.model_path, max_slots=request.slots,
                                         device=request.device, dtype=request.dtype,
                                         cuda_graphs=request.cuda_graphs)
    return backend


_CASCADE_PATHS: Final = ("vad_path", "asr_path", "voice_path", "responder_path")


def _cascade(request: BackendRequest) -> Backend:
    from inference_worker.backends.cascade import CascadeBackend, CascadeConfig

    unknown = set(request.options) - {*_CASCADE_PATHS, "responder"}
    if unknown:
        raise ValueError(f"unknown cascade options {sorted(unknown)}")
    paths = {key: request.options.get(key) for key in _CASCADE_PATHS}
    if request.model_path and paths["responder_path"] is None:
        paths["responder_path"] = request.model_path  # a transformers causal LM directory
    responder = request.options.get(
        "responder", "causal_lm" if paths["responder_path"] else "echo")
    return CascadeBackend.load(**paths, responder=responder,
                               config=CascadeConfig(max_slots=request.slots))


#: What the cascade's own Silero VAD does (``CascadeConfig``'s defaults, which a test holds
#: this to): its sessions show this turn detection whatever a client asks, since the backend
#: decides its turns itself.
CASCADE_TURN_DETECTION: Final[Mapping[str, object]] = MappingProxyType({
    "type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
    "silence_duration_ms": 500, "idle_timeout_ms": None, "create_response": True,
    "interrupt_response": True,
})


#: A backend that speaks with a voice of its own (Moshi's weights, the cascade's Piper voice):
#: a voice prompt is refused. The loopback and the fake take one (the fake records it).
_OWN_VOICE: Final = ConfigSupport(ref_audio=Applies.NEVER)


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendEntry:
    """One backend: how its sessions take turns, and how to build it.

    Attributes:
        name: what ``--backend`` / ``DUPLEX_GATEWAY_BACKEND`` calls it.
        turns: how its sessions take turns.
        profile: what its sessions can be (voices, modalities, what transcribes, ...).
        load: builds it from a request (None: no frames, its own model port serves it).
        needs_model_path: it cannot load without weights (``DUPLEX_GATEWAY_MODEL_PATH``).
    """

    name: str
    turns: TurnMode
    profile: SessionProfile
    load: Callable[[BackendRequest], Backend] | None
    needs_model_path: bool = False

    @property
    def frames(self) -> bool:
        """Whether the engine steps it frame by frame (every backend but ``loopback``)."""
        return self.load is not None


#: Every backend the worker serves, by name.
REGISTRY: Final[Mapping[str, BackendEntry]] = MappingProxyType({entry.name: entry for entry in (
    BackendEntry(name="loopback", turns=TurnMode.LOOPBACK, profile=LOOPBACK, load=None),
    BackendEntry(name="fake", turns=TurnMode.AUDIO, profile=frame_profile("fake"), load=_fake),
    BackendEntry(name="moshi", turns=TurnMode.AUDIO,
                 profile=frame_profile("moshi", config=_OWN_VOICE),
                 load=_moshi, needs_model_path=True),
    BackendEntry(name="cascade", turns=TurnMode.EVENTS,
                 profile=frame_profile("cascade", voices=("en_US-joe-medium",),
                                       transcription_model="whisper-tiny.en",
                                       turn_detection=CASCADE_TURN_DETECTION,
                                       config=_OWN_VOICE),
                 load=_cascade),
    # A test backend: the fake's echo that sees video and says what it saw.
    BackendEntry(name="recording", turns=TurnMode.AUDIO,
                 profile=frame_profile("recording", sees_video=True), load=_recording),
)})
#: Every backend name the worker accepts.
BACKENDS: Final = tuple(REGISTRY)
#: Backends stepped frame by frame by the engine.
FRAME_BACKENDS: Final = tuple(name for name, entry in REGISTRY.items() if entry.frames)


#: The seed's ``input_modes``: every backend takes its input as appended audio chunks.
_INPUT_MODES: Final = ("append_audio_chunk",)


def capabilities_of(name: str, *, frame_seconds: float, slots: int = 1) -> JsonObject:
    """What sessions on backend ``name`` can do, as ``session.created``, ``session.resumed``
    and ``GET /v1/models`` announce it: every field of the seed's ``DuplexCapabilities``, each
    answered for what this backend really does, plus this server's own flags
    (``supports_server_vad``, ``supports_text_input_append``, ``supports_input_transcription``).
    Clients branch on these, never on a model's name.

    Args:
        name: the backend.
        frame_seconds: how long one model output lasts (``chunk_period_ms``).
        slots: the sessions one worker of it serves at once.
    """
    entry = backend_entry(name)
    turns, policy, profile = entry.turns, POLICIES[entry.turns], entry.profile
    native = turns is not TurnMode.LOOPBACK
    server_vad = not policy.model_detects_speech
    return {
        "implementation_level": "model_native_duplex" if native else "turn_based_duplex",
        "supports_session_adapter": True,
        "supports_model_native_turn_policy": native,
        # commit, response.create and server VAD signal turns from outside the model
        "supports_external_turn_signal": True,
        "supports_client_commit": True,
        "supports_server_vad": server_vad,
        # every backend stops its response when the user barges in (Backend.stop_response)
        "supports_barge_in": True,
        "supports_playback_ack": True,
        # a frame model hears each append as it arrives; the loopback waits for the turn
        "supports_input_append": policy.frames,
        "supports_text_input_append": False,
        "supports_replace_latest_chunk": False,
        "supports_reencode_context": False,
        "supports_rollback_to_checkpoint": False,
        "supports_turn_commit_only": not native,
        "supports_kv_lease": False,
        "supports_core_kv_lease": False,
        # a frame model keeps its own state per slot (Moshi's caches, the cascade's turn)
        "supports_model_internal_state": policy.frames,
        "supports_stage_resumption": False,
        "supports_scheduler_native_append": False,
        "supports_core_resumable_request": False,
        "supports_concurrent_turn_requests": False,
        "required_input_modalities": ["audio"],
        "optional_input_modalities": ["video"] if profile.sees_video else [],
        "supports_stage_connector_handoff": False,
        # a frame model hears while it speaks; the loopback plays a turn back after it
        "supports_independent_io_streams": policy.frames,
        "supports_realtime_endpoint": True,
        "supports_multi_session": True,
        "supports_multi_session_same_replica": slots > 1,
        # leases fence a session to one worker; a resume moves it to another gateway
        "supports_session_lease": True,
        "supports_session_resume": True,
        "session_admission_mode": "serving_managed",
        "supports_audio_truncate": True,
        "supports_image_input": False,
        "supports_text_only_turn": "text" in profile.output_modalities,
        "supports_chat_completions": False,
        "text_turn_priming_units": 0,
        "supports_input_transcription": policy.model_detects_speech,
        "requires_model_runner_kv": False,
        "requires_native_stage_role": False,
        "adapter_patterns": ["frame_step_batch"] if policy.frames else ["chunk_group_append"],
        "input_modes": list(_INPUT_MODES),
        "signal_sources": [*(["model_native"] if native else []), "client_event",
                           *(["server_policy"] if server_vad else [])],
        "stage_handoff_transport": None,
        "chunk_period_ms": round(frame_seconds * 1000),
        # not measured per backend, so none is promised
        "target_barge_in_latency_ms": None,
    }


def backend_entry(name: str) -> BackendEntry:
    """The table's entry for ``name``.

    Raises:
        ValueError: no backend has that name (the message lists the ones that exist).
    """
    entry = REGISTRY.get(name)
    if entry is None:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
    return entry


def loopback_core(session_id: str, *, detector: Callable[[VadConfig], Vad] = EnergyVad,
                  core: type[ConversationCore] = ConversationCore) -> ConversationCore:
    """The conversation core of a loopback session: its model is the paced playback.

    Args:
        session_id: the session's id.
        detector: makes the turn detector of ``turn_detection``.
        core: the core's class (a test's subclass).
    """
    return core(session_id, model=LoopbackModel(), profile=LOOPBACK,
                policy=POLICIES[TurnMode.LOOPBACK], frame_seconds=CHUNK_SECONDS,
                detector=detector)


def frame_core(session_id: str, *, model: str, frame_seconds: float,
               turns: TurnMode = TurnMode.AUDIO, profile: SessionProfile | None = None,
               detector: Callable[[VadConfig], Vad] = EnergyVad,
               core: type[ConversationCore] = ConversationCore) -> ConversationCore:
    """The conversation core of a session on the frame backend named ``model``: its model is
    an engine slot.

    Args:
        session_id: the session's id.
        model: the backend's name.
        frame_seconds: how long one tick lasts.
        turns: how the backend's sessions take turns.
        profile: what its sessions can be (None: :func:`frame_profile` of ``model``).
        detector: makes the turn detector of ``turn_detection``.
        core: the core's class (a test's subclass).
    """
    return core(session_id, model=EngineModel(),
                profile=profile if profile is not None else frame_profile(model),
                policy=POLICIES[turns], frame_seconds=frame_seconds, detector=detector)
