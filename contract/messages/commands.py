"""The commands: what the gateway appends to a session's input log for its worker."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

from contract.reasons import CloseReason

JsonObject: TypeAlias = dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateSession:
    """``session.update``: a Realtime session patch; the worker decides what may apply."""

    KIND: ClassVar[str] = "update"
    session: JsonObject
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendAudio:
    """``input_audio_buffer.append``: audio in the session's input format unless the append
    names its own, plus the seed's optional camera frames and hints.

    ``format`` is the append's encoding name exactly as sent (the seed's ``pcm16``,
    ``pcm_f32le``, ... or a GA type such as ``audio/pcm``) and ``sample_rate_hz`` its rate;
    None leaves each to the session. ``hints`` holds the seed's other per-append keys as sent
    (:data:`APPEND_HINT_KEYS`), None when there are none. ``video_frames`` are images as bare
    base64 (strictly valid), in capture order; an append may carry frames and no audio.
    """

    KIND: ClassVar[str] = "append"
    audio: bytes
    format: str | None = None
    sample_rate_hz: int | None = None
    is_speech: bool | None = None
    hints: JsonObject | None = None
    video_frames: tuple[str, ...] = ()
    event_id: str | None = None


#: The seed's per-append hints other than ``is_speech``: keys its clients attach to an append,
#: each of which a server may use or ignore (seed_behaviour.md §4.5).
APPEND_HINT_KEYS: frozenset[str] = frozenset({
    "duration_ms", "audio_duration_ms", "audio_start_ms", "audio_end_ms", "speech",
    "speech_probability", "vad", "overlap_action", "overlap", "force_barge_in", "force_listen",
    "text", "transcript",
})


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitInput:
    """``input_audio_buffer.commit``, with the seed's options.

    ``final``: the user's turn ends here (the seed's default). ``create_response``: answer
    the commit or not whatever the session's turn setting says (None: the session decides).
    ``is_speech``: the client's own verdict on the committed audio (False: a silent commit).
    """

    KIND: ClassVar[str] = "commit"
    final: bool = True
    create_response: bool | None = None
    is_speech: bool | None = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClearInput:
    """``input_audio_buffer.clear``."""

    KIND: ClassVar[str] = "clear"
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateResponse:
    """``response.create``: optional per-response overrides, as sent."""

    KIND: ClassVar[str] = "respond"
    response: JsonObject | None = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelResponse:
    """``response.cancel``."""

    KIND: ClassVar[str] = "cancel"
    response_id: str | None = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """``session.heartbeat``: keeps the lease alive; answered in order by the worker."""

    KIND: ClassVar[str] = "heartbeat"
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CloseSession:
    """``session.close``: an ordered, graceful end decided by the client."""

    KIND: ClassVar[str] = "close"
    reason: str = CloseReason.CLIENT_CLOSE
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateItem:
    """``conversation.item.create``: the item as sent (the worker validates its shape) and
    where it goes (None: at the end; ``root``: first; an item id: after that item)."""

    KIND: ClassVar[str] = "item.create"
    item: JsonObject
    previous_item_id: str | None = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RetrieveItem:
    """``conversation.item.retrieve``."""

    KIND: ClassVar[str] = "item.retrieve"
    item_id: str
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteItem:
    """``conversation.item.delete``."""

    KIND: ClassVar[str] = "item.delete"
    item_id: str
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TruncateItem:
    """``conversation.item.truncate``: the client heard ``audio_end_ms`` of an assistant
    audio item's content part ``content_index``, and no more."""

    KIND: ClassVar[str] = "item.truncate"
    item_id: str
    content_index: int
    audio_end_ms: int
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClearOutputAudio:
    """``output_audio_buffer.clear``: drop the active response's audio not yet sent.
    ``response_id`` (the seed's): the response the client means; None, the active one."""

    KIND: ClassVar[str] = "output.clear"
    response_id: str | None = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputBackpressure:
    """Written by the gateway, never sent by a client: the client has not read this much of
    the session's output (events and bytes behind the log's end). The worker ends the
    active response ``failed`` (``output_backpressure``) and stops the model, so a client that
    does not read is not flooded, and nothing already written is dropped."""

    KIND: ClassVar[str] = "output.backpressure"
    pending_events: int
    pending_bytes: int
    event_id: str | None = None


# The seed's duplex extensions (seed_behaviour.md §2). What each one does is the worker's to
# decide; here they are only the typed values the input log carries.


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelInput:
    """``input.cancel``: drop the pending input and stop whatever work is in flight."""

    KIND: ClassVar[str] = "input.cancel"
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendText:
    """``input.text.append``: text for the user's turn (bounded at the gateway's edge)."""

    KIND: ClassVar[str] = "input.text"
    text: str
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BargeIn:
    """``barge_in``: the client's hard interrupt of the active response."""

    KIND: ClassVar[str] = "barge_in"
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SignalTurn:
    """``turn.signal``: a turn transition the gateway does not route to a typed command
    (``event`` is never one of those), with its payload as sent."""

    KIND: ClassVar[str] = "turn.signal"
    event: str
    payload: JsonObject = dataclasses.field(default_factory=dict)
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AckPlayback:
    """``playback.ack``: the client played ``played_ms`` of a response's audio and commits
    ``committed_ms`` of it to the conversation (None: all it played). With neither id the
    worker picks the response still playing."""

    KIND: ClassVar[str] = "playback.ack"
    played_ms: int
    committed_ms: int | None = None
    response_id: str | None = None
    item_id: str | None = None
    event_id: str | None = None


Command: TypeAlias = (
    UpdateSession
    | AppendAudio
    | CommitInput
    | ClearInput
    | CreateResponse
    | CancelResponse
    | Heartbeat
    | CloseSession
    | CreateItem
    | RetrieveItem
    | DeleteItem
    | TruncateItem
    | ClearOutputAudio
    | OutputBackpressure
    | CancelInput
    | AppendText
    | BargeIn
    | SignalTurn
    | AckPlayback
)
