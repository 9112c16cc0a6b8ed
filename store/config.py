"""Reading a frozen settings dataclass from ``DUPLEX_GATEWAY_*`` variables (style rule 8).

Shared by the gateway and the worker, so both read settings the same way; each process builds
its one settings object at start and passes it down, and nothing else reads ``os.environ``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, TypeVar

__all__ = ["ENV_PREFIX", "SettingsError", "from_env"]

ENV_PREFIX = "DUPLEX_GATEWAY_"
_T = TypeVar("_T")


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the variable."""


def _cast(name: str, raw: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes")
        if isinstance(default, tuple):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        return type(default)(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a valid {type(default).__name__}") from None


def from_env(cls: type[_T], environ: Mapping[str, str] | None = None, **overrides: Any) -> _T:
    """Build ``cls`` from defaults, then ``DUPLEX_GATEWAY_<FIELD>``, then explicit overrides.

    Overrides whose value is None are ignored (an unset command-line flag).

    Raises:
        SettingsError: a variable does not parse, naming it.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        name = ENV_PREFIX + f.name.upper()
        if name in env:
            values[f.name] = _cast(name, env[name], f.default)
    values.update({k: v for k, v in overrides.items() if v is not None})
    settings = cls(**values)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        value = getattr(settings, f.name)
        if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            raise SettingsError(f"{ENV_PREFIX}{f.name.upper()} must not be negative")
    return settings
