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

The conversation keeps its items in order (:class:`Item`: id, role, status, content with the
audio bytes left out, and for assistant audio the audio generated so far), at most
:data:`MAX_ITEMS` of them: adding one more drops the oldest first, silently, as GA's own context
truncation does. The client manages them with ``conversation.item.create`` / ``.retrieve`` /
``.delete`` / ``.truncate`` (:meth:`Conversation.item_command`), the same for every runner:
a truncation cuts an assistant audio item to the milliseconds the client says it heard and
drops its transcript, so the history never claims audio the user did not hear.

The :class:`Runner` protocols are what the worker's driver sees of a runner.
"""

from __future__ import annotations

import base64
import binascii
import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeAlias, TypeGuard

from inference_worker.frames import FrameOutput
from inference_worker.realtime_items import (
    assistant_item,
    content_part,
    item_content,
    response_object,
    zero_usage,
)
from inference_worker.session_config import BYTES_PER_SECOND, Refusal
from inference_worker.untrusted import describe
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
    "MAX_ITEMS",
    "Conversation",
    "CreatedUserTurn",
    "FrameRunner",
    "InputTimeline",
    "Item",
    "ItemCommand",
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

#: Items a conversation keeps; one more drops the oldest (never the one just added).
MAX_ITEMS: Final = 256
#: ``previous_item_id`` of ``conversation.item.create`` that puts the item first (GA).
_ROOT: Final = "root"
#: Longest client-chosen item id.
_MAX_ITEM_ID_CHARS: Final = 64
#: The content part types each role's message may carry (openai_realtime.md §1c).
_PART_TYPES: Final = {
    "user": ("input_text", "input_audio"),
    "system": ("input_text",),
    "assistant": ("output_text", "output_audio"),
}

ItemCommand: TypeAlias = msg.CreateItem | msg.RetrieveItem | msg.DeleteItem | msg.TruncateItem


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
class Item:
    """One conversation item, as the conversation keeps it (no audio bytes).

    Attributes:
        id: the item's id.
        role: ``user``, ``system`` or ``assistant`` (every item is a ``message``).
        status: ``in_progress``, ``completed`` or ``incomplete``.
        content: its GA content parts, without their ``audio``.
        audio_bytes: assistant audio: the bytes generated so far (or sent with a created
            item), cut to the heard length by a truncation.
    """

    id: str
    role: str
    status: str
    content: tuple[JsonObject, ...]
    audio_bytes: int = 0

    @property
    def audio_ms(self) -> int:
        """Milliseconds of audio, rounded up: a client that played every byte it got may
        say so in whole milliseconds without exceeding it."""
        return -(-self.audio_bytes // _BYTES_PER_MS)

    @property
    def truncatable(self) -> bool:
        """Whether it is an assistant audio item (the only kind GA truncates)."""
        return self.role == "assistant" and any(part["type"] == "output_audio"
                                                for part in self.content)

    def realtime(self) -> JsonObject:
        """The GA item object (``realtime.item``)."""
        return {"id": self.id, "object": "realtime.item", "type": "message", "role": self.role,
                "status": self.status, "content": [dict(part) for part in self.content]}


@dataclass(frozen=True, slots=True, kw_only=True)
class CreatedUserTurn:
    """A user message a ``conversation.item.create`` added, for a runner that answers user
    turns: its id and the pcm16 audio of its ``input_audio`` parts (empty for text)."""

    item_id: str
    audio: bytes


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
        self._order: list[str] = []  # item ids, oldest first
        self._by_id: dict[str, Item] = {}
        self._items = 0
        self._responses = 0
        self._reserved_item_id: str | None = None  # the next user item's, once announced

    @property
    def _last_item_id(self) -> str | None:
        """The tail of the conversation: the item a new one follows."""
        return self._order[-1] if self._order else None

    @property
    def items(self) -> list[Item]:
        """The conversation's items, in order."""
        return [self._by_id[item_id] for item_id in self._order]

    def item(self, item_id: str) -> Item | None:
        """The item ``item_id`` (None: not in the conversation, or no longer)."""
        return self._by_id.get(item_id)

    @property
    def last_response_id(self) -> str | None:
        """The id of the newest response (None before the first)."""
        return f"resp_{self._responses}" if self._responses else None

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
        self._insert(Item(id=item.id, role="user", status="completed",
                          content=_user_audio_content(None)), None)
        self.emit(msg.InputCommitted(item_id=item.id, previous_item_id=item.previous_item_id),
                  msg.ItemAdded(item=_user_item(item.id, None),
                                previous_item_id=item.previous_item_id))
        if done:
            self.complete_user_item(item, None)
        return item

    def complete_user_item(self, item: UserItem, transcript: str | None) -> None:
        """``conversation.item.done`` for a user item, with its transcript if known."""
        self._update(item.id, content=_user_audio_content(transcript))
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
        self._insert(Item(id=item_id, role="assistant", status="in_progress",
                          content=(item_content(audio),)), None)
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
        self._update(iid, status=item["status"], content=(dict(content),))
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

    def audio_delta(self, response: OpenResponse, audio: bytes) -> None:
        """``response.output_audio.delta``; the response's item counts the audio generated."""
        self.emit(msg.AudioDelta(response_id=response.id, item_id=response.item_id,
                                 output_index=0, content_index=0, audio=audio))
        item = self._by_id.get(response.item_id)
        if item is not None:
            self._update(item.id, audio_bytes=item.audio_bytes + len(audio))

    def output_cleared(self, response_id: str | None) -> None:
        """``output_audio_buffer.cleared``, naming the response whose audio was dropped, or
        the newest one when none was playing ("" before any response)."""
        self.emit(msg.OutputAudioCleared(response_id=response_id or self.last_response_id or ""))

    # ------------------------------------------------------------------ client item commands

    def item_command(self, command: ItemCommand, *, active: OpenResponse | None,
                     cancel_active: Callable[[], None]) -> CreatedUserTurn | None:
        """Apply ``conversation.item.create`` / ``.retrieve`` / ``.delete`` / ``.truncate``.

        Args:
            command: the client's command.
            active: the response that may still be cancelled (None: none is active).
            cancel_active: ends ``active`` as ``cancelled`` (``client_cancelled``), the way the
                runner cancels; called when a truncation names its item, before truncating.

        Returns:
            The user message a create added, for a runner that answers user turns.
        """
        match command:
            case msg.CreateItem():
                return self._create_item(command)
            case msg.RetrieveItem():
                item = self._known(command.event_id, command.item_id)
                if item is not None:
                    self.emit(msg.ItemRetrieved(item=item.realtime()))
            case msg.DeleteItem():
                self._delete_item(command, active)
            case msg.TruncateItem():
                self._truncate_item(command, active, cancel_active)
        return None

    def _known(self, event_id: str | None, item_id: str,
               param: str = "item_id") -> Item | None:
        item = self._by_id.get(item_id)
        if item is None:
            self.refuse(event_id, Refusal(
                code="item_not_found", param=param,
                message=f"Item with item_id {describe(item_id)} not found in conversation."))
        return item

    def _delete_item(self, command: msg.DeleteItem, active: OpenResponse | None) -> None:
        item = self._known(command.event_id, command.item_id)
        if item is None:
            return
        if active is not None and active.item_id == item.id:
            self.refuse(command.event_id, Refusal(
                code="invalid_value", param="item_id",
                message=f"Item {item.id} belongs to the active response {active.id};"
                " cancel it (response.cancel) before deleting it."))
            return
        self._order.remove(item.id)
        del self._by_id[item.id]
        self.emit(msg.ItemDeleted(item_id=item.id))

    def _truncate_item(self, command: msg.TruncateItem, active: OpenResponse | None,
                       cancel_active: Callable[[], None]) -> None:
        item = self._known(command.event_id, command.item_id)
        if item is None:
            return
        refusal = _truncate_refusal(item, command)
        if refusal is not None:
            self.refuse(command.event_id, refusal)
            return
        if active is not None and active.item_id == item.id:
            cancel_active()  # what the client did not hear will not be generated either
        current = self._by_id.get(item.id, item)
        # GA drops the transcript: it would describe audio the user never heard.
        content = tuple({**part, "transcript": ""} if part["type"] == "output_audio" else part
                        for part in current.content)
        heard = min(current.audio_bytes, command.audio_end_ms * _BYTES_PER_MS)
        self._update(item.id, content=content, audio_bytes=heard)
        self.emit(msg.ItemTruncated(item_id=item.id, content_index=command.content_index,
                                    audio_end_ms=command.audio_end_ms))

    def _create_item(self, command: msg.CreateItem) -> CreatedUserTurn | None:
        parsed = _parse_item(command.item)
        if isinstance(parsed, Refusal):
            self.refuse(command.event_id, parsed)
            return None
        role, content, audio = parsed
        item_id = command.item.get("id")
        if item_id is not None:
            refusal = self._id_refusal(item_id)
            if refusal is not None:
                self.refuse(command.event_id, refusal)
                return None
        after = command.previous_item_id
        if after not in (None, _ROOT) and self._known(
                command.event_id, after, "previous_item_id") is None:
            return None
        item = Item(id=item_id or self._new_item_id(), role=role, status="completed",
                    content=content, audio_bytes=len(audio) if role == "assistant" else 0)
        previous = self._insert(item, after)
        self.emit(msg.ItemAdded(item=item.realtime(), previous_item_id=previous),
                  msg.ItemDone(item=item.realtime(), previous_item_id=previous))
        return CreatedUserTurn(item_id=item.id, audio=audio) if role == "user" else None

    def _id_refusal(self, item_id: Any) -> Refusal | None:
        if not isinstance(item_id, str):
            return Refusal(code="invalid_type", param="item.id", message="expected a string")
        if not 0 < len(item_id) <= _MAX_ITEM_ID_CHARS:
            return Refusal(code="invalid_value", param="item.id",
                           message=f"must be 1 to {_MAX_ITEM_ID_CHARS} characters")
        if item_id in self._by_id or item_id == self._reserved_item_id:
            return Refusal(code="invalid_value", param="item.id",
                           message=f"an item with id {describe(item_id)} already exists")
        return None

    # ------------------------------------------------------------------ the item store

    def _insert(self, item: Item, after: str | None) -> str | None:
        """Put ``item`` after ``after`` (None: at the end; ``root``: first), keep the bound;
        return the id of the item before it."""
        if after is None:
            index = len(self._order)
        elif after == _ROOT:
            index = 0
        else:
            index = self._order.index(after) + 1
        self._order.insert(index, item.id)
        self._by_id[item.id] = item
        while len(self._order) > MAX_ITEMS:
            oldest = self._order[0] if self._order[0] != item.id else self._order[1]
            self._order.remove(oldest)
            del self._by_id[oldest]
        index = self._order.index(item.id)
        return self._order[index - 1] if index else None

    def _update(self, item_id: str, **changes: Any) -> None:
        # An item dropped by the bound or deleted is not brought back by a late update.
        item = self._by_id.get(item_id)
        if item is not None:
            self._by_id[item_id] = dataclasses.replace(item, **changes)

    def _new_item_id(self) -> str:
        while True:  # a client may have taken a name of ours for an item it created
            self._items += 1
            item_id = f"item_{self._items}"
            if item_id not in self._by_id:
                return item_id


def _user_audio_content(transcript: str | None) -> tuple[JsonObject, ...]:
    return ({"type": "input_audio", "transcript": transcript},)


def _truncate_refusal(item: Item, command: msg.TruncateItem) -> Refusal | None:
    """Why ``item`` cannot be cut to ``command.audio_end_ms`` (None: it can)."""
    if not item.truncatable:
        return Refusal(code="invalid_value", param="item_id",
                       message=f"Only assistant audio items can be truncated; {item.id} is not"
                       " one.")
    if command.content_index != 0:
        return Refusal(code="invalid_value", param="content_index",
                       message="Invalid value for 'content_index': audio is content part 0.")
    if command.audio_end_ms > item.audio_ms:
        return Refusal(code="invalid_value", param="audio_end_ms",
                       message=f"audio_end_ms {command.audio_end_ms} is longer than the"
                       f" {item.audio_ms} ms of audio of item {item.id}.")
    return None


def _parse_item(item: JsonObject) -> tuple[str, tuple[JsonObject, ...], bytes] | Refusal:
    """A created item's role, its content parts without audio, and the pcm16 audio its parts
    carried; or why it is refused. Only ``message`` items: sessions have no tools, so no
    ``function_call`` exists for a ``function_call_output`` to answer."""
    kind = _string_field(item, "type", "item.type")
    if isinstance(kind, Refusal):
        return kind
    if kind != "message":
        return Refusal(code="invalid_value", param="item.type",
                       message=f"unsupported item type {describe(kind)}: this server takes"
                       " 'message' items (its sessions have no tools to call)")
    role = _string_field(item, "role", "item.role")
    if isinstance(role, Refusal):
        return role
    if role not in _PART_TYPES:
        return Refusal(code="invalid_value", param="item.role",
                       message=f"unsupported role {describe(role)}: expected one of"
                       " 'user', 'system', 'assistant'")
    parts = item.get("content")
    if parts is None:
        return Refusal(code="missing_required_parameter", param="item.content",
                       message="Missing required parameter: 'item.content'.")
    if not isinstance(parts, list):
        return Refusal(code="invalid_type", param="item.content", message="expected an array")
    if not parts:
        return Refusal(code="invalid_value", param="item.content",
                       message="a message needs at least one content part")
    content: list[JsonObject] = []
    audio = bytearray()
    for index, part in enumerate(parts):
        parsed = _parse_part(part, _PART_TYPES[role], f"item.content[{index}]")
        if isinstance(parsed, Refusal):
            return parsed
        content.append(parsed[0])
        audio += parsed[1]
    return role, tuple(content), bytes(audio)


def _parse_part(part: Any, allowed: tuple[str, ...],
                param: str) -> tuple[JsonObject, bytes] | Refusal:
    """One content part without its audio, and the audio; or why it is refused."""
    if not isinstance(part, dict):
        return Refusal(code="invalid_type", param=param, message="expected an object")
    kind = _string_field(part, "type", f"{param}.type")
    if isinstance(kind, Refusal):
        return kind
    if kind not in allowed:
        return Refusal(code="invalid_value", param=f"{param}.type",
                       message=f"unsupported part type {describe(kind)} for this role:"
                       f" expected one of {', '.join(allowed)}")
    if kind.endswith("_text"):
        text = _string_field(part, "text", f"{param}.text")
        return text if isinstance(text, Refusal) else ({"type": kind, "text": text}, b"")
    transcript = part.get("transcript")
    if transcript is not None and not isinstance(transcript, str):
        return Refusal(code="invalid_type", param=f"{param}.transcript",
                       message="expected a string or null")
    audio = _pcm16(part.get("audio"), f"{param}.audio")
    if isinstance(audio, Refusal):
        return audio
    if kind == "output_audio":
        transcript = transcript or ""  # assistant audio always has a transcript, maybe empty
    return {"type": kind, "transcript": transcript}, audio


def _string_field(obj: JsonObject, key: str, param: str) -> str | Refusal:
    value = obj.get(key)
    if value is None:
        return Refusal(code="missing_required_parameter", param=param,
                       message=f"Missing required parameter: '{param}'.")
    if not isinstance(value, str):
        return Refusal(code="invalid_type", param=param, message="expected a string")
    return value


def _pcm16(value: Any, param: str) -> bytes | Refusal:
    """The optional base64 pcm16 ``audio`` of a part (b"" when absent)."""
    if value is None:
        return b""
    if not isinstance(value, str):
        return Refusal(code="invalid_type", param=param, message="expected a base64 string")
    try:
        audio = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return Refusal(code="invalid_value", param=param, message="not base64")
    if len(audio) % 2:
        return Refusal(code="invalid_value", param=param,
                       message="pcm16 audio must be whole 2-byte samples")
    return audio


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
