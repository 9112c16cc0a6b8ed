"""The Moshi backend: HF ``MoshiForConditionalGeneration`` (+ its Mimi codec) stepped per 80 ms.

One :meth:`MoshiBackend.step` runs, batched over the listed slots (models.md §3, §4.2):

1. streaming Mimi encode of the user's frame -> 8 user codes (:class:`MimiStreamer`);
2. the temporal transformer, one position per slot, on a per-slot ring KV cache
   (:class:`SlotRingCache`), fed the previous text token, Moshi's own audio codes and the user's
   codes, each codebook at its acoustic delay -> text logits and a hidden state;
3. the depth transformer, 8 small steps -> Moshi's 8 audio codes for this position;
4. Kyutai ``LMGen``'s token ring undoes the delays: a slot's first ``max_delay`` ticks give no
   frame (empty pcm), then one frame per tick;
5. streaming Mimi decode of that frame -> 1920 samples, and its text token -> a transcript delta.

Each step returns a record of what it added to the slot's context (the input, the tokens the
temporal step read, the frame decoded: :mod:`.moshi_context`), from which
:meth:`MoshiBackend.resume_slot` rebuilds the slot on another worker.

A stopped response (:meth:`MoshiBackend.stop_response`) loses the frames the delay still held
for it and its half-decoded text; the model's own context goes on (it cannot be rewound).

Slots are rows of preallocated state. A tick computes the contiguous row range spanning the listed
slots; unlisted rows inside it run on dummy input and commit nothing (Kyutai's exec mask), so a
paused slot resumes bit-for-bit where it stopped, and no row reads another's state. Sampling
draws from one ``torch.Generator`` per slot, so a session's tokens do not depend on its batch.
The step's cost is that of the row range, so a worker should fill the lowest free slot first.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from transformers import (
    AutoTokenizer,
    DynamicCache,
    MimiConfig,
    MoshiConfig,
    MoshiForConditionalGeneration,
    PreTrainedTokenizerBase,
)

from inference_worker.backend import (
    NO_SLOT_CONFIG,
    Audio,
    FrameSpec,
    SlotConfig,
    SlotResult,
    SlotStep,
)
from inference_worker.backends.mimi_stream import MimiStreamer
from inference_worker.backends.moshi_cache import SlotRingCache
from inference_worker.backends.moshi_context import (
    RecordShape,
    StepRecord,
    TokenRecord,
    compact_record,
    decode_record,
    encode_record,
)
from inference_worker.backends.moshi_graphs import compile_transformers, require_cuda
from inference_worker.backends.moshi_loading import (
    parse_dtype,
    place,
    require_supported_transformers,
)
from inference_worker.backends.moshi_sampling import SamplingParams, candidates, sample
from inference_worker.backends.moshi_text import TextStream
from inference_worker.backends.moshi_ticks import SlotTokens, StepFrames, StepTrace

__all__ = [
    "MoshiBackend",
    "SamplingParams",
    "SlotTokens",
    "StepTrace",
    "build_full_size_on",
    "parse_dtype",
    "require_supported_transformers",
]

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_EMPTY: Audio = np.zeros(0, dtype=np.float32)
_EMPTY.flags.writeable = False  # shared by every warm-up result


class MoshiBackend:
    """Moshi on HF transformers, many sessions in lockstep (implements ``Backend``).

    Not thread-safe: call ``open_slot``, ``close_slot`` and ``step`` from one (model) thread.

    Args:
        model: an eval-mode ``MoshiForConditionalGeneration`` on its final device and dtype.
        max_slots: sessions served at once; state for all of them is allocated here.
        tokenizer: decodes text tokens; ``None`` renders them as ``"<id>"``.
        sampling: token sampling (default: Kyutai's temperatures and top-k).
        seed: seeds the per-session generators of sessions opened without a seed.
        context: temporal attention window in frames (default: ``config.sliding_window``).
        acoustic_delay: frames by which codebooks 1.. lag codebook 0 (Moshi: 1).
        text_pad_ids: text tokens that produce no transcript (Kyutai: 0 and 3).
        cuda_graphs: replay the temporal and depth transformers as CUDA graphs
            (:meth:`compile_graphs`); needs the model on a CUDA device.
        resume_steps: the newest step records a checkpoint carries (``FrameSpec.context_steps``;
            None: the temporal context's window; 0: none, its sessions do not move): the
            temporal context a moved slot is rebuilt with.
        codec_steps: of those, how many keep the step's input audio and decoded frame
            (``FrameSpec.whole_context_steps``), from which Mimi's caches are rebuilt; the
            older ones keep only their tokens. A moved slot is rebuilt exactly while its
            session is at most this many frames old. The default is Mimi's encoder window
            (10 s): each whole record holds a frame of input audio, and a session's checkpoint
            lives in Redis.
    """

    def __init__(
        self,
        model: MoshiForConditionalGeneration,
        *,
        max_slots: int,
        tokenizer: PreTrainedTokenizerBase | None = None,
        sampling: SamplingParams | None = None,
        seed: int = 0,
        context: int | None = None,
        acoustic_delay: int = 1,
        text_pad_ids: Iterable[int] = (0, 3),
        cuda_graphs: bool = False,
        resume_steps: int | None = None,
        codec_steps: int = 125,
    ) -> None:
        config: MoshiConfig = model.config
        window = context if context is not None else int(config.sliding_window)
        resume_steps = window if resume_steps is None else resume_steps
        if max_slots < 1 or min(acoustic_delay, resume_steps, codec_steps) < 0:
            raise ValueError("max_slots must be >= 1, acoustic_delay and the steps >= 0")
        self.model = model
        self.config = config
        self.sampling = sampling if sampling is not None else SamplingParams()
        self.tokenizer = tokenizer
        self.text_pad_ids = tuple(text_pad_ids)
        self.num_codebooks = k = int(config.num_codebooks)
        self.device = next(model.decoder.parameters()).device
        self.mimi = MimiStreamer(model.audio_encoder, max_slots=max_slots, num_codebooks=k)
        self.spec = FrameSpec(
            in_rate=self.mimi.sample_rate,
            in_samples=self.mimi.frame_size,
            out_rate=self.mimi.sample_rate,
            out_samples=self.mimi.frame_size,
            max_slots=max_slots,
            context_steps=resume_steps,
            whole_context_steps=min(codec_steps, resume_steps),
        )
        self._silence: Audio = np.zeros(self.spec.out_samples, dtype=np.float32)
        self._silence.flags.writeable = False  # shared by every muted result
        self._kv = SlotRingCache(
            num_layers=config.num_hidden_layers,
            max_slots=max_slots,
            num_kv_heads=int(config.num_key_value_heads or config.num_attention_heads),
            head_dim=int(config.head_dim or config.hidden_size // config.num_attention_heads),
            window=window,
            chunk=1,
            device=self.device,
            dtype=next(model.decoder.parameters()).dtype,
        )
        # Kyutai's delays over [text, Moshi's K codebooks, the user's K codebooks].
        acoustic = [0] + [acoustic_delay] * (k - 1)
        self.max_delay = acoustic_delay if k > 1 else 0
        self._delays = torch.tensor([0, *acoustic, *acoustic], device=self.device)
        self._initial = torch.tensor(
            [config.vocab_size] + [config.audio_vocab_size] * (2 * k), device=self.device
        )
        # LMGen's token ring: position p holds what the temporal step at offset p reads.
        self._ring = torch.zeros(
            (max_slots, 1 + 2 * k, self.max_delay + 2), dtype=torch.long, device=self.device
        )
        self._offsets = torch.zeros(max_slots, dtype=torch.long, device=self.device)
        self._generators: dict[int, torch.Generator] = {}
        self._slot_seeds: dict[int, int] = {}  # what each open slot's generator was seeded with
        self._records = RecordShape(codebooks=k, ring_size=self.max_delay + 2,
                                    samples=self.spec.in_samples)
        self._seeds = torch.Generator().manual_seed(seed)
        self._text: dict[int, TextStream] = {}
        # Per open slot: frames still to come out silent, their tokens sampled before a stop.
        self._muted: dict[int, int] = {}
        #: Each open slot's tokens of the frame it emitted in the last tick that listed it.
        self.last_tokens: dict[int, SlotTokens | None] = {}
        #: Set to keep :attr:`last_trace` (tests; it holds references to the tick's tensors).
        self.trace = False
        self.last_trace: StepTrace | None = None
        # Compiled transformers: each tick starts a new cudagraph-trees step.
        self._compiled = False
        if cuda_graphs:
            self.compile_graphs()

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype = "float32",
        mimi_dtype: str | torch.dtype = "float32",
        max_slots: int = 16,
        **kwargs: Any,
    ) -> MoshiBackend:
        """Load a ``save_pretrained`` directory (Moshi + Mimi, and a tokenizer if it has one).

        Args:
            path: a local model directory; nothing is downloaded.
            device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
            dtype: the language model's dtype (``"float32"``, ``"bfloat16"``, ``"float16"``).
            mimi_dtype: the codec's dtype; float32 by default, as Kyutai runs Mimi.
            max_slots: sessions served at once.
            **kwargs: the other keyword arguments of :class:`MoshiBackend`.

        Raises:
            ValueError: ``cuda_graphs`` on a device that is not a CUDA one (before loading).
        """
        require_supported_transformers()
        if kwargs.get("cuda_graphs"):
            require_cuda(torch.device(device))
        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"no Moshi model directory at {path} (config.json missing)")
        # A progress bar per load is noise in a service's log (and a tty's escapes in a file).
        transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        model = MoshiForConditionalGeneration.from_pretrained(
            path, dtype=parse_dtype(dtype), attn_implementation="sdpa"
        )
        tokenizer = None
        if any((path / name).is_file() for name in _TOKENIZER_FILES):
            tokenizer = AutoTokenizer.from_pretrained(path)
        place(model, torch.device(device), parse_dtype(mimi_dtype))
        return cls(model, max_slots=max_slots, tokenizer=tokenizer, **kwargs)

    def compile_graphs(self, compile_backend: str = "inductor") -> None:
        """Compile the temporal and depth transformers (:mod:`.moshi_graphs`); with
        ``inductor``, replayed as CUDA graphs. Another ``compile_backend`` (``eager``) runs
        the same plumbing without graphs, on any device.

        Raises:
            ValueError: ``inductor`` and the model is not on a CUDA device.
        """
        if compile_backend == "inductor":
            require_cuda(self.device)
        compile_transformers(self.model, compile_backend)
        self._compiled = True

    # ------------------------------------------------------------------ slots

    @property
    def slot_state_bytes(self) -> int:
        """Device bytes of per-session state (KV rings, conv tails) per slot."""
        total = self._kv.nbytes + self.mimi.state_bytes + self._ring.nbytes
        return total // self.spec.max_slots

    def open_slot(self, slot: int, config: SlotConfig = NO_SLOT_CONFIG, *,
                  seed: int | None = None) -> None:
        """Reset ``slot`` for a new session; ``seed`` fixes its sampling (else one is drawn).
        Of ``config`` it uses nothing: Moshi takes no text or voice prompt (see its profile)."""
        self._check_slot(slot)
        self.mimi.reset(slot)
        self._kv.reset_slot(slot)
        self._ring[slot] = 0
        self._offsets[slot] = 0
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seeds))
        generator = self._generators.get(slot)
        if generator is None:
            generator = self._generators[slot] = torch.Generator(device=self.device)
        generator.manual_seed(seed)
        self._slot_seeds[slot] = seed
        self._text[slot] = TextStream(self.tokenizer, self.text_pad_ids)
        self._muted[slot] = 0
        self.last_tokens[slot] = None

    def resume_slot(self, slot: int, config: SlotConfig, context: Sequence[bytes]) -> None:
        """Open ``slot`` as the slot whose newest step records are ``context`` (compact ones
        first, then whole ones) was after its last step: the records replayed teacher-forced
        on a fresh slot (:mod:`.moshi_context`), then its delay ring, counters and text
        context set as the last one says.

        Raises:
            ValueError: a record this backend did not write, or records not of consecutive
                steps of one slot, compact ones first and the newest whole (the slot stays
                as it was).
        """
        if not context:
            self.open_slot(slot, config)
            return
        decoded = [decode_record(data, self._records) for data in context]
        tokens = [r for r in decoded if isinstance(r, TokenRecord)]
        records = [r for r in decoded if isinstance(r, StepRecord)]
        if (not records or decoded[:len(tokens)] != tokens
                or any(b.offset != a.offset + 1 for a, b in itertools.pairwise(decoded))
                or any(r.seed != records[0].seed for r in records)):
            raise ValueError("Moshi step records of other than consecutive steps of one slot,"
                             " compact ones first, the newest whole")
        self.open_slot(slot, config, seed=records[0].seed)
        rows = slice(slot, slot + 1)
        before = decoded[0].offset - 1  # steps the records do not reach back to
        self._kv.offsets[slot] = before
        heard = records[0].offset - 1  # steps before the whole records: Mimi starts there
        if heard:
            self.mimi.place(slot, encoded=heard, decoded=max(0, heard - self.max_delay))
        # Each cache is a function of its own inputs alone, so each replays on its own, as
        # many steps at once as it can take (the order of a step's parts does not matter).
        frames = [record.frame[1:] for record in records if record.frame is not None]
        with torch.no_grad():
            self.mimi.replay(
                slot, torch.from_numpy(np.concatenate([r.pcm for r in records])).to(self.device),
                torch.tensor(frames, dtype=torch.long, device=self.device).view(
                    len(frames), self.num_codebooks).T)
            self._prefill(rows, torch.tensor([r.lm_input for r in decoded], device=self.device))
            for _ in range(decoded[-1].offset):
                self._noise(rows, [slot])  # the generator drawn as often as the slot's was
        last = records[-1]
        self._ring[slot] = torch.tensor(last.ring, device=self.device).view(
            self._ring.shape[1:])
        self._offsets[slot] = last.offset
        self._muted[slot] = last.muted
        self._text[slot].context = list(last.text_context)

    def _prefill(self, rows: slice, tokens: torch.Tensor) -> None:
        """The temporal steps that read ``tokens [steps, 1 + 2K]``, teacher-forced, on one
        row: as many at once as its empty ring holds, then one by one (and always one by one
        with compiled graphs, which are made for one shape)."""
        run = torch.ones(1, dtype=torch.bool, device=self.device)
        at_once = 1 if self._compiled else self._kv.capacity
        head = min(at_once, tokens.shape[0])
        if head > 1:
            position_ids, mask = self._kv.begin(rows, head)
            self.model.decoder(inputs_embeds=self._embed(tokens[None, :head]),
                               attention_mask=mask, position_ids=position_ids, cache=self._kv,
                               use_cache=True)
            self._kv.commit(run)
            tokens = tokens[head:]
        for step in tokens:
            self._temporal(rows, run, step[None])

    def compact_record(self, record: bytes) -> bytes:
        """A step record past the newest ``codec_steps``: the tokens its step read, which
        rebuild the temporal context (:func:`.moshi_context.compact_record`)."""
        return compact_record(record, self._records)

    def configure_slot(self, slot: int, config: SlotConfig) -> None:
        """Nothing to apply (see :meth:`open_slot`)."""
        self._check_slot(slot)

    def close_slot(self, slot: int) -> None:
        """Free ``slot``; its state is left as it is until the next :meth:`open_slot`."""
        self._check_slot(slot)
        self._text.pop(slot, None)
        self._slot_seeds.pop(slot, None)
        self._muted.pop(slot, None)
        self.last_tokens.pop(slot, None)

    def stop_response(self, slot: int) -> None:
        """Drop what the open ``slot`` would still say of its cancelled response.

        Dropped: the frames whose tokens were sampled before the stop but are not out yet (the
        acoustic delay holds the text token and first codebook of the next ``max_delay``
        frames) come out as full-length silence with no text and no :attr:`last_tokens`.
        They are still decoded, so Mimi's decoder passes the overlap of the cancelled audio
        it holds. The text stream's detokenizing context is cleared too, so no word of the
        cancelled response is completed or glued to what comes next.

        Not dropped: a full-duplex model's context cannot be rewound. The temporal KV cache,
        the token ring and the sampling generator keep all the model said and heard, so it
        goes on from there and may well keep talking; the conversation core mutes the rest
        of its turn. Other slots are untouched.
        """
        if slot not in self._text:
            raise ValueError(f"slot {slot} is not open")
        pending = min(self.max_delay, int(self._offsets[slot]))  # fewer during the warm-up
        self._muted[slot] = pending
        self._text[slot] = TextStream(self.tokenizer, self.text_pad_ids)

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.spec.max_slots:
            raise ValueError(f"slot {slot} out of range 0..{self.spec.max_slots - 1}")

    # ------------------------------------------------------------------ the tick

    @torch.no_grad()
    def step(self, inputs: list[SlotStep]) -> list[SlotResult]:
        """Advance every listed slot by one frame, in one batched pass (see the module doc)."""
        if self._compiled:
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
        if not inputs:
            return []
        slots = [item.slot for item in inputs]
        if len(set(slots)) != len(slots) or any(s not in self._text for s in slots):
            raise ValueError(f"slots must be open and listed once, got {slots}")
        lo = min(slots)
        rows = slice(lo, max(slots) + 1)
        n = rows.stop - lo
        pcm = np.zeros((n, 1, self.spec.in_samples), dtype=np.float32)
        for item in inputs:
            if item.pcm.shape != (self.spec.in_samples,):
                raise ValueError(f"slot {item.slot}: expected {self.spec.in_samples} samples")
            pcm[item.slot - lo, 0] = item.pcm
        listed = torch.zeros(n, dtype=torch.bool)
        listed[[s - lo for s in slots]] = True
        exec_mask = listed.to(self.device)

        user = self.mimi.encode(rows, exec_mask, torch.from_numpy(pcm).to(self.device))
        frames = self._lm_step(rows, exec_mask, user, slots)
        ready = frames.ready.cpu()
        audio = None
        if bool(ready.any()):
            codes = frames.frame[:, 1:]
            audio = self.mimi.decode(rows, frames.ready, codes).float().cpu().numpy()
        tokens = frames.frame.cpu().tolist()
        read = frames.lm_input.cpu().tolist()
        results = [self._result(item.slot, lo, bool(ready[item.slot - lo]), tokens, audio)
                   for item in inputs]
        if not self.spec.context_steps:
            return results
        rings = self._ring[rows].cpu()
        return [dataclasses.replace(result, context=encode_record(StepRecord(
            offset=int(self._offsets[item.slot]), seed=self._slot_seeds[item.slot],
            muted=self._muted[item.slot], lm_input=tuple(read[item.slot - lo]),
            frame=tuple(tokens[item.slot - lo]) if ready[item.slot - lo] else None,
            ring=tuple(rings[item.slot - lo].flatten().tolist()),
            text_context=tuple(self._text[item.slot].context), pcm=item.pcm)))
            for item, result in zip(inputs, results, strict=True)]

    def _result(
        self, slot: int, lo: int, ready: bool, tokens: list[list[int]], audio: Audio | None
    ) -> SlotResult:
        if not ready or audio is None:
            self.last_tokens[slot] = None
            return SlotResult(slot=slot, pcm=_EMPTY)
        if self._muted[slot]:
            self._muted[slot] -= 1
            self.last_tokens[slot] = None
            return SlotResult(slot=slot, pcm=self._silence)
        row = tokens[slot - lo]
        self.last_tokens[slot] = SlotTokens(row[0], tuple(row[1:]))
        # The contract is [-1, 1]; trained Mimi stays inside, random test weights do not.
        pcm = np.clip(audio[slot - lo], -1.0, 1.0).astype(np.float32, copy=False)
        return SlotResult(slot=slot, pcm=pcm, text=self._text[slot].delta(row[0]))

    def _lm_step(
        self, rows: slice, exec_mask: torch.Tensor, user: torch.Tensor, slots: list[int]
    ) -> StepFrames:
        """One temporal + depth step over ``rows`` with the delay ring (Kyutai ``LMGen._step``)."""
        k = self.num_codebooks
        offsets = self._offsets[rows]
        ring = self._ring[rows]
        size = ring.shape[-1]
        run = exec_mask[:, None, None]
        # The user's codebooks go in at their delayed positions.
        user_ring = ring[:, 1 + k :]
        at = ((offsets[:, None] + self._delays[None, 1 + k :]) % size)[..., None]
        user_ring.scatter_(2, at, torch.where(run, user[..., None], user_ring.gather(2, at)))
        # Read this offset's tokens; a codebook still within its delay reads the initial token.
        at = (offsets % size)[:, None, None].expand(-1, ring.shape[1], 1)
        lm_input = ring.gather(2, at)[..., 0]
        is_init = (offsets[:, None] <= self._delays[None]) | ~exec_mask[:, None]
        lm_input = torch.where(is_init, self._initial[None], lm_input)

        text_logits, hidden = self._temporal(rows, exec_mask, lm_input)
        text_noise, audio_noise = self._noise(rows, slots)
        params = self.sampling
        text = sample(text_logits, params.text_temperature, params.text_top_k, text_noise)
        audio, depth_logits = self._depth(hidden, text, audio_noise)

        # The sampled tokens belong to the next position; only executing rows store them.
        offsets = offsets + exec_mask.long()
        self._offsets[rows] = offsets
        own = ring[:, : 1 + k]
        at = (offsets % size)[:, None, None].expand(-1, 1 + k, 1)
        new = torch.cat([text[:, None], audio], dim=1)[..., None]
        own.scatter_(2, at, torch.where(run, new, own.gather(2, at)))
        # The frame whose last codebook was just sampled: codebook j sits at its delay.
        at = ((offsets[:, None] - self.max_delay + self._delays[None, : 1 + k]) % size)[..., None]
        frame = own.gather(2, at)[..., 0]
        if self.trace:
            self.last_trace = StepTrace(
                rows, exec_mask, user, lm_input, text_logits, depth_logits, text, audio
            )
        return StepFrames(ready=exec_mask & (offsets > self.max_delay), frame=frame,
                       lm_input=lm_input)

    def _temporal(
        self, rows: slice, exec_mask: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Embed ``[n, 1 + 2K]`` tokens as Moshi's forward does and run one cached position."""
        position_ids, mask = self._kv.begin(rows, 1)
        out = self.model.decoder(
            inputs_embeds=self._embed(tokens[:, None]),
            attention_mask=mask,
            position_ids=position_ids,
            cache=self._kv,
            use_cache=True,
        )
        self._kv.commit(exec_mask)
        return out.logits[:, -1], out.last_hidden_state

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[n, q, 1 + 2K]`` tokens embedded as Moshi's forward does: ``[n, q, hidden]``."""
        model = self.model
        embeds: torch.Tensor = model.decoder.model.embed_tokens(tokens[..., 0])
        for j, table in enumerate(model.embed_tokens):
            embeds = embeds + table(tokens[..., 1 + j])
        return embeds

    def _depth(
        self, hidden: torch.Tensor, text: torch.Tensor, noise: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample the K audio codes one by one with the depth transformer and a small cache.

        Embeddings are looked up here, with the codebook index known on the host, and passed as
        ``inputs_embeds``: HF's own lookup calls ``.item()`` per codebook (a GPU sync each).
        """
        depth = self.model.depth_decoder
        cache = DynamicCache(config=depth.config)
        previous = text[:, None]
        embeds = depth.text_embed_tokens(previous)
        codes, logits = [], []
        params = self.sampling
        for j in range(self.num_codebooks):
            out = depth(
                input_ids=previous,
                last_hidden_state=hidden,
                inputs_embeds=embeds,
                cache=cache,
                use_cache=True,
            )
            step_logits = out.logits[:, -1]
            step_noise = None if noise is None else noise[:, j]
            code = sample(step_logits, params.temperature, params.top_k, step_noise)
            codes.append(code)
            logits.append(step_logits)
            previous = code[:, None]
            if j + 1 < self.num_codebooks:
                embeds = depth.embed_tokens[j](previous)
        return torch.stack(codes, dim=1), torch.stack(logits, dim=1)

    def _noise(
        self, rows: slice, slots: list[int]
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Exponential noise for this tick's sampling, drawn from each listed slot's generator.

        One draw per slot per tick, of a size fixed by the sampling parameters, so a session's
        random stream does not depend on which other slots are in the batch.
        """
        params = self.sampling
        text_k = candidates(params.text_temperature, params.text_top_k, self.config.vocab_size)
        audio_vocab = int(self.config.audio_vocab_size or 0)
        audio_k = candidates(params.temperature, params.top_k, audio_vocab)
        size = text_k + self.num_codebooks * audio_k
        if size == 0:
            return None, None
        noise = torch.ones((rows.stop - rows.start, size), device=self.device)
        for slot in slots:
            noise[slot - rows.start].exponential_(generator=self._generators[slot])
        text_noise = noise[:, :text_k] if text_k else None
        audio_noise = noise[:, text_k:].view(-1, self.num_codebooks, audio_k) if audio_k else None
        return text_noise, audio_noise


def build_full_size_on(
    device: str | torch.device,
    dtype: str | torch.dtype = "bfloat16",
    max_slots: int = 16,
    **kwargs: Any,
) -> MoshiBackend:
    """A random-init Moshi 7B (transformers' default ``MoshiConfig``/``MimiConfig``) on ``device``.

    For capacity and latency runs on a GPU, where no weights can be downloaded: compute and
    memory do not depend on the weight values. The model is built on the device directly (no
    7.8B-parameter CPU init). ~14.5 GiB of weights in bf16, plus ~1.5 GiB KV per slot at the
    default 3000-frame context (pass ``context=`` to shrink it).
    """
    require_supported_transformers()
    torch_device = torch.device(device)
    torch_dtype = parse_dtype(dtype)
    config = MoshiConfig(audio_encoder_config=MimiConfig())
    config._attn_implementation = "sdpa"
    with torch_device:
        model = MoshiForConditionalGeneration._from_config(  # type: ignore[no-untyped-call]
            config, dtype=torch_dtype
        )
    place(model, torch_device, parse_dtype(kwargs.pop("mimi_dtype", torch.float32)))
    return MoshiBackend(model, max_slots=max_slots, **kwargs)
