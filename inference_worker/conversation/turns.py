"""How a backend's sessions take turns, as one table: :data:`POLICIES` maps each
:class:`TurnMode` to the :class:`TurnPolicy` the conversation core follows.

The core is the same for every backend; where backends differ (who detects speech, what
ends a response, whether the model can be stopped mid-word) it reads a flag of the policy,
never a backend's name.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

__all__ = ["POLICIES", "TurnMode", "TurnPolicy"]


class TurnMode(enum.Enum):
    """How a backend's sessions take turns."""

    #: No model: a committed turn's audio is played back (or echoed as it streams).
    LOOPBACK = "loopback"
    #: A full-duplex model: responses are cut out of its output audio (Moshi, the fake).
    AUDIO = "audio"
    #: The backend signals turns itself in its events (the cascade: VAD, ASR, responder, TTS).
    EVENTS = "events"


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnPolicy:
    """What the conversation core does differently for one turn mode.

    Attributes:
        answers_turns: a response answers one committed user turn (the loopback plays it
            back), so ``response.create`` needs one (``response_create_without_input``).
        keeps_turn_audio: the core keeps the uncommitted input audio (to hand it to the
            model with the response); otherwise the model heard it already and it is counted.
        opens_on_output: the model's audible output outside a response opens one (the model
            speaks when it decides to).
        ends_on_silence: sustained silence ends a response, and a response the model leaves
            silent for :data:`~inference_worker.conversation.responses.REPLY_TIMEOUT_S` ends
            empty (the model says nothing else).
        model_detects_speech: the model reports the user's speech and turns; the energy VAD
            of ``turn_detection`` never runs.
        mutes_after_cancel: the model cannot be stopped mid-word: a cancelled response's rest
            is dropped until its turn is over.
        frames: the engine steps the model frame by frame (input goes to it as it arrives, and
            time-to-first-audio is measured).
    """

    answers_turns: bool
    keeps_turn_audio: bool
    opens_on_output: bool
    ends_on_silence: bool
    model_detects_speech: bool
    mutes_after_cancel: bool
    frames: bool


#: Every turn mode's policy.
POLICIES: Final[Mapping[TurnMode, TurnPolicy]] = MappingProxyType({
    TurnMode.LOOPBACK: TurnPolicy(
        answers_turns=True, keeps_turn_audio=True, opens_on_output=False,
        ends_on_silence=False, model_detects_speech=False, mutes_after_cancel=False,
        frames=False),
    TurnMode.AUDIO: TurnPolicy(
        answers_turns=False, keeps_turn_audio=False, opens_on_output=True,
        ends_on_silence=True, model_detects_speech=False, mutes_after_cancel=True, frames=True),
    TurnMode.EVENTS: TurnPolicy(
        answers_turns=False, keeps_turn_audio=False, opens_on_output=True,
        ends_on_silence=False, model_detects_speech=True, mutes_after_cancel=True, frames=True),
})
