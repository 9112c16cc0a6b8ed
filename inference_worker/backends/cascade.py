"""The ``cascade`` backend: VAD -> Whisper -> responder -> Piper, half duplex with barge-in.

A CPU backend with real offline weights (see :mod:`.cascade_models`). Each slot is a
half-duplex voice agent::

    LISTENING --(speech, then `silence_ms` of silence)--> TRANSCRIBING
    TRANSCRIBING --(transcript, non-empty)--> RESPONDING --(last audio played)--> LISTENING
    TRANSCRIBING --(transcript empty)--> LISTENING
    TRANSCRIBING / RESPONDING --(user speech: barge-in)--> LISTENING (the new speech is kept)
    TRANSCRIBING / RESPONDING --(stop_response: the client cancelled)--> LISTENING

What a frame engine sees, per slot and tick (:class:`~inference_worker.backend.SlotResult`):

* ``pcm``: empty while the slot is not speaking. While it speaks, ``out_samples`` per tick of
  the answer at 24 kHz; fewer on the last tick, and fewer or none on a tick where synthesis
  has not caught up (a gap in the answer, never padding).
* ``text``: the assistant's text as it is spoken: a chunk's text arrives on the tick its
  first audio does. All ``text`` of one response concatenated is the responder's answer
  (with the whitespace between chunks made one space). The responder is handed the
  transcript and how long transcribing it took (:class:`~.cascade_models.Heard`), timed on
  the pool thread around the transcriber's call.
* ``reports`` (:mod:`~inference_worker.conversation.reports`; several may come on one tick, in
  the order they happened):

  - ``UserSpeechStarted``: the VAD heard ``min_speech_ms`` of speech. Turn audio includes
    ``pre_roll_ms`` before it. If the slot was answering (or about to), ``BargedIn`` and
    ``TurnEnded`` follow it on the same tick.
  - ``UserSpeechStopped``: ``silence_ms`` of silence (or ``max_utterance_s`` of speech) ended
    the utterance; transcription starts on the thread pool.
  - ``UserTranscript``: the user's words, on the tick the transcription is ready, one per
    utterance and in utterance order: possibly on ``UserSpeechStopped``'s own tick (a fast
    transcriber), possibly after the next utterance's start and stop. ``""`` when Whisper
    heard nothing (then no response follows). ``UserTranscriptFailed`` instead when
    transcription failed.
  - ``ResponseStarted``: on the same tick as a non-empty transcript whose turn was not
    interrupted; the answer's text and audio follow on later ticks.
  - ``TurnEnded``: the answer ended: on the tick that carries its last audio (after
    ``Failed`` if the responder or synthesis failed), or on a barge-in.
  - ``BargedIn``: user speech stopped the answer: the unplayed audio is dropped and the
    producer is cancelled. It always comes with ``UserSpeechStarted`` and ``TurnEnded``.
    Speech during TRANSCRIBING cancels the coming answer silently: its transcript still
    arrives, but no ``ResponseStarted`` follows it.

:meth:`CascadeBackend.stop_response` (the session cancelled the response) does what a
barge-in does to the answers, without any report: the answer playing stops with no
``TurnEnded``, its producer is cancelled, and a transcript still being transcribed gets no
answer (its ``UserTranscript`` still arrives). The speech being heard is not touched.

Threading: ``step`` runs the VAD for all listed slots, window by window (one ONNX call per
window for a batched export; one per slot and window for faster-whisper's, the default, whose
first axis is time: about 0.2 ms per slot and 32 ms window on one core), and does bookkeeping
only, so it stays fast whatever the other slots are doing. Whisper and the answer (responder +
Piper + resampling) run on a small thread pool owned by the backend
(``CascadeConfig.workers``); ``step`` polls their futures and returns no audio for a slot until
its results are ready (measured with the batched export: 8 slots, 2 cores, pool busy with
Whisper and Piper: median 1.4 ms, p99 11 ms per step). An answer is synthesized chunk by chunk
(a sentence, or ``max_chunk_chars``), so playback starts after the first chunk, not after the
whole answer. Call :meth:`CascadeBackend.close` to stop the pool.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from inference_worker.audio_frames import SincResampler, resample
from inference_worker.backend import NO_SLOT_CONFIG, FrameSpec, SlotConfig, SlotResult, SlotStep
from inference_worker.backends.cascade_models import (
    ECHO,
    Heard,
    Responder,
    Synthesizer,
    Transcriber,
    load_asr,
    load_responder,
    load_tts,
)
from inference_worker.backends.cascade_turns import TurnDetector
from inference_worker.conversation.reports import (
    BargedIn,
    Failed,
    ModelReport,
    ResponseStarted,
    TurnEnded,
    UserSpeechStarted,
    UserSpeechStopped,
    UserTranscript,
    UserTranscriptFailed,
)
from inference_worker.turn_detection.silero import SileroVad, VadState, load_vad

__all__ = [
    "CascadeBackend",
    "CascadeConfig",
    "SlotState",
    "TurnDetector",
    "speech_segments",
]

_log = logging.getLogger(__name__)

Audio = npt.NDArray[np.float32]

_EMPTY: Final = np.zeros(0, dtype=np.float32)
# A step's record (``SlotResult.context``) for a slot between turns, the one place a cascade
# slot continues from; any other step's is empty: it cannot be continued from there.
_BETWEEN_TURNS: Final = b"between turns"
_WINDOW_MS: Final = 1000 * SileroVad.window / SileroVad.rate  # 32 ms
# A chunk of answer text ends at a sentence end followed by space (or a newline).
_SENTENCE_END: Final = re.compile(r"(?<=[.!?;:])\s+|\n+")


class SlotState(StrEnum):
    """Where a slot is in its half-duplex turn cycle."""

    CLOSED = "closed"
    LISTENING = "listening"
    TRANSCRIBING = "transcribing"
    RESPONDING = "responding"


@dataclass(frozen=True, slots=True, kw_only=True)
class CascadeConfig:
    """The cascade's knobs; the VAD defaults mirror OpenAI ``server_vad``'s.

    Attributes:
        max_slots: slots allocated (sessions served at once).
        rate: the client-side rate of input and output audio (Hz).
        frame_samples: samples per tick in and out (768 = 32 ms at 24 kHz, one VAD window).
        threshold: speech probability at or above which a window is speech.
        min_speech_ms: speech needed to start a turn (and to barge in).
        silence_ms: silence that ends a turn (the hangover).
        pre_roll_ms: audio kept from before the speech start.
        max_utterance_s: a turn is cut (``speech_stopped``) after this much speech.
        max_chunk_chars: answer text is synthesized at sentence ends, or at a word boundary
            once this long.
        workers: threads for transcription and answers, shared by all slots.
    """

    max_slots: int = 8
    rate: int = 24000
    frame_samples: int = 768
    threshold: float = 0.5
    min_speech_ms: int = 96
    silence_ms: int = 500
    pre_roll_ms: int = 300
    max_utterance_s: float = 30.0
    max_chunk_chars: int = 160
    workers: int = 2

    def windows(self, ms: float) -> int:
        """``ms`` in whole VAD windows (at least one)."""
        return max(1, math.ceil(ms / _WINDOW_MS))


def speech_segments(vad: SileroVad, pcm: Audio, rate: int,
                    config: CascadeConfig | None = None) -> list[tuple[float, float]]:
    """The turns the backend would detect in ``pcm``, as ``(start_s, end_s)`` of speech."""
    config = config or CascadeConfig()
    audio = resample(pcm, rate, vad.rate)
    detector = _detector(config)
    state, segments = VadState(), []
    count = len(audio) // vad.window
    for index in range(count):
        window = audio[index * vad.window:(index + 1) * vad.window]
        if detector.push(float(vad.probabilities(window[None], [state])[0])) == "stop":
            segments.append((detector.start_window, detector.last_speech_window + 1))
    if detector.speaking:
        segments.append((detector.start_window, detector.last_speech_window + 1))
    seconds = _WINDOW_MS / 1000
    return [(round(a * seconds, 3), round(b * seconds, 3)) for a, b in segments]


def _detector(config: CascadeConfig) -> TurnDetector:
    return TurnDetector(threshold=config.threshold,
                        min_speech=config.windows(config.min_speech_ms),
                        hangover=config.windows(config.silence_ms))


# ---------------------------------------------------------------------------- slot state


@dataclass(frozen=True, slots=True)
class _Chunk:
    """One synthesized piece of the answer: its text and its audio at the client rate."""

    text: str
    audio: Audio


@dataclass(frozen=True, slots=True)
class _Failed:
    """The producer's failure, passed through the chunk queue."""

    error: str


_END: Final = "end"
_Item = _Chunk | _Failed | Literal["end"]


@dataclass(slots=True)
class _Response:
    """An answer being produced (pool thread) and played (``step``)."""

    cancel: threading.Event = field(default_factory=threading.Event)
    chunks: queue.SimpleQueue[_Item] = field(default_factory=queue.SimpleQueue)
    audio: Audio = field(default_factory=lambda: _EMPTY)
    position: int = 0
    finished: bool = False
    error: str | None = None
    #: Chunks put by the producer (producer-side only).
    produced: int = 0
    producer: Future[None] | None = None


@dataclass(slots=True)
class _Turn:
    """A user utterance being transcribed; ``respond`` is cleared by a barge-in."""

    transcript: Future[Heard]
    respond: bool = True


@dataclass(slots=True)
class _Slot:
    """One session's state."""

    resampler: SincResampler
    detector: TurnDetector
    pre_roll: deque[Audio]
    vad: VadState = field(default_factory=VadState)
    pending: Audio = field(default_factory=lambda: _EMPTY)
    utterance: list[Audio] | None = None
    turns: deque[_Turn] = field(default_factory=deque)
    response: _Response | None = None


@dataclass(slots=True)
class _Tick:
    """One slot's output being built during a step."""

    pcm: Audio = field(default_factory=lambda: _EMPTY)
    text: str = ""
    reports: list[ModelReport] = field(default_factory=list)


def _between_turns(slot: _Slot) -> bool:
    """Whether the slot holds nothing of a turn: no speech heard or counting towards a turn,
    no utterance, transcript or answer under way."""
    return (slot.response is None and not slot.turns and slot.utterance is None
            and slot.detector.idle)


def _drop_answers(slot: _Slot) -> bool:
    """Cancel the slot's answer and those of its transcripts still to come; whether an answer
    was under way (its end is then the caller's to report)."""
    for turn in slot.turns:
        turn.respond = False
    response, slot.response = slot.response, None
    if response is None:
        return False
    response.cancel.set()  # the producer stops at its next piece or audio chunk
    return True


# ------------------------------------------------------------------------------- backend


class CascadeBackend:
    """VAD -> Whisper -> responder -> Piper for ``max_slots`` sessions (see the module doc).

    ``spec``: 24 kHz mono in and out, ``frame_samples`` (32 ms) per tick. Resampling to the
    VAD/ASR rate (16 kHz) and from the voice's rate happens inside.
    """

    def __init__(self, *, vad: SileroVad, asr: Transcriber, tts: Synthesizer,
                 responder: Responder, config: CascadeConfig | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        """Assemble loaded models (see :meth:`load` to load them too).

        ``asr`` takes audio at ``asr.rate`` (the VAD's 16 kHz for Whisper; other rates are
        resampled); ``tts`` yields audio at ``tts.rate``, resampled to ``config.rate``.
        ``clock`` (seconds) times each transcription for the responder.
        """
        self.config = config or CascadeConfig()
        cfg = self.config
        self.spec = FrameSpec(in_rate=cfg.rate, in_samples=cfg.frame_samples,
                              out_rate=cfg.rate, out_samples=cfg.frame_samples,
                              max_slots=cfg.max_slots, context_steps=1)
        self._vad, self._asr, self._tts, self._responder = vad, asr, tts, responder
        self._clock = clock
        self._slots: dict[int, _Slot] = {}
        self._pool = ThreadPoolExecutor(max_workers=cfg.workers,
                                        thread_name_prefix="cascade")
        self._max_utterance = round(cfg.max_utterance_s * vad.rate)

    @classmethod
    def load(cls, *, vad_path: str | Path | None = None, asr_path: str | Path | None = None,
             voice_path: str | Path | None = None, responder: str = ECHO,
             responder_path: str | Path | None = None,
             config: CascadeConfig | None = None) -> CascadeBackend:
        """Load every model (``None`` = the default weights of the ``cascade`` extra).

        Raises:
            WeightsNotFound: a path or a default weight package is missing.
        """
        return cls(vad=load_vad(vad_path), asr=load_asr(asr_path), tts=load_tts(voice_path),
                   responder=load_responder(responder, responder_path), config=config)

    # ------------------------------------------------------------------- Backend interface

    def open_slot(self, slot: int, config: SlotConfig = NO_SLOT_CONFIG) -> None:
        """Start ``slot`` afresh in LISTENING (whatever it held is dropped). Of ``config`` it
        uses nothing: its responder's prompt and its voice are fixed when it loads, and its
        profile refuses a voice prompt and a temperature."""
        if not 0 <= slot < self.spec.max_slots:
            raise ValueError(f"slot {slot} out of range 0..{self.spec.max_slots - 1}")
        self.close_slot(slot)
        cfg = self.config
        self._slots[slot] = _Slot(
            resampler=SincResampler(cfg.rate, self._vad.rate),
            detector=_detector(cfg),
            pre_roll=deque(maxlen=cfg.windows(cfg.pre_roll_ms + cfg.min_speech_ms)),
        )

    def configure_slot(self, slot: int, config: SlotConfig) -> None:
        """Nothing to apply (see :meth:`open_slot`)."""
        if not 0 <= slot < self.spec.max_slots:
            raise ValueError(f"slot {slot} out of range 0..{self.spec.max_slots - 1}")

    def close_slot(self, slot: int) -> None:
        """Free ``slot``: cancel its answer; pending transcriptions finish and are discarded."""
        state = self._slots.pop(slot, None)
        if state is not None and state.response is not None:
            state.response.cancel.set()

    def stop_response(self, slot: int) -> None:
        """The client cancelled: the responder and TTS stop for ``slot``, its unplayed audio
        is dropped, and a transcript not answered yet will not be; no report says so."""
        _drop_answers(self._open(slot))

    def step(self, inputs: list[SlotStep]) -> list[SlotResult]:
        """Advance the listed slots by one tick (batched VAD, then per-slot bookkeeping)."""
        slots = [self._open(item.slot) for item in inputs]
        ticks = [_Tick() for _ in inputs]
        self._listen(inputs, slots, ticks)
        for slot, tick in zip(slots, ticks, strict=True):
            self._collect_transcript(slot, tick)
            if slot.response is not None:
                self._play(slot, slot.response, tick)
        return [SlotResult(slot=item.slot, pcm=tick.pcm, text=tick.text,
                           reports=tuple(tick.reports),
                           context=_BETWEEN_TURNS if _between_turns(slot) else b"")
                for item, tick, slot in zip(inputs, ticks, slots, strict=True)]

    def resume_slot(self, slot: int, config: SlotConfig, context: Sequence[bytes]) -> None:
        """Open ``slot`` as a slot that was between turns: its conversation is the session's
        items, which its core carries, so a fresh slot continues it; what restarts is the
        VAD's recurrent state, the pre-roll and the resampler's (room noise, between turns).

        Raises:
            ValueError: the record is not one of a slot between turns.
        """
        if context and context[-1] != _BETWEEN_TURNS:
            raise ValueError("a cascade slot continues only from between turns")
        self.open_slot(slot, config)

    # ----------------------------------------------------------------------------- extras

    def state(self, slot: int) -> SlotState:
        """``slot``'s place in the turn cycle (for tests and metrics)."""
        state = self._slots.get(slot)
        if state is None:
            return SlotState.CLOSED
        if state.response is not None:
            return SlotState.RESPONDING
        if any(turn.respond for turn in state.turns):
            return SlotState.TRANSCRIBING
        return SlotState.LISTENING

    def settle(self, timeout: float) -> bool:
        """Wait until no transcription or answer synthesis is running; False on timeout.

        For tests and offline use, to step without spinning: after it returns, the next
        ``step`` sees every result so far. A real-time worker never calls it.
        """
        futures: list[Future[Any]] = []
        for slot in self._slots.values():
            futures += [turn.transcript for turn in slot.turns]
            if slot.response is not None and slot.response.producer is not None:
                futures.append(slot.response.producer)
        return not wait(futures, timeout=timeout).not_done

    def close(self) -> None:
        """Cancel every answer and stop the thread pool (waits for running jobs)."""
        for slot in list(self._slots):
            self.close_slot(slot)
        self._pool.shutdown(wait=True, cancel_futures=True)

    # --------------------------------------------------------------------------- listening

    def _open(self, slot: int) -> _Slot:
        state = self._slots.get(slot)
        if state is None:
            raise ValueError(f"slot {slot} is not open")
        return state

    def _listen(self, inputs: Sequence[SlotStep], slots: Sequence[_Slot],
                ticks: Sequence[_Tick]) -> None:
        """Resample each input to 16 kHz and run the VAD over whole windows, batched."""
        window = self._vad.window
        ready: list[list[Audio]] = []
        for item, slot in zip(inputs, slots, strict=True):
            audio = np.concatenate([slot.pending, slot.resampler.process(item.pcm)])
            count = len(audio) // window
            ready.append([audio[i * window:(i + 1) * window] for i in range(count)])
            slot.pending = audio[count * window:]
        for index in range(max((len(windows) for windows in ready), default=0)):
            rows = [row for row, windows in enumerate(ready) if len(windows) > index]
            probabilities = self._vad.probabilities(
                np.stack([ready[row][index] for row in rows]), [slots[row].vad for row in rows]
            )
            for row, probability in zip(rows, probabilities, strict=True):
                self._on_window(slots[row], ready[row][index], float(probability), ticks[row])

    def _on_window(self, slot: _Slot, window: Audio, probability: float, tick: _Tick) -> None:
        slot.pre_roll.append(window)
        if slot.utterance is not None:
            slot.utterance.append(window)
        boundary = slot.detector.push(probability)
        if boundary == "start":
            tick.reports.append(UserSpeechStarted())
            slot.utterance = list(slot.pre_roll)
            self._interrupt(slot, tick)
        elif boundary == "stop" or (
            slot.utterance is not None and len(slot.utterance) * len(window) >= self._max_utterance
        ):
            slot.detector.stop()
            self._end_utterance(slot, tick)

    def _interrupt(self, slot: _Slot, tick: _Tick) -> None:
        """Barge-in: the user speaks, so no answer pending or playing goes on."""
        if _drop_answers(slot):
            tick.reports += (BargedIn(), TurnEnded())

    def _end_utterance(self, slot: _Slot, tick: _Tick) -> None:
        tick.reports.append(UserSpeechStopped())
        audio = np.concatenate(slot.utterance or [_EMPTY])
        if self._asr.rate != self._vad.rate:
            audio = resample(audio, self._vad.rate, self._asr.rate)
        slot.utterance = None
        slot.turns.append(_Turn(self._pool.submit(self._transcribe, audio)))

    def _transcribe(self, audio: Audio) -> Heard:
        """Pool thread: the transcript, and how long it took (what the responder reports)."""
        started = self._clock()
        transcript = self._asr.transcribe(audio)
        return Heard(transcript, self._clock() - started)

    # --------------------------------------------------------------------------- answering

    def _collect_transcript(self, slot: _Slot, tick: _Tick) -> None:
        """Report the oldest finished transcription (one per tick) and start its answer."""
        if not slot.turns or not slot.turns[0].transcript.done():
            return
        turn = slot.turns.popleft()
        error = turn.transcript.exception()
        heard = None if error is not None else turn.transcript.result()
        if error is not None:
            _log.warning("transcription failed: %r", error)
            tick.reports.append(UserTranscriptFailed(message=f"transcription failed: {error!r}"))
        else:
            tick.reports.append(UserTranscript(text="" if heard is None else heard.transcript))
        if turn.respond and heard is not None and heard.transcript:
            tick.reports.append(ResponseStarted())
            response = _Response()
            slot.response = response
            response.producer = self._pool.submit(self._produce, heard, response)

    def _produce(self, heard: Heard, response: _Response) -> None:
        """Pool thread: stream the responder's text, synthesize it chunk by chunk."""
        try:
            pending = ""
            with contextlib.closing(self._responder.respond(heard)) as pieces:
                for piece in pieces:
                    if response.cancel.is_set():
                        return
                    parts = _SENTENCE_END.split(pending + piece)
                    pending = parts.pop()
                    if len(pending) >= self.config.max_chunk_chars and " " in pending.strip():
                        head, _, pending = pending.rpartition(" ")
                        parts.append(head)
                    for part in parts:
                        self._speak(part, response)
            if pending:
                self._speak(pending, response)
        except Exception as exc:
            _log.warning("answer failed: %r", exc)
            response.chunks.put(_Failed(f"answer failed: {exc!r}"))
        finally:
            response.chunks.put(_END)

    def _speak(self, text: str, response: _Response) -> None:
        """Synthesize one chunk of text; its text rides with its first audio."""
        text = text.strip()
        if not text:
            return
        # The split ate the whitespace between chunks; put one space back for the text.
        label = text if response.produced == 0 else f" {text}"
        response.produced += 1
        for audio in self._tts.synthesize(text):
            if response.cancel.is_set():
                return
            response.chunks.put(_Chunk(label, resample(audio, self._tts.rate, self.config.rate)))
            label = ""

    def _play(self, slot: _Slot, response: _Response, tick: _Tick) -> None:
        """Emit up to one frame of the answer; end the response when all of it has played."""
        need, parts = self.spec.out_samples, []
        while need > 0:
            if response.position >= len(response.audio) and not self._next_chunk(response, tick):
                break
            take = min(need, len(response.audio) - response.position)
            parts.append(response.audio[response.position:response.position + take])
            response.position += take
            need -= take
        if parts:
            tick.pcm = np.concatenate(parts)
        if response.finished and response.position >= len(response.audio):
            if response.error is not None:
                tick.reports.append(Failed(message=response.error))
            tick.reports.append(TurnEnded())
            slot.response = None

    def _next_chunk(self, response: _Response, tick: _Tick) -> bool:
        """Load the next synthesized chunk if there is one; False if none is ready yet."""
        while not response.finished:
            try:
                item = response.chunks.get_nowait()
            except queue.Empty:
                return False
            if isinstance(item, _Chunk):
                response.audio, response.position = item.audio, 0
                tick.text += item.text
                return True
            if isinstance(item, _Failed):
                response.error = item.error  # the end marker follows
            else:
                response.finished = True
        return False
