"""What every runner keeps the same way: the conversation's items and its responses' events.

Both runners (the loopback's :class:`~inference_worker.session_runner.SessionRunner` and the
frame backends' :class:`~inference_worker.duplex_runner.DuplexRunner`) decide *when* a turn is
committed or a response opens and ends; this module decides *what* that emits, once: item ids
and their order, the user item's events, a response's opening and closing sequences (Realtime
GA order, openai_realtime.md §2a; seed §3.4), refusals as ``error`` events. It is I/O-free
like the runners: it only queues typed events for the driver to drain.

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
from store import messages as msg
from store.messages import JsonObject

__all__ = [
    "Conversation",
    "FrameRunner",
    "OpenResponse",
    "PendingInput",
    "Runner",
    "UserItem",
    "already_active",
    "cancel_refusal",
    "commit_too_small",
    "is_frame_runner",
]


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

    # ------------------------------------------------------------------ items

    def add_user_item(self, *, done: bool) -> UserItem:
        """A committed user turn: ``input_audio_buffer.committed`` ->
        ``conversation.item.added`` [-> ``conversation.item.done``, when ``done``; else the
        caller completes it with :meth:`complete_user_item` once its transcript is known]."""
        item = UserItem(id=self._new_item_id(), previous_item_id=self._last_item_id)
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
