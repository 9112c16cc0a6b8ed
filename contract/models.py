"""Model names: what a worker serves, what a client asks for, and the fleet seen per model.

A worker serves one or more model names (``SERVED_MODEL_NAMES``, like vLLM's
``--served-model-name``: the first is its own name, the others aliases; by default its
backend's name) and publishes them when it registers. A client names the model it wants (the
URL's ``?model=``, or its first ``session.update``); placement puts the session on a worker
that serves that name, and the open script checks the name again in the worker's own slot, so
a stale view of the fleet never places a session on a worker of another model.

The fleet per model (:func:`store.directory.models_of_fleet`) is derived from the worker loads
placement already reads; nothing is stored per model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

__all__ = [
    "MAX_MODEL_NAMES",
    "MODEL_NAME_PATTERN",
    "decode_models",
    "encode_models",
    "is_model_name",
]

#: A model name: what vLLM and OpenAI names look like (``moshi``, ``gpt-realtime``,
#: ``kyutai/moshiko-pytorch-bf16``, ``model:v2``), with nothing a URL, a label or a log line
#: would have to quote.
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"
_MODEL_NAME = re.compile(MODEL_NAME_PATTERN)
#: The most names one worker may serve: they are read with every placement.
MAX_MODEL_NAMES = 16


def is_model_name(value: Any) -> bool:
    """Whether ``value`` is a well-formed model name."""
    return isinstance(value, str) and _MODEL_NAME.fullmatch(value) is not None


def encode_models(names: Sequence[str]) -> str:
    """A worker's served names as its record holds them: a JSON array, first name first.

    Raises:
        ValueError: none, too many, a malformed name, or one named twice.
    """
    if not 1 <= len(names) <= MAX_MODEL_NAMES:
        raise ValueError(f"a worker serves 1 to {MAX_MODEL_NAMES} model names, not {len(names)}")
    for name in names:
        if not is_model_name(name):
            raise ValueError(f"not a model name: {name!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"a model name is given twice: {', '.join(names)}")
    return json.dumps(list(names), separators=(",", ":"))


def decode_models(raw: bytes | None) -> tuple[str, ...]:
    """A worker record's ``models`` field; () when it has none or it is not a list of names
    (only our workers write it: such a worker then serves no name a client can ask for)."""
    if not raw:
        return ()
    try:
        decoded = json.loads(raw)
    except ValueError:
        return ()
    if not isinstance(decoded, list) or not all(is_model_name(name) for name in decoded):
        return ()
    return tuple(decoded)
