"""The ``duplex-gateway`` command: entry points above every layer (gateway, worker, store)."""

from __future__ import annotations

__all__: list[str] = []
