"""How a worker builds its sessions: each a conversation core of the worker's backend (one kind
of core for every backend), named after the model its client opened it with, holding an engine
slot on a frame backend (with what its checkpoints keep of it, where the backend's slots can
be continued elsewhere); and the profile every new session here starts from, which the worker
publishes so that ``session.created`` can announce it before the worker sees the session."""

from __future__ import annotations

from collections.abc import Callable

from inference_worker.backends.loopback import CHUNK_SECONDS
from inference_worker.backends.registry import (
    backend_entry,
    capabilities_of,
    frame_core,
    loopback_core,
)
from inference_worker.conversation.core import ConversationCore
from inference_worker.conversation.seed_settings import slot_config_of
from inference_worker.conversation.turns import POLICIES
from inference_worker.engine import Engine, SlotResume
from inference_worker.input_hold import InputHold, SessionCheckpoints
from inference_worker.sessions import Session
from inference_worker.settings import WorkerSettings
from inference_worker.slot_context import SlotContext
from inference_worker.turn_detection.vad import Vad, VadConfig
from store.directory import WorkerProfile
from store.logs import SessionStart

__all__ = ["SessionFactory"]


class SessionFactory:
    """The sessions of one worker's backend; ``engine`` None: the loopback, which has none."""

    def __init__(self, settings: WorkerSettings,
                 detector: Callable[[VadConfig], Vad]) -> None:
        """Sessions of ``settings.backend``, each turn detector made by ``detector``."""
        self._entry = backend_entry(settings.backend)
        # A session opened without a model name is named after the first this worker serves.
        self._own_name = settings.models[0]
        self._detector = detector
        self._slots = settings.slots
        self._settings = settings

    def session(self, session_id: str, engine: Engine | None, start: SessionStart,
                resume: SlotResume | None = None) -> Session | None:
        """A new session as its record ``start`` describes it: named after its announced
        model (see :meth:`core`), checkpointed where the settings say so, holding input for
        its checkpoints within its input bounds, its engine slot continuing where ``resume``
        says (a moved session's); None: no engine slot is free."""
        core = self.core(session_id, engine, start.model)
        handle = slot_context = None
        checkpoints = self._checkpoints(start, engine)
        if engine is not None:
            # The slot opens with the new session's settings; a session.update applied before
            # the engine thread opened it rides the open (Engine.configure).
            handle = engine.open(session_id, slot_config_of(core.session), resume)
            if handle is None:  # more placements than slots: cannot while capacity holds
                return None
            if checkpoints is not None:
                slot_context = (SlotContext(engine, handle) if resume is None
                                else SlotContext(engine, handle, resume.context, resume.epoch))
        return Session(core=core, handle=handle, checkpoints=checkpoints,
                       slot_context=slot_context)

    @property
    def keeps_turn_audio(self) -> bool:
        """Whether its sessions' cores keep the input buffer's bytes (a restore needs them
        back): only a backend that answers a turn with its audio does."""
        return POLICIES[self._entry.turns].keeps_turn_audio

    def _checkpoints(self, start: SessionStart,
                     engine: Engine | None) -> SessionCheckpoints | None:
        """What the session's checkpoints hold: at most the settings' bounds, and at most a
        quarter of each of its input log's bounds, so its unread input keeps the rest. None
        where no worker could continue one: a frame backend whose slots cannot be continued
        elsewhere (``FrameSpec.context_steps`` 0), whose lost worker's reaper ends them."""
        settings = self._settings
        if not settings.checkpoint_interval_s or (
                engine is not None and not engine.spec.context_steps):
            return None
        entries, size = settings.checkpoint_hold_entries, settings.checkpoint_hold_bytes
        if start.input_log_max_entries:
            entries = min(entries, max(1, start.input_log_max_entries // 4))
        if start.input_log_max_bytes:
            size = min(size, max(1, start.input_log_max_bytes // 4))
        return SessionCheckpoints(InputHold(max_entries=entries, max_bytes=size))

    def core(self, session_id: str, engine: Engine | None,
             name: str | None = None) -> ConversationCore:
        """The conversation core of a new session, named ``name`` (the model its client opened
        it with; None: this worker's own model name, the first it serves)."""
        entry = self._entry
        if engine is None:
            core = loopback_core(session_id, detector=self._detector)
        else:
            core = frame_core(session_id, model=entry.name,
                              frame_seconds=engine.spec.frame_seconds, turns=entry.turns,
                              profile=entry.profile, detector=self._detector)
        core.name(name if name is not None else self._own_name)
        return core

    def profile(self, engine: Engine | None) -> WorkerProfile:
        """The default session of a new session here (without its ``id``) and what sessions
        here can do: what ``session.created`` announces before this worker sees the session.

        Raises:
            ValueError: it is too large to publish (the worker refuses to start).
        """
        frame_seconds = CHUNK_SECONDS if engine is None else engine.spec.frame_seconds
        session = self.core("", engine).session  # named after the worker's own model name
        session.pop("id", None)
        profile = WorkerProfile(session=session, capabilities=capabilities_of(
            self._entry.name, frame_seconds=frame_seconds, slots=self._slots))
        profile.encode()  # its size is checked here, at start, not at the first registration
        return profile
