"""The conversation's items and its responses' events, for the conversation core.

The core (:class:`~inference_worker.conversation.core.ConversationCore`) decides *when* a turn is
committed or a response opens and ends; this module decides *what* that emits, once: item ids
and their order, the user item's events, a response's opening and closing sequences (Realtime
GA order, openai_realtime.md §2a; seed §3.4), refusals as ``error`` events. It is I/O-free
like the core: it only queues typed events for the driver to drain.

Turn detection's events are built here too: :meth:`Conversation.speech_started` reserves the
id the turn's user item will get, so ``speech_started``, ``speech_stopped`` and the commit that
follows all name it (the detector itself: :mod:`inference_worker.turn_detection.timeline`).

The conversation keeps its items in order (:class:`~inference_worker.conversation.items.Item`: id,
role, status, content with the
audio bytes left out, and for assistant audio the audio generated so far), at most
:data:`MAX_ITEMS` of them: adding one more drops the oldest first, silently, as GA's own context
truncation does. The client manages them with ``conversation.item.create`` / ``.retrieve`` /
``.delete`` / ``.truncate`` (:meth:`Conversation.item_command`), the same for every backend:
a truncation cuts an assistant audio item to the milliseconds the client says it heard and
drops its transcript, so the history never claims audio the user did not hear.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from contract import messages as msg
from contract.messages import JsonObject
from inference_worker.audio_formats import AudioFormat, OutputEncoder
from inference_worker.conversation.items import (
    FUNCTION_ITEMS,
    CreatedUserTurn,
    Item,
    cut_transcript,
    format_of,
    parse_message,
    truncate_refusal,
)
from inference_worker.conversation.objects import (
    ResponseStatus,
    assistant_item,
    content_part,
    item_content,
    response_object,
    user_audio_content,
    user_item_object,
    zero_usage,
)
from inference_worker.conversation.profiles import BYTES_PER_SECOND
from inference_worker.conversation.refusals import Refusal, RefusalCode
from inference_worker.untrusted import describe

__all__ = [
    "MAX_ITEMS",
    "Conversation",
    "HistoryState",
    "ItemCommand",
    "OpenResponse",
    "UserItem",
]

#: Bytes of pcm16 24 kHz mono per millisecond of audio.
_BYTES_PER_MS = BYTES_PER_SECOND // 1000

#: Items a conversation keeps; one more drops the oldest (never the one just added).
MAX_ITEMS: Final = 256
#: ``previous_item_id`` of ``conversation.item.create`` that puts the item first (GA).
_ROOT: Final = "root"
#: Longest client-chosen item id.
_MAX_ITEM_ID_CHARS: Final = 64


ItemCommand: TypeAlias = msg.CreateItem | msg.RetrieveItem | msg.DeleteItem | msg.TruncateItem


@dataclass(frozen=True, slots=True, kw_only=True)
class UserItem:
    """A user message item: its id and the item before it."""

    id: str
    previous_item_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenResponse:
    """An open response: its ids, its output modality, the object ``response.created``
    carried (the base of ``response.done``), and whether it stays out of the conversation
    (``conversation: "none"``: its item is never added)."""

    id: str
    item_id: str
    previous_item_id: str | None
    audio: bool
    created: JsonObject
    out_of_band: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryState:
    """What a checkpoint keeps of a conversation between responses: the session object, the
    items in order, and the counters every new item's and response's id comes from."""

    config: JsonObject
    items: tuple[Item, ...]
    item_count: int
    response_count: int
    reserved_item_id: str | None  # a speech start announced it; the user item takes it


class Conversation:
    """The default conversation of one session, and the events it emits, in order.

    Args:
        config: the effective session object (the core replaces it on ``session.update``).
    """

    def __init__(self, config: JsonObject) -> None:
        self.config = config
        self._encoder = OutputEncoder(AudioFormat.PCM24K)
        self._speak_epoch: int | None = None  # a speak decision no delta has carried yet
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

    @property
    def quiet(self) -> bool:
        """Whether no event waits to be taken (a checkpoint cannot carry one)."""
        return not self._events

    def snapshot(self) -> HistoryState:
        """The conversation as a checkpoint keeps it (between responses)."""
        return HistoryState(config=copy.deepcopy(self.config),
                            items=copy.deepcopy(tuple(self.items)),
                            item_count=self._items, response_count=self._responses,
                            reserved_item_id=self._reserved_item_id)

    def restore(self, state: HistoryState) -> None:
        """Continue from ``state``, taken by :meth:`snapshot` of another instance."""
        self.config = copy.deepcopy(state.config)
        self._order = [item.id for item in state.items]
        self._by_id = {item.id: item for item in state.items}
        self._items, self._responses = state.item_count, state.response_count
        self._reserved_item_id = state.reserved_item_id

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

    def _added(self, item: JsonObject, previous_item_id: str | None) -> None:
        """``conversation.item.added`` (GA), then the same item as ``conversation.item.created``
        (its beta and seed name, still a GA server event): clients of either name see it."""
        self.emit(msg.ItemAdded(item=copy.deepcopy(item), previous_item_id=previous_item_id),
                  msg.ItemCreated(item=copy.deepcopy(item), previous_item_id=previous_item_id))

    def session_updated(self) -> None:
        """``session.updated`` with the whole effective session object."""
        self.emit(msg.SessionUpdated(session=copy.deepcopy(self.config)))

    @property
    def input_format(self) -> AudioFormat:
        """The format the client's audio comes in (``audio.input.format``)."""
        return format_of(self.config["audio"]["input"]["format"])

    @property
    def output_format(self) -> AudioFormat:
        """The format the client's audio goes out in (``audio.output.format``)."""
        return format_of(self.config["audio"]["output"]["format"])

    # ------------------------------------------------------------------ turn detection

    def speech_started(self, audio_start_ms: int) -> None:
        """``input_audio_buffer.speech_started``, naming the user item the turn will be."""
        self.emit(msg.InputSpeechStarted(audio_start_ms=audio_start_ms,
                                         item_id=self._next_user_item_id()))

    def timeout_triggered(self, audio_start_ms: int, audio_end_ms: int) -> None:
        """``input_audio_buffer.timeout_triggered``, naming the user item the silent segment
        becomes (its commit follows)."""
        self.emit(msg.InputTimeoutTriggered(audio_start_ms=audio_start_ms,
                                            audio_end_ms=audio_end_ms,
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

    def add_user_item(self, *, done: bool, silent: bool = False,
                      transcript: str | None = None, listen: str | None = None,
                      listen_epoch: int = 0) -> UserItem:
        """A committed user turn: ``input_audio_buffer.committed`` ->
        ``conversation.item.added`` [-> ``conversation.item.done``, when ``done``, with its
        ``transcript`` if known; else the caller completes it with :meth:`complete_user_item`
        once its transcript is known]. Its id is the one a ``speech_started`` announced, when
        one did. A ``silent`` turn's commit says so (the client declared its audio silence), and
        a turn that gets no spoken answer carries the seed's ``listen`` decision (its reason)
        and the epoch it was taken in."""
        item = UserItem(id=self._next_user_item_id(), previous_item_id=self._last_item_id)
        self._reserved_item_id = None
        self._insert(Item(id=item.id, role="user", status="completed",
                          content=user_audio_content(None)), None)
        self.emit(msg.InputCommitted(item_id=item.id, previous_item_id=item.previous_item_id,
                                     silent=silent, listen=listen, listen_epoch=listen_epoch))
        self._added(user_item_object(item.id, None), item.previous_item_id)
        if done:
            self.complete_user_item(item, transcript)
        return item

    def complete_user_item(self, item: UserItem, transcript: str | None,
                           failure: str | None = None) -> None:
        """``conversation.item.done`` for a user item, with its transcript if known: after
        ``conversation.item.input_audio_transcription.completed`` when the model transcribed
        it, or ``.failed`` (with ``failure``, why) when transcribing failed (GA order)."""
        self._update(item.id, content=user_audio_content(transcript))
        if transcript is not None:
            self.emit(msg.InputTranscriptionCompleted(item_id=item.id, content_index=0,
                                                      transcript=transcript))
        elif failure is not None:
            self.emit(msg.InputTranscriptionFailed(item_id=item.id, content_index=0,
                                                   code="transcription_failed",
                                                   message=failure))
        self.emit(msg.ItemDone(item=user_item_object(item.id, transcript),
                               previous_item_id=item.previous_item_id))

    # ------------------------------------------------------------------ responses

    def open_response(self, *, audio: bool, metadata: dict[str, str] | None,
                      output: JsonObject | None = None,
                      out_of_band: bool = False) -> OpenResponse:
        """``response.created`` -> ``response.output_item.added`` -> ``conversation.item.added``
        -> ``response.content_part.added``; the response's item joins the conversation.

        ``output`` (``format``, ``voice``) is what ``response.create`` set for this response
        (None: the session's); its audio goes out in that format. An ``out_of_band`` response
        (``conversation: "none"``) has no ``conversation_id`` and its item never joins the
        conversation: no ``conversation.item.*`` event names it."""
        self._responses += 1
        response_id = f"resp_{self._responses}"
        created = response_object(response_id, self.config, audio, metadata, output)
        if out_of_band:
            created["conversation_id"] = None
        # A response starts with a clean encoder, in its own format.
        self._encoder = OutputEncoder(format_of(created["audio"]["output"]["format"]))
        item_id = self._new_item_id()
        response = OpenResponse(
            id=response_id, item_id=item_id,
            previous_item_id=None if out_of_band else self._last_item_id, audio=audio,
            created=created, out_of_band=out_of_band)
        item = assistant_item(item_id, "in_progress", [])
        self.emit(msg.ResponseCreated(response=copy.deepcopy(response.created)),
                  msg.OutputItemAdded(response_id=response_id, output_index=0, item=item))
        if not out_of_band:
            self._insert(Item(id=item_id, role="assistant", status="in_progress",
                              content=(item_content(audio),)), None)
            self._added(item, response.previous_item_id)
        self.emit(msg.ContentPartAdded(response_id=response_id, item_id=item_id,
                                       output_index=0, content_index=0,
                                       part=content_part(audio)))
        return response

    def finish_response(self, response: OpenResponse, *, status: ResponseStatus,
                        reason: str | None = None, transcript: str = "",
                        seed_reason: str | None = None, listen: str | None = None,
                        listen_epoch: int = 0) -> None:
        """The closing half, the same for a completed, cancelled or failed response: the audio
        and transcript ends (audio responses), the part, the item, ``response.done``.

        Args:
            response: the response :meth:`open_response` opened.
            status: ``completed``, ``cancelled`` or ``failed``.
            reason: why it was cancelled (``status_details.reason``) or failed (the code of
                ``status_details.error``); None when completed.
            transcript: what the model said in it.
            seed_reason: the seed's reason for the cancel where it differs from ``reason``.
            listen: the seed's listen decision that ends it (it made no sound), taken in
                ``listen_epoch``; its ``response.done`` carries both.
        """
        self._speak_epoch = None  # a decision no delta carried ends with its response
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
        else:
            # A text response's text: what the model said in it (the loopback says nothing).
            part, content = {**part, "text": transcript}, {**content, "text": transcript}
            self.emit(msg.TextDone(response_id=rid, item_id=iid, output_index=0,
                                   content_index=0, text=transcript))
        completed = status is ResponseStatus.COMPLETED
        item = assistant_item(iid, "completed" if completed else "incomplete", [content])
        self._update(iid, status=item["status"], content=(dict(content),))
        details: JsonObject | None = None
        if status is ResponseStatus.FAILED:
            details = {"type": "failed", "error": {"type": "server_error", "code": reason}}
        elif reason is not None:
            details = {"type": "cancelled", "reason": reason}
        done = {**copy.deepcopy(response.created), "status": status, "status_details": details,
                "output": [item], "usage": zero_usage()}
        self.emit(msg.ContentPartDone(response_id=rid, item_id=iid, output_index=0,
                                      content_index=0, part=part))
        if not response.out_of_band:
            self.emit(msg.ItemDone(item=copy.deepcopy(item),
                                   previous_item_id=response.previous_item_id))
        self.emit(
            msg.OutputItemDone(response_id=rid, output_index=0, item=copy.deepcopy(item)),
            msg.ResponseDone(response=done, seed_reason=seed_reason, listen=listen,
                             listen_epoch=listen_epoch),
            # GA follows every response.done with the limits in force: none are enforced here.
            msg.RateLimitsUpdated(rate_limits=[]),
        )

    def audio_delta(self, response: OpenResponse, audio: bytes,
                    speak_epoch: int | None = None) -> None:
        """``response.output_audio.delta`` of ``audio`` (pcm16 24 kHz) in the session's output
        format; the response's item counts the audio generated. ``speak_epoch``: the seed's
        speak decision, taken in that epoch, rides this delta (or the next one emitted)."""
        if speak_epoch is not None:
            self._speak_epoch = speak_epoch
        encoded = self._encoder.encode(audio)
        if encoded:  # G.711 carries a sample or two over to the next delta
            self.emit(msg.AudioDelta(response_id=response.id, item_id=response.item_id,
                                     output_index=0, content_index=0, audio=encoded,
                                     speak_epoch=self._speak_epoch))
            self._speak_epoch = None
        item = self._by_id.get(response.item_id)
        if item is not None:  # not dropped by the bound or deleted (see _update)
            self._by_id[item.id] = item.with_audio_bytes(item.audio_bytes + len(audio))

    def keep_heard(self, item_id: str, heard_ms: int) -> None:
        """Cut an assistant audio item to the ``heard_ms`` the client acknowledged (never
        longer than it is), and its transcript in proportion: an interrupted answer's history
        holds only what the user heard. No event: the client said it, in a playback ack."""
        item = self._by_id.get(item_id)
        if item is None or not item.truncatable:
            return
        heard = min(item.audio_bytes, heard_ms * _BYTES_PER_MS)
        if heard == item.audio_bytes:
            return
        share = heard / item.audio_bytes if item.audio_bytes else 0.0
        content = tuple({**part, "transcript": cut_transcript(part.get("transcript") or "", share)}
                        if part["type"] == "output_audio" else part for part in item.content)
        self._update(item_id, content=content, audio_bytes=heard)

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
                core cancels; called when a truncation names its item, before truncating.

        Returns:
            The user message a create added, for a core that answers user turns.
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

    def audio_of_input(self, items: tuple[JsonObject, ...]) -> bytes | Refusal:
        """The user audio of a ``response.create``'s ``input`` items (message items, read
        as ``conversation.item.create`` reads them), pcm16 24 kHz; or why they are refused."""
        audio = bytearray()
        for index, item in enumerate(items):
            parsed = parse_message(item, self.input_format)
            if isinstance(parsed, Refusal):
                param = parsed.param.replace("item", f"response.input[{index}]", 1) \
                    if parsed.param else f"response.input[{index}]"
                return Refusal(code=parsed.code, param=param, message=parsed.message)
            role, _content, part_audio = parsed
            if role == "user":
                audio += part_audio
        return bytes(audio)

    def _known(self, event_id: str | None, item_id: str,
               param: str = "item_id") -> Item | None:
        item = self._by_id.get(item_id)
        if item is None:
            self.refuse(event_id, Refusal(
                code=RefusalCode.ITEM_NOT_FOUND, param=param,
                message=f"Item with item_id {describe(item_id)} not found in conversation."))
        return item

    def _delete_item(self, command: msg.DeleteItem, active: OpenResponse | None) -> None:
        item = self._known(command.event_id, command.item_id)
        if item is None:
            return
        if active is not None and active.item_id == item.id:
            self.refuse(command.event_id, Refusal(
                code=RefusalCode.INVALID_VALUE, param="item_id",
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
        refusal = truncate_refusal(item, command)
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
        if command.item.get("type") in FUNCTION_ITEMS:
            parsed_function = self._parse_function_item(command.item)
            if isinstance(parsed_function, Refusal):
                self.refuse(command.event_id, parsed_function)
                return None
            return self._add_created(command, parsed_function, b"")
        parsed = parse_message(command.item, self.input_format)
        if isinstance(parsed, Refusal):
            self.refuse(command.event_id, parsed)
            return None
        role, content, audio = parsed
        message = Item(id="", role=role, status="completed", content=content,
                       audio_bytes=len(audio) if role == "assistant" else 0)
        return self._add_created(command, message, audio)

    def _parse_function_item(self, item: JsonObject) -> Item | Refusal:
        """A created ``function_call`` (a call the client replays into the history) or
        ``function_call_output`` (its result: it answers one ``function_call`` of the
        conversation, once), without its id yet; or why it is refused."""
        kind: str = item["type"]
        names = FUNCTION_ITEMS[kind]
        fields: list[tuple[str, str]] = []
        for name in names:
            value = item.get(name, "" if name == "arguments" else None)
            if value is None:
                return Refusal(code=RefusalCode.MISSING_REQUIRED_PARAMETER, param=f"item.{name}",
                               message=f"Missing required parameter: 'item.{name}'.")
            if not isinstance(value, str):
                return Refusal(code=RefusalCode.INVALID_TYPE, param=f"item.{name}",
                               message="expected a string")
            fields.append((name, value))
        call_id = dict(fields)["call_id"]
        calls = [known for known in self._by_id.values() if dict(known.fields).get("call_id")
                 == call_id]
        if kind == "function_call" and calls:
            return Refusal(code=RefusalCode.INVALID_VALUE, param="item.call_id",
                           message=f"a function call with call_id {describe(call_id)} exists")
        if kind == "function_call_output":
            if not any(known.kind == "function_call" for known in calls):
                return Refusal(code=RefusalCode.INVALID_VALUE, param="item.call_id",
                               message=f"no function_call with call_id {describe(call_id)} in"
                               " the conversation to answer")
            if any(known.kind == "function_call_output" for known in calls):
                return Refusal(code=RefusalCode.INVALID_VALUE, param="item.call_id",
                               message=f"the function call {describe(call_id)} is answered"
                               " already")
        return Item(id="", role="", status="completed", content=(), kind=kind,
                    fields=tuple(fields))

    def _add_created(self, command: msg.CreateItem, created: Item,
                     audio: bytes) -> CreatedUserTurn | None:
        """Give a parsed created item its id and place, add it, announce it."""
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
        item = dataclasses.replace(created, id=item_id or self._new_item_id())
        previous = self._insert(item, after)
        self._added(item.realtime(), previous)
        self.emit(msg.ItemDone(item=item.realtime(), previous_item_id=previous))
        return CreatedUserTurn(item_id=item.id, audio=audio) if item.role == "user" else None

    def _id_refusal(self, item_id: Any) -> Refusal | None:
        if not isinstance(item_id, str):
            return Refusal(code=RefusalCode.INVALID_TYPE, param="item.id",
                           message="expected a string")
        if not 0 < len(item_id) <= _MAX_ITEM_ID_CHARS:
            return Refusal(code=RefusalCode.INVALID_VALUE, param="item.id",
                           message=f"must be 1 to {_MAX_ITEM_ID_CHARS} characters")
        if item_id in self._by_id or item_id == self._reserved_item_id:
            return Refusal(code=RefusalCode.INVALID_VALUE, param="item.id",
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
