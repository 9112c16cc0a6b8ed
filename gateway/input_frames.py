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
it names, else the Realtime default (16-bit PCM at 24 kHz). A session whose format was
changed by ``session.update`` without each append naming it is measured at that default, so
its cuts come early or late by the ratio, and the hold's bound still applies.
"""

from __future__ import annotations

from contract.messages import AppendAudio, Command

__all__ = ["DEFAULT_INPUT_RATE_HZ", "FrameCuts", "audio_microseconds"]

#: The Realtime API's default input rate, for 16-bit PCM (the only rate GA's audio/pcm takes).
DEFAULT_INPUT_RATE_HZ = 24_000
#: The G.711 rate, which its encodings always have.
_G711_RATE_HZ = 8_000


def audio_microseconds(command: AppendAudio) -> int:
    """How long ``command``'s audio lasts, by its bytes at the encoding and rate it names (16-bit
    PCM at :data:`DEFAULT_INPUT_RATE_HZ` where it names none)."""
    name = (command.format or "").lower()
    if "f32" in name:
        width, default_rate = 4, DEFAULT_INPUT_RATE_HZ
    elif any(mark in name for mark in ("g711", "pcmu", "pcma", "law")):
        width, default_rate = 1, _G711_RATE_HZ
    else:
        width, default_rate = 2, DEFAULT_INPUT_RATE_HZ
    rate = command.sample_rate_hz or default_rate
    return len(command.audio) * 1_000_000 // (width * rate)


class FrameCuts:
    """One attachment's audio on the model's frame grid: which command completes a frame.

    Args:
        frame_us: the model's frame in microseconds (None: not known, never cut by audio).
    """

    __slots__ = ("_audio_us", "_frame_us", "_frames_cut")

    def __init__(self, frame_us: int | None) -> None:
        self._frame_us = frame_us if frame_us and frame_us > 0 else None
        self._audio_us = 0
        self._frames_cut = 0

    def cut_after(self, command: Command) -> bool:
        """Count ``command`` in (in the order the client sent them); True when the input held
        up to it should be appended now: it completes a frame, or it is not audio."""
        if not isinstance(command, AppendAudio):
            return True
        if self._frame_us is None or not command.audio:
            return False
        self._audio_us += audio_microseconds(command)
        frames = self._audio_us // self._frame_us
        if frames <= self._frames_cut:
            return False
        self._frames_cut = frames
        return True
