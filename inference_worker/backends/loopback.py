"""The ``loopback`` backend: a "model" that answers a user turn by playing its audio back.

It is the load and latency test double of DESIGN.md §4. This module holds how it plays audio
back (:class:`PacedPlayback`: 40 ms chunks at real-time pace) and the model port the
conversation core drives (:class:`LoopbackModel`). It does no I/O and reads no clock: time is
passed in.
"""

from __future__ import annotations

from typing import Final

from contract.messages import JsonObject
from inference_worker.conversation.model_port import ModelState, PendingInput
from inference_worker.conversation.reports import (
    AUDIBLE,
    Output,
    Report,
    ResponseStarted,
    TurnEnded,
)
from inference_worker.conversation.seed_settings import SlotConfig

__all__ = ["CHUNK_BYTES", "CHUNK_SECONDS", "LoopbackModel", "PacedPlayback"]

# 40 ms per audio delta: small enough for barge-in to feel immediate, big enough to keep the
# number of log entries per second (DESIGN.md §5, Redis commands per session) low.
CHUNK_SECONDS: Final = 0.04
CHUNK_BYTES: Final = 1920
# Tolerance when comparing `now` with a chunk's due time: callers compute times as sums of
# floats (start + k * 0.04), which may land a hair below the exact value.
_EPSILON: Final = 1e-9


class PacedPlayback:
    """Releases a turn's audio in 40 ms chunks at real-time pace.

    The chunk covering ``[t, t + 40 ms)`` of the audio is due at ``start + t``, so the first
    chunk is due at once and the last one when the audio is nearly played out. A late caller
    gets every chunk that is due, in order: the loopback never drops audio to catch up.
    """

    __slots__ = ("_audio", "_next", "_start")

    def __init__(self, audio: bytes, *, start: float) -> None:
        """Prepare ``audio`` (pcm16 24 kHz mono) for playback starting at ``start`` seconds."""
        self._audio = audio
        self._start = start
        self._next = 0  # index of the next chunk to release

    @property
    def finished(self) -> bool:
        """Whether every chunk has been released."""
        return self._next * CHUNK_BYTES >= len(self._audio)

    def next_due(self) -> float | None:
        """When the next chunk is due, or None once every chunk has been released."""
        if self.finished:
            return None
        return self._start + self._next * CHUNK_SECONDS

    def release(self, now: float) -> list[bytes]:
        """Return the chunks due at ``now`` (possibly none), in playback order."""
        chunks: list[bytes] = []
        due = self.next_due()
        while due is not None and now + _EPSILON >= due:
            offset = self._next * CHUNK_BYTES
            chunks.append(self._audio[offset : offset + CHUNK_BYTES])
            self._next += 1
            due = self.next_due()
        return chunks


class LoopbackModel:
    """The loopback's "model": it answers a response with the committed turn's audio, paced
    (turn mode), or echoes each appended chunk at once (``extra_body.loopback_mode`` stream:
    the relay-latency path, no buffering, no pacing; the commit ends the echo's turn)."""

    __slots__ = ("_auto", "_commits", "_epoch", "_listen_for", "_playback", "_queued",
                 "_stream", "_streaming", "slot_config")

    def __init__(self) -> None:
        self._stream = False
        self._auto = False
        self._listen_for = 0  # extra_body.force_listen_count
        self._commits = 0  # committed turns so far
        #: What the session's last accepted session.update gave the model (the voice prompt
        #: included); the loopback speaks with the caller's voice, so it only keeps it.
        self.slot_config = SlotConfig()
        self._streaming = False  # an echo turn is open
        self._playback: PacedPlayback | None = None
        self._queued: list[Report] = []
        self._epoch = 0

    @property
    def auto_respond(self) -> bool:
        """``extra_body.auto_response`` in turn mode: every commit is answered at once, but
        the first ``extra_body.force_listen_count`` (the seed's forced listening)."""
        return self._auto and not self._stream and self._commits >= self._listen_for

    @property
    def epoch(self) -> int:
        """The stops so far: each takes effect at once (nothing of a stopped turn is queued)."""
        return self._epoch

    def checkpoint(self) -> ModelState | None:
        """Its stops and commits, while nothing plays or waits to be reported (None then)."""
        if self._playback is not None or self._queued or self._streaming:
            return None
        return ModelState(self._epoch, self._commits)

    def restore(self, state: ModelState) -> None:
        """Continue a checkpointed session: its stops and commits so far."""
        self._epoch, self._commits = state.epoch, state.commits

    def configure(self, config: JsonObject) -> None:
        """Read the mode, ``auto_response`` and ``force_listen_count`` of ``extra_body``."""
        extra = config["extra_body"]
        self._stream = extra["loopback_mode"] == "stream"
        self._auto = bool(extra["auto_response"])
        self._listen_for = int(extra.get("force_listen_count", 0))

    def configure_slot(self, config: SlotConfig) -> None:
        """Keep ``config``: the loopback's voice is the caller's."""
        self.slot_config = config

    def hear(self, audio: bytes, video: tuple[bytes, ...] = ()) -> None:
        """Stream mode: echo ``audio``, opening the echo's turn with its first chunk. It sees
        no video (its profile says so: the core refuses frames before they get here)."""
        if not audio or not self._stream or self._playback is not None:
            return  # a played-back turn owns the output
        if not self._streaming:
            self._streaming = True
            self._queued.append(ResponseStarted())
        self._queued.append(Output(audio=audio, level=AUDIBLE))

    def forget_input(self) -> None:
        """Nothing held: the core keeps the turn's audio."""

    def answer(self, audio: bytes, *, spoken: bool, now: float) -> None:
        """Play ``audio`` back from ``now`` (a text answer is empty and over at once)."""
        if spoken:
            self._playback = PacedPlayback(audio, start=now)
        else:
            self._queued.append(TurnEnded())

    def committed(self) -> None:
        """The commit ends an echo's turn: the echo answered it."""
        self._commits += 1
        if self._streaming:
            self._streaming = False
            self._queued.append(TurnEnded())

    def stop(self) -> None:
        """Drop the audio not released yet."""
        self._epoch += 1
        self._playback = None
        self._streaming = False
        self._queued.clear()

    def reports(self, now: float) -> list[Report]:
        """The chunks due at ``now``, and the end of the turn once the last one is out."""
        reports, self._queued = self._queued, []
        playback = self._playback
        if playback is not None:
            reports += [Output(audio=chunk, level=AUDIBLE) for chunk in playback.release(now)]
            if playback.finished:
                self._playback = None
                reports.append(TurnEnded())
        return reports

    def next_deadline(self) -> float | None:
        """When the next chunk is due (None when nothing plays)."""
        return self._playback.next_due() if self._playback is not None else None

    def take_input(self) -> PendingInput:
        """Nothing: no engine serves the loopback."""
        return PendingInput()
