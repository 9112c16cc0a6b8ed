"""The Moshi backend's per-tick data: what a slot emitted, and what a tick's internals were."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SlotTokens", "StepFrames", "StepTrace"]


@dataclass(frozen=True, slots=True)
class SlotTokens:
    """The tokens of the frame a slot emitted this tick (after undoing the acoustic delay)."""

    text: int
    audio: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StepTrace:
    """Internals of the last tick over ``rows`` (kept only when ``MoshiBackend.trace`` is set)."""

    rows: slice
    exec_mask: torch.Tensor  #: [n] bool
    user_codes: torch.Tensor  #: [n, K] Mimi codes of the input frame
    lm_input: torch.Tensor  #: [n, 1 + 2K] text, Moshi audio, user audio fed to the temporal step
    text_logits: torch.Tensor  #: [n, text_vocab]
    depth_logits: torch.Tensor  #: [n, K, audio_vocab]
    text: torch.Tensor  #: [n] sampled text token
    audio: torch.Tensor  #: [n, K] sampled audio codes (for the delayed position)


@dataclass(frozen=True, slots=True)
class StepFrames:
    """What a tick leaves for its results: per row, its output frame and what it read."""

    ready: torch.Tensor  # [n] bool: an output frame exists for the row
    frame: torch.Tensor  # [n, 1 + K]: text token and K audio codes of that frame
    lm_input: torch.Tensor  # [n, 1 + 2K]: the tokens the temporal step read
