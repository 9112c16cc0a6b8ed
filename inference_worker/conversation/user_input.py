"""The user's side of a session's input: the input audio buffer and its machine
(``input_audio_buffer.*``, :class:`~inference_worker.conversation.states.InputState`).

:class:`UserInput` keeps the audio appended since the last commit or clear (its bytes where
the policy keeps them, the newest 60 s; else only their count) and moves the input machine
with every change, through the table (an illegal move raises). :class:`VideoGate` decides
what becomes of the camera frames that ride an append. Pure: no I/O, no clock.
"""

from __future__ import annotations

import binascii

from inference_worker.conversation.profiles import MAX_BUFFER_BYTES, MIN_COMMIT_BYTES
from inference_worker.conversation.refusals import VIDEO_ONLY_REFUSAL, VIDEO_REFUSAL, Refusal
from inference_worker.conversation.states import InputState, Trigger, move, transition

__all__ = ["UserInput", "VideoGate"]


class VideoGate:
    """The camera frames of a session's appends: decoded for a model that sees video, where
    they ride audio (every backend requires audio, as the seed's audio-primary models do: an
    append of frames alone is refused, each time); for a model that does not see video,
    refused once (the session's first frame), then dropped.

    Args:
        sees: the session's model takes video (its profile's ``sees_video``).
    """

    __slots__ = ("_refused", "_sees")

    def __init__(self, *, sees: bool) -> None:
        self._sees = sees
        self._refused = False

    def admit(self, frames: tuple[str, ...], *, with_audio: bool,
              ) -> tuple[tuple[bytes, ...], Refusal | None]:
        """The images of an append's ``frames`` (base64, checked at the gateway) for the
        model, and the refusal to answer with (None: none); ``with_audio``: the append
        carries audio."""
        if not frames:
            return (), None
        if self._sees:
            if not with_audio:
                return (), VIDEO_ONLY_REFUSAL
            return tuple(binascii.a2b_base64(frame) for frame in frames), None
        if self._refused:
            return (), None
        self._refused = True
        return (), VIDEO_REFUSAL


class UserInput:
    """The input appended since the last commit or clear, and the input machine's state.

    Args:
        keep: keep the bytes (a backend that answers committed turns with their audio), not
            only their count.
    """

    __slots__ = ("_audio", "_keep", "_size", "state")

    def __init__(self, *, keep: bool) -> None:
        self._keep = keep
        self._audio = bytearray()
        self._size = 0
        self.state = InputState.EMPTY

    @property
    def size(self) -> int:
        """Bytes buffered."""
        return self._size

    def append(self, audio: bytes) -> None:
        """Buffer ``audio`` (not empty)."""
        self.state = move(self.state, Trigger.APPEND)
        if self._keep:
            self._audio += audio
            if len(self._audio) > MAX_BUFFER_BYTES:
                del self._audio[:len(self._audio) - MAX_BUFFER_BYTES]  # keep the newest
            self._size = len(self._audio)
        else:
            self._size += len(audio)

    @property
    def committable(self) -> bool:
        """Whether a manual commit may take the buffer (at least 100 ms, as OpenAI requires)."""
        return (self._size >= MIN_COMMIT_BYTES
                and transition(self.state, Trigger.COMMIT) is not None)

    def commit(self) -> bytes:
        """A manual commit (checked :attr:`committable` first): the whole buffer."""
        self.state = move(self.state, Trigger.COMMIT)
        audio = bytes(self._audio)
        self._drop()
        return audio

    def take_turn(self, begin: int, end: int, fed: int, *, rest_stays: bool) -> bytes:
        """Turn detection committed the turn between timeline bytes ``begin`` and ``end``
        (``fed``: the timeline's end): what came before it is dropped; what came after stays
        buffered, and counts as buffered input when ``rest_stays``."""
        start = fed - self._size  # the timeline position of the buffer's first byte
        first = min(self._size, max(0, begin - start))
        last = min(self._size, max(first, end - start))
        audio = bytes(self._audio[first:last])
        if self._keep:
            del self._audio[:last]
        self._size -= last
        self._taken()
        if rest_stays and self._size:
            self.state = move(self.state, Trigger.APPEND)
        return audio

    def taken_by_model(self) -> None:
        """A backend that detects speech itself committed the turn: the buffer empties."""
        self._drop()
        self._taken()

    def clear(self) -> None:
        """``input_audio_buffer.clear``: drop the buffer."""
        self.state = move(self.state, Trigger.CLEAR)
        self._drop()

    def close(self) -> None:
        """``session.close``: drop the buffer; the machine closes."""
        self.state = move(self.state, Trigger.CLOSE)
        self._drop()

    def _taken(self) -> None:
        # The machine commits when it held input: a turn can end with nothing buffered (the
        # turn before it in the same append, or a clear, took the audio).
        if self.state is InputState.BUFFERED:
            self.state = move(self.state, Trigger.COMMIT)

    def _drop(self) -> None:
        self._audio.clear()
        self._size = 0
