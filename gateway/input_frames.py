"""Where a frame backend's input is cut into appends: on the model's frame boundaries.

A worker that reads its input once per model tick (``store/keys.py``: it pulls) takes a
session's audio a frame at a time (the session's ``chunk_period_ms``, 80 ms for Moshi), so
the gateway holds its input and appends it in one packed entry a frame (``store/logs.py``):
the append that completes a frame goes as soon as its audio is here, and none goes before.
The cut is counted on the audio the connection has relayed since it attached, so entries
follow the frame grid even when the client's chunks do not divide a frame (30 ms chunks are
cut after the third, then the sixth, ...), each at the first command boundary past a frame's
end: a command is never split, so it keeps its own index and client seq.

Any other command (a commit, a response request, a session update) is cut at once with
whatever audio precedes it: the model would act on it no sooner, and holding it would only
delay the turn it signals. A session whose frame the gateway does not know, and audio it
cannot measure, is cut by the hold's bound alone (``PULLED_INPUT_HOLD_S``).

An append's duration is its bytes over its encoding's bytes a second: the encoding and rate
it names, else the session's input format as the attachment found it (the session object
of the open or the resume: ``audio.input.format``), else the Realtime default (16-bit PCM at
24 kHz). A format changed by ``session.update`` on this connection, with appends that do not
name it, is measured at the one the attachment found, so its cuts come early or late by the
ratio, and the hold's bound still applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contract.messages import AppendAudio, Command

__all__ = ["DEFAULT_INPUT_FORMAT", "AudioFormat", "FrameCuts", "audio_microseconds",
           "frame_cuts_for", "input_format_of"]


@dataclass(frozen=True, slots=True)
class AudioFormat:
    """Bytes a sample and samples a second."""

    width: int
    rate_hz: int


#: The Realtime API's default input: 16-bit PCM at 24 kHz (the only rate GA's audio/pcm takes).
DEFAULT_INPUT_FORMAT = AudioFormat(2, 24_000)
#: G.711, whose rate is always 8 kHz.
_G711 = AudioFormat(1, 8_000)
#: The session object's ``audio.input.format`` types this measures.
_SESSION_FORMATS = {"audio/pcm": DEFAULT_INPUT_FORMAT, "audio/pcmu": _G711, "audio/pcma": _G711}


def input_format_of(session: Mapping[str, Any] | None) -> AudioFormat:
    """The input format a session object names (``audio.input.format``), or the default."""
    audio = (session or {}).get("audio")
    given = audio.get("input") if isinstance(audio, dict) else None
    fmt = given.get("format") if isinstance(given, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    known = _SESSION_FORMATS.get(kind) if isinstance(kind, str) else None
    if known is None or not isinstance(fmt, dict):
        return DEFAULT_INPUT_FORMAT
    rate = fmt.get("rate")
    if known is DEFAULT_INPUT_FORMAT and type(rate) is int and rate > 0:
        return AudioFormat(known.width, rate)
    return known


def audio_microseconds(command: AppendAudio,
                       session_format: AudioFormat = DEFAULT_INPUT_FORMAT) -> int:
    """How long ``command``'s audio lasts, by its bytes at the encoding and rate it names,
    else at ``session_format``'s."""
    name = (command.format or "").lower()
    if not name:
        fmt = session_format
    elif "f32" in name:
        fmt = AudioFormat(4, DEFAULT_INPUT_FORMAT.rate_hz)
    elif any(mark in name for mark in ("g711", "pcmu", "pcma", "law")):
        fmt = _G711
    else:
        fmt = DEFAULT_INPUT_FORMAT
    rate = command.sample_rate_hz or fmt.rate_hz
    return len(command.audio) * 1_000_000 // (fmt.width * rate)


class FrameCuts:
    """One attachment's audio on the model's frame grid: which command completes a frame.

    Args:
        frame_us: the model's frame in microseconds (None: not known, never cut by audio).
        session_format: the session's input format, for appends that name none.
    """

    __slots__ = ("_audio_us", "_format", "_frame_us", "_frames_cut")

    def __init__(self, frame_us: int | None,
                 session_format: AudioFormat = DEFAULT_INPUT_FORMAT) -> None:
        self._frame_us = frame_us if frame_us and frame_us > 0 else None
        self._format = session_format
        self._audio_us = 0
        self._frames_cut = 0

    def cut_after(self, command: Command) -> bool:
        """Count ``command`` in (in the order the client sent them); True when the input held
        up to it should be appended now: it completes a frame, or it is not audio."""
        if not isinstance(command, AppendAudio):
            return True
        if self._frame_us is None or not command.audio:
            return False
        self._audio_us += audio_microseconds(command, self._format)
        frames = self._audio_us // self._frame_us
        if frames <= self._frames_cut:
            return False
        self._frames_cut = frames
        return True


def frame_cuts_for(session: Mapping[str, Any] | None,
                   capabilities: Mapping[str, Any] | None) -> FrameCuts:
    """The cuts of an attachment whose session object and capabilities the open or resume
    found: frames of its ``chunk_period_ms``, audio at its input format."""
    period = (capabilities or {}).get("chunk_period_ms")
    return FrameCuts(period * 1000 if type(period) is int else None, input_format_of(session))
