"""A Moshi slot's text tokens as transcript deltas (the backend's inner monologue)."""

from __future__ import annotations

from collections.abc import Iterable

from transformers import PreTrainedTokenizerBase

__all__ = ["TextStream"]


class TextStream:
    """Turns a slot's text tokens into transcript deltas.

    With a tokenizer, a token's delta is ``decode(context + [token])`` minus ``decode(context)``
    over the last few non-pad tokens, which gets SentencePiece's leading spaces and multi-token
    characters right. Without one (tiny random test models), a non-pad token renders as
    ``"<id>"``. Padding tokens always render as ``""``.
    """

    _CONTEXT = 4

    def __init__(self, tokenizer: PreTrainedTokenizerBase | None, pad_ids: Iterable[int]) -> None:
        self.tokenizer = tokenizer
        self.pad_ids = frozenset(pad_ids)
        self.context: list[int] = []

    def delta(self, token: int) -> str:
        """The transcript text ``token`` adds ("" for padding)."""
        if token in self.pad_ids:
            return ""
        if self.tokenizer is None:
            return f"<{token}>"
        before = self._decode(self.context)
        after = self._decode([*self.context, token])
        self.context = [*self.context, token][-self._CONTEXT :]
        return after[len(before) :] if after.startswith(before) else self._decode([token])

    def _decode(self, ids: list[int]) -> str:
        assert self.tokenizer is not None
        return str(self.tokenizer.decode(ids, skip_special_tokens=True)) if ids else ""
