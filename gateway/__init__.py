"""Stateless websocket gateways speaking the OpenAI Realtime protocol plus duplex extensions."""

from __future__ import annotations

__all__: list[str] = []
