"""CUDA graphs for the Moshi backend: its temporal and depth transformers compiled with
``torch.compile(mode="reduce-overhead")``, which records CUDA graphs (cudagraph trees) of the
compiled regions and replays them, so a tick launches a few graphs instead of every kernel.

``MoshiBackend(cuda_graphs=True)`` (the worker's ``DUPLEX_GATEWAY_MOSHI_CUDA_GRAPHS``) and the
GPU check's ``graphs`` mode both come here. Each batch size the backend steps at is compiled
the first time it runs, on the model thread: the first ticks at a new size are slow.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["compile_transformers", "require_cuda"]

#: Graph sets kept per compiled module: one per batch size (the row range a tick spans).
_CACHE_SIZE_LIMIT = 64


def require_cuda(device: torch.device) -> None:
    """Refuse CUDA graphs on a device that is not a CUDA one.

    Raises:
        ValueError: ``device`` is not ``cuda`` (``cpu``, ``mps``...); one line.
    """
    if device.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA device, and the model is on {device}"
                         " (set the device to cuda, or turn CUDA graphs off)")


class _ClonedOutputs(torch.nn.Module):
    """Runs the compiled module and clones every tensor of its output.

    Replayed graphs write their outputs into a shared pool that the next replay overwrites,
    and the depth transformer runs once per codebook in a tick: each output is cloned before
    the next call. Attributes it does not have (``config``, embedding tables) are the
    original's.
    """

    def __init__(self, fast: Any, original: torch.nn.Module) -> None:
        super().__init__()
        self.fast = fast
        object.__setattr__(self, "_original", original)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.fast(*args, **kwargs)
        for key, value in list(out.items()):
            if isinstance(value, torch.Tensor):
                out[key] = value.clone()
        return out

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_original"), name)


def _compiled(module: torch.nn.Module, compile_backend: str) -> torch.nn.Module:
    if compile_backend == "inductor":
        fast = torch.compile(module, mode="reduce-overhead", dynamic=False)
    else:
        fast = torch.compile(module, backend=compile_backend, dynamic=False)
    return _ClonedOutputs(fast, module)


def compile_transformers(model: Any, compile_backend: str = "inductor") -> None:
    """Replace ``model``'s temporal and depth transformers by their compiled forms.

    With ``inductor``, as CUDA graphs (the caller checked the device: :func:`require_cuda`);
    the caller then starts a new cudagraph-trees step at each tick
    (``torch.compiler.cudagraph_mark_step_begin``). Any other ``compile_backend`` (``eager``:
    dynamo only, no graphs) serves to test this plumbing on a CPU.
    """
    torch._dynamo.config.cache_size_limit = _CACHE_SIZE_LIMIT
    model.decoder = _compiled(model.decoder, compile_backend)
    model.depth_decoder = _compiled(model.depth_decoder, compile_backend)
