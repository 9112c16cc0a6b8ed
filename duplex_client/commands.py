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
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, ClassVar

__all__ = [
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


@dataclass(frozen=True, slots=True)
class InputAudioBufferAppendEvent(ClientCommand):
    """``input_audio_buffer.append``: pcm16 LE mono 24 kHz, raw bytes (base64 on the wire)."""

    type: ClassVar[str] = "input_audio_buffer.append"
    audio: bytes

    def _fields(self) -> dict[str, Any]:
        return {"audio": base64.b64encode(self.audio).decode()}


@dataclass(frozen=True, slots=True)
class InputAudioBufferCommitEvent(ClientCommand):
    """``input_audio_buffer.commit``."""

    type: ClassVar[str] = "input_audio_buffer.commit"


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
    """``output_audio_buffer.clear``: stop the response audio being played."""

    type: ClassVar[str] = "output_audio_buffer.clear"


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

    async def append_audio(self, pcm16: bytes) -> None:
        """``input_audio_buffer.append`` (pcm16 LE mono 24 kHz)."""
        await self.submit(InputAudioBufferAppendEvent(pcm16))

    async def append_text(self, text: str) -> None:
        """``input.text.append``: text for the user's turn (at most 4096 characters)."""
        await self.submit(InputTextAppendEvent(text))

    async def commit(self) -> None:
        """``input_audio_buffer.commit``."""
        await self.submit(InputAudioBufferCommitEvent())

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

    async def clear_output_audio(self) -> None:
        """``output_audio_buffer.clear``."""
        await self.submit(OutputAudioBufferClearEvent())

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

    async def close(self, reason: str = "client_close") -> None:
        """``session.close``: the session ends with ``session.closed``; read it from
        :meth:`DuplexClient.events`, or wait for it with
        :meth:`DuplexClient.wait_closed`."""
        await self.submit(SessionCloseEvent(reason))
