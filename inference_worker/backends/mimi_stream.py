"""Streaming Mimi encode and decode for many session slots, one 80 ms frame per tick.

HF's ``MimiModel`` streams the encoder only, and with one shared time base for the batch. Its
decoder keeps no conv state at all: each call re-pads with zeros and the transposed convs drop
their overlap, so frame-by-frame decoding is ~50% wrong (models.md §3.2, HF issue #38535). This
module drives the stock Mimi submodules itself and keeps, per slot:

* for every causal ``MimiConv1d``, the last ``padding_total`` input samples (prepended to the next
  frame, which is what the offline forward's left padding sees);
* for every ``MimiConvTranspose1d``, its last ``kernel - stride`` outputs without bias, added to
  the start of the next frame's output (Kyutai's ``StreamingConvTranspose1d``);
* for the encoder and decoder transformers, a :class:`SlotRingCache` (sliding window 250 at 25 Hz).

All state is ``[max_slots, ...]`` tensors, so opening a slot is "zero that row", and a tick
commits state only for the rows whose exec mask is True: a slot not in the tick does not move.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import MimiModel
from transformers.models.mimi.modeling_mimi import (
    MimiConv1d,
    MimiConvTranspose1d,
    MimiResnetBlock,
)

from inference_worker.backends.moshi_cache import SlotRingCache

__all__ = ["MimiStreamer"]


class MimiStreamer:
    """Per-slot streaming Mimi: ``encode`` pcm frames to codes, ``decode`` codes to pcm frames.

    Each call takes a contiguous range of slots (``rows``) and a bool ``exec_mask`` over it;
    rows whose mask is False are computed on whatever they are given but keep their state.

    Args:
        mimi: a causal ``MimiModel`` (``use_causal_conv``, ``trim_right_ratio == 1``), in eval mode.
        max_slots: slots to allocate state for.
        num_codebooks: codebooks produced by ``encode`` (Moshi uses 8 of Mimi's 32).
    """

    def __init__(self, mimi: MimiModel, *, max_slots: int, num_codebooks: int) -> None:
        config = mimi.config
        if not config.use_causal_conv or config.trim_right_ratio != 1.0:
            raise ValueError("streaming needs a causal Mimi (use_causal_conv, trim_right_ratio=1)")
        if mimi.encoder is None or mimi.decoder is None:
            raise ValueError("streaming needs both halves of Mimi")
        self.mimi = mimi
        self.encoder = mimi.encoder
        self.decoder = mimi.decoder
        self.max_slots = max_slots
        self.num_codebooks = num_codebooks
        self.frame_size = int(config.frame_size)
        self.sample_rate = int(config.sampling_rate)
        # Transformer positions per frame: the 25 Hz SEANet rate over the 12.5 Hz code rate.
        self.chunk = self.frame_size // math.prod(config.upsampling_ratios or [1])
        param = next(mimi.parameters())
        self.device, self.dtype = param.device, param.dtype
        self._conv_tail: dict[nn.Module, torch.Tensor] = {}
        self._convtr_tail: dict[nn.Module, torch.Tensor] = {}
        for module in mimi.modules():
            if isinstance(module, MimiConv1d):
                conv = module.conv
                # HF's `padding_total` buffer, from the conv's ints (no device read; meta works).
                padding = (conv.kernel_size[0] - 1) * conv.dilation[0] + 1 - conv.stride[0]
                self._conv_tail[module] = self._zeros(conv.in_channels, padding)
            elif isinstance(module, MimiConvTranspose1d):
                if module.padding_left != 0:
                    raise ValueError("streaming needs right-trimmed transposed convs")
                convtr = module.conv
                self._convtr_tail[module] = self._zeros(
                    convtr.out_channels, convtr.kernel_size[0] - convtr.stride[0]
                )
        # A "replicate"-padded conv (Mimi's downsample) pads with its first input sample, so a
        # slot's first frame fills its tail from the input instead of using zeros.
        self._fresh = torch.ones(max_slots, dtype=torch.bool, device=self.device)
        self._encoder_kv = self._ring(self.encoder.config)
        self._decoder_kv = self._ring(self.decoder.config)
        self._rows = slice(0, 0)
        self._exec = torch.zeros(0, dtype=torch.bool, device=self.device)

    def _zeros(self, channels: int, length: int) -> torch.Tensor:
        return torch.zeros(
            (self.max_slots, channels, length), device=self.device, dtype=self.dtype
        )

    def _ring(self, config: object) -> SlotRingCache:
        return SlotRingCache(
            num_layers=config.num_hidden_layers,  # type: ignore[attr-defined]
            max_slots=self.max_slots,
            num_kv_heads=config.num_key_value_heads,  # type: ignore[attr-defined]
            head_dim=config.head_dim,  # type: ignore[attr-defined]
            window=config.sliding_window,  # type: ignore[attr-defined]
            chunk=self.chunk,
            device=self.device,
            dtype=self.dtype,
        )

    @property
    def state_bytes(self) -> int:
        """Bytes of per-slot state held for all slots."""
        tails = list(self._conv_tail.values()) + list(self._convtr_tail.values())
        return sum(t.nbytes for t in tails) + self._encoder_kv.nbytes + self._decoder_kv.nbytes

    def reset(self, slot: int) -> None:
        """Forget one slot's audio history (encoder and decoder), for a new session."""
        for tail in (*self._conv_tail.values(), *self._convtr_tail.values()):
            tail[slot].zero_()
        self._fresh[slot] = True
        self._encoder_kv.reset_slot(slot)
        self._decoder_kv.reset_slot(slot)

    def place(self, slot: int, *, encoded: int, decoded: int) -> None:
        """Put a freshly reset slot where one that encoded and decoded that many frames is,
        its history unknown: its transformers' positions moved on, their rings and the conv
        tails empty, its downsample no longer fresh (a slot rebuilt from a later frame on)."""
        self._encoder_kv.offsets[slot] = encoded * self.chunk
        self._decoder_kv.offsets[slot] = decoded * self.chunk
        self._fresh[slot] = encoded == 0

    @torch.no_grad()
    def replay(self, slot: int, pcm: torch.Tensor, codes: torch.Tensor) -> None:
        """Put a freshly reset (or :meth:`place`-d) slot where it would be after encoding the
        frames of ``pcm [frames * frame_size]`` and decoding ``codes [num_codebooks,
        frames]``: as many frames at once as the transformer's empty ring holds, then one by
        one (the conv tails carry across calls, so the state is the stepped one's)."""
        rows, run = slice(slot, slot + 1), torch.ones(1, dtype=torch.bool, device=self.device)
        at_once = self._encoder_kv.capacity // self.chunk
        frames = pcm.shape[0] // self.frame_size
        for start, stop in _spans(frames, at_once):
            part = pcm[start * self.frame_size:stop * self.frame_size]
            self._encode_latents(rows, run, part.view(1, 1, -1))
        at_once = self._decoder_kv.capacity // self.chunk
        for start, stop in _spans(codes.shape[1], at_once):
            self._decode(rows, run, codes[None, :, start:stop])

    # ------------------------------------------------------------------ streaming layers

    def _commit(self, tail: torch.Tensor, new: torch.Tensor) -> None:
        view = tail[self._rows]
        view.copy_(torch.where(self._exec[:, None, None], new, view))

    def _conv(self, module: MimiConv1d, x: torch.Tensor) -> torch.Tensor:
        tail = self._conv_tail[module]
        previous = tail[self._rows]
        if module.pad_mode == "replicate":
            first = x[..., :1].expand_as(previous)
            previous = torch.where(self._fresh[self._rows][:, None, None], first, previous)
        elif module.pad_mode != "constant":
            raise ValueError(f"unsupported Mimi pad_mode {module.pad_mode!r}")
        padded = torch.cat([previous, x.to(previous.dtype)], dim=-1)
        self._commit(tail, padded[..., padded.shape[-1] - tail.shape[-1] :])
        out: torch.Tensor = module.conv(padded)
        return out

    def _convtr(self, module: MimiConvTranspose1d, x: torch.Tensor) -> torch.Tensor:
        tail = self._convtr_tail[module]
        overlap = tail.shape[-1]
        y: torch.Tensor = module.conv(x)
        if overlap == 0:
            return y
        y = torch.cat([y[..., :overlap] + tail[self._rows], y[..., overlap:]], dim=-1)
        new_tail = y[..., -overlap:]
        bias = module.conv.bias
        if bias is not None:
            # The next frame's own output already carries the bias at these samples.
            new_tail = new_tail - bias[None, :, None]
        self._commit(tail, new_tail)
        return y[..., :-overlap]

    def _resblock(self, block: MimiResnetBlock, x: torch.Tensor) -> torch.Tensor:
        h = x
        for layer in block.block:
            h = self._conv(layer, h) if isinstance(layer, MimiConv1d) else layer(h)
        shortcut = block.shortcut
        residual = self._conv(shortcut, x) if isinstance(shortcut, MimiConv1d) else shortcut(x)
        out: torch.Tensor = residual + h
        return out

    def _seanet(self, layers: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
        for layer in layers:
            if isinstance(layer, MimiConv1d):
                x = self._conv(layer, x)
            elif isinstance(layer, MimiConvTranspose1d):
                x = self._convtr(layer, x)
            elif isinstance(layer, MimiResnetBlock):
                x = self._resblock(layer, x)
            else:
                x = layer(x)
        return x

    def _transformer(self, model: nn.Module, kv: SlotRingCache, x: torch.Tensor) -> torch.Tensor:
        position_ids, mask = kv.begin(self._rows, x.shape[-1])
        out = model(
            x.transpose(1, 2),
            attention_mask=mask,
            position_ids=position_ids,
            cache=kv,
            use_cache=True,
        )
        kv.commit(self._exec)
        hidden: torch.Tensor = out.last_hidden_state.transpose(1, 2)
        return hidden

    def _begin(self, rows: slice, exec_mask: torch.Tensor, batch: int) -> None:
        if rows.stop - rows.start != batch or exec_mask.shape != (batch,):
            raise ValueError("rows, exec_mask and the batch must have the same length")
        self._rows, self._exec = rows, exec_mask

    # ------------------------------------------------------------------ public API

    @torch.no_grad()
    def encode_latents(
        self, rows: slice, exec_mask: torch.Tensor, pcm: torch.Tensor
    ) -> torch.Tensor:
        """Encode one frame per row: ``pcm [n, 1, frame_size]`` -> latents ``[n, dim, 1]``."""
        if pcm.shape[1:] != (1, self.frame_size):
            raise ValueError(f"expected pcm [n, 1, {self.frame_size}], got {tuple(pcm.shape)}")
        return self._encode_latents(rows, exec_mask, pcm)

    def _encode_latents(self, rows: slice, exec_mask: torch.Tensor,
                        pcm: torch.Tensor) -> torch.Tensor:
        self._begin(rows, exec_mask, pcm.shape[0])
        h = self._seanet(self.encoder.encoder_seanet.layers, pcm.to(self.dtype))
        h = self._transformer(self.encoder.encoder_transformer, self._encoder_kv, h)
        if self.encoder.downsample is not None:
            h = self._conv(self.encoder.downsample, h)
        self._fresh[rows] &= ~exec_mask
        return h

    @torch.no_grad()
    def encode(self, rows: slice, exec_mask: torch.Tensor, pcm: torch.Tensor) -> torch.Tensor:
        """Encode one frame per row: ``pcm [n, 1, frame_size]`` -> codes ``[n, num_codebooks]``."""
        latents = self.encode_latents(rows, exec_mask, pcm)
        codes: torch.Tensor = self.mimi.quantizer.encode(latents, self.num_codebooks)
        return codes[..., 0].transpose(0, 1)

    @torch.no_grad()
    def decode(self, rows: slice, exec_mask: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Decode one frame per row: codes ``[n, num_codebooks]`` -> pcm ``[n, frame_size]``."""
        return self._decode(rows, exec_mask, codes[..., None])

    def _decode(self, rows: slice, exec_mask: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        self._begin(rows, exec_mask, codes.shape[0])
        h = self.mimi.quantizer.decode(codes).to(self.dtype)
        if self.decoder.upsample is not None:
            h = self._convtr(self.decoder.upsample, h)
        h = self._transformer(self.decoder.decoder_transformer, self._decoder_kv, h)
        pcm = self._seanet(self.decoder.decoder_seanet.layers, h)
        return pcm[:, 0]


def _spans(count: int, first: int) -> list[tuple[int, int]]:
    """``[0, count)`` as one span of up to ``first``, then spans of one."""
    head = min(count, first)
    return ([(0, head)] if head else []) + [(i, i + 1) for i in range(head, count)]
