"""The events: what a worker appends to a session's output log for the gateway."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

from contract.messages.commands import JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionUpdated:
    """The effective session configuration after an open or an update."""

    KIND: ClassVar[str] = "session.updated"
    session: JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorEvent:
    """A refusal or failure, attributed to a client event when there is one."""

    KIND: ClassVar[str] = "error"
    code: str
    message: str
    error_type: str = "invalid_request_error"
    param: str | None = None
    client_event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatAck:
    """Answer to ``session.heartbeat``."""

    KIND: ClassVar[str] = "heartbeat_ack"


@dataclass(frozen=True, slots=True, kw_only=True)
class InputCommitted:
    """The input buffer became a user item."""

    KIND: ClassVar[str] = "input.committed"
    item_id: str
    previous_item_id: str | None = None
    #: A silent commit (``is_speech: false``): the turn was silence, its audio dropped and no
    #: response follows (the seed's ``empty`` / ``no_response`` commit).
    silent: bool = False
    #: The seed's listen decision this commit carries (``silence_or_noise``, ``model_listen``):
    #: the turn gets no spoken answer; None when it may get one.
    listen: str | None = None
    #: The session's epoch at that decision (0 without one).
    listen_epoch: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class InputCleared:
    """The input buffer was emptied."""

    KIND: ClassVar[str] = "input.cleared"


@dataclass(frozen=True, slots=True, kw_only=True)
class InputSpeechStarted:
    """Turn detection heard speech start in the input buffer."""

    KIND: ClassVar[str] = "input.speech_started"
    #: Milliseconds of the session's input audio before the turn, prefix padding included.
    audio_start_ms: int
    #: The id the user item of this turn will get once it is committed.
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InputSpeechStopped:
    """Turn detection heard speech end in the input buffer (a commit follows)."""

    KIND: ClassVar[str] = "input.speech_stopped"
    #: Milliseconds of the session's input audio up to the turn's end, its silence included.
    audio_end_ms: int
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemAdded:
    """A conversation item was added (user item on commit, assistant item on response)."""

    KIND: ClassVar[str] = "item.added"
    item: JsonObject
    previous_item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemCreated:
    """The same item as the :class:`ItemAdded` just before it, under the name the beta API
    and the seed use (``conversation.item.created``, still in GA's server events): clients
    written for either name see every item."""

    KIND: ClassVar[str] = "item.created"
    item: JsonObject
    previous_item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemDone:
    """A conversation item is final."""

    KIND: ClassVar[str] = "item.done"
    item: JsonObject
    previous_item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemRetrieved:
    """Answer to ``conversation.item.retrieve``: the item as the conversation holds it."""

    KIND: ClassVar[str] = "item.retrieved"
    item: JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemDeleted:
    """An item left the conversation (``conversation.item.delete``)."""

    KIND: ClassVar[str] = "item.deleted"
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemTruncated:
    """An assistant audio item was cut to what the client heard; its transcript is gone."""

    KIND: ClassVar[str] = "item.truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputAudioCleared:
    """Answer to ``output_audio_buffer.clear``: the response whose audio was dropped (or the
    last one, when none was playing)."""

    KIND: ClassVar[str] = "output_audio.cleared"
    response_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseCreated:
    """A response started; ``response`` is the Realtime response object."""

    KIND: ClassVar[str] = "response.created"
    response: JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseDone:
    """A response ended (completed, cancelled, failed or incomplete)."""

    KIND: ClassVar[str] = "response.done"
    response: JsonObject
    #: The seed's cancel reason where it differs from GA's ``status_details.reason``
    #: (``barge_in``, ``output_audio_buffer_clear``); None where the two agree.
    seed_reason: str | None = None
    #: The seed's listen decision that ended this response
    #: (``model_turn_completed_without_output``: it never made a sound); None otherwise.
    listen: str | None = None
    #: The session's epoch at that decision (0 without one).
    listen_epoch: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputItemAdded:
    """An output item of a response started."""

    KIND: ClassVar[str] = "output_item.added"
    response_id: str
    output_index: int
    item: JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputItemDone:
    """An output item of a response is final."""

    KIND: ClassVar[str] = "output_item.done"
    response_id: str
    output_index: int
    item: JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class ContentPartAdded:
    """A content part of an output item started."""

    KIND: ClassVar[str] = "content_part.added"
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part: JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class ContentPartDone:
    """A content part of an output item is final."""

    KIND: ClassVar[str] = "content_part.done"
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part: JsonObject


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioDelta:
    """A chunk of output audio (pcm16 LE mono, the session's output rate)."""

    KIND: ClassVar[str] = "audio.delta"
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    audio: bytes
    #: The seed's speak decision, on the response's first audible delta: the session's epoch
    #: then; None on every other delta.
    speak_epoch: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioDone:
    """The audio of a content part is complete."""

    KIND: ClassVar[str] = "audio.done"
    response_id: str
    item_id: str
    output_index: int
    content_index: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TranscriptDelta:
    """A piece of the transcript of the output audio."""

    KIND: ClassVar[str] = "transcript.delta"
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TranscriptDone:
    """The full transcript of the output audio."""

    KIND: ClassVar[str] = "transcript.done"
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    transcript: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TextDelta:
    """A piece of a text content part of an output item."""

    KIND: ClassVar[str] = "text.delta"
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TextDone:
    """The whole text of a text content part (completed, or cut short by a cancel)."""

    KIND: ClassVar[str] = "text.done"
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionCallArgumentsDelta:
    """A piece of the JSON arguments of a function call output item."""

    KIND: ClassVar[str] = "function_call_arguments.delta"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionCallArgumentsDone:
    """The whole JSON arguments of a function call output item, and the function's name."""

    KIND: ClassVar[str] = "function_call_arguments.done"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTranscriptionDelta:
    """A piece of the transcript of a user item's input audio."""

    KIND: ClassVar[str] = "input_transcription.delta"
    item_id: str
    content_index: int
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTranscriptionCompleted:
    """The whole transcript of a user item's input audio."""

    KIND: ClassVar[str] = "input_transcription.completed"
    item_id: str
    content_index: int
    transcript: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTranscriptionFailed:
    """Transcribing a user item's input audio failed; the item stays, without transcript."""

    KIND: ClassVar[str] = "input_transcription.failed"
    item_id: str
    content_index: int
    code: str
    message: str
    error_type: str = "server_error"
    param: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTimeoutTriggered:
    """Turn detection's ``idle_timeout_ms`` ran out with no speech after the last response:
    ``audio_start_ms`` to ``audio_end_ms`` of the input timeline was silent."""

    KIND: ClassVar[str] = "input.timeout_triggered"
    audio_start_ms: int
    audio_end_ms: int
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimitsUpdated:
    """The rate limits that apply to the session, after each ``response.done``."""

    KIND: ClassVar[str] = "rate_limits.updated"
    #: GA ``RateLimit`` objects (``name``, ``limit``, ``remaining``, ``reset_seconds``).
    rate_limits: list[JsonObject]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlaybackAcknowledged:
    """Answer to ``playback.ack``: the response's playback ledger after it, in milliseconds
    of audio (each only moves forward)."""

    KIND: ClassVar[str] = "playback.acknowledged"
    response_id: str
    item_id: str
    generated_ms: int
    sent_ms: int
    played_ms: int
    committed_ms: int
    #: The ack cut the response's history hard (the seed's ``truncate``; its wire never asks).
    truncate: bool = False
    #: The conversation's item now holds the acknowledged ``committed_ms`` of the response's
    #: audio (an interrupted answer cut to what was heard): the seed's ``history_committed``.
    history_committed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnEvent:
    """A turn transition (``turn.signal``) the worker applied, the turn state after it (one
    of the seed's six: ``idle``, ``user_speaking``, ``user_committed``,
    ``assistant_generating``, ``assistant_playing``, ``barge_in``) and the session's epoch."""

    KIND: ClassVar[str] = "turn.event"
    event: str
    turn_state: str
    payload: JsonObject = dataclasses.field(default_factory=dict)
    epoch: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionClosed:
    """Terminal: a deliberate end (client close, runtime failure, worker loss)."""

    KIND: ClassVar[str] = "session.closed"
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionExpired:
    """Terminal: the reaper ended the session (grace or idle expiry)."""

    KIND: ClassVar[str] = "session.expired"
    reason: str


Event: TypeAlias = (
    SessionUpdated
    | ErrorEvent
    | HeartbeatAck
    | InputCommitted
    | InputCleared
    | InputSpeechStarted
    | InputSpeechStopped
    | ItemAdded
    | ItemCreated
    | ItemDone
    | ItemRetrieved
    | ItemDeleted
    | ItemTruncated
    | OutputAudioCleared
    | ResponseCreated
    | ResponseDone
    | OutputItemAdded
    | OutputItemDone
    | ContentPartAdded
    | ContentPartDone
    | AudioDelta
    | AudioDone
    | TranscriptDelta
    | TranscriptDone
    | TextDelta
    | TextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
    | InputTranscriptionDelta
    | InputTranscriptionCompleted
    | InputTranscriptionFailed
    | InputTimeoutTriggered
    | RateLimitsUpdated
    | PlaybackAcknowledged
    | TurnEvent
    | SessionClosed
    | SessionExpired
)
