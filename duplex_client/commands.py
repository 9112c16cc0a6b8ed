"""Typed client commands for :meth:`duplex_client.DuplexClient.submit`.

One frozen dataclass per client event the gateway accepts (``session.resume`` excepted: the
client sends it itself when it resumes; the seed's aliases need none: each command sends the
canonical name). Each is named after the Realtime event it becomes, as the openai SDK names its
client events (``input_audio_buffer.append`` is :class:`InputAudioBufferAppendEvent`), so that
no name here means a different shape than it does in the store's log contract. Each renders
its own wire JSON; ``event_id``, when given, is echoed as ``error.event_id`` if the gateway or
the worker refuses the command.

``sequenced`` says how the client sends a command: numbered with ``client_seq`` and kept for
resending after a resume (everything that changes the session), or sent once and dropped while
disconnected (``session.heartbeat``: the resume itself is activity; ``session.event_ack``: the
next ack covers it).

:class:`CommandMethods` gives each command a method named as the seed's
``DuplexSessionHandle`` names it (``append_audio``, ``commit``, ``barge_in``, ...).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, ClassVar

__all__ = [
    "APPEND_HINT_KEYS",
    "BargeInEvent",
    "ClientCommand",
    "CommandMethods",
    "ConversationItemCreateEvent",
    "ConversationItemDeleteEvent",
    "ConversationItemRetrieveEvent",
    "ConversationItemTruncateEvent",
    "InputAudioBufferAppendEvent",
    "InputAudioBufferClearEvent",
    "InputAudioBufferCommitEvent",
    "InputCancelEvent",
    "InputTextAppendEvent",
    "OutputAudioBufferClearEvent",
    "PlaybackAckEvent",
    "ResponseCancelEvent",
    "ResponseCreateEvent",
    "SessionCloseEvent",
    "SessionEventAckEvent",
    "SessionHeartbeatEvent",
    "SessionUpdateEvent",
    "TurnSignalEvent",
]


@dataclass(frozen=True, slots=True)
class ClientCommand:
    """The base of every command: its wire ``type`` and the optional client ``event_id``."""

    type: ClassVar[str]
    sequenced: ClassVar[bool] = True
    event_id: str | None = field(default=None, kw_only=True)

    def to_wire(self) -> dict[str, Any]:
        """The JSON object to send (without ``client_seq``: the client numbers it)."""
        message: dict[str, Any] = {"type": self.type}
        if self.event_id is not None:
            message["event_id"] = self.event_id
        message.update(self._fields())
        return message

    def _fields(self) -> dict[str, Any]:
        return {}


def _present(**fields: Any) -> dict[str, Any]:
    """The optional fields that were given: an absent one is left out, not sent as null."""
    return {key: value for key, value in fields.items() if value is not None}


@dataclass(frozen=True, slots=True)
class SessionUpdateEvent(ClientCommand):
    """``session.update``: a patch of the session object."""

    type: ClassVar[str] = "session.update"
    session: Mapping[str, Any]

    def _fields(self) -> dict[str, Any]:
        return {"session": dict(self.session)}


#: The seed's per-append hint keys: they ride at the append's top level, as the seed sends them.
APPEND_HINT_KEYS = frozenset({
    "duration_ms", "audio_duration_ms", "audio_start_ms", "audio_end_ms", "speech",
    "speech_probability", "vad", "overlap_action", "overlap", "force_barge_in", "force_listen",
    "text", "transcript",
})


@dataclass(frozen=True, slots=True)
class InputAudioBufferAppendEvent(ClientCommand):
    """``input_audio_buffer.append``: raw bytes (base64 on the wire) with the seed's
    per-append fields, each sent only when given.

    ``format`` (``pcm16``, ``pcm_f32le``, ``g711_ulaw``, or a GA type such as ``audio/pcm``)
    and ``sample_rate_hz`` say how ``audio`` is encoded (None: as the session's input);
    ``is_speech`` is the client's own speech classification; ``video_frames`` are base64
    JPEG/PNG frames (a data URL's prefix is stripped: the wire carries bare base64), in
    capture order, paired with this audio; ``duration_ms``, ``audio_end_ms`` and ``hints``
    (the seed's other hint keys, :data:`APPEND_HINT_KEYS`) ride at the append's top level.
    ``audio`` may be empty when the append carries only frames.
    """

    type: ClassVar[str] = "input_audio_buffer.append"
    audio: bytes
    _: KW_ONLY
    format: str | None = None
    sample_rate_hz: int | None = None
    is_speech: bool | None = None
    video_frames: tuple[str, ...] = ()
    duration_ms: int | None = None
    audio_end_ms: int | None = None
    hints: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.hints or ()) - APPEND_HINT_KEYS
        if unknown:
            # is_speech has its own field on the wire: a hint of that name would be read as
            # nothing at all, so it is refused like any other unknown key.
            raise ValueError(f"not a hint the gateway knows: {sorted(unknown)} (hints:"
                             f" {sorted(APPEND_HINT_KEYS)}; is_speech is an argument)")
        given = {"duration_ms": self.duration_ms, "audio_end_ms": self.audio_end_ms}
        twice = {key for key, value in given.items() if value is not None} & set(self.hints or ())
        if twice:
            raise ValueError(f"given both as an argument and in hints: {sorted(twice)}")

    def _fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        if self.audio or not self.video_frames:  # frames alone go without an empty audio
            fields["audio"] = base64.b64encode(self.audio).decode()
        fields.update(_present(format=self.format, sample_rate_hz=self.sample_rate_hz,
                               is_speech=self.is_speech))
        if self.video_frames:
            fields["video_frames"] = [_bare_base64(frame) for frame in self.video_frames]
        fields.update(dict(self.hints or {}))
        fields.update(_present(duration_ms=self.duration_ms, audio_end_ms=self.audio_end_ms))
        return fields


def _bare_base64(frame: str) -> str:
    """A frame as bare base64: a data URL's ``data:image/jpeg;base64,`` prefix is cut."""
    if frame.startswith("data:"):
        _, _, frame = frame.partition(",")
    return frame


@dataclass(frozen=True, slots=True)
class InputAudioBufferCommitEvent(ClientCommand):
    """``input_audio_buffer.commit``, with the seed's fields, each sent only when it says
    something: ``final=False`` (more of this turn follows), ``create_response`` (sent as
    ``response_create``, the seed's wire name: answer the turn, or not, whatever the session's
    default), ``is_speech`` (False: a silent commit, which gets no answer)."""

    type: ClassVar[str] = "input_audio_buffer.commit"
    _: KW_ONLY
    final: bool = True
    create_response: bool | None = None
    is_speech: bool | None = None

    def _fields(self) -> dict[str, Any]:
        return {**({} if self.final else {"final": False}),
                **_present(response_create=self.create_response, is_speech=self.is_speech)}


@dataclass(frozen=True, slots=True)
class InputAudioBufferClearEvent(ClientCommand):
    """``input_audio_buffer.clear``."""

    type: ClassVar[str] = "input_audio_buffer.clear"


@dataclass(frozen=True, slots=True)
class ResponseCreateEvent(ClientCommand):
    """``response.create``, with the Realtime ``response`` options when given."""

    type: ClassVar[str] = "response.create"
    response: Mapping[str, Any] | None = None

    def _fields(self) -> dict[str, Any]:
        return _present(response=None if self.response is None else dict(self.response))


@dataclass(frozen=True, slots=True)
class ResponseCancelEvent(ClientCommand):
    """``response.cancel``: the active response, or the one named."""

    type: ClassVar[str] = "response.cancel"
    response_id: str | None = None

    def _fields(self) -> dict[str, Any]:
        return _present(response_id=self.response_id)


@dataclass(frozen=True, slots=True)
class ConversationItemCreateEvent(ClientCommand):
    """``conversation.item.create``: ``item`` is a Realtime conversation item."""

    type: ClassVar[str] = "conversation.item.create"
    item: Mapping[str, Any]
    previous_item_id: str | None = None

    def _fields(self) -> dict[str, Any]:
        return {"item": dict(self.item), **_present(previous_item_id=self.previous_item_id)}


@dataclass(frozen=True, slots=True)
class ConversationItemRetrieveEvent(ClientCommand):
    """``conversation.item.retrieve``."""

    type: ClassVar[str] = "conversation.item.retrieve"
    item_id: str

    def _fields(self) -> dict[str, Any]:
        return {"item_id": self.item_id}


@dataclass(frozen=True, slots=True)
class ConversationItemDeleteEvent(ClientCommand):
    """``conversation.item.delete``."""

    type: ClassVar[str] = "conversation.item.delete"
    item_id: str

    def _fields(self) -> dict[str, Any]:
        return {"item_id": self.item_id}


@dataclass(frozen=True, slots=True)
class ConversationItemTruncateEvent(ClientCommand):
    """``conversation.item.truncate``: cut an assistant item's audio at ``audio_end_ms``."""

    type: ClassVar[str] = "conversation.item.truncate"
    item_id: str
    audio_end_ms: int
    content_index: int = 0

    def _fields(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "content_index": self.content_index,
                "audio_end_ms": self.audio_end_ms}


@dataclass(frozen=True, slots=True)
class OutputAudioBufferClearEvent(ClientCommand):
    """``output_audio_buffer.clear``: stop the response audio being played (the one named,
    or whichever plays)."""

    type: ClassVar[str] = "output_audio_buffer.clear"
    response_id: str | None = None

    def _fields(self) -> dict[str, Any]:
        return _present(response_id=self.response_id)


@dataclass(frozen=True, slots=True)
class InputTextAppendEvent(ClientCommand):
    """``input.text.append``: text for the user's turn (at most 4096 characters)."""

    type: ClassVar[str] = "input.text.append"
    text: str

    def _fields(self) -> dict[str, Any]:
        return {"text": self.text}


@dataclass(frozen=True, slots=True)
class InputCancelEvent(ClientCommand):
    """``input.cancel``: drop the pending input and stop the work in flight."""

    type: ClassVar[str] = "input.cancel"


@dataclass(frozen=True, slots=True)
class BargeInEvent(ClientCommand):
    """``barge_in``: interrupt the active response at once."""

    type: ClassVar[str] = "barge_in"


@dataclass(frozen=True, slots=True)
class TurnSignalEvent(ClientCommand):
    """``turn.signal``: a turn transition named ``event``, with its ``payload``. The events
    that name a client event (``barge_in``, ``response.cancel``, ...) are that event, with
    its fields in ``payload``."""

    type: ClassVar[str] = "turn.signal"
    event: str
    payload: Mapping[str, Any] | None = None

    def _fields(self) -> dict[str, Any]:
        return {"event": self.event, "payload": dict(self.payload or {})}


@dataclass(frozen=True, slots=True)
class PlaybackAckEvent(ClientCommand):
    """``playback.ack``: ``played_ms`` of a response's audio was played (``committed_ms`` of
    it kept in the conversation; None: all of it). Without ids: the response playing now."""

    type: ClassVar[str] = "playback.ack"
    played_ms: int
    _: KW_ONLY
    committed_ms: int | None = None
    response_id: str | None = None
    item_id: str | None = None

    def _fields(self) -> dict[str, Any]:
        return {"played_ms": self.played_ms, **_present(
            committed_ms=self.committed_ms, response_id=self.response_id, item_id=self.item_id)}


@dataclass(frozen=True, slots=True)
class SessionHeartbeatEvent(ClientCommand):
    """``session.heartbeat``: keeps the session from the idle TTL; unsequenced."""

    type: ClassVar[str] = "session.heartbeat"
    sequenced: ClassVar[bool] = False


@dataclass(frozen=True, slots=True)
class SessionCloseEvent(ClientCommand):
    """``session.close``: the session ends; ``session.closed`` is its last event."""

    type: ClassVar[str] = "session.close"
    reason: str = "client_close"

    def _fields(self) -> dict[str, Any]:
        return {"reason": self.reason}


@dataclass(frozen=True, slots=True)
class SessionEventAckEvent(ClientCommand):
    """``session.event_ack``: the log may drop every event up to ``server_event_seq``;
    unsequenced."""

    type: ClassVar[str] = "session.event_ack"
    sequenced: ClassVar[bool] = False
    server_event_seq: int

    def _fields(self) -> dict[str, Any]:
        return {"server_event_seq": self.server_event_seq}


class CommandMethods:
    """One method per command, each :meth:`submit` of it; the class that sends them
    (:class:`~duplex_client.DuplexClient`) provides :meth:`submit`."""

    __slots__ = ()

    async def submit(self, command: ClientCommand) -> None:
        """Send ``command``."""
        raise NotImplementedError

    async def append_audio(self, audio: bytes, *, format: str | None = None,
                           sample_rate_hz: int | None = None, is_speech: bool | None = None,
                           video_frames: Sequence[str] | None = None,
                           duration_ms: int | None = None, audio_end_ms: int | None = None,
                           hints: Mapping[str, Any] | None = None) -> None:
        """``input_audio_buffer.append``, with the seed handle's arguments (see
        :class:`InputAudioBufferAppendEvent`). ``format`` None means the session's input
        format (the seed's handle says ``pcm16``, its own session default), so a GA session in
        G.711 is not misread."""
        await self.submit(InputAudioBufferAppendEvent(
            audio, format=format, sample_rate_hz=sample_rate_hz, is_speech=is_speech,
            video_frames=tuple(video_frames or ()), duration_ms=duration_ms,
            audio_end_ms=audio_end_ms, hints=hints))

    async def append_text(self, text: str) -> None:
        """``input.text.append``: text for the user's turn (at most 4096 characters)."""
        await self.submit(InputTextAppendEvent(text))

    async def commit(self, *, final: bool = True, create_response: bool | None = None,
                     is_speech: bool | None = None) -> None:
        """``input_audio_buffer.commit``, with the seed handle's arguments (see
        :class:`InputAudioBufferCommitEvent`)."""
        await self.submit(InputAudioBufferCommitEvent(
            final=final, create_response=create_response, is_speech=is_speech))

    async def clear_input(self) -> None:
        """``input_audio_buffer.clear``."""
        await self.submit(InputAudioBufferClearEvent())

    async def cancel_input(self) -> None:
        """``input.cancel``: drop the pending input and stop the work in flight."""
        await self.submit(InputCancelEvent())

    async def create_response(self, options: Mapping[str, Any] | None = None) -> None:
        """``response.create`` with optional per-response options."""
        await self.submit(ResponseCreateEvent(options))

    async def cancel_response(self, response_id: str | None = None) -> None:
        """``response.cancel``."""
        await self.submit(ResponseCancelEvent(response_id))

    async def barge_in(self) -> None:
        """``barge_in``: interrupt the active response at once."""
        await self.submit(BargeInEvent())

    async def clear_output_audio(self, response_id: str | None = None) -> None:
        """``output_audio_buffer.clear``: the response named, or whichever plays."""
        await self.submit(OutputAudioBufferClearEvent(response_id))

    async def signal_turn(self, event: str, payload: Mapping[str, Any] | None = None) -> None:
        """``turn.signal``: the turn transition ``event``; one that names a client event
        (``barge_in``, ``response.cancel``, ...) is that event, with its fields in
        ``payload``."""
        await self.submit(TurnSignalEvent(event, payload))

    async def ack_playback(self, played_ms: int, *, response_id: str | None = None,
                           item_id: str | None = None, committed_ms: int | None = None) -> None:
        """``playback.ack``: ``played_ms`` of a response's audio was played; ``committed_ms``
        of it (default: all played) stays in the conversation. Without ids: the response
        playing now. Answered by ``playback.acknowledged``."""
        await self.submit(PlaybackAckEvent(played_ms, committed_ms=committed_ms,
                                      response_id=response_id, item_id=item_id))

    async def create_item(self, item: Mapping[str, Any],
                          previous_item_id: str | None = None) -> None:
        """``conversation.item.create``."""
        await self.submit(ConversationItemCreateEvent(item, previous_item_id))

    async def retrieve_item(self, item_id: str) -> None:
        """``conversation.item.retrieve``."""
        await self.submit(ConversationItemRetrieveEvent(item_id))

    async def delete_item(self, item_id: str) -> None:
        """``conversation.item.delete``."""
        await self.submit(ConversationItemDeleteEvent(item_id))

    async def truncate_item(self, item_id: str, audio_end_ms: int,
                            content_index: int = 0) -> None:
        """``conversation.item.truncate``."""
        await self.submit(ConversationItemTruncateEvent(item_id, audio_end_ms, content_index))

    async def update(self, patch: Mapping[str, Any]) -> None:
        """``session.update``."""
        await self.submit(SessionUpdateEvent(patch))

    async def heartbeat(self) -> None:
        """``session.heartbeat`` (unsequenced: dropped while disconnected)."""
        await self.submit(SessionHeartbeatEvent())
