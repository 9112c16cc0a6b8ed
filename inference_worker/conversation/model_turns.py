"""The user's turns as a backend that detects speech itself reports them (the cascade: its
VAD and ASR), for the conversation core.

Such a backend says when the user started and stopped speaking, what they said (or that
transcribing failed) and when they interrupted the model; :class:`ModelTurns` turns each
report into the same events turn detection makes, placed where the model was on the input
timeline, and keeps the user item a stop added until its transcript completes it. Pure: no
I/O, no clock (``now`` is passed in).
"""

from __future__ import annotations

from inference_worker.conversation.history import Conversation, UserItem
from inference_worker.conversation.objects import CancelReason, ResponseStatus
from inference_worker.conversation.reports import (
    BargedIn,
    Report,
    UserSpeechStarted,
    UserSpeechStopped,
    UserTranscript,
    UserTranscriptFailed,
)
from inference_worker.conversation.responses import Responses
from inference_worker.conversation.states import Trigger
from inference_worker.conversation.user_input import UserInput
from inference_worker.turn_detection.timeline import InputTimeline

__all__ = ["ModelTurns"]


class ModelTurns:
    """What a backend that detects speech itself reports of the user's turns.

    Args:
        conversation: the session's history, which emits the events.
        responses: the session's responses (a barge-in ends the active one).
        user_input: the session's input buffer (a stop takes it).
        timeline: the session's input timeline (where the model's reports are placed).
    """

    __slots__ = ("_conversation", "_input", "_responses", "_timeline", "_user_item", "input_ms")

    def __init__(self, conversation: Conversation, responses: Responses, user_input: UserInput,
                 timeline: InputTimeline) -> None:
        self._conversation = conversation
        self._responses = responses
        self._input = user_input
        self._timeline = timeline
        self._user_item: UserItem | None = None  # added on end of speech, awaiting its transcript
        #: The model's place on the input timeline (the engine's count of the input it
        #: consumed), once a frame said it.
        self.input_ms: int | None = None

    @property
    def awaiting_transcript(self) -> bool:
        """Whether a user item waits for its transcript (a checkpoint cannot carry it)."""
        return self._user_item is not None

    def on_report(self, report: Report, now: float) -> None:
        """The backend said the user spoke, stopped, said something or interrupted it."""
        if isinstance(report, UserSpeechStarted):
            self._conversation.speech_started(self._heard_at_ms())
        elif isinstance(report, BargedIn):
            if self._responses.active:
                self._responses.end(Trigger.CANCEL, ResponseStatus.CANCELLED,
                                    CancelReason.TURN_DETECTED)
        elif isinstance(report, UserSpeechStopped):
            self._conversation.speech_stopped(self._heard_at_ms())
            self.complete(None)
            self._user_item = self._conversation.add_user_item(done=False)
            self._input.taken_by_model()
            self._responses.anchor = now
        elif isinstance(report, UserTranscript):
            self.complete(report.text)
        elif isinstance(report, UserTranscriptFailed):
            self.complete(None, failure=report.message)

    def complete(self, transcript: str | None, failure: str | None = None) -> None:
        """Complete the user item awaiting its transcript, if any (with ``failure``: why
        transcribing it failed)."""
        pending, self._user_item = self._user_item, None
        if pending is not None:
            self._conversation.complete_user_item(pending, transcript, failure)

    def _heard_at_ms(self) -> int:
        """Where on the input timeline the model heard what it reports now: its own place,
        never past what was appended; the input appended so far when that is not known."""
        fed = self._timeline.fed_ms
        heard = self.input_ms
        return fed if heard is None else min(heard, fed)
