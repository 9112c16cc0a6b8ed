"""What a model did, as typed reports: all a backend tells the conversation core.

A backend never decides an event. It reports what its model did: a tick's output
(:class:`Output`: audio, its level, text), the user's speech starting and stopping, the
user's transcript, that it started or ended its own turn, that it barged in, that it failed.
The core turns reports into events. :func:`reports_of` reads one engine tick's
:class:`~inference_worker.audio_frames.FrameOutput`; the loopback's playback reports the same types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from inference_worker.audio_frames import FrameOutput

__all__ = [
    "AUDIBLE",
    "SILENCE_LEVEL",
    "BargedIn",
    "Failed",
    "Output",
    "Report",
    "ResponseStarted",
    "TurnEnded",
    "UserSpeechStarted",
    "UserSpeechStopped",
    "UserTranscript",
    "UserTranscriptFailed",
    "reports_of",
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


Report: TypeAlias = (Output | UserSpeechStarted | UserSpeechStopped | UserTranscript
                     | UserTranscriptFailed | ResponseStarted | TurnEnded | BargedIn | Failed)

# A backend's event keys, and what each reports when set.
_EVENT_REPORTS: Final[dict[str, Report]] = {
    "speech_started": UserSpeechStarted(),
    "barge_in": BargedIn(),
    "speech_stopped": UserSpeechStopped(),
}


def reports_of(frame: FrameOutput) -> list[Report]:
    """One tick's reports, in the order they happened: the backend's events (in the order it
    set them: ``speech_started`` precedes ``barge_in``) after its failure, the user's
    transcript (or its failure: an ``error`` that comes with a ``transcript``), the start of
    the model's turn (after the transcript: the user item it answers is complete by then),
    the tick's output, then the end of the model's turn."""
    reports: list[Report] = []
    events: dict[str, Any] = frame.events
    for key, value in events.items():
        report = _EVENT_REPORTS.get(key)
        if report is not None and value:
            reports.append(report)
    error = events.get("error")
    failed = isinstance(error, str) and bool(error)
    transcript = events.get("transcript")
    if isinstance(transcript, str):
        # A transcript that comes with an error is the transcription's failure.
        reports.append(UserTranscriptFailed(message=str(error)) if failed
                       else UserTranscript(text=transcript))
    elif failed:
        reports.insert(0, Failed(message=str(error)))
    if events.get("response_started"):
        reports.append(ResponseStarted())
    reports.append(Output(audio=frame.audio, level=frame.level, text=frame.text))
    if events.get("end_of_turn") or events.get("response_done"):
        reports.append(TurnEnded())
    return reports
