"""What a model did, as typed reports: all a backend tells the conversation core.

A backend never decides an event. It reports what its model did: a tick's output
(:class:`Output`: audio, its level, text), the user's speech starting and stopping, the
user's transcript, that it started or ended its own turn, that it barged in, that it failed.
The core turns reports into events. A frame backend returns them with each tick
(``SlotResult.reports``, carried by :class:`~inference_worker.audio_frames.FrameOutput`); the
loopback's playback reports the same types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias

__all__ = [
    "AUDIBLE",
    "SILENCE_LEVEL",
    "BargedIn",
    "Failed",
    "ModelReport",
    "Output",
    "Report",
    "ResponseStarted",
    "TurnEnded",
    "UserSpeechStarted",
    "UserSpeechStopped",
    "UserTranscript",
    "UserTranscriptFailed",
]

#: RMS below which output counts as silence (-50 dBFS).
SILENCE_LEVEL: Final = 10 ** (-50 / 20)
#: The level of output known to be meant (the loopback's playback of the user's own audio).
AUDIBLE: Final = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Output:
    """The model's output for one tick (or one chunk): pcm16 24 kHz audio, its RMS level in
    [0, 1] and the text it produced with it ("" for none)."""

    audio: bytes
    level: float
    text: str = ""

    @property
    def audible(self) -> bool:
        """Whether it carries audio above the silence level."""
        return bool(self.audio) and self.level > SILENCE_LEVEL


@dataclass(frozen=True, slots=True, kw_only=True)
class UserSpeechStarted:
    """The model heard the user start speaking."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UserSpeechStopped:
    """The model heard the user stop: the user's turn is over."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UserTranscript:
    """What the model heard the user say in the turn that stopped last."""

    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class UserTranscriptFailed:
    """The model could not transcribe the user's turn that stopped last."""

    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseStarted:
    """The model started its own turn."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnEnded:
    """The model's turn is over (it said so, or its playback ran out)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BargedIn:
    """The model stopped talking because the user talked over it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Failed:
    """The model failed on this session's turn (the session goes on)."""

    message: str


#: What a backend reports of its model on a tick besides the tick's output (``SlotResult``).
ModelReport: TypeAlias = (UserSpeechStarted | UserSpeechStopped | UserTranscript
                          | UserTranscriptFailed | ResponseStarted | TurnEnded | BargedIn | Failed)
Report: TypeAlias = Output | ModelReport
