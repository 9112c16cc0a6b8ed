"""The Moshi backend on tiny random Moshi + Mimi configs (CPU, float32, no downloads).

Tolerances follow models.md §7.3: streamed Mimi and stepped temporal logits to 1e-4 absolute;
depth-transformer logits relative 1e-4 (random-init ``MoshiFlexibleLinear`` weights are plain
``randn``, so its logits reach ~1e3 and float32 summation order alone moves them by ~1e-3).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from inference_worker.backend import Backend, FrameSpec, SlotStep
from inference_worker.backends.mimi_stream import MimiStreamer
from inference_worker.backends.moshi import (
    MoshiBackend,
    SlotTokens,
    StepTrace,
    build_full_size_on,
    require_supported_transformers,
)
from inference_worker.backends.moshi_tiny import write_tiny_moshi
from tests.worker.moshi_fixtures import (
    FRAME,
    Session,
    audio,
    load,
    run_alone,
    same_audio,
    seeded_one_thread,
    write_tiny,
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny model directory for the module."""
    return write_tiny(tmp_path_factory.mktemp("tiny_moshi"))


@pytest.fixture(autouse=True)
def _seeded() -> Iterator[None]:
    with seeded_one_thread():
        yield


# ------------------------------------------------------------------------------- loading


def test_loads_a_save_pretrained_dir(tiny_dir: Path) -> None:
    """``MoshiBackend.load`` reads back exactly the weights ``save_pretrained`` wrote."""
    backend = load(tiny_dir, max_slots=3)
    written = write_tiny_moshi(tiny_dir.parent / "again", seed=0, tokenizer=False)
    loaded = backend.model.state_dict()
    for name, tensor in written.state_dict().items():
        assert torch.equal(loaded[name], tensor), name
    assert isinstance(backend, Backend)
    assert backend.spec == FrameSpec(
        in_rate=24000, in_samples=FRAME, out_rate=24000, out_samples=FRAME, max_slots=3,
        context_steps=3000, whole_context_steps=125,
    )
    assert backend.tokenizer is not None
    assert backend.model.config._attn_implementation == "sdpa"


def test_load_rejects_a_missing_dir_and_unknown_dtype(tmp_path: Path, tiny_dir: Path) -> None:
    """A directory without config.json and an unknown dtype fail with a clear error."""
    with pytest.raises(FileNotFoundError):
        MoshiBackend.load(tmp_path)
    with pytest.raises(ValueError, match="unknown dtype"):
        MoshiBackend.load(tiny_dir, dtype="float8")


def test_older_transformers_is_refused_with_the_fix() -> None:
    """Releases before 5.24 fail deep in the first step, so they are refused by name first."""
    with pytest.raises(RuntimeError, match=r"needs transformers >= 5\.24\.0, found 5\.17\.0"):
        require_supported_transformers("5.17.0")
    require_supported_transformers("5.24.0")
    require_supported_transformers("5.25.0.dev0")
    require_supported_transformers()  # the installed one


def test_device_and_dtype_arguments(tiny_dir: Path) -> None:
    """``device`` and ``dtype`` are honoured: a bfloat16 LM with a float32 Mimi still steps."""
    backend = load(tiny_dir, max_slots=2, device=torch.device("cpu"), dtype="bfloat16")
    assert next(backend.model.decoder.parameters()).dtype == torch.bfloat16
    assert next(backend.model.depth_decoder.parameters()).dtype == torch.bfloat16
    assert next(backend.model.audio_encoder.parameters()).dtype == torch.float32
    backend.open_slot(1)
    results = [backend.step([SlotStep(slot=1, pcm=frame)])[0] for frame in audio(1, 3)]
    assert [r.pcm.size for r in results] == [0, FRAME, FRAME]
    assert all(r.pcm.dtype == np.float32 and np.isfinite(r.pcm).all() for r in results[1:])


def test_full_size_config_builds_on_the_meta_device() -> None:
    """``build_full_size_on`` builds the 7.8B default config (checked on "meta": no memory)."""
    backend = build_full_size_on("meta", "bfloat16", max_slots=2)
    params = sum(p.numel() for p in backend.model.parameters())
    assert 7.7e9 < params < 7.8e9
    assert next(backend.model.decoder.parameters()).dtype == torch.bfloat16
    assert backend.spec.in_samples == FRAME and backend.spec.max_slots == 2
    # 32 layers x 2 x 4096 x 2 bytes per frame x 3000 frames: ~1.46 GiB, plus Mimi's state.
    assert 1.4 * 2**30 < backend.slot_state_bytes < 1.6 * 2**30


# ------------------------------------------------------------------------------- Mimi


def test_streaming_encode_equals_offline_encode(tiny_dir: Path) -> None:
    """Per-slot streaming encode equals an offline encode, with late joins and a pause."""
    mimi = load(tiny_dir, max_slots=1).model.audio_encoder
    frames = 6
    waves = [np.concatenate(audio(seed, frames)) for seed in (1, 2, 3)]
    streamer = MimiStreamer(mimi, max_slots=3, num_codebooks=8)
    start = {0: 0, 1: 2, 2: 0}  # slot 1 joins at tick 2
    pause = {2: {2, 3}}  # slot 2 sits out ticks 2 and 3
    done = dict.fromkeys(start, 0)
    latents: dict[int, list[torch.Tensor]] = {s: [] for s in start}
    codes: dict[int, list[torch.Tensor]] = {s: [] for s in start}
    for tick in range(frames + 2):
        run = [s for s in start
               if start[s] <= tick and tick not in pause.get(s, ()) and done[s] < frames]
        batch = torch.zeros(3, 1, FRAME)
        for s in run:
            batch[s, 0] = torch.from_numpy(waves[s][done[s] * FRAME : (done[s] + 1) * FRAME])
        exec_mask = torch.tensor([s in run for s in range(3)])
        lat = streamer.encode_latents(slice(0, 3), exec_mask, batch)
        code = mimi.quantizer.encode(lat, 8)[..., 0].transpose(0, 1)
        for s in run:
            latents[s].append(lat[s])
            codes[s].append(code[s])
            done[s] += 1
    with torch.no_grad():
        for s, wave in enumerate(waves):
            x = torch.from_numpy(wave)[None, None]
            offline_latents = mimi.encoder(x).latents[0]
            offline_codes = mimi.encode(x, num_quantizers=8).audio_codes[0]
            assert torch.allclose(torch.cat(latents[s], -1), offline_latents, atol=1e-4, rtol=0)
            assert torch.equal(torch.stack(codes[s], -1), offline_codes)


def test_streaming_decode_equals_offline_decode(tiny_dir: Path) -> None:
    """Streaming decode equals an offline decode; HF's own per-frame decode does not."""
    mimi = load(tiny_dir, max_slots=1).model.audio_encoder
    frames = 6
    codes = torch.randint(0, 64, (2, 8, frames))
    streamer = MimiStreamer(mimi, max_slots=2, num_codebooks=8)
    both = torch.ones(2, dtype=torch.bool)
    streamed = torch.cat(
        [streamer.decode(slice(0, 2), both, codes[..., t]) for t in range(frames)], -1
    )
    with torch.no_grad():
        offline = mimi.decode(codes).audio_values[:, 0]
        cache = DynamicCache(config=mimi.decoder.config)
        naive = []
        for t in range(frames):
            out = mimi.decode(codes[..., t : t + 1], decoder_cache=cache)
            naive.append(out.audio_values[:, 0])
    assert torch.allclose(streamed, offline, atol=1e-4, rtol=0)
    # If this starts failing, HF now streams Mimi's decoder: MimiStreamer may be retired.
    assert (torch.cat(naive, -1) - offline).abs().max() > 1e-2


def test_mimi_slot_reset_forgets_the_previous_session(tiny_dir: Path) -> None:
    """A slot reused after ``reset`` decodes as if fresh."""
    mimi = load(tiny_dir, max_slots=1).model.audio_encoder
    codes = torch.randint(0, 64, (1, 8, 3))
    one = torch.ones(1, dtype=torch.bool)
    streamer = MimiStreamer(mimi, max_slots=1, num_codebooks=8)
    first = [streamer.decode(slice(0, 1), one, codes[..., t]) for t in range(3)]
    streamer.decode(slice(0, 1), one, torch.randint(0, 64, (1, 8)))
    streamer.reset(0)
    again = [streamer.decode(slice(0, 1), one, codes[..., t]) for t in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


# ------------------------------------------------------------------------------- Moshi LM


def _traced_run(backend: MoshiBackend, ticks: int, slot: int) -> list[StepTrace]:
    """Step slot 0 and ``slot`` together for ``ticks``; the traces of each tick."""
    backend.trace = True
    sessions = {0: audio(7, ticks), slot: audio(1, ticks)}
    for s in sessions:
        backend.open_slot(s)
    traces = []
    for t in range(ticks):
        backend.step([SlotStep(slot=s, pcm=frames[t]) for s, frames in sessions.items()])
        assert backend.last_trace is not None
        traces.append(backend.last_trace)
    return traces


@pytest.mark.parametrize("context", [None, 3])
def test_stepped_logits_equal_a_full_forward(tiny_dir: Path, context: int | None) -> None:
    """Stepped temporal + depth logits equal Moshi's teacher-forced full forward."""
    # With context=3 the ring wraps, and the reference uses a sliding-window mask.
    ticks, slot = 7, 1
    backend = load(tiny_dir, max_slots=2, context=context)
    traces = _traced_run(backend, ticks, slot)
    row = [slot - tr.rows.start for tr in traces]
    lm_input = torch.stack([tr.lm_input[r] for tr, r in zip(traces, row, strict=True)])
    k = backend.num_codebooks
    mask = None
    if context is not None:
        i = torch.arange(ticks)
        mask = ((i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < context))[None, None]
    model = backend.model
    with torch.no_grad():
        full = model(
            input_ids=lm_input[None, :, 0],
            moshi_audio_codes=lm_input[None, :, 1 : 1 + k].transpose(1, 2),
            user_audio_codes=lm_input[None, :, 1 + k :].transpose(1, 2),
            attention_mask=mask,
        )
        stepped = torch.stack([tr.text_logits[r] for tr, r in zip(traces, row, strict=True)])
        assert torch.allclose(stepped, full.logits[0], atol=1e-4, rtol=0)
        for t, (tr, r) in enumerate(zip(traces, row, strict=True)):
            forced = torch.cat([tr.text[r : r + 1], tr.audio[r, :-1]])[None]
            hidden = full.last_hidden_state[:, t : t + 1]
            reference = model.depth_decoder(input_ids=forced, last_hidden_state=hidden).logits[0]
            scale = reference.abs().max()
            assert (tr.depth_logits[r] - reference).abs().max() <= 1e-4 * scale
            assert torch.equal(reference.argmax(-1), tr.audio[r])


@pytest.mark.parametrize("delay", [1, 2])
def test_acoustic_delay(tiny_dir: Path, delay: int) -> None:
    """Codebooks 1.. lag by ``delay`` frames: inputs, warm-up and output frames line up."""
    # Kyutai LMGen's token ring: the step at offset s reads what was sampled at s - 1 (initial
    # tokens while s <= delay), the user's codebook j >= 1 of frame s - delay, and a frame is
    # emitted once its last codebook exists.
    ticks, k = 6, 8
    backend = load(tiny_dir, max_slots=1, acoustic_delay=delay)
    backend.trace = True
    backend.open_slot(0)
    traces, results, tokens = [], [], []
    for frame in audio(3, ticks):
        results.append(backend.step([SlotStep(slot=0, pcm=frame)])[0])
        assert backend.last_trace is not None
        traces.append(backend.last_trace)
        tokens.append(backend.last_tokens[0])
    text_init, audio_init = backend.config.vocab_size, backend.config.audio_vocab_size
    assert [r.pcm.size for r in results] == [0] * delay + [FRAME] * (ticks - delay)
    for s, trace in enumerate(traces):
        fed = trace.lm_input[0].tolist()
        for j in range(k):
            lag = 0 if j == 0 else delay
            # Moshi's own codebook j: what the previous step sampled, once past its delay.
            expected_own = audio_init if s <= lag else int(traces[s - 1].audio[0, j])
            expected_user = audio_init if s <= lag else int(traces[s - lag].user_codes[0, j])
            assert fed[1 + j] == expected_own
            assert fed[1 + k + j] == expected_user
        assert fed[0] == (text_init if s == 0 else int(traces[s - 1].text[0]))
    for s in range(delay, ticks):
        # Text and codebook 0 were sampled `delay` steps ago, codebooks 1.. at this step.
        first = traces[s - delay]
        expected = [int(first.text[0]), int(first.audio[0, 0])]
        expected += [int(traces[s].audio[0, j]) for j in range(1, k)]
        assert tokens[s] == SlotTokens(expected[0], tuple(expected[1:]))


# ------------------------------------------------------------------------------- batching


# session name -> (seed, frames, slot, first tick, ticks it sits out)
PLAN: dict[str, tuple[int, int, int, int, frozenset[int]]] = {
    "solo": (1, 10, 5, 2, frozenset({6, 7})),  # the session under test: late, then paused
    "a": (2, 5, 0, 0, frozenset()),  # leaves at tick 5 ...
    "a2": (3, 6, 0, 7, frozenset()),  # ... and slot 0 is reused
    "b": (4, 8, 3, 1, frozenset({4})),
    "c": (5, 7, 7, 3, frozenset()),
    "d": (6, 12, 1, 0, frozenset()),
    "e": (8, 10, 2, 0, frozenset({5, 6})),
    "f": (9, 9, 4, 2, frozenset()),
    "g": (10, 9, 6, 1, frozenset()),
}


def _run_plan(backend: MoshiBackend) -> tuple[dict[str, Session], int]:
    """Drive every PLAN session through one 8-slot backend; also the most slots in a tick."""
    sessions = {name: Session(seed, frames, sample_seed=100 + seed)
                for name, (seed, frames, *_) in PLAN.items()}
    live: dict[int, str] = {}
    tick = widest = 0
    while not all(s.done for s in sessions.values()):
        for name, (_, _, slot, first, _) in PLAN.items():
            if tick == first:
                assert slot not in live, "plan error: slot still in use"
                backend.open_slot(slot, seed=sessions[name].sample_seed)
                live[slot] = name
        listed = [(slot, name) for slot, name in live.items() if tick not in PLAN[name][4]]
        widest = max(widest, len(listed))
        results = backend.step([sessions[name].next_step(slot) for slot, name in listed])
        for (slot, name), result in zip(listed, results, strict=True):
            assert result.slot == slot
            sessions[name].record(backend, result)
            if sessions[name].done:
                backend.close_slot(slot)
                del live[slot]
        tick += 1
    return sessions, widest


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_batch_invariance(tiny_dir: Path, sampled: bool) -> None:
    """Each session's tokens, text and audio are the same alone and in a batch of 8."""
    # Sessions join late, pause, leave, and a slot is reused; sampling uses per-slot generators.
    batched, widest = _run_plan(load(tiny_dir, max_slots=8, sampled=sampled))
    assert widest == 8
    alone_backend = load(tiny_dir, max_slots=1, sampled=sampled)
    for name, got in batched.items():
        seed, frames, *_ = PLAN[name]
        alone = run_alone(alone_backend, Session(seed, frames, sample_seed=100 + seed))
        assert got.tokens == alone.tokens, name
        assert [r.text for r in got.results] == [r.text for r in alone.results], name
        for mine, theirs in zip(got.results, alone.results, strict=True):
            assert same_audio(mine.pcm, theirs.pcm), name
    assert sum(t is not None for t in batched["solo"].tokens) == 9


def test_pause_does_not_advance_the_slot(tiny_dir: Path) -> None:
    """A slot left out of some ticks continues exactly as if it had never paused."""
    backend = load(tiny_dir, max_slots=2)
    frames = audio(2, 5)
    backend.open_slot(0)
    backend.open_slot(1)
    got: list[tuple[np.ndarray, SlotTokens | None]] = []
    for tick in range(8):
        steps = [SlotStep(slot=1, pcm=audio(9, 1)[0])]
        if tick not in (1, 2, 3):
            steps.insert(0, SlotStep(slot=0, pcm=frames[len(got)]))
        result = backend.step(steps)
        if len(result) == 2:
            got.append((result[0].pcm, backend.last_tokens[0]))
    alone = run_alone(load(tiny_dir, max_slots=1), Session(2, 5))
    assert [tokens for _, tokens in got] == alone.tokens
    assert all(same_audio(a, r.pcm) for (a, _), r in zip(got, alone.results, strict=True))


def test_nan_input_poisons_only_its_own_slot(tiny_dir: Path) -> None:
    """NaN and huge input in one slot leave the other slots' outputs bit-identical."""

    def run(poison: bool) -> tuple[list[list[np.ndarray]], MoshiBackend]:
        backend = load(tiny_dir, max_slots=3)
        inputs = [audio(seed, 6) for seed in (1, 2, 3)]
        if poison:
            inputs[1][2] = np.full(FRAME, np.nan, dtype=np.float32)
            inputs[1][3] = np.full(FRAME, 1e30, dtype=np.float32)
        for slot in range(3):
            backend.open_slot(slot)
        out: list[list[np.ndarray]] = [[], [], []]
        for t in range(6):
            results = backend.step([SlotStep(slot=s, pcm=inputs[s][t]) for s in range(3)])
            for result in results:
                out[result.slot].append(result.pcm)
        return out, backend

    clean, _ = run(poison=False)
    poisoned, backend = run(poison=True)
    for slot in (0, 2):
        assert all(np.array_equal(a, b) for a, b in zip(clean[slot], poisoned[slot], strict=True))
    # The poisoned slot's encoder state is NaN now: its user codes are garbage, so its replies
    # change (they stay finite: Moshi's own codes, not the input, are decoded).
    assert not all(np.array_equal(a, b) for a, b in zip(clean[1], poisoned[1], strict=True))
    # Reopening the poisoned slot gives a clean session again.
    backend.close_slot(1)
    fresh = run_alone(backend, Session(4, 4), slot=1)
    alone = run_alone(load(tiny_dir, max_slots=1), Session(4, 4))
    assert fresh.tokens == alone.tokens


# ------------------------------------------------------------------------------- stopping


def _run_pair(backend: MoshiBackend, ticks: int,
              stop_after: int | None = None) -> tuple[Session, Session]:
    """Two sessions in slots 0 and 1, stepped together; slot 0's response is stopped after
    step ``stop_after`` (0-based; -1: before the first step; None: never)."""
    sessions = (Session(5, ticks, sample_seed=1), Session(6, ticks, sample_seed=2))
    for slot, session in enumerate(sessions):
        backend.open_slot(slot, seed=session.sample_seed)
    if stop_after == -1:
        backend.stop_response(0)
    for tick in range(ticks):
        results = backend.step([s.next_step(slot) for slot, s in enumerate(sessions)])
        for session, result in zip(sessions, results, strict=True):
            session.record(backend, result)
        if tick == stop_after:
            backend.stop_response(0)
    return sessions


@pytest.mark.parametrize("delay", [1, 2])
def test_stop_drops_the_delayed_frames_and_nothing_else(tiny_dir: Path, delay: int) -> None:
    """After a stop, the ``delay`` frames already sampled come out silent with no text; then
    the model goes on as if unstopped (its context cannot be rewound); the other slot never
    notices."""
    ticks = 12
    reference = _run_pair(load(tiny_dir, max_slots=2, acoustic_delay=delay), ticks)
    spoken = [t for t in range(delay, ticks - delay - 1) if reference[0].results[t + 1].text]
    assert spoken, "the tiny model should say something mid-session"
    stop_after = spoken[0]
    mine, theirs = _run_pair(load(tiny_dir, max_slots=2, acoustic_delay=delay), ticks,
                             stop_after=stop_after)
    muted = range(stop_after + 1, stop_after + 1 + delay)
    for t in muted:
        assert mine.results[t].text == "" and mine.tokens[t] is None
        assert mine.results[t].pcm.shape == (FRAME,) and not mine.results[t].pcm.any()
    assert reference[0].results[muted[0]].text != ""  # what the stop dropped
    assert mine.tokens[: muted[0]] == reference[0].tokens[: muted[0]]
    assert mine.tokens[muted[-1] + 1 :] == reference[0].tokens[muted[-1] + 1 :]
    assert theirs.tokens == reference[1].tokens
    assert [r.text for r in theirs.results] == [r.text for r in reference[1].results]
    assert all(same_audio(a.pcm, b.pcm)
               for a, b in zip(theirs.results, reference[1].results, strict=True))


def test_stop_before_speaking_drops_nothing(tiny_dir: Path) -> None:
    """A stop before the slot's first step has no sampled frame to drop: its session runs as
    an unstopped one; a stop for a closed slot is refused."""
    reference = _run_pair(load(tiny_dir, max_slots=2), 4)
    backend = load(tiny_dir, max_slots=2)
    mine, _ = _run_pair(backend, 4, stop_after=-1)
    assert mine.tokens == reference[0].tokens
    assert [r.pcm.size for r in mine.results] == [0, FRAME, FRAME, FRAME]
    backend.close_slot(0)
    with pytest.raises(ValueError, match="not open"):
        backend.stop_response(0)


# ------------------------------------------------------------------------------- text and API


def test_text_deltas_from_the_tokenizer(tiny_dir: Path) -> None:
    """Text deltas concatenate to the tokenizer's decode of the non-padding tokens."""
    backend = load(tiny_dir, max_slots=1)
    session = run_alone(backend, Session(5, 12))
    ids = [t.text for t in session.tokens if t is not None]
    words = [i for i in ids if i not in (0, 3)]
    assert words, "the tiny model should say something"
    assert backend.tokenizer is not None
    expected = backend.tokenizer.decode(words, skip_special_tokens=True)
    assert "".join(r.text for r in session.results) == expected
    assert all(r.text == "" for r, t in zip(session.results, session.tokens, strict=True)
               if t is None or t.text in (0, 3))


def test_text_placeholders_without_a_tokenizer(tmp_path: Path) -> None:
    """Without a tokenizer a token renders as "<id>", and padding as ""."""
    write_tiny_moshi(tmp_path, seed=0, tokenizer=False)
    backend = load(tmp_path, max_slots=1)
    assert backend.tokenizer is None
    session = run_alone(backend, Session(5, 6))
    for result, tokens in zip(session.results, session.tokens, strict=True):
        if tokens is None or tokens.text in (0, 3):
            assert result.text == ""
        else:
            assert result.text == f"<{tokens.text}>"


def test_step_rejects_bad_input(tiny_dir: Path) -> None:
    """Closed, duplicate and out-of-range slots, and wrong frame sizes, are refused."""
    backend = load(tiny_dir, max_slots=2)
    frame = audio(1, 1)[0]
    with pytest.raises(ValueError, match="open"):
        backend.step([SlotStep(slot=0, pcm=frame)])
    backend.open_slot(0)
    with pytest.raises(ValueError, match="open"):
        backend.step([SlotStep(slot=0, pcm=frame), SlotStep(slot=0, pcm=frame)])
    with pytest.raises(ValueError, match="samples"):
        backend.step([SlotStep(slot=0, pcm=frame[:100])])
    with pytest.raises(ValueError, match="range"):
        backend.open_slot(2)
    assert backend.step([]) == []
