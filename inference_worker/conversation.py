"""What every runner keeps the same way: the conversation's items and its responses' events.

Both runners (the loopback's :class:`~inference_worker.session_runner.SessionRunner` and the
frame backends' :class:`~inference_worker.duplex_runner.DuplexRunner`) decide *when* a turn is
committed or a response opens and ends; this module decides *what* that emits, once: item ids
and their order, the user item's events, a response's opening and closing sequences (Realtime
GA order, openai_realtime.md §2a; seed §3.4), refusals as ``error`` events. It is I/O-free
like the runners: it only queues typed events for the driver to drain.

Turn detection is shared the same way: :class:`InputTimeline` counts a session's input audio
and, while ``turn_detection`` is on, feeds it to an :class:`~inference_worker.vad.EnergyVad`;
:meth:`Conversation.speech_started` reserves the id the turn's user item will get, so
``speech_started``, ``speech_stopped`` and the commit that follows all name it.

The :class:`Runner` protocols are what the worker's driver sees of a runner.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Protocol, TypeGuard

from inference_worker.frames import FrameOutput
from inference_worker.loopback import BYTES_PER_SECOND, Refusal
from inference_worker.realtime_items import (
    assistant_item,
    content_part,
    item_content,
    response_object,
    zero_usage,
)
from inference_worker.vad import (
    EnergyVad,
    SpeechStarted,
    SpeechStopped,
    VadConfig,
    VadEvent,
    vad_config_from_turn_detection,
)
from store import messages as msg
from store.messages import JsonObject

__all__ = [
    "Conversation",
    "FrameRunner",
    "InputTimeline",
    "OpenResponse",
    "PendingInput",
    "Runner",
    "TurnDetection",
    "UserItem",
    "already_active",
    "cancel_refusal",
    "commit_too_small",
    "is_frame_runner",
    "turn_detection_of",
]

#: Bytes of pcm16 24 kHz mono per millisecond of audio.
_BYTES_PER_MS = BYTES_PER_SECOND // 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingInput:
    """What the engine must do for a session's slot: clear queued input, then queue audio."""

    clear: bool = False
    audio: bytes = b""


class Runner(Protocol):
    """A session's conversational state, as the worker drives it (commands in, events out)."""

    @property
    def close_requested(self) -> str | None: ...

    @property
    def session(self) -> JsonObject: ...

    def receive(self, command: msg.Command, now: float) -> None: ...

    def tick(self, now: float) -> None: ...

    def next_deadline(self) -> float | None: ...

    def events_to_send(self) -> list[msg.Event]: ...


class FrameRunner(Runner, Protocol):
    """A runner whose model is stepped by the engine: it takes each tick's output and gives
    the input the engine should apply."""

    def on_frame(self, frame: FrameOutput, now: float) -> None: ...

    def take_input(self) -> PendingInput: ...

    def take_first_audio_latencies(self) -> list[float]: ...


def is_frame_runner(runner: Runner) -> TypeGuard[FrameRunner]:
    """Whether ``runner`` takes frames. A look at its class, not a runtime-checkable
    isinstance: that would evaluate every property (a deep copy of the session) per tick."""
    return callable(getattr(type(runner), "on_frame", None))


@dataclass(frozen=True, slots=True, kw_only=True)
class UserItem:
    """A user message item: its id and the item before it."""

    id: str
    previous_item_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenResponse:
    """An open response: its ids, its output modality and the object ``response.created``
    carried (the base of ``response.done``)."""

    id: str
    item_id: str
    previous_item_id: str | None
    audio: bool
    created: JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnDetection:
    """The session's ``turn_detection``, as the runners act on it.

    Attributes:
        vad: how the detector hears speech.
        create_response: answer each detected turn as ``response.create`` would.
        interrupt_response: cancel the active response when speech starts (``turn_detected``).
    """

    vad: VadConfig
    create_response: bool
    interrupt_response: bool


def turn_detection_of(config: JsonObject) -> TurnDetection | None:
    """The turn detection of an effective session object (None: off, push-to-talk)."""
    value = config["audio"]["input"]["turn_detection"]
    if value is None:
        return None
    return TurnDetection(vad=vad_config_from_turn_detection(value),
                         create_response=bool(value["create_response"]),
                         interrupt_response=bool(value["interrupt_response"]))


class InputTimeline:
    """A session's input audio timeline (bytes appended since it opened) and, while turn
    detection is on, the detector that hears it.

    Event times are milliseconds on this timeline, whenever the detector was switched on, as
    the Realtime API counts from the start of the session's audio.
    """

    def __init__(self) -> None:
        self._fed = 0
        self._vad: EnergyVad | None = None
        self._vad_origin_ms = 0  # the timeline's position when the detector was created
        self._settings: TurnDetection | None = None

    @property
    def settings(self) -> TurnDetection | None:
        """The turn detection in force (None: off)."""
        return self._settings

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

    def configure(self, settings: TurnDetection | None) -> None:
        """Apply the session's turn detection. The same settings again change nothing (a turn
        in progress goes on); other settings restart detection; None stops it."""
        if settings == self._settings:
            return
        self._settings = settings
        if settings is None:
            self._vad = None
        elif self._vad is None:
            self._vad = EnergyVad(settings.vad)
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


class Conversation:
    """The default conversation of one session, and the events it emits, in order.

    Args:
        config: the effective session object (the runner replaces it on ``session.update``).
    """

    def __init__(self, config: JsonObject) -> None:
        self.config = config
        self._events: list[msg.Event] = []
        self._last_item_id: str | None = None  # the tail of the conversation
        self._items = 0
        self._responses = 0
        self._reserved_item_id: str | None = None  # the next user item's, once announced

    def emit(self, *events: msg.Event) -> None:
        """Queue events after those already queued."""
        self._events += events

    def take_events(self) -> list[msg.Event]:
        """The events queued since the last call, in order; forgets them."""
        events, self._events = self._events, []
        return events

    def refuse(self, client_event_id: str | None, refusal: Refusal) -> None:
        """Answer a command with an ``error`` event naming it."""
        self.emit(msg.ErrorEvent(code=refusal.code, message=refusal.message,
                                 param=refusal.param, client_event_id=client_event_id))

    def session_updated(self) -> None:
        """``session.updated`` with the whole effective session object."""
        self.emit(msg.SessionUpdated(session=copy.deepcopy(self.config)))

    # ------------------------------------------------------------------ turn detection

    def speech_started(self, audio_start_ms: int) -> None:
        """``input_audio_buffer.speech_started``, naming the user item the turn will be."""
        self.emit(msg.InputSpeechStarted(audio_start_ms=audio_start_ms,
                                         item_id=self._next_user_item_id()))

    def speech_stopped(self, audio_end_ms: int) -> None:
        """``input_audio_buffer.speech_stopped``, naming the same item (the commit follows)."""
        self.emit(msg.InputSpeechStopped(audio_end_ms=audio_end_ms,
                                         item_id=self._next_user_item_id()))

    def _next_user_item_id(self) -> str:
        if self._reserved_item_id is None:
            self._reserved_item_id = self._new_item_id()
        return self._reserved_item_id

    # ------------------------------------------------------------------ items

    def add_user_item(self, *, done: bool) -> UserItem:
        """A committed user turn: ``input_audio_buffer.committed`` ->
        ``conversation.item.added`` [-> ``conversation.item.done``, when ``done``; else the
        caller completes it with :meth:`complete_user_item` once its transcript is known].
        Its id is the one a ``speech_started`` announced, when one did."""
        item = UserItem(id=self._next_user_item_id(), previous_item_id=self._last_item_id)
        self._reserved_item_id = None
        self._last_item_id = item.id
        self.emit(msg.InputCommitted(item_id=item.id, previous_item_id=item.previous_item_id),
                  msg.ItemAdded(item=_user_item(item.id, None),
                                previous_item_id=item.previous_item_id))
        if done:
            self.complete_user_item(item, None)
        return item

    def complete_user_item(self, item: UserItem, transcript: str | None) -> None:
        """``conversation.item.done`` for a user item, with its transcript if known."""
        self.emit(msg.ItemDone(item=_user_item(item.id, transcript),
                               previous_item_id=item.previous_item_id))

    # ------------------------------------------------------------------ responses

    def open_response(self, *, audio: bool, metadata: dict[str, str] | None) -> OpenResponse:
        """``response.created`` -> ``response.output_item.added`` -> ``conversation.item.added``
        -> ``response.content_part.added``; the response's item joins the conversation."""
        self._responses += 1
        response_id = f"resp_{self._responses}"
        item_id = self._new_item_id()
        response = OpenResponse(
            id=response_id, item_id=item_id, previous_item_id=self._last_item_id, audio=audio,
            created=response_object(response_id, self.config, audio, metadata))
        self._last_item_id = item_id
        item = assistant_item(item_id, "in_progress", [])
        self.emit(
            msg.ResponseCreated(response=copy.deepcopy(response.created)),
            msg.OutputItemAdded(response_id=response_id, output_index=0, item=item),
            msg.ItemAdded(item=copy.deepcopy(item), previous_item_id=response.previous_item_id),
            msg.ContentPartAdded(response_id=response_id, item_id=item_id, output_index=0,
                                 content_index=0, part=content_part(audio)),
        )
        return response

    def finish_response(self, response: OpenResponse, *, status: str,
                        reason: str | None = None, transcript: str = "") -> None:
        """The closing half, the same for a completed and a cancelled response: the audio and
        transcript ends (audio responses), the part, the item, ``response.done``.

        Args:
            response: the response :meth:`open_response` opened.
            status: ``completed`` or ``cancelled``.
            reason: why it was cancelled (``status_details.reason``); None when completed.
            transcript: what the model said in it.
        """
        rid, iid, audio = response.id, response.item_id, response.audio
        part, content = content_part(audio), item_content(audio)
        if audio:
            part = {**part, "transcript": transcript}
            content = {**content, "transcript": transcript}
            self.emit(
                msg.AudioDone(response_id=rid, item_id=iid, output_index=0, content_index=0),
                msg.TranscriptDone(response_id=rid, item_id=iid, output_index=0,
                                   content_index=0, transcript=transcript),
            )
        item = assistant_item(iid, "completed" if status == "completed" else "incomplete",
                              [content])
        details = None if reason is None else {"type": "cancelled", "reason": reason}
        done = {**copy.deepcopy(response.created), "status": status, "status_details": details,
                "output": [item], "usage": zero_usage()}
        self.emit(
            msg.ContentPartDone(response_id=rid, item_id=iid, output_index=0, content_index=0,
                                part=part),
            msg.ItemDone(item=copy.deepcopy(item), previous_item_id=response.previous_item_id),
            msg.OutputItemDone(response_id=rid, output_index=0, item=copy.deepcopy(item)),
            msg.ResponseDone(response=done),
        )

    def _new_item_id(self) -> str:
        self._items += 1
        return f"item_{self._items}"


def _user_item(item_id: str, transcript: str | None) -> JsonObject:
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": "user",
            "status": "completed",
            "content": [{"type": "input_audio", "transcript": transcript}]}


# --------------------------------------------------------------------------- refusals


def commit_too_small(buffered_bytes: int) -> Refusal:
    """``input_audio_buffer.commit`` with less than 100 ms buffered (OpenAI's wording)."""
    buffered_ms = buffered_bytes * 1000 / BYTES_PER_SECOND
    return Refusal(
        code="input_audio_buffer_commit_empty",
        message="Error committing input audio buffer: buffer too small. Expected at least"
        f" 100ms of audio, but buffer only has {buffered_ms:.2f}ms of audio.",
    )


def already_active(response_id: str) -> Refusal:
    """``response.create`` while a response is active (OpenAI's wording)."""
    return Refusal(
        code="conversation_already_has_active_response",
        message=f"Conversation already has an active response in progress: {response_id}."
        " Wait until the response is finished before creating a new one.",
    )


def cancel_refusal(active_id: str | None, requested_id: str | None) -> Refusal | None:
    """Why ``response.cancel`` cannot cancel (None: it can): no response is active, or it
    names another response than the active one."""
    if active_id is None:
        return Refusal(code="response_cancel_not_active",
                       message="Cancellation failed: no active response found")
    if requested_id is not None and requested_id != active_id:
        return Refusal(code="response_cancel_not_active", param="response_id",
                       message=f"Cancellation failed: {requested_id} is not active")
    return None
