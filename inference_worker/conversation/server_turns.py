"""The user's turns as turn detection (``server_vad`` / ``semantic_vad``) finds them in the
input, for the conversation core.

:class:`ServerTurns` feeds the appended audio to the session's
:class:`~inference_worker.turn_detection.timeline.InputTimeline` and acts on what its detector
hears: a speech start (``speech_started``; with ``interrupt_response`` the active response
ends ``cancelled`` ``turn_detected``), a speech stop (``speech_stopped``, then the turn is
committed as a manual commit would be and, with ``create_response``, answered), and
``idle_timeout_ms`` (once a response ended, that much input without speech commits the silent
segment and answers it). Pure: no I/O, no clock (``now`` is passed in).
"""

from __future__ import annotations

from collections.abc import Callable

from inference_worker.conversation.history import Conversation
from inference_worker.conversation.objects import CancelReason
from inference_worker.conversation.responses import Responses
from inference_worker.conversation.user_input import UserInput
from inference_worker.turn_detection.timeline import InputTimeline
from inference_worker.turn_detection.vad import SpeechStarted, VadEvent

__all__ = ["CommitTurn", "ServerTurns"]

#: Commits a detected turn's audio at ``now``, answering it when the flag says so.
CommitTurn = Callable[[bytes, float, bool], None]


class ServerTurns:
    """Turn detection's side of one session's input.

    Args:
        conversation: the session's history, which emits the events.
        responses: the session's responses (speech interrupts the active one).
        user_input: the session's input buffer (a detected turn takes its part of it).
        timeline: the session's input timeline and its detector.
        commit: commits a detected turn (the core's own commit of a turn).
    """

    __slots__ = ("_commit", "_conversation", "_input", "_responses", "_timeline",
                 "_turn_start_ms", "idle_from_ms")

    def __init__(self, conversation: Conversation, responses: Responses, user_input: UserInput,
                 timeline: InputTimeline, commit: CommitTurn) -> None:
        self._conversation = conversation
        self._responses = responses
        self._input = user_input
        self._timeline = timeline
        self._commit = commit
        self._turn_start_ms = 0  # where the turn being spoken started (its speech_started)
        #: The idle timeout's start, once a response ended (None: not counting).
        self.idle_from_ms: int | None = None

    def hear(self, audio: bytes, now: float) -> None:
        """The client appended ``audio`` (pcm16 24 kHz): what the detector hears in it, then
        ``idle_timeout_ms``: once a response ended, that much input without speech commits
        the silent segment and answers it, after ``input_audio_buffer.timeout_triggered``.
        Measured on the input timeline: a client streams its microphone, silence included.
        (One call per append: it is on every relayed chunk's path.)"""
        for event in self._timeline.feed(audio):
            self._on_speech(event, now)
        settings, start = self._timeline.settings, self.idle_from_ms
        if (settings is None or settings.idle_timeout_ms is None or start is None
                or self._responses.active or self._timeline.speaking):
            return
        timeline = self._timeline
        end = timeline.fed_ms
        if end - start < settings.idle_timeout_ms:
            return
        self.idle_from_ms = None
        self._conversation.timeout_triggered(start, end)
        audio = self._input.take_turn(timeline.byte_at(start), timeline.byte_at(end),
                                      timeline.fed_bytes, rest_stays=False)
        self._timeline.reset()
        self._commit(audio, now, True)

    @property
    def turn_start_ms(self) -> int:
        """Where the turn being spoken started on the input timeline (its speech start)."""
        return self._turn_start_ms

    def restore(self, turn_start_ms: int, idle_from_ms: int | None) -> None:
        """Continue a checkpointed session."""
        self._turn_start_ms, self.idle_from_ms = turn_start_ms, idle_from_ms

    def response_ended(self) -> None:
        """A response ended: the idle timeout counts from here."""
        self.idle_from_ms = self._timeline.fed_ms

    def _on_speech(self, event: VadEvent, now: float) -> None:
        settings = self._timeline.settings
        assert settings is not None  # only a detector makes events
        if isinstance(event, SpeechStarted):
            self._turn_start_ms = event.audio_start_ms
            self.idle_from_ms = None  # the user spoke: not idle
            # GA order: speech_started first, then the interrupted response's response.done.
            self._conversation.speech_started(event.audio_start_ms)
            if settings.interrupt_response and self._responses.cancellable() is not None:
                self._responses.cancel(CancelReason.TURN_DETECTED)
            return
        self._conversation.speech_stopped(event.audio_end_ms)
        timeline = self._timeline
        # What followed the turn stays buffered.
        audio = self._input.take_turn(timeline.byte_at(self._turn_start_ms),
                                      timeline.byte_at(event.audio_end_ms), timeline.fed_bytes,
                                      rest_stays=True)
        self._commit(audio, now, settings.create_response)
