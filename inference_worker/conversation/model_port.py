"""The model as the conversation core drives it: :class:`ModelPort`.

The core tells its model what happened (input heard, input forgotten, a response opened for
it to fill, a turn committed, a response stopped) and collects what the model did as
:mod:`~inference_worker.conversation.reports`. Two ports exist: the loopback's paced playback
(:class:`~inference_worker.backends.loopback.LoopbackModel`, which reports on its own clock) and
:class:`EngineModel`, a frame backend's slot, whose reports come with each engine tick and
whose instructions wait for the worker's driver (:meth:`EngineModel.take_input`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from contract.messages import JsonObject
from inference_worker.conversation.reports import Report
from inference_worker.conversation.seed_settings import SlotConfig

__all__ = ["EngineModel", "ModelPort", "ModelState", "PendingInput"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingInput:
    """What the engine must do for a session's slot: apply a new slot configuration, stop the
    model's response (once per stop asked for: the engine counts them into each frame's
    epoch), clear queued input, then queue audio, with the camera frames that rode it (each at
    a byte offset into ``audio``)."""

    clear: bool = False
    audio: bytes = b""
    stops: int = 0
    video: tuple[tuple[int, tuple[bytes, ...]], ...] = ()
    #: The slot's new configuration (None: unchanged).
    config: SlotConfig | None = None


@dataclass(frozen=True, slots=True)
class ModelState:
    """What a checkpoint keeps of a model port: the stops so far (its epoch) and the turns it
    heard committed (the loopback counts them for ``force_listen_count``)."""

    epoch: int
    commits: int = 0


class ModelPort(Protocol):
    """One session's model, as the core sees it."""

    @property
    def auto_respond(self) -> bool:
        """Whether every manually committed turn is answered at once (as if followed by
        ``response.create``)."""
        ...

    @property
    def epoch(self) -> int:
        """How many stops the core asked for: output the model produced before the last of
        them took effect (an engine frame of an older epoch) belongs to a cancelled response."""
        ...

    def checkpoint(self) -> ModelState | None:
        """Its state, or None while it holds something a checkpoint cannot carry (output not
        reported yet, input not handed to its engine)."""
        ...

    def restore(self, state: ModelState) -> None:
        """A checkpointed session continues here, from ``state``."""

    def configure(self, config: JsonObject) -> None:
        """The session's effective configuration changed to ``config``."""

    def configure_slot(self, config: SlotConfig) -> None:
        """An accepted ``session.update`` gave the backend this slot configuration (what it
        needs of the session: instructions, voice, voice prompt, temperature, its knobs)."""

    def hear(self, audio: bytes, video: tuple[bytes, ...] = ()) -> None:
        """The user's input audio (pcm16 24 kHz), in order, with the camera frames of its
        append (only for a profile that sees video; ``audio`` may then be empty)."""

    def forget_input(self) -> None:
        """Drop the input the model has not consumed yet."""

    def answer(self, audio: bytes, *, spoken: bool, now: float) -> None:
        """A response was opened for the model to fill: ``audio`` is the committed turn it
        answers (empty when the model heard the input already), ``spoken`` its modality."""

    def committed(self) -> None:
        """The user's turn was committed."""

    def stop(self) -> None:
        """The response was cancelled: stop it."""

    def reports(self, now: float) -> list[Report]:
        """What the model did by ``now`` that the core has not been told yet."""
        ...

    def next_deadline(self) -> float | None:
        """When :meth:`reports` next has something (None: only when told something)."""
        ...

    def take_input(self) -> PendingInput:
        """What the engine must do for this session's slot now; forgets it."""
        ...


class EngineModel:
    """A frame backend's slot: its input waits for the driver, its reports come with ticks.

    A full-duplex model decides itself when it answers, so :meth:`answer` and
    :meth:`committed` tell it nothing; it hears the user's audio as it arrives.
    """

    __slots__ = ("_audio", "_clear", "_config", "_epoch", "_stops", "_video")

    def __init__(self) -> None:
        self._audio = bytearray()
        self._video: list[tuple[int, tuple[bytes, ...]]] = []
        self._config: SlotConfig | None = None  # for the engine, since the last take_input
        self._clear = False
        self._stops = 0  # asked for since the last take_input
        self._epoch = 0

    @property
    def auto_respond(self) -> bool:
        """Never: the model answers when it decides to."""
        return False

    @property
    def epoch(self) -> int:
        """The stops asked for so far (the engine stamps each frame with those it applied)."""
        return self._epoch

    def checkpoint(self) -> ModelState | None:
        """Its epoch, once the engine took everything asked of it (None before)."""
        if self._audio or self._video or self._clear or self._stops or self._config:
            return None
        return ModelState(self._epoch)

    def restore(self, state: ModelState) -> None:
        """Count stops from the state's epoch (the engine's slot must stamp its frames from
        there)."""
        self._epoch = state.epoch

    def configure(self, config: JsonObject) -> None:
        """Nothing to do: the slot's settings come typed (:meth:`configure_slot`)."""

    def configure_slot(self, config: SlotConfig) -> None:
        """Hand ``config`` to the engine with the slot's next input (the newest wins)."""
        self._config = config

    def hear(self, audio: bytes, video: tuple[bytes, ...] = ()) -> None:
        """Queue ``audio`` for the engine, ``video`` where it starts."""
        if video:
            self._video.append((len(self._audio), video))
        self._audio += audio

    def forget_input(self) -> None:
        """Drop the queued audio, and have the engine drop what it holds too."""
        self._audio.clear()
        self._video.clear()
        self._clear = True

    def answer(self, audio: bytes, *, spoken: bool, now: float) -> None:
        """Nothing to say to the model: its next audible output fills the response."""

    def committed(self) -> None:
        """Nothing to say to the model: it heard the turn."""

    def stop(self) -> None:
        """Have the engine stop the slot's response (a backend that can drops the rest)."""
        self._stops += 1
        self._epoch += 1

    def reports(self, now: float) -> list[Report]:
        """None: the engine's ticks carry the reports."""
        return []

    def next_deadline(self) -> float | None:
        """None: the engine's ticks drive the model."""
        return None

    def take_input(self) -> PendingInput:
        """The configuration, stop, clear and audio queued since the last call; forgets them."""
        pending = PendingInput(clear=self._clear, audio=bytes(self._audio), stops=self._stops,
                               video=tuple(self._video), config=self._config)
        self._audio.clear()
        self._video.clear()
        self._clear, self._stops, self._config = False, 0, None
        return pending
