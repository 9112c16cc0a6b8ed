"""The camera frames that ride a session's appends: what the model gets of them, and when
they are refused. Pure: no I/O, no clock."""

from __future__ import annotations

import binascii

from inference_worker.conversation.refusals import VIDEO_ONLY_REFUSAL, VIDEO_REFUSAL, Refusal

__all__ = ["VideoGate"]


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

    @property
    def refused(self) -> bool:
        """Whether the session's first frame was refused (the rest are dropped quietly)."""
        return self._refused

    def restore(self, *, refused: bool) -> None:
        """Continue a checkpointed session (:attr:`refused` as it was)."""
        self._refused = refused

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
