"""The backends the framework tests run against, as the ``served`` fixture hands them out
(``tests/e2e/conftest.py``): the loopback of ``duplex-gateway dev``, and a cascade worker with
its offline weights (Silero, Whisper tiny.en, the echo responder, Piper) behind one gateway."""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any, Final

from inference_worker.backends.registry import CASCADE_TURN_DETECTION
from tests.worker.speech import normalize

__all__ = ["BACKENDS", "FRAMEWORK_MODELS", "SHOWN", "Served", "Shown", "says_nearly"]

#: Every backend a ``served`` test runs against, in order.
BACKENDS: Final = ("loopback", "cascade")
#: The model names the frameworks ask for by default (pipecat, LiveKit, openai-agents): the
#: deployments they run against serve their backend under these too (aliases), as an operator
#: whose clients keep a framework's defaults would configure it.
FRAMEWORK_MODELS: Final = ("gpt-realtime", "gpt-realtime-2", "gpt-realtime-2.1")


@dataclass(frozen=True, slots=True)
class Served:
    """A stack ready to serve sessions.

    Attributes:
        backend: the worker's backend, one of :data:`BACKENDS`.
        base_url: the websocket base URL the SDK takes (``ws://HOST:PORT/v1``).
    """

    backend: str
    base_url: str


@dataclass(frozen=True, slots=True)
class Shown:
    """What ``session.updated`` shows of a framework's voice, transcription and turn
    detection settings on a backend: what it really serves, whatever the framework asked for.

    Attributes:
        voice: ``audio.output.voice``.
        transcription: ``audio.input.transcription`` once a client turned it on.
        turn_detection: ``audio.input.turn_detection`` whatever was asked (None: as asked).
    """

    voice: str
    transcription: dict[str, Any] | None
    turn_detection: dict[str, Any] | None = None


#: Per backend: the loopback has no voice of its own and nothing transcribes, and it detects
#: turns as asked; the cascade speaks with Piper's one voice, transcribes with Whisper and
#: takes turns with its own Silero VAD.
SHOWN: Final = {
    "loopback": Shown(voice="marin", transcription=None),
    "cascade": Shown(voice="en_US-joe-medium", transcription={"model": "whisper-tiny.en"},
                     turn_detection=dict(CASCADE_TURN_DETECTION)),
}


def says_nearly(sentence: str, heard: str) -> bool:
    """Whether ``heard`` holds the words of ``sentence`` in order, but for at most one (Piper
    then Whisper: a word may come back inflected on a loaded machine)."""
    said, got = normalize(sentence).split(), normalize(heard).split()
    same = sum(block.size for block in SequenceMatcher(None, said, got).get_matching_blocks())
    return same >= len(said) - 1
