"""What ``duplex-gateway talk`` knows of its session, fed one server event at a time (no I/O):
the answer's audio, whether every turn heard was answered, and what to print or send."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Final

from duplex_gateway.wav import RATE

__all__ = ["AnswerState", "Notice", "Output", "Played", "Said"]

_BYTES_PER_MS: Final = RATE * 2 // 1000


@dataclass(frozen=True, slots=True)
class Said:
    """Transcript text to print: ``speaker`` (``you`` or ``assistant``), ``text``, and
    whether the line ends with it."""

    speaker: str
    text: str
    ends_line: bool


@dataclass(frozen=True, slots=True)
class Notice:
    """A line about the session for stderr."""

    text: str


@dataclass(frozen=True, slots=True)
class Played:
    """A response ended: acknowledge ``played_ms`` of its audio (all talk received)."""

    response_id: str
    played_ms: int


Output = Said | Notice | Played


@dataclass(slots=True)
class AnswerState:
    """What talk knows of the session, fed one server event at a time (no I/O).

    The answer is every ``response.output_audio.delta``, in order. A turn is pending from
    the server's ``speech_started`` until a response ends after its speech stopped, or its
    transcript comes back empty (nothing is answered then); talk is done once the question
    was sent, a response ended and no turn is pending or being spoken.
    """

    audio: bytearray = field(default_factory=bytearray)
    responses_done: int = 0
    #: ``status`` of the last ``response.done`` and why, when it did not complete.
    last_status: str | None = None
    last_problem: str | None = None
    active_response: str | None = None
    speaking: bool = False
    turn_pending: bool = False
    #: ``session.resync_required``'s reason: events of the answer are gone.
    lost: str | None = None
    #: The terminal event: ``session.closed reason`` / ``session.expired reason``.
    ended: str | None = None
    _response_bytes: int = 0
    _assistant_line_open: bool = False

    def finished(self, question_sent: bool) -> bool:
        """Whether every turn heard so far has been answered (the question being sent)."""
        return (question_sent and self.responses_done > 0 and self.active_response is None
                and not self.speaking and not self.turn_pending)

    @property
    def answer_s(self) -> float:
        return len(self.audio) / (2 * RATE)

    def apply(self, data: dict[str, Any]) -> list[Output]:
        """Take one server event; what to print or send because of it."""
        kind = data.get("type")
        if kind == "input_audio_buffer.speech_started":
            self.speaking = self.turn_pending = True
        elif kind == "input_audio_buffer.speech_stopped":
            self.speaking = False
        elif kind == "conversation.item.input_audio_transcription.completed":
            return self._heard(str(data.get("transcript", "")))
        elif kind == "conversation.item.input_audio_transcription.failed":
            self._nothing_to_answer()
            return [Notice(f"the server could not transcribe the question: "
                           f"{_message(data.get('error'))}")]
        elif kind == "response.created":
            self.active_response = str(data.get("response", {}).get("id", ""))
            self._response_bytes = 0
        elif kind == "response.output_audio.delta":
            self._audio(data)
        elif kind == "response.output_audio_transcript.delta":
            self._assistant_line_open = True
            return [Said("assistant", str(data.get("delta", "")), ends_line=False)]
        elif kind == "response.output_audio_transcript.done":
            return self._assistant_done(str(data.get("transcript", "")))
        elif kind == "response.done":
            return self._response_done(data.get("response", {}))
        else:
            return self._session_event(kind, data)
        return []

    def _session_event(self, kind: Any, data: dict[str, Any]) -> list[Output]:
        if kind == "error":
            return [Notice(f"the server refused a command: {_message(data.get('error'))}")]
        if kind == "session.resync_required":
            self.lost = str(data.get("reason"))
            return [Notice(f"events were lost ({self.lost}): the answer has a gap")]
        if kind in ("session.closed", "session.expired"):
            self.ended = f"{kind} {data.get('reason')}"
        return []

    def _audio(self, data: dict[str, Any]) -> None:
        chunk = base64.b64decode(data.get("delta", ""))
        self.audio += chunk
        self._response_bytes += len(chunk)

    def _heard(self, transcript: str) -> list[Output]:
        if not transcript.strip():
            self._nothing_to_answer()
            return []
        return [Said("you", transcript.strip(), ends_line=True)]

    def _nothing_to_answer(self) -> None:
        # The server answers no turn it heard nothing in: unless more speech is being heard,
        # no turn is left to wait for.
        if not self.speaking:
            self.turn_pending = False

    def _assistant_done(self, transcript: str) -> list[Output]:
        if self._assistant_line_open:
            self._assistant_line_open = False
            return [Said("assistant", "", ends_line=True)]
        return [Said("assistant", transcript, ends_line=True)] if transcript else []

    def _response_done(self, response: dict[str, Any]) -> list[Output]:
        outputs: list[Output] = []
        if self._assistant_line_open:
            self._assistant_line_open = False
            outputs.append(Said("assistant", "", ends_line=True))
        self.responses_done += 1
        self.last_status = str(response.get("status"))
        details = response.get("status_details") or {}
        problem = details.get("reason") or _message(details.get("error")) or None
        self.last_problem = None if self.last_status == "completed" else str(problem)
        if not self.speaking:
            self.turn_pending = False
        response_id = str(response.get("id") or self.active_response or "")
        if self._response_bytes and response_id:
            outputs.append(Played(response_id, self._response_bytes // _BYTES_PER_MS))
        self.active_response = None
        return outputs


def _message(error: Any) -> str:
    """``code: message`` of an ``error`` object ("" for none)."""
    if not isinstance(error, dict):
        return ""
    return ": ".join(str(part) for part in (error.get("code"), error.get("message")) if part)
