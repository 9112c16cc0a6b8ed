"""Deterministic continuation of a frame backend's session (docs/design/hand-over.md): a
session moved to another engine at a safe point, through its checkpoint's encoding, gives
the same events for the same input as one that never moved: moved == unmoved.

Each run drives a session as the worker does (its core's input pumped into its engine slot,
one engine tick per frame, the tick's output fed to its core), on a clock of its own. The
moved run stops at a safe point, encodes the checkpoint with the slot's context, restores it
on a fresh engine's slot, and goes on with the same input.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from contract import messages as msg
from inference_worker.audio_frames import float_to_pcm16
from inference_worker.backend import NO_SLOT_CONFIG
from inference_worker.backends.fake import FakeBackend, FakeOptions
from inference_worker.conversation.checkpoint import CoreState, decode, encode
from inference_worker.engine import Engine, SlotResume
from inference_worker.session_factory import SessionFactory
from inference_worker.sessions import Session
from inference_worker.settings import WorkerSettings
from inference_worker.turn_detection.vad import EnergyVad
from store.logs import SessionStart

pytestmark = pytest.mark.timeout(60)

T0 = 1000.0
SAMPLES = 1920  # 80 ms at 24 kHz: the fake's frame
FRAME_S = SAMPLES / 24000
START = SessionStart(epoch="e1", model="fake")

# A frame of input: ``None`` is a tick with nothing appended (the model hears silence).
Script = list[bytes | None]
# What a test does to a session before a tick: (tick, command).
Commands = dict[int, msg.Command]


def marked(mark: int) -> bytes:
    """One frame of audio that says ``mark`` (loud enough to be speech)."""
    return float_to_pcm16(np.full(SAMPLES, 0.2 + mark / 1000, dtype=np.float32))


def quiet(seed: int = 0) -> bytes:
    """One frame of room noise, below any speech threshold: seed 0 is digital silence."""
    noise = np.random.default_rng(seed).normal(0.0, 0.002 if seed else 0.0, SAMPLES)
    return float_to_pcm16(noise.astype(np.float32))


class Run:
    """One session driven tick by tick on an engine of its own."""

    def __init__(self, options: FakeOptions, session: Session | None = None,
                 resume: SlotResume | None = None, engine: Engine | None = None) -> None:
        self.factory = SessionFactory(WorkerSettings(backend="fake", slots=2), EnergyVad)
        self.engine = engine or Engine(FakeBackend(max_slots=2, options=options))
        made = session or self.factory.session("sess_moved", self.engine, START, resume)
        assert made is not None
        self.session = made
        self.events: list[tuple[int, msg.Event]] = []  # each with the tick it came at
        self.heard = bytearray()  # every append's audio: the input log's, for a read-back

    def tick(self, index: int, audio: bytes | None, command: msg.Command | None) -> None:
        now = T0 + index * FRAME_S
        core, handle = self.session.core, self.session.handle
        assert handle is not None
        if command is not None:
            core.receive(command, now)
        if audio is not None:
            core.receive(msg.AppendAudio(audio=audio), now)
            self.heard += audio
        pending = core.take_input()
        if pending.config is not None:
            self.engine.configure(handle, pending.config)
        for _ in range(pending.stops):
            self.engine.stop_response(handle)
        if pending.clear:
            self.engine.clear_input(handle)
        if pending.audio:
            self.engine.push_audio(handle, pending.audio)
        report = self.engine.tick_once(scheduled=now)
        assert report is not None and not report.failed
        frame = report.outputs[handle.serial]
        core.on_frame(frame, now + FRAME_S / 2)
        assert self.session.slot_context is not None
        self.session.slot_context.consumed(frame)
        core.tick(now + FRAME_S / 2)
        self.events += [(index, event) for event in core.events_to_send()]

    def checkpoint(self) -> CoreState | None:
        """The session's checkpoint, as the worker's checkpointer takes it (None: off a safe
        point)."""
        state = self.session.core.checkpoint()
        if state is None or self.session.slot_context is None:
            return None
        place = self.session.slot_context.at(state)
        if place is None:
            return None
        return dataclasses.replace(state, model_context=place.records,
                                   model_unconsumed=place.unconsumed)


def moved_from(state: CoreState, options: FakeOptions, heard: bytes) -> Run:
    """A session restored from ``state`` through its encoding, on a fresh engine, its input
    buffer read back from ``heard`` (the input log's audio)."""
    decoded = decode(encode(state))
    assert decoded.model_context is not None
    unconsumed = heard[len(heard) - decoded.model_unconsumed:] if decoded.model_unconsumed else b""
    resume = SlotResume(context=decoded.model_context, epoch=decoded.model.epoch,
                        input_frames=round((decoded.model_input_ms or 0) / (FRAME_S * 1000)),
                        unconsumed=unconsumed)
    run = Run(options, resume=resume)
    run.session.core.restore(decoded, heard[len(heard) - decoded.buffer.size:])
    run.heard = bytearray(heard)
    return run


def both_ways(options: FakeOptions, script: Script, commands: Commands,
              move_from: int,
              ) -> tuple[list[tuple[int, msg.Event]], list[tuple[int, msg.Event]], CoreState]:
    """The events of a session that never moved and of one moved at its first safe point
    from tick ``move_from`` on, and the checkpoint it moved from (its ``model_input_ms``: the
    tick it moved after)."""
    unmoved, moving = Run(options), Run(options)
    moved: Run | None = None
    moved_at: CoreState | None = None
    for index, audio in enumerate(script):
        unmoved.tick(index, audio, commands.get(index))
        if moved is None:
            moving.tick(index, audio, commands.get(index))
            state = moving.checkpoint() if index >= move_from else None
            if state is not None:
                moved, moved_at = moved_from(state, options, bytes(moving.heard)), state
                moved.events = list(moving.events)
        else:
            moved.tick(index, audio, commands.get(index))
    assert moved is not None and moved_at is not None, "no safe point to move at"
    return unmoved.events, moved.events, moved_at


def tick_of(state: CoreState) -> int:
    """The tick a session moved after, by its model's place on the input timeline (every
    tick of these scripts steps a frame of input)."""
    return round((state.model_input_ms or 0) / (FRAME_S * 1000)) - 1


def kinds(events: list[tuple[int, msg.Event]]) -> list[str]:
    return [type(event).__name__ for _, event in events]


def spoken(events: list[tuple[int, msg.Event]]) -> bytes:
    return b"".join(e.audio for _, e in events if isinstance(e, msg.AudioDelta))


def talk(marks: range, pause: int) -> Script:
    """Speech, each frame marked, then a pause of room noise, each frame its own."""
    frames: Script = [marked(m) for m in marks]
    return frames + [quiet(marks[-1] * 100 + n) for n in range(pause)]


def test_an_echo_moved_between_answers_answers_as_if_it_never_moved() -> None:
    """The fake echo's slot moves with the frame it would echo next and its tick count: the
    second answer, after the move, is the same events, ids and audio."""
    script = talk(range(1, 6), 12) + talk(range(10, 16), 12) + [None] * 4
    unmoved, moved, state = both_ways(FakeOptions(), script, {}, move_from=8)
    assert 8 <= tick_of(state) < 17, "it moved in the pause between the two answers"
    assert moved == unmoved
    assert kinds(unmoved).count("ResponseDone") == 2
    audio = spoken(moved)
    frames = [audio[i:i + SAMPLES * 2] for i in range(0, len(audio), SAMPLES * 2)]
    speech = [marked(m) for m in [*range(1, 6), *range(10, 16)]]
    assert [f for f in frames if f in speech] == speech, "each word echoed once, in order"


def test_a_tone_model_moved_in_its_gap_speaks_on_the_same_beat() -> None:
    """A model that takes turns on its own (its tick count is its state) keeps its rhythm
    across the move: the next bursts come on the same ticks, with the same ids."""
    options = FakeOptions(mode="tone", tone_frames=4, gap_frames=6, text="hi")
    unmoved, moved, _ = both_ways(options, [None] * 40, {}, move_from=6)
    assert moved == unmoved
    assert kinds(unmoved).count("ResponseDone") >= 3


def test_a_response_cancelled_before_the_move_stays_cancelled_after_it() -> None:
    """A cancel bumps the slot's epoch; the moved slot starts at it, so its frames are not
    taken for the cancelled response's, and the next burst answers as it would have."""
    options = FakeOptions(mode="tone", tone_frames=5, gap_frames=6)
    commands: Commands = {3: msg.CancelResponse()}
    unmoved, moved, state = both_ways(options, [None] * 40, commands, move_from=4)
    assert moved == unmoved
    statuses = [e.response["status"] for _, e in unmoved if isinstance(e, msg.ResponseDone)]
    assert statuses[0] == "cancelled" and "completed" in statuses[1:]
    assert state.model.epoch == 1, "it moved after the cancel, its epoch with it"


def test_a_checkpoint_counts_the_input_its_slot_has_not_stepped() -> None:
    """Input given to the slot and not stepped yet (half a frame, a whole one) is counted in
    the checkpoint, for the slot that continues the session to be given first. A stop the
    engine has not applied, or a step whose output the core has not consumed, holds the
    checkpoint back: the records do not reflect them."""
    run = Run(FakeOptions(mode="tone", tone_frames=2, gap_frames=30))
    for index in range(6):
        run.tick(index, quiet(), None)
    state = run.checkpoint()
    assert state is not None and state.model_unconsumed == 0, "quiet, in a gap: a safe point"
    handle = run.session.handle
    assert handle is not None
    run.engine.push_audio(handle, quiet()[: SAMPLES])  # half a frame
    assert (state := run.checkpoint()) is not None and state.model_unconsumed == SAMPLES
    run.engine.push_audio(handle, quiet()[SAMPLES:])  # a whole frame queued
    assert (state := run.checkpoint()) is not None and state.model_unconsumed == SAMPLES * 2
    run.engine.push_audio(handle, quiet())
    run.engine.tick_once()  # a step the core has not seen
    assert run.checkpoint() is None
    run.tick(7, None, None)
    assert (state := run.checkpoint()) is not None and state.model_unconsumed == 0
    run.engine.stop_response(handle)
    assert run.checkpoint() is None, "a stop the engine has not applied"


def test_an_echo_moved_with_its_input_queued_ahead_echoes_it_as_if_unmoved() -> None:
    """A client ahead of real time: each word and its pause appended at once, so the slot
    holds frames it has not stepped when the session is at a safe point. They are read back
    and given to the new slot first: the echo goes on as if the session had never moved."""
    words = [talk(range(1, 5), 14), talk(range(30, 36), 14)]
    # The second word comes while the first one's pause is still queued.
    script: Script = [b"".join(f or b"" for f in words[0])] + [None] * 13 + [
        b"".join(f or b"" for f in words[1])] + [None] * 40
    unmoved, moved, state = both_ways(FakeOptions(), script, {}, move_from=6)
    assert state.model_unconsumed >= 2 * SAMPLES * 2, "it moved with frames queued, unstepped"
    assert moved == unmoved
    audio = spoken(moved)
    frames = [audio[i:i + SAMPLES * 2] for i in range(0, len(audio), SAMPLES * 2)]
    speech = [marked(m) for m in [*range(1, 5), *range(30, 36)]]
    assert [f for f in frames if f in speech] == speech


def test_a_resumed_slot_refuses_a_record_it_did_not_write() -> None:
    backend = FakeBackend(max_slots=1)
    with pytest.raises(ValueError, match="not one of 1920-sample frames"):
        backend.resume_slot(0, NO_SLOT_CONFIG, [b"x"])
    with pytest.raises(ValueError, match="says 0 ticks"):
        backend.resume_slot(0, NO_SLOT_CONFIG, [bytes(8 + SAMPLES * 4)])


def test_an_echo_moved_as_a_word_begins_echoes_that_word_at_its_new_worker() -> None:
    """Without turn detection the session is at a safe point as a word's first frame is heard
    (what the slot said so far is the pause's echo): the slot moves holding that frame, and
    its new worker echoes it first."""
    script = talk(range(1, 4), 12) + talk(range(20, 24), 12)
    off = msg.UpdateSession(session={"audio": {"input": {"turn_detection": None}}})
    unmoved, moved, state = both_ways(FakeOptions(), script, {0: off}, move_from=15)
    assert tick_of(state) == 15, "it moved with the second word's first frame heard, unechoed"
    assert moved == unmoved
    audio = spoken(moved)
    frames = [audio[i:i + SAMPLES * 2] for i in range(0, len(audio), SAMPLES * 2)]
    speech = [marked(m) for m in [*range(1, 4), *range(20, 24)]]
    assert [f for f in frames if f in speech] == speech
