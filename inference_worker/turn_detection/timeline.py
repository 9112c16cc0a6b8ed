"""Turn detection as the conversation core acts on it: the session's settings
(:class:`TurnDetection`) and the input timeline the detector hears (:class:`InputTimeline`).

:class:`InputTimeline` counts a session's input audio and, while ``turn_detection`` is on,
feeds it to a detector (:class:`~inference_worker.turn_detection.vad.EnergyVad`, or Silero where
installed). Event times are milliseconds on this timeline. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from contract.messages import JsonObject
from inference_worker.conversation.profiles import BYTES_PER_SECOND
from inference_worker.turn_detection.vad import (
    DetectorPlace,
    EnergyVad,
    SpeechStarted,
    SpeechStopped,
    Vad,
    VadConfig,
    VadEvent,
    vad_config_from_turn_detection,
)

__all__ = ["InputTimeline", "TimelinePlace", "TurnDetection", "turn_detection_of"]

#: Bytes of pcm16 24 kHz mono per millisecond of audio.
_BYTES_PER_MS: Final = BYTES_PER_SECOND // 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnDetection:
    """The session's ``turn_detection``, as the core acts on it.

    Attributes:
        vad: how the detector hears speech.
        create_response: answer each detected turn as ``response.create`` would.
        interrupt_response: cancel the active response when speech starts (``turn_detected``).
        idle_timeout_ms: after a response, this much input without speech answers anyway
            (``input_audio_buffer.timeout_triggered``; None: never).
    """

    vad: VadConfig
    create_response: bool
    interrupt_response: bool
    idle_timeout_ms: int | None = None


def turn_detection_of(config: JsonObject) -> TurnDetection | None:
    """The turn detection of an effective session object (None: off, push-to-talk)."""
    value = config["audio"]["input"]["turn_detection"]
    if value is None:
        return None
    return TurnDetection(vad=vad_config_from_turn_detection(value),
                         create_response=bool(value["create_response"]),
                         interrupt_response=bool(value["interrupt_response"]),
                         idle_timeout_ms=value.get("idle_timeout_ms"))


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelinePlace:
    """A timeline's place between turns: the bytes appended, and its detector's (None: off),
    with where on the timeline the detector was made."""

    fed_bytes: int
    detector_origin_ms: int
    detector: DetectorPlace | None


class InputTimeline:
    """A session's input audio timeline (bytes appended since it opened) and, while turn
    detection is on, the detector that hears it (``detector`` makes one for a
    :class:`~inference_worker.turn_detection.vad.VadConfig`: the energy VAD, or Silero where
    installed).

    Event times are milliseconds on this timeline, whenever the detector was switched on, as
    the Realtime API counts from the start of the session's audio.
    """

    def __init__(self, detector: Callable[[VadConfig], Vad] = EnergyVad) -> None:
        self._detector = detector
        self._fed = 0
        self._vad: Vad | None = None
        self._vad_origin_ms = 0  # the timeline's position when the detector was created
        self._settings: TurnDetection | None = None

    @property
    def settings(self) -> TurnDetection | None:
        """The turn detection in force (None: off)."""
        return self._settings

    @property
    def speaking(self) -> bool:
        """Whether the detector hears speech going on now."""
        return self._vad is not None and self._vad.speaking

    @property
    def fed_bytes(self) -> int:
        """Bytes of input audio appended so far."""
        return self._fed

    @property
    def fed_ms(self) -> int:
        """Whole milliseconds of input audio appended so far."""
        return self._fed // _BYTES_PER_MS

    @staticmethod
    def byte_at(ms: int) -> int:
        """The timeline position in bytes of ``ms``."""
        return ms * _BYTES_PER_MS

    @property
    def place(self) -> TimelinePlace | None:
        """Where the timeline and its detector are, when the detector has nothing in progress
        (what a checkpoint keeps); None while it has."""
        if self._vad is None:
            return TimelinePlace(fed_bytes=self._fed, detector_origin_ms=0, detector=None)
        detector = self._vad.place
        return None if detector is None else TimelinePlace(
            fed_bytes=self._fed, detector_origin_ms=self._vad_origin_ms, detector=detector)

    def resume(self, place: TimelinePlace) -> None:
        """Continue a checkpointed session's timeline at ``place``, once configured as it
        was: its detector goes on from where the other was (its own state anew)."""
        self._fed = place.fed_bytes
        if self._vad is None or self._settings is None:
            return
        if place.detector is None:  # detection was off there: it starts here
            self._vad, self._vad_origin_ms = self._detector(self._settings.vad), self.fed_ms
            return
        self._vad_origin_ms = place.detector_origin_ms
        self._vad.resume(place.detector)

    def configure(self, settings: TurnDetection | None) -> None:
        """Apply the session's turn detection. The same settings again change nothing (a turn
        in progress goes on); other settings restart detection; None stops it."""
        if settings == self._settings:
            return
        self._settings = settings
        if settings is None:
            self._vad = None
        elif self._vad is None:
            self._vad = self._detector(settings.vad)
            self._vad_origin_ms = self.fed_ms
        else:
            self._vad.reset(settings.vad)

    def feed(self, audio: bytes) -> list[VadEvent]:
        """Count appended audio; with detection on, the speech events it completes."""
        self._fed += len(audio)
        if self._vad is None:
            return []
        origin = self._vad_origin_ms
        return [SpeechStarted(audio_start_ms=origin + event.audio_start_ms)
                if isinstance(event, SpeechStarted)
                else SpeechStopped(audio_end_ms=origin + event.audio_end_ms)
                for event in self._vad.feed(audio)]

    def reset(self) -> None:
        """Forget a turn in progress (after a manual commit or a clear took its audio)."""
        if self._vad is not None:
            self._vad.reset()
