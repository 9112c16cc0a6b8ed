"""A slot ring KV cache: one preallocated ring per attention layer, one row per session slot.

HF's ``DynamicCache`` gives every row of a batch one shared time base, so sessions could not join,
pause or leave independently. Here each row (slot) keeps its own write offset, in the manner of
Kyutai's ``RingKVCache``: a tick writes row ``b``'s new keys at ``offsets[b] + i`` (mod the
capacity), RoPE gets ``offsets[b] + i`` as the position, and a 4D bool mask lets each query see
exactly the entries of its own session inside the sliding window. HF's mask builders return a
4D mask unchanged, so the stock ``MoshiModel`` and ``MimiTransformerModel`` run on it as they are.

A tick computes a contiguous range of rows (``rows``); rows in it that are not executing
(``exec_mask`` False) still run, on dummy input, but their offsets do not move, so their next
real tick rewrites the same ring entries: a paused session resumes exactly where it stopped.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

__all__ = ["SlotRingCache"]


# CacheLayerMixin's __init__/__init_subclass__ carry no annotations.
class _RingLayer(CacheLayerMixin):  # type: ignore[no-untyped-call]
    """One attention layer's ring; the owning :class:`SlotRingCache` holds the tick's indices."""

    is_sliding = False

    def __init__(self, owner: SlotRingCache, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.owner = owner
        self.ring_keys = self.keys = keys
        self.ring_values = self.values = values
        self.device = keys.device
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the ring is allocated up front, so memory use is known at load time."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this tick's keys/values (``[n, heads, q, dim]``) and return the rows' rings."""
        rows, index = self.owner.tick_rows, self.owner.tick_index
        assert index is not None, "SlotRingCache.begin() must run before the forward"
        keys, values = self.ring_keys[rows], self.ring_values[rows]
        n, heads, q, dim = key_states.shape
        scatter_index = index[:, None, :, None].expand(n, heads, q, dim)
        keys.scatter_(2, scatter_index, key_states.to(keys.dtype))
        values.scatter_(2, scatter_index, value_states.to(values.dtype))
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """The whole ring is always attended to (the caller's 4D mask selects entries)."""
        return self.owner.capacity, 0

    def get_seq_length(self) -> int:
        """Positions are per row (``SlotRingCache.offsets``); there is no single length.

        HF only asks for it to invent ``position_ids`` or a mask, and both are always passed.
        """
        return 0

    def get_max_length(self) -> int:
        """The ring's capacity."""
        return self.owner.capacity


class SlotRingCache(Cache):
    """Preallocated per-slot ring KV cache with a sliding window, for a stock HF transformer.

    Use per tick: ``position_ids, mask = cache.begin(rows, q)``, run the model with
    ``attention_mask=mask, position_ids=position_ids, cache=cache``, then
    ``cache.commit(exec_mask)``. A tick of more positions than ``chunk`` is a prefill (a slot
    rebuilt from its history): only into rows that hold nothing yet, at most ``capacity``
    positions, so no entry a query of the tick needs is overwritten within it.

    Args:
        num_layers: attention layers of the model.
        max_slots: rows allocated.
        num_kv_heads: key/value heads per layer.
        head_dim: per-head dimension.
        window: the sliding window in positions: a query at ``p`` sees keys ``p - window + 1 .. p``.
        chunk: positions written per tick (1 for Moshi's temporal transformer, 2 for Mimi's).
        device: where the rings live.
        dtype: the rings' dtype (the model's).
    """

    def __init__(
        self,
        *,
        num_layers: int,
        max_slots: int,
        num_kv_heads: int,
        head_dim: int,
        window: int,
        chunk: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        if window < 1 or chunk < 1:
            raise ValueError(f"window ({window}) and chunk ({chunk}) must be positive")
        self.window = window
        self.chunk = chunk
        # A tick writes `chunk` entries before attending, so the ring needs `chunk - 1` spare
        # entries for its first query to still see the oldest key of its window.
        self.capacity = window + chunk - 1
        shape = (max_slots, num_kv_heads, self.capacity, head_dim)
        self._rings = [
            _RingLayer(
                self,
                torch.zeros(shape, device=device, dtype=dtype),
                torch.zeros(shape, device=device, dtype=dtype),
            )
            for _ in range(num_layers)
        ]
        super().__init__(layers=list(self._rings))
        self.offsets = torch.zeros(max_slots, dtype=torch.long, device=device)
        # Absolute position held by each ring entry, -1 when empty.
        self.entry_pos = torch.full((max_slots, self.capacity), -1, dtype=torch.long, device=device)
        self._steps = torch.arange(chunk, device=device)
        self._tick_positions = chunk
        self.tick_rows = slice(0, 0)
        self.tick_index: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        """Bytes held by the key/value rings of all rows."""
        return sum(ring.ring_keys.nbytes + ring.ring_values.nbytes for ring in self._rings)

    def reset_slot(self, slot: int) -> None:
        """Empty one row for a new session.

        The ring is zeroed, not only masked: a NaN left by a poisoned session would otherwise
        leak through the attention product (masked weight 0 times NaN is NaN).
        """
        for ring in self._rings:
            ring.ring_keys[slot].zero_()
            ring.ring_values[slot].zero_()
        self.offsets[slot] = 0
        self.entry_pos[slot] = -1

    def begin(self, rows: slice, q: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Prepare a tick of ``q`` positions for ``rows``; return ``(position_ids, mask)``.

        ``position_ids`` is ``[n, q]``; ``mask`` is a bool ``[n, 1, q, capacity]`` (True =
        attend). Every computed row sees its own current entries, so no softmax row is empty.
        """
        steps = self._steps
        if q != self.chunk:
            if not 0 < q <= self.capacity or bool((self.entry_pos[rows] >= 0).any()):
                raise ValueError(f"this cache writes {self.chunk} positions per tick, or up to"
                                 f" {self.capacity} into empty rows; got {q}")
            steps = torch.arange(q, device=self._steps.device)
        positions = self.offsets[rows][:, None] + steps[None, :]
        index = positions % self.capacity
        entry_pos = self.entry_pos[rows]
        entry_pos.scatter_(1, index, positions)
        keys = entry_pos[:, None, :]
        query = positions[:, :, None]
        visible = (keys >= 0) & (keys <= query) & (keys > query - self.window)
        self.tick_rows, self.tick_index, self._tick_positions = rows, index, q
        return positions, visible[:, None]

    def commit(self, exec_mask: torch.Tensor) -> None:
        """Advance the executing rows of the current tick; the others stay where they were."""
        self.offsets[self.tick_rows] += exec_mask.long() * self._tick_positions
