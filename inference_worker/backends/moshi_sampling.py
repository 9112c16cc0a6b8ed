"""Token sampling for the Moshi backend: greedy, or Kyutai's ``LMGen`` top-k sampling."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SamplingParams", "candidates", "sample"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """Token sampling; a temperature of 0 means greedy. Defaults are Kyutai's ``LMGen``'s."""

    temperature: float = 0.8
    top_k: int = 250
    text_temperature: float = 0.7
    text_top_k: int = 25

    @classmethod
    def greedy(cls) -> SamplingParams:
        """Argmax for text and audio (deterministic without any generator)."""
        return cls(temperature=0.0, text_temperature=0.0)


def candidates(temperature: float, top_k: int, vocab: int) -> int:
    """Candidates kept when sampling (0 for greedy)."""
    if temperature <= 0:
        return 0
    return vocab if top_k <= 0 else min(top_k, vocab)


def sample(
    logits: torch.Tensor, temperature: float, top_k: int, noise: torch.Tensor | None
) -> torch.Tensor:
    """Greedy, or top-k sampling as Kyutai does it: ``argmax(p / Exp(1) noise)`` ~ ``p``."""
    if temperature <= 0 or noise is None:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    top, index = probs.topk(noise.shape[-1], dim=-1)
    choice = (top / noise).argmax(dim=-1, keepdim=True)
    return index.gather(-1, choice)[:, 0]
