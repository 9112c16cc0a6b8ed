"""Turn detection on a session's input: the detectors (the energy VAD, Silero) and the input
timeline that places their events on the session's audio.

Nothing is imported here: each module is imported by its own name.
"""

from __future__ import annotations

__all__: list[str] = []
