"""Loading the Moshi backend's model: the transformers it needs, dtypes, placement."""

from __future__ import annotations

import torch
import transformers
from packaging.version import Version
from transformers import MoshiForConditionalGeneration

__all__ = ["MIN_TRANSFORMERS", "parse_dtype", "place", "require_supported_transformers"]

# The streaming code drives Mimi's and Moshi's submodules and their cache interface directly.
# Both changed shape in 5.24 (Mimi split into encoder/decoder sub-models, the ``cache=`` kwarg);
# earlier releases fail deep inside the first step, so they are refused up front.
MIN_TRANSFORMERS = Version("5.24.0")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def require_supported_transformers(version: str | None = None) -> None:
    """Raise ``RuntimeError`` naming the fix if ``transformers`` is older than this backend needs.

    Args:
        version: the version to judge; the installed one by default.
    """
    found = Version(version if version is not None else transformers.__version__)
    if found < MIN_TRANSFORMERS:
        raise RuntimeError(
            f"the moshi backend needs transformers >= {MIN_TRANSFORMERS}, found {found}: install"
            " the project's moshi extra (pip install 'duplex-gateway[moshi]')"
        )


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32"``/``"bfloat16"``/``"float16"`` (or a ``torch.dtype``) -> ``torch.dtype``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPES)}") from None


def place(
    model: MoshiForConditionalGeneration, device: torch.device, mimi_dtype: torch.dtype
) -> None:
    """Move to ``device``, put Mimi in ``mimi_dtype``, and switch to eval mode."""
    # nn.Module's own methods: PreTrainedModel's wrappers of `to`/`eval` are untyped.
    torch.nn.Module.to(model, device)
    torch.nn.Module.to(model.audio_encoder, mimi_dtype)
    torch.nn.Module.train(model, False)
    # Mimi caches its codebooks' embedding tables on first use; drop any made before the move.
    for module in model.audio_encoder.modules():
        if hasattr(module, "_embed"):
            module._embed = None
