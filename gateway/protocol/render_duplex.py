"""Rendering for connections that speak the seed's duplex dialect (no I/O).

A duplex connection gets what a GA one gets (:mod:`gateway.protocol.render`), reshaped where
the seed's released server says it differently (docs/reference/protocol.md, "The duplex
dialect"): its names (``attachment_generation``; the resync reasons and error codes of
:mod:`gateway.protocol.dialect`), its fields (capabilities inside the session object,
``response_id`` at the top of ``response.created`` / ``.done``, the chunk's ``format`` and
``sample_rate_hz`` on every audio delta, the cancel reason it names) and its shapes
(``playback.acknowledged`` nested under ``event``), plus the events only it has.

The seed's listen and speak decisions ride events every dialect gets (a user item's commit,
a ``response.done``, an audio delta): GA ignores them, so its ``server_event_seq`` numbers
stay 1, 2, 3, ...; here each becomes a frame of its own (``response.listen``,
``response.speak``), put into the connection's extra-frame list for the delivery code to
send around the event's frame, without a ``server_event_seq`` (no log entry of its own).

One :class:`DuplexRenderer` per connection: the audio deltas' format follows the session
object the connection last announced or delivered, so the renderer keeps it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from contract import messages as m
from gateway.protocol import envelope as env
from gateway.protocol.dialect import SEED_RESYNC_REASONS, seed_error_code
from gateway.protocol.errors import GatewayError
from gateway.protocol.render import (
    render_error,
    render_event,
    render_notice,
)

__all__ = ["DECISION_EVENT_TYPES", "DEFAULT_OUTPUT_AUDIO", "DuplexRenderer", "ExtraFrames",
           "output_audio_of"]

JsonDict: TypeAlias = dict[str, Any]

#: Frames derived from the event they ride: (whether it goes before that event's frame, the
#: frame without its ``event_id``, which the sender stamps).
ExtraFrames: TypeAlias = list[tuple[bool, JsonDict]]

#: The server event types only the duplex dialect has: the seed's decisions, each a frame
#: derived from the event it rides, never a log entry.
DECISION_EVENT_TYPES: frozenset[str] = frozenset({"response.listen", "response.speak"})

#: A session object that names no output format plays pcm16 at 24 kHz (GA's default).
DEFAULT_OUTPUT_AUDIO = ("pcm16", 24000)

# GA ``audio.output.format.type`` -> the seed's encoding name and, for G.711, its fixed rate.
_ENCODINGS: dict[str, tuple[str, int | None]] = {
    "audio/pcm": ("pcm16", None),
    "audio/pcm_f32le": ("pcm_f32le", None),
    "audio/pcmu": ("g711_ulaw", 8000),
    "audio/pcma": ("g711_alaw", 8000),
}


def output_audio_of(session: Mapping[str, Any]) -> tuple[str, int] | None:
    """The seed's (encoding, sample rate) of the session object's ``audio.output.format``;
    None when the object names no format this knows (the previous one holds)."""
    audio = session.get("audio")
    output = audio.get("output") if isinstance(audio, dict) else None
    fmt = output.get("format") if isinstance(output, dict) else None
    if not isinstance(fmt, dict):
        return None
    kind = fmt.get("type")
    known = _ENCODINGS.get(kind) if isinstance(kind, str) else None
    if known is None:
        return None
    encoding, fixed_rate = known
    rate = fmt.get("rate")
    if fixed_rate is not None:
        return encoding, fixed_rate
    if type(rate) is int and rate > 0:
        return encoding, rate
    return encoding, DEFAULT_OUTPUT_AUDIO[1]


def _seed_error(body: JsonDict) -> JsonDict:
    """An ``error`` object with the seed's code."""
    return {**body, "code": seed_error_code(body["code"], body.get("param"))}


class DuplexRenderer:
    """Renders one duplex connection's events, notices and errors; see the module docstring.

    Its three methods have the signatures of :func:`~gateway.protocol.render.render_event`,
    :func:`~gateway.protocol.render.render_notice` and
    :func:`~gateway.protocol.render.render_error`, so the connection core calls whichever
    dialect's without a branch.

    Args:
        extra: where the decision frames derived from an event go (see :data:`ExtraFrames`);
            the sender empties it after each event.
    """

    def __init__(self, extra: ExtraFrames) -> None:
        self._extra = extra
        self.audio_format, self.sample_rate_hz = DEFAULT_OUTPUT_AUDIO
        self._capabilities: JsonDict | None = None
        self._session_id: str | None = None
        self._patches: dict[type[Any], Callable[[JsonDict, Any], JsonDict]] = {
            m.SessionUpdated: self._session_updated,
            m.AudioDelta: self._audio_delta,
            m.ResponseCreated: _response_created,
            m.ResponseDone: self._response_done,
            m.InputCommitted: self._input_committed,
            m.PlaybackAcknowledged: _playback_acknowledged,
            m.ErrorEvent: _error_event,
        }

    # ------------------------------------------------------------------ events

    def event(self, event: m.Event, *, server_event_seq: int, event_id: str,
              session_id: str | None = None) -> JsonDict:
        """A worker event as the seed's server sends it."""
        rendered = render_event(event, server_event_seq=server_event_seq,
                                event_id=event_id, session_id=session_id)
        patch = self._patches.get(type(event))
        if patch is None:
            return rendered
        self._session_id = session_id
        return patch(rendered, event)

    def _session(self, session: Mapping[str, Any]) -> JsonDict:
        """The session object with the capabilities the connection knows inside it, and the
        output format it names taken for the audio deltas that follow."""
        audio = output_audio_of(session)
        if audio is not None:
            self.audio_format, self.sample_rate_hz = audio
        if self._capabilities is None:
            return dict(session)
        return {**session, "capabilities": self._capabilities}

    def _session_updated(self, rendered: JsonDict, event: m.SessionUpdated) -> JsonDict:
        rendered["session"] = self._session(event.session)
        return rendered

    def _audio_delta(self, rendered: JsonDict, event: m.AudioDelta) -> JsonDict:
        if event.speak_epoch is not None:
            self._extra.append((True, _speak(event.response_id, event.item_id,
                                             event.speak_epoch)))
        rendered["format"] = self.audio_format
        rendered["sample_rate_hz"] = self.sample_rate_hz
        return rendered

    def _input_committed(self, rendered: JsonDict, event: m.InputCommitted) -> JsonDict:
        if event.listen is not None:
            self._extra.append((False, self._listen(event.listen, event.listen_epoch, None)))
        return rendered

    def _response_done(self, rendered: JsonDict, event: m.ResponseDone) -> JsonDict:
        if event.listen is not None:
            self._extra.append((True, self._listen(event.listen, event.listen_epoch,
                                                   event.response.get("id"))))
        return _response_done(rendered, event)

    def _listen(self, reason: str, epoch: int, response_id: str | None) -> JsonDict:
        # The seed's shape: a response object whose status is the decision, the reason in its
        # metadata; the id only where the decision ends that response.
        response: JsonDict = {"object": "realtime.response", "status": "listening",
                              "metadata": {"reason": reason, "epoch": epoch}}
        rendered: JsonDict = {"type": "response.listen", "event_id": "", "epoch": epoch,
                              "response": response}
        if response_id is not None:
            response["id"] = response_id
            rendered["response_id"] = response_id
        if self._session_id is not None:
            rendered["session_id"] = self._session_id
        return rendered

    # ------------------------------------------------------------------ notices

    def notice(self, notice: env.Notice, *, event_id: str) -> JsonDict:
        """A gateway notice with the seed's names and its capabilities inside the session."""
        rendered = render_notice(notice, event_id=event_id)
        if "lease_generation" in rendered:
            rendered["attachment_generation"] = rendered.pop("lease_generation")
        capabilities = rendered.pop("capabilities", None)
        if capabilities is not None:
            self._capabilities = capabilities
        if "session" in rendered:
            rendered["session"] = self._session(rendered["session"])
        if isinstance(notice, env.ResyncRequiredNotice):
            rendered["reason"] = SEED_RESYNC_REASONS.get(notice.reason, notice.reason)
        return rendered

    # ------------------------------------------------------------------ errors

    def error(self, error: GatewayError, event_id: str) -> JsonDict:
        """A gateway error with the seed's code."""
        rendered = render_error(error, event_id)
        rendered["error"] = _seed_error(rendered["error"])
        return rendered


def _speak(response_id: str, item_id: str, epoch: int) -> JsonDict:
    return {"type": "response.speak", "event_id": "", "response_id": response_id,
            "item_id": item_id, "output_index": 0, "content_index": 0,
            "metadata": {"epoch": epoch, "model_speak": True}}


def _error_event(rendered: JsonDict, event: m.ErrorEvent) -> JsonDict:
    rendered["error"] = _seed_error(rendered["error"])
    return rendered


def _response_created(rendered: JsonDict, event: m.ResponseCreated) -> JsonDict:
    rendered["response_id"] = event.response.get("id")
    return rendered


def _response_done(rendered: JsonDict, event: m.ResponseDone) -> JsonDict:
    rendered["response_id"] = event.response.get("id")
    # The seed's own name for why a response was cut short, where the worker knows it.
    seed_reason = getattr(event, "seed_reason", None)
    if seed_reason:
        response = dict(event.response)
        details = response.get("status_details")
        response["status_details"] = {**(details if isinstance(details, dict) else {}),
                                      "reason": seed_reason}
        rendered["response"] = response
    return rendered


def _playback_acknowledged(rendered: JsonDict, event: m.PlaybackAcknowledged) -> JsonDict:
    # The seed nests the ack's details under ``event``: every field the worker's event has.
    details = {field.name: getattr(event, field.name) for field in dataclasses.fields(event)}
    head = {key: rendered[key] for key in ("type", "event_id", "server_event_seq")}
    return {**head, "event": details}
