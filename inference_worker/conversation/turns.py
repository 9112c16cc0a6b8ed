"""How a backend's sessions take turns, as one table: :data:`POLICIES` maps each
:class:`TurnMode` to the :class:`TurnPolicy` the conversation core follows.

The core is the same for every backend; where backends differ (who detects speech, what
ends a response, whether the model can be stopped mid-word) it reads a flag of the policy,
never a backend's name.

The seed's turn vocabulary lives here too: the :class:`TurnState` a ``turn.event`` reports,
the ``turn.signal`` events that move it (:data:`SIGNALLED`), why a turn gets no spoken answer
(:class:`ListenReason`) and the seed's cancel reasons where they differ from GA's
(:class:`SeedReason`). The turn state is a label the core reports, not a machine it checks:
like the seed, each step of a turn sets it, and a client's signal may set it too.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

__all__ = [
    "POLICIES",
    "SIGNALLED",
    "ListenReason",
    "SeedReason",
    "TurnMode",
    "TurnPolicy",
    "TurnSignal",
    "TurnState",
]


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


class TurnState(enum.StrEnum):
    """Where the session's turn is (the seed's ``turn_state``)."""

    IDLE = "idle"
    #: The client is sending speech (an append not declared silence).
    USER_SPEAKING = "user_speaking"
    #: A user turn was committed; no response has opened for it yet.
    USER_COMMITTED = "user_committed"
    #: A response is open; the model has not made a sound in it yet.
    ASSISTANT_GENERATING = "assistant_generating"
    #: The response's audible output is flowing.
    ASSISTANT_PLAYING = "assistant_playing"
    #: The last response was cancelled (a barge-in, a cancel, a cleared output).
    BARGE_IN = "barge_in"


class TurnSignal(enum.StrEnum):
    """The seed's turn-event names a ``turn.signal`` may carry (any other name is echoed)."""

    USER_STARTED = "user_started"
    USER_COMMITTED = "user_committed"
    ASSISTANT_STARTED = "assistant_started"
    ASSISTANT_DONE = "assistant_done"
    BARGE_IN = "barge_in"
    PLAYBACK_ACK = "playback_ack"
    TIMEOUT = "timeout"
    CLOSE = "close"


#: The turn state a signal sets, as the seed's does; the other signals leave it.
SIGNALLED: Final[Mapping[str, TurnState]] = MappingProxyType({
    TurnSignal.USER_STARTED: TurnState.USER_SPEAKING,
    TurnSignal.USER_COMMITTED: TurnState.USER_COMMITTED,
    TurnSignal.ASSISTANT_STARTED: TurnState.ASSISTANT_GENERATING,
    TurnSignal.ASSISTANT_DONE: TurnState.IDLE,
    TurnSignal.BARGE_IN: TurnState.BARGE_IN,
})


class ListenReason(enum.StrEnum):
    """Why a turn gets no spoken answer (``response.listen``'s reason, the seed's words)."""

    #: A commit the client declared silence (``is_speech: false``).
    SILENCE_OR_NOISE = "silence_or_noise"
    #: A turn whose appends said ``force_listen``: the model is told to listen, and does.
    MODEL_LISTEN = "model_listen"
    #: A response ended without a sound from the model.
    WITHOUT_OUTPUT = "model_turn_completed_without_output"


class SeedReason(enum.StrEnum):
    """The seed's cancel reasons where GA names the cancel otherwise (``response.done``'s
    ``status_details.reason`` stays GA's)."""

    #: ``barge_in`` and ``input.cancel`` (GA: ``turn_detected``, ``client_cancelled``).
    BARGE_IN = "barge_in"
    #: ``output_audio_buffer.clear`` (GA: ``client_cancelled``).
    OUTPUT_AUDIO_BUFFER_CLEAR = "output_audio_buffer_clear"
