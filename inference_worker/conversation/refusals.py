"""Why the worker refuses a client's request: one value every refusal is, whatever decides it
(the session's rules, a format, an item, the conversation core). It becomes the ``error``
event the client gets, naming the command at fault."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Refusal"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """Why a request was refused: the OpenAI error ``code``, a message and the ``param``."""

    code: str
    message: str
    param: str | None = None
