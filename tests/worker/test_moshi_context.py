"""A Moshi slot moved through its step records (``inference_worker/backends/moshi_context.py``;
docs/design/hand-over.md, "Moshi's context"): moved == unmoved.

A session runs on one backend for a while, its records are taken as a checkpoint carries them
(the newest ``resume_steps``, as bytes), and another backend loaded from the same directory
rebuilds a slot from them and runs the rest of the session: it says what the unmoved session
says, token for token (greedy, and sampled with the session's seed), its audio within the
tiny model's float32 bound, after a stop as well. Each continuation checked here fails with
the rebuild broken (the encoder's, the temporal ring's, the generator's or the decoder's
replay left out), which the "a part left out" test holds.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from inference_worker.audio_frames import FrameOutput, pcm16_to_float
from inference_worker.backend import NO_SLOT_CONFIG, SlotConfig, SlotResult
from inference_worker.backends.moshi import MoshiBackend
from inference_worker.backends.moshi_cache import SlotRingCache
from inference_worker.backends.moshi_context import (
    RecordShape,
    StepRecord,
    decode_record,
    encode_record,
)
from inference_worker.engine import Engine, SlotHandle, SlotResume
from inference_worker.slot_context import SlotContext
from tests.worker.moshi_fixtures import (
    Session,
    load,
    run_alone,
    same_audio,
    seeded_one_thread,
    write_tiny,
)

pytestmark = pytest.mark.timeout(120)

FRAMES = 24
MOVE_AT = 10


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("tiny_moshi_context"))


@pytest.fixture(autouse=True)
def _seeded() -> Iterator[None]:
    with seeded_one_thread():
        yield


def as_pcm16(session: Session) -> Session:
    """The session's input as a client's PCM16 gives it (what the records keep as PCM16)."""
    session.inputs = [np.round(frame * 32767).astype(np.float32) / np.float32(32768.0)
                      for frame in session.inputs]
    return session


def moved(tiny_dir: Path, session: Session, *, sampled: bool = False, slot: int = 1,
          stop_after: int | None = None, **options: object) -> tuple[Session, MoshiBackend]:
    """``session`` run for MOVE_AT frames on one backend, then rebuilt in ``slot`` of another
    from its records and run to its end; the response stopped after frame ``stop_after``."""
    first = load(tiny_dir, max_slots=2, sampled=sampled, **options)
    records: list[bytes] = []
    first.open_slot(0, seed=session.sample_seed)
    for frame in range(MOVE_AT):
        (result,) = first.step([session.next_step(0)])
        session.record(first, result)
        records.append(result.context)
        if frame == stop_after:
            first.stop_response(0)
    kept = records[-first.spec.context_steps:]
    second = load(tiny_dir, max_slots=2, sampled=sampled, **options)
    second.resume_slot(slot, NO_SLOT_CONFIG, kept)
    while not session.done:
        (result,) = second.step([session.next_step(slot)])
        session.record(second, result)
    return session, second


def unmoved(tiny_dir: Path, session: Session, *, sampled: bool = False,
            stop_after: int | None = None) -> Session:
    backend = load(tiny_dir, max_slots=2, sampled=sampled)
    backend.open_slot(0, seed=session.sample_seed)
    while not session.done:
        (result,) = backend.step([session.next_step(0)])
        session.record(backend, result)
        if len(session.results) - 1 == stop_after:
            backend.stop_response(0)
    return session


def assert_same(a: Session, b: Session) -> None:
    assert a.tokens == b.tokens
    assert [r.text for r in a.results] == [r.text for r in b.results]
    assert all(same_audio(x.pcm, y.pcm) for x, y in zip(a.results, b.results, strict=True))


@pytest.mark.parametrize("sampled", [False, True])
def test_a_moved_slot_says_what_the_unmoved_one_says(tiny_dir: Path, sampled: bool) -> None:
    """Greedy, and sampled from the session's seed (the generator drawn as often): after the
    move, the same tokens, text and audio as the session that never moved; the records of
    PCM16 input keep it as PCM16 (half a float frame)."""
    reference = unmoved(tiny_dir, as_pcm16(Session(3, FRAMES, sample_seed=7)), sampled=sampled)
    session, _ = moved(tiny_dir, as_pcm16(Session(3, FRAMES, sample_seed=7)), sampled=sampled)
    assert any(t is not None for t in reference.tokens[MOVE_AT:]), "it says nothing after"
    assert_same(session, reference)
    assert len(session.results[0].context) < 1920 * 4


def test_float_input_and_a_stop_before_the_move(tiny_dir: Path) -> None:
    """Input that is not PCM16 is kept as float32; a response stopped two frames before the
    move has its delayed frames muted across it and its text context cleared, as unmoved."""
    reference = unmoved(tiny_dir, Session(4, FRAMES, sample_seed=2), stop_after=MOVE_AT - 2)
    session, _ = moved(tiny_dir, Session(4, FRAMES, sample_seed=2), stop_after=MOVE_AT - 2)
    assert_same(session, reference)
    assert len(session.results[0].context) > 1920 * 4


def test_a_part_left_out_of_the_rebuild_shows(tiny_dir: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The rebuild without the encoder's replay (the user's codes then start cold) gives other
    tokens: the comparison above can fail."""
    reference = unmoved(tiny_dir, as_pcm16(Session(3, FRAMES, sample_seed=7)))
    original = MoshiBackend.resume_slot

    def without_encoder(self: MoshiBackend, slot: int, config: SlotConfig,
                        context: Sequence[bytes]) -> None:
        self.mimi._encode_latents = lambda *args: None  # type: ignore[method-assign,assignment]
        try:
            original(self, slot, config, context)
        finally:
            del self.mimi._encode_latents

    monkeypatch.setattr(MoshiBackend, "resume_slot", without_encoder)
    session, _ = moved(tiny_dir, as_pcm16(Session(3, FRAMES, sample_seed=7)))
    assert session.tokens != reference.tokens


def test_records_past_resume_steps_rebuild_from_the_newest(tiny_dir: Path) -> None:
    """With ``resume_steps`` 4 the checkpoint carries the newest four: the rebuilt slot goes on
    at the right position (the frames keep coming, its delay ring and counters as the last
    record says) with its older context lost, so moved no longer equals unmoved."""
    session, backend = moved(tiny_dir, as_pcm16(Session(3, FRAMES, sample_seed=7)),
                             resume_steps=4)
    assert backend.spec.context_steps == 4
    assert int(backend._offsets[1]) == FRAMES
    assert all(r.pcm.size == 1920 for r in session.results[MOVE_AT:])


def test_records_are_checked(tiny_dir: Path) -> None:
    """A record of another shape, version or slot, records not of consecutive steps, and no
    records at all (a fresh open)."""
    backend = load(tiny_dir, max_slots=2)
    backend.open_slot(0, seed=1)
    steps: list[SlotResult] = []
    for _ in range(3):
        (result,) = backend.step([Session(1, 1).next_step(0)])
        steps.append(result)
    shape = RecordShape(codebooks=8, ring_size=3, samples=1920)
    record = decode_record(steps[-1].context, shape)
    assert isinstance(record, StepRecord)
    assert record.offset == 3 and record.seed == 1 and record.frame is not None
    assert encode_record(record) == steps[-1].context
    for bad, why in [(steps[0].context[:-2], "not one of a slot"),
                     (b"\x02" + steps[0].context[1:], "version 2"), (b"\x01", "shorter")]:
        with pytest.raises(ValueError, match=why):
            backend.resume_slot(1, NO_SLOT_CONFIG, [bad])
    with pytest.raises(ValueError, match="consecutive steps"):
        backend.resume_slot(1, NO_SLOT_CONFIG, [steps[0].context, steps[2].context])
    with pytest.raises(ValueError, match="not one of a slot"):
        decode_record(steps[0].context, RecordShape(codebooks=4, ring_size=3, samples=1920))
    with pytest.raises(ValueError, match="not one of a slot"):
        backend.compact_record(steps[0].context[:-2])  # checked, though its audio is not read
    backend.resume_slot(1, NO_SLOT_CONFIG, [])
    assert int(backend._offsets[1]) == 0


def test_no_records_without_resume_steps(tiny_dir: Path) -> None:
    """``resume_steps`` 0: no records (its sessions take no checkpoints and do not move)."""
    backend = load(tiny_dir, max_slots=1, resume_steps=0)
    result = run_alone(backend, Session(1, 3)).results[-1]
    assert backend.spec.context_steps == 0 and result.context == b""


def engine_frames(engine: Engine, handle: SlotHandle, inputs: list[bytes],
                  stop_at: int | None = None) -> list[FrameOutput]:
    """Each of ``inputs`` pushed and stepped by a tick of ``engine``: the slot's frames; its
    response stopped before input ``stop_at``."""
    frames = []
    for index, pcm16 in enumerate(inputs):
        if index == stop_at:
            engine.stop_response(handle)
        engine.push_audio(handle, pcm16)
        report = engine.tick_once()
        assert report is not None and not report.failed
        frames.append(report.outputs[handle.serial])
    return frames


def test_an_engine_slot_resumed_from_a_checkpoints_records_goes_on_unmoved(
        tiny_dir: Path) -> None:
    """Through the engines as the worker drives them (pcm16 pushed, a tick per frame, a stop
    as the core asks for one): a slot opened on another engine, beside another session, with
    the moved slot's records, epoch and input place gives the frames the unmoved slot gives:
    the same text and records (so tokens), at the same input places, the audio within the
    float32 bound."""
    inputs = [np.round(frame * 32767).astype("<i2").tobytes()
              for frame in Session(6, FRAMES).inputs]
    unmoved_engine = Engine(load(tiny_dir, max_slots=2, sampled=True))
    handle = unmoved_engine.open("sess_unmoved")
    assert handle is not None
    unmoved = engine_frames(unmoved_engine, handle, inputs, stop_at=4)

    first = Engine(load(tiny_dir, max_slots=2, sampled=True))
    moving = first.open("sess_moved")
    assert moving is not None
    before = engine_frames(first, moving, inputs[:MOVE_AT], stop_at=4)
    second = Engine(load(tiny_dir, max_slots=2, sampled=True))
    second.open("sess_other")  # the moved session lands in another slot
    resumed = second.open("sess_moved", resume=SlotResume(
        context=tuple(frame.context for frame in before), epoch=before[-1].epoch,
        input_frames=MOVE_AT))
    assert resumed is not None and resumed.slot == 1
    after = engine_frames(second, resumed, inputs[MOVE_AT:])
    assert [(f.text, f.epoch, f.context) for f in before + after] == [
        (f.text, f.epoch, f.context) for f in unmoved]
    # another slot beside it changes the batch's shape, so float32 rounding: within 3 LSB
    assert all(same_audio(pcm16_to_float(a.audio), pcm16_to_float(b.audio))
               for a, b in zip(before + after, unmoved, strict=True))
    assert [f.input_ms for f in after] == [f.input_ms for f in unmoved[MOVE_AT:]]


def test_a_prefill_goes_only_into_an_empty_ring() -> None:
    """A ring cache takes more positions than its chunk in one tick only into rows that hold
    nothing and only as many as it has room for, so no key a query of the tick needs is
    overwritten within it."""
    cache = SlotRingCache(num_layers=1, max_slots=2, num_kv_heads=1, head_dim=2, window=4,
                          chunk=1, device=torch.device("cpu"), dtype=torch.float32)
    positions, mask = cache.begin(slice(0, 1), 4)
    assert positions.tolist() == [[0, 1, 2, 3]]
    assert mask[0, 0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0],
                                         [1, 1, 1, 1]]
    cache.commit(torch.ones(1, dtype=torch.bool))
    assert int(cache.offsets[0]) == 4
    with pytest.raises(ValueError, match="into empty rows"):
        cache.begin(slice(0, 1), 2)  # the row holds keys now
    with pytest.raises(ValueError, match="into empty rows"):
        cache.begin(slice(1, 2), 5)  # more than the ring holds
    positions, _ = cache.begin(slice(0, 1), 1)
    assert positions.tolist() == [[4]]


def test_older_records_keep_their_tokens_and_rebuild_the_temporal_context(
        tiny_dir: Path) -> None:
    """With ``codec_steps`` 4, a session's slot context keeps its newest four records whole and
    the older ones compact (40 bytes: the position and the tokens read); rebuilt from them,
    the moved slot's temporal context is the unmoved one's, every position of it, and its
    delay ring and place are the last record's (Mimi's caches start at the whole records, so
    its next words may differ)."""
    first = load(tiny_dir, max_slots=2, codec_steps=4)
    engine = Engine(first)
    handle = engine.open("sess_long")
    assert handle is not None
    kept = SlotContext(engine, handle)
    inputs = [np.round(frame * 32767).astype("<i2").tobytes()
              for frame in Session(8, MOVE_AT).inputs]
    for frame in engine_frames(engine, handle, inputs):
        kept.consumed(frame)
    records = kept.records
    assert [len(r) for r in records[:MOVE_AT - 4]] == [40] * (MOVE_AT - 4)
    assert all(len(r) > 4000 for r in records[MOVE_AT - 4:])
    assert first.compact_record(records[0]) == records[0]  # compact once and for all

    second = load(tiny_dir, max_slots=2, codec_steps=4)
    second.resume_slot(1, NO_SLOT_CONFIG, records)
    assert int(second._offsets[1]) == int(first._offsets[0]) == MOVE_AT
    assert torch.equal(second._ring[1], first._ring[0])
    assert int(second._kv.offsets[1]) == MOVE_AT
    for moved, unmoved in zip(second._kv._rings, first._kv._rings, strict=True):
        assert torch.allclose(moved.ring_keys[1, :, :MOVE_AT],
                              unmoved.ring_keys[0, :, :MOVE_AT], atol=1e-5)
        assert torch.allclose(moved.ring_values[1, :, :MOVE_AT],
                              unmoved.ring_values[0, :, :MOVE_AT], atol=1e-5)
    with pytest.raises(ValueError, match="compact ones first"):
        second.resume_slot(0, NO_SLOT_CONFIG, [records[-1], records[0]])
    with pytest.raises(ValueError, match="the newest whole"):
        second.resume_slot(0, NO_SLOT_CONFIG, records[:3])
