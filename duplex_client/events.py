"""The server events the client hands out, typed by their ``type``, and the marker of a resume.

Every event is a :class:`RealtimeEvent` (its ``type``, ``server_event_seq`` and whole JSON
object); the kinds a caller branches on are subclasses, so ``isinstance(event, AudioDelta)``
works as it does with the seed's client, and their properties read both dialects' shapes (the
GA one and the seed's ``?duplex=1`` one: ``response_id`` at the top or nested, an ``error``
object or the seed's flat error, ``playback.acknowledged`` fields at the top or under
``event``). Any other type is a plain :class:`RealtimeEvent`.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AudioDelta",
    "ErrorEvent",
    "InputCommitted",
    "ListenDecision",
    "PlaybackAcknowledged",
    "RealtimeEvent",
    "ResponseCreated",
    "ResponseDone",
    "Resumed",
    "SessionClosed",
    "SessionCreated",
    "SessionExpired",
    "SessionResyncRequired",
    "SessionUpdated",
    "SpeakDecision",
    "SpeechStarted",
    "SpeechStopped",
    "TextDelta",
    "TranscriptDelta",
    "TurnEvent",
    "event_of",
]


def _text(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) else None


def _int(data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _object(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class RealtimeEvent:
    """One server event: its ``type``, its ``server_event_seq`` (None for connection-level
    notices such as ``session.created``) and the whole JSON object."""

    type: str
    server_event_seq: int | None
    data: dict[str, Any] = field(repr=False)

    @property
    def audio(self) -> bytes:
        """The decoded audio of a ``response.output_audio.delta`` (empty for other events)."""
        if self.type != "response.output_audio.delta":
            return b""
        return base64.b64decode(self.data.get("delta") or "")

    @property
    def response_id(self) -> str | None:
        """The response the event belongs to: ``response_id`` at the top (every
        response-scoped event, and the seed's ``response.created`` / ``.done``), else
        ``response.id``."""
        return _text(self.data, "response_id") or _text(_object(self.data, "response"), "id")

    @property
    def item_id(self) -> str | None:
        return _text(self.data, "item_id")

    @property
    def event_id(self) -> str | None:
        """The server's id of this event (not a client command's)."""
        return _text(self.data, "event_id")


class SessionCreated(RealtimeEvent):
    """``session.created``: the session object, its id and the resume credentials."""

    __slots__ = ()

    @property
    def session(self) -> dict[str, Any]:
        return _object(self.data, "session")

    @property
    def session_id(self) -> str | None:
        """Top-level ``session_id``, or the session object's ``id`` (the seed's only place)."""
        return (_text(self.data, "session_id") or _text(self.session, "id")
                or _text(self.session, "session_id"))

    @property
    def resume_token(self) -> str | None:
        return _text(self.data, "resume_token")

    @property
    def generation(self) -> int | None:
        """The attach generation: ``lease_generation`` here, the seed's
        ``attachment_generation`` on a duplex connection."""
        value = _int(self.data, "lease_generation")
        return value if value is not None else _int(self.data, "attachment_generation")

    @property
    def capabilities(self) -> dict[str, Any] | None:
        """``capabilities`` beside the session object, or the seed's
        ``session.capabilities``; None when neither is there."""
        for holder in (self.data, self.session):
            value = holder.get("capabilities")
            if isinstance(value, dict):
                return value
        return None


class SessionUpdated(RealtimeEvent):
    """``session.updated``: the whole session object after the update."""

    __slots__ = ()

    @property
    def session(self) -> dict[str, Any]:
        return _object(self.data, "session")


class SessionClosed(RealtimeEvent):
    """``session.closed``: the session's last event."""

    __slots__ = ()

    @property
    def reason(self) -> str | None:
        return _text(self.data, "reason")


class SessionExpired(RealtimeEvent):
    """``session.expired``: the session's last event, after a grace or TTL ran out."""

    __slots__ = ()

    @property
    def reason(self) -> str | None:
        return _text(self.data, "reason")


class SessionResyncRequired(RealtimeEvent):
    """``session.resync_required``: events the client lacks cannot be replayed."""

    __slots__ = ()

    @property
    def reason(self) -> str | None:
        return _text(self.data, "reason")

    @property
    def replay_from(self) -> int | None:
        """The number of the next event (None on the seed's shape, which has none)."""
        return _int(self.data, "replay_from")


class ResponseCreated(RealtimeEvent):
    """``response.created``."""

    __slots__ = ()


class ResponseDone(RealtimeEvent):
    """``response.done``: ``status`` is ``completed``, ``cancelled``, ``failed`` or
    ``incomplete``."""

    __slots__ = ()

    @property
    def status(self) -> str | None:
        return _text(_object(self.data, "response"), "status")


class AudioDelta(RealtimeEvent):
    """``response.output_audio.delta``: :attr:`audio`, and the chunk's own ``format`` and
    ``sample_rate_hz`` where the server says them (the seed's dialect does)."""

    __slots__ = ()

    @property
    def format(self) -> str | None:
        return _text(self.data, "format")

    @property
    def sample_rate_hz(self) -> int | None:
        value = _int(self.data, "sample_rate_hz")
        return value if value is not None and value > 0 else None


class _TextDeltaBase(RealtimeEvent):
    __slots__ = ()

    @property
    def text(self) -> str:
        """The text this delta adds."""
        return _text(self.data, "delta") or ""


class TranscriptDelta(_TextDeltaBase):
    """``response.output_audio_transcript.delta``."""

    __slots__ = ()


class TextDelta(_TextDeltaBase):
    """``response.output_text.delta`` (or the beta ``response.text.delta``)."""

    __slots__ = ()


class ListenDecision(RealtimeEvent):
    """``response.listen``: the model keeps listening (no spoken answer for this turn); with
    a ``response_id`` it ends that response."""

    __slots__ = ()


class SpeakDecision(RealtimeEvent):
    """``response.speak``: the model chose to answer; audio follows."""

    __slots__ = ()


class InputCommitted(RealtimeEvent):
    """``input_audio_buffer.committed``."""

    __slots__ = ()


class SpeechStarted(RealtimeEvent):
    """``input_audio_buffer.speech_started``."""

    __slots__ = ()


class SpeechStopped(RealtimeEvent):
    """``input_audio_buffer.speech_stopped``."""

    __slots__ = ()


class TurnEvent(RealtimeEvent):
    """``turn.event``: a turn transition (``event``), the ``turn_state`` after it and, on
    the seed's dialect, the ``epoch``."""

    __slots__ = ()

    @property
    def event(self) -> str | None:
        return _text(self.data, "event")

    @property
    def turn_state(self) -> str | None:
        return _text(self.data, "turn_state")

    @property
    def epoch(self) -> int | None:
        return _int(self.data, "epoch")


class PlaybackAcknowledged(RealtimeEvent):
    """``playback.acknowledged``: the fields at the top (GA connections) or under ``event``
    (the seed's dialect) read alike."""

    __slots__ = ()

    @property
    def details(self) -> dict[str, Any]:
        """The acknowledgement's fields, wherever the dialect put them."""
        nested = self.data.get("event")
        return nested if isinstance(nested, dict) else self.data

    @property
    def played_ms(self) -> int | None:
        return _int(self.details, "played_ms")

    @property
    def committed_ms(self) -> int | None:
        return _int(self.details, "committed_ms")

    @property
    def response_id(self) -> str | None:
        return _text(self.details, "response_id") or _text(self.data, "response_id")

    @property
    def item_id(self) -> str | None:
        return _text(self.details, "item_id")


class ErrorEvent(RealtimeEvent):
    """``error``: ``code``, ``message`` and the refused command's ``related_event_id``, from
    the Realtime ``error`` object or the seed's flat shape (``error`` a text, ``code`` beside
    it)."""

    __slots__ = ()

    @property
    def _error(self) -> dict[str, Any]:
        return _object(self.data, "error")

    @property
    def code(self) -> str | None:
        return _text(self._error, "code") or _text(self.data, "code")

    @property
    def message(self) -> str:
        return _text(self._error, "message") or _text(self.data, "error") or ""

    @property
    def related_event_id(self) -> str | None:
        """The ``event_id`` of the client command this refuses, when there is one."""
        return _text(self._error, "event_id")


_EVENT_TYPES: dict[str, type[RealtimeEvent]] = {
    "session.created": SessionCreated,
    "session.updated": SessionUpdated,
    "session.closed": SessionClosed,
    "session.expired": SessionExpired,
    "session.resync_required": SessionResyncRequired,
    "response.created": ResponseCreated,
    "response.done": ResponseDone,
    "response.output_audio.delta": AudioDelta,
    "response.output_audio_transcript.delta": TranscriptDelta,
    "response.output_text.delta": TextDelta,
    "response.text.delta": TextDelta,
    "response.listen": ListenDecision,
    "response.speak": SpeakDecision,
    "input_audio_buffer.committed": InputCommitted,
    "input_audio_buffer.speech_started": SpeechStarted,
    "input_audio_buffer.speech_stopped": SpeechStopped,
    "turn.event": TurnEvent,
    "playback.acknowledged": PlaybackAcknowledged,
    "error": ErrorEvent,
}


def event_of(data: dict[str, Any]) -> RealtimeEvent:
    """The typed event for one server JSON object."""
    kind = data.get("type")
    name = kind if isinstance(kind, str) else ""
    seq = _int(data, "server_event_seq")
    return _EVENT_TYPES.get(name, RealtimeEvent)(name, seq, data)


@dataclass(frozen=True, slots=True)
class Resumed(RealtimeEvent):
    """The marker :meth:`DuplexClient.events` yields where it resumed the session: the
    ``session.resumed`` answer (type ``session.resumed``, no ``server_event_seq``), plus how
    the client got there. The events after it continue those before it, with no gap and no
    duplicate (a gap the server cannot fill is a ``session.resync_required`` event next)."""

    #: The gateway URL the session was resumed through.
    url: str = ""
    #: Connections tried for this resume (1: the first one worked).
    attempts: int = 1
    #: What ended the previous connection: ``dropped`` (no close frame), ``closed 1012``, ...;
    #: empty for a resume the caller asked for.
    after: str = ""

    @property
    def replay_from(self) -> int | None:
        """The ``server_event_seq`` the replay starts at (None where the gateway did not say:
        the seed's dialect)."""
        return _int(self.data, "replay_from")

    @property
    def last_client_seq(self) -> int | None:
        """The highest ``client_seq`` the input log held; the commands after it were resent
        (None where the gateway did not say)."""
        return _int(self.data, "last_client_seq")
