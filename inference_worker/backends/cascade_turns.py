"""The cascade's turn detector (:class:`TurnDetector`): speech start and end from the VAD's
per-window probabilities."""

from __future__ import annotations

from typing import Literal

__all__ = ["TurnDetector"]


class TurnDetector:
    """Speech start and end from per-window speech probabilities, with hysteresis.

    A turn starts after ``min_speech`` consecutive windows at or above ``threshold`` and ends
    after ``hangover`` windows below ``threshold - 0.15`` (windows in between neither extend
    nor end it), as in Silero's ``VADIterator``. Pure: no audio, no model.
    """

    def __init__(self, *, threshold: float, min_speech: int, hangover: int) -> None:
        """Counts are in windows."""
        self._threshold = threshold
        self._negative = max(threshold - 0.15, 0.01)
        self._min_speech = min_speech
        self._hangover = hangover
        self._index = -1
        self._run = 0
        self._silence = 0
        #: Whether the user is speaking (between a start and a stop).
        self.speaking = False
        #: Window index where the current (or last) turn's speech began.
        self.start_window = 0
        #: Window index of the current (or last) turn's last speech window.
        self.last_speech_window = 0

    def push(self, probability: float) -> Literal["start", "stop"] | None:
        """Feed the next window's probability; returns a turn boundary if it makes one."""
        self._index += 1
        if not self.speaking:
            if probability < self._threshold:
                self._run = 0
                return None
            self._run += 1
            if self._run < self._min_speech:
                return None
            self.speaking, self._silence = True, 0
            self.start_window = self._index - self._run + 1
            self.last_speech_window = self._index
            return "start"
        if probability >= self._threshold:
            self._silence, self.last_speech_window = 0, self._index
        elif probability < self._negative:
            self._silence += 1
            if self._silence >= self._hangover:
                self.stop()
                return "stop"
        return None

    def stop(self) -> None:
        """End the turn now (e.g. at ``max_utterance_s``)."""
        self.speaking, self._run, self._silence = False, 0, 0

    @property
    def idle(self) -> bool:
        """Whether it hears nothing: no turn, and no speech window counting towards one."""
        return not self.speaking and self._run == 0
