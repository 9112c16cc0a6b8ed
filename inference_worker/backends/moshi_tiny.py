"""Tiny random Moshi + Mimi model directories, for tests, benches and development on a CPU.

No Moshi weights can be downloaded here, so everything that runs the Moshi backend on a CPU runs
a random-init model small enough to step in milliseconds, written with ``save_pretrained`` and
read back through :meth:`MoshiBackend.load` like a real checkpoint. The shapes keep what matters
to the streaming code: Mimi's real strides (1920 samples per 12.5 Hz frame, 2 transformer
positions per frame), its replicate-padded downsample, 8 codebooks and the depth transformer.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    MimiConfig,
    MoshiConfig,
    MoshiForConditionalGeneration,
    PreTrainedTokenizerFast,
)
from transformers.models.mimi.modeling_mimi import MimiEuclideanCodebook

__all__ = ["tiny_mimi_config", "tiny_moshi_config", "write_tiny_moshi"]


def tiny_mimi_config(*, sliding_window: int = 250) -> MimiConfig:
    """A ~0.15M-parameter Mimi with the real strides (frame 1920 samples at 24 kHz)."""
    return MimiConfig(
        sampling_rate=24000,
        hidden_size=32,
        num_filters=4,
        num_residual_layers=1,
        upsampling_ratios=[8, 6, 5, 4],
        codebook_size=64,
        codebook_dim=32,
        vector_quantization_hidden_dimension=32,
        num_quantizers=8,
        num_semantic_quantizers=1,
        upsample_groups=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=8,
        sliding_window=sliding_window,
        max_position_embeddings=8000,
        use_cache=True,
    )


def tiny_moshi_config(*, sliding_window: int = 3000, mimi_window: int = 250) -> MoshiConfig:
    """A ~0.3M-parameter Moshi (text vocab 100, audio vocab 64, 8 codebooks) on a tiny Mimi."""
    return MoshiConfig(
        vocab_size=100,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        ffn_dim=128,
        max_position_embeddings=3000,
        sliding_window=sliding_window,
        num_codebooks=8,
        audio_encoder_config=tiny_mimi_config(sliding_window=mimi_window),
        depth_decoder_config={
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "ffn_dim": 64,
            "max_position_embeddings": 9,
            "sliding_window": 8,
        },
    )


def _tiny_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``vocab_size`` made-up words, SentencePiece-style spacing.

    Ids 0 and 3 are Moshi's text paddings; the others are words ``▁w<id>``, so a decoded
    transcript reads ``"w5 w17 ..."``.
    """
    vocab = {f"▁w{i}": i for i in range(vocab_size)}
    vocab.update({"<pad>": 0, "<unk>": 1, "<s>": 2, "<epad>": 3})
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>", bos_token="<s>"
    )


def write_tiny_moshi(
    out_dir: str | os.PathLike[str],
    *,
    seed: int = 0,
    tokenizer: bool = True,
    sliding_window: int = 3000,
) -> MoshiForConditionalGeneration:
    """Write a random tiny Moshi (+ Mimi, + a tokenizer unless disabled) to ``out_dir``.

    Returns the model as written (eval mode, float32), for comparisons with what gets loaded.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = tiny_moshi_config(sliding_window=sliding_window)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MoshiForConditionalGeneration(config)
        model.train(False)
        # HF initialises Mimi's codebooks to zeros, which maps every frame to code 0 and would
        # make the model deaf to its input. Random centroids, at the latents' scale (~1).
        for module in model.audio_encoder.modules():
            if isinstance(module, MimiEuclideanCodebook):
                with torch.no_grad():
                    module.embed_sum.normal_()
                    module.cluster_usage.fill_(1.0)
                module._embed = None
    model.save_pretrained(out)
    if tokenizer:
        _tiny_tokenizer(config.vocab_size).save_pretrained(out)
    return model
