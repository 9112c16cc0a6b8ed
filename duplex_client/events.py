"""The server events the client hands out, and the marker of a resume."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RealtimeEvent", "Resumed"]


@dataclass(frozen=True, slots=True)
class RealtimeEvent:
    """One server event: its ``type``, its ``server_event_seq`` (None for connection-level
    notices such as ``session.created``) and the whole JSON object."""

    type: str
    server_event_seq: int | None
    data: dict[str, Any] = field(repr=False)

    @property
    def audio(self) -> bytes:
        """The decoded audio of a ``response.output_audio.delta``."""
        return base64.b64decode(self.data.get("delta", ""))


@dataclass(frozen=True, slots=True)
class Resumed(RealtimeEvent):
    """The marker :meth:`DuplexClient.events` yields where it resumed the session: the
    ``session.resumed`` answer (type ``session.resumed``, no ``server_event_seq``), plus how
    the client got there. The events after it continue those before it, with no gap and no
    duplicate (a gap the server cannot fill is a ``session.resync_required`` event next)."""

    #: The gateway URL the session was resumed through.
    url: str = ""
    #: Connections tried for this resume (1: the first one worked).
    attempts: int = 1
    #: What ended the previous connection: ``dropped`` (no close frame), ``closed 1012``, ...;
    #: empty for a resume the caller asked for.
    after: str = ""

    @property
    def replay_from(self) -> int:
        """The ``server_event_seq`` the replay starts at."""
        return int(self.data["replay_from"])

    @property
    def last_client_seq(self) -> int:
        """The highest ``client_seq`` the input log held; the commands after it were resent."""
        return int(self.data["last_client_seq"])

