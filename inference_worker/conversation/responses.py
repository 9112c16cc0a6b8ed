"""One session's responses: the response machine and the output gate, the model's output
streaming into the active response, when that response ends, and the mute after a cancel.

The conversation core owns the user's side (input, turn detection, items) and decides when a
response opens or is cancelled; :class:`Responses` keeps the one active response and what the
model's output does to it, the same for every backend, following the session's
:class:`~inference_worker.conversation.turns.TurnPolicy`:

* Every output inside a response is an audio delta, pauses included; text is a transcript
  delta. Where the model speaks when it decides to, its first audible output outside a
  response opens one, and text it produced before that leads the transcript.
* The model's end of turn completes the response, as does (where the policy says) sustained
  silence of ``extra_body.end_of_turn_silence_ms``; a response the model neither speaks in nor
  takes up within :data:`REPLY_TIMEOUT_S` completes empty.
* A model that cannot stop mid-word is muted when its response is cancelled, until its turn
  is over: the client never hears the rest.
* The seed's decisions: ``response.speak`` just before a response's first audible output;
  ``response.listen`` naming a response that completes without a sound (its ``response.done``
  follows). The seed's turn state (:attr:`Responses.turn`) follows the response's steps.

Every move of the response machine and the gate goes through
:data:`~inference_worker.conversation.states.TRANSITIONS` (an illegal one raises). Pure: no
I/O, no clock (``now`` is passed in).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from contract import messages as msg
from contract.messages import JsonObject
from contract.reasons import CloseReason
from inference_worker.conversation.history import Conversation, OpenResponse
from inference_worker.conversation.model_port import ModelPort
from inference_worker.conversation.objects import CancelReason, ResponseStatus
from inference_worker.conversation.playback import Ledger, PlaybackLedgers
from inference_worker.conversation.refusals import Refusal, RefusalCode
from inference_worker.conversation.reports import Output
from inference_worker.conversation.states import (
    GateState,
    ResponseState,
    Trigger,
    move,
    transition,
)
from inference_worker.conversation.turns import ListenReason, TurnPolicy, TurnState
from inference_worker.untrusted import describe

__all__ = ["REPLY_TIMEOUT_S", "ActiveResponse", "Responses", "ResponsesState"]

#: A response the model leaves silent this long completes empty (``ends_on_silence``).
REPLY_TIMEOUT_S: Final = 5.0
# Where a profile says nothing of it: the sustained silence that ends the model's turn.
_DEFAULT_SILENCE_MS: Final = 800
# Text the model produced while no response was open; bounded so silence cannot grow it.
_MAX_HELD_TEXT: Final = 2000
# The response states in which a response is active.
_ACTIVE: Final = frozenset({ResponseState.OPEN, ResponseState.SPEAKING})


@dataclass(slots=True, kw_only=True)
class ActiveResponse:
    """The one active response and how far the model's turn has got."""

    opened: OpenResponse
    spontaneous: bool  # the model opened it (not response.create, not an automatic answer)
    adopted: bool = False  # the model said it started its turn in it (it will end it)
    transcript: list[str] = field(default_factory=list)
    silent_run: int = 0  # consecutive silent outputs since the last audible one
    age: int = 0  # outputs since it opened


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponsesState:
    """What a checkpoint keeps of the response side between responses: the output gate, the
    seed's turn state, the mute's and the held text's counts, the playback ledgers."""

    gate: GateState
    turn: TurnState
    mute_silence: int
    held_text: str
    held_quiet: int
    ledgers: tuple[Ledger, ...]


class Responses:
    """The response side of one session (see the module docstring).

    Args:
        conversation: the session's history, which emits the response events.
        model: the session's model (told to stop on a cancel).
        policy: how the backend's sessions take turns.
        frame_seconds: how long one model output lasts (silence is counted in outputs).
        on_open: called before a response opens (the core completes a pending user item).
        on_end: called after a response ended (the core starts the idle timeout).
    """

    __slots__ = ("_ack_only", "_conversation", "_frame_seconds", "_held_quiet", "_held_text",
                 "_latencies", "_ledgers", "_model", "_mute_silence", "_on_end", "_on_open",
                 "_policy", "_silence_outputs", "anchor", "current", "gate", "state", "turn")

    def __init__(self, conversation: Conversation, model: ModelPort, policy: TurnPolicy,
                 frame_seconds: float, *, on_open: Callable[[], None],
                 on_end: Callable[[], None]) -> None:
        self._conversation = conversation
        self._model = model
        self._policy = policy
        self._frame_seconds = frame_seconds
        self._on_open = on_open
        self._on_end = on_end
        self.state = ResponseState.IDLE
        self.gate = GateState.LIVE
        self.current: ActiveResponse | None = None
        #: The seed's turn state: set here by the response's steps, by the core by the user's.
        self.turn = TurnState.IDLE
        #: The trigger time-to-first-audio is measured from (None: nothing to measure).
        self.anchor: float | None = None
        self._mute_silence = 0
        self._held_text = ""
        self._held_quiet = 0  # silent outputs since the held text last grew
        self._latencies: list[float] = []
        self._ledgers = PlaybackLedgers()
        # Silent outputs in a row that end the model's turn: read once per output, so counted
        # on each configure, not per output.
        self._silence_outputs = 1
        self._ack_only = False  # playback_commit_policy ack_only

    @property
    def active(self) -> bool:
        """Whether a response is active (opened and not ended)."""
        return self.state in _ACTIVE

    @property
    def active_id(self) -> str | None:
        """The active response's id (None: none is active)."""
        return None if self.current is None else self.current.opened.id

    def configure(self, config: JsonObject) -> None:
        """The session's configuration changed: count sustained silence by its
        ``end_of_turn_silence_ms``."""
        silence_ms: int = config["extra_body"].get("end_of_turn_silence_ms", _DEFAULT_SILENCE_MS)
        self._silence_outputs = max(1, math.ceil(silence_ms / 1000 / self._frame_seconds))
        self._ack_only = config.get("playback_commit_policy") == "ack_only"

    def snapshot(self) -> ResponsesState:
        """The response side as a checkpoint keeps it (no response active: its caller's
        check)."""
        return ResponsesState(gate=self.gate, turn=self.turn, mute_silence=self._mute_silence,
                              held_text=self._held_text, held_quiet=self._held_quiet,
                              ledgers=self._ledgers.snapshot())

    def restore(self, state: ResponsesState) -> None:
        """Continue from ``state``, idle (the trigger time of the first-audio latency is not
        kept: it is a clock reading of the process that took it)."""
        self.gate, self.turn = state.gate, state.turn
        self._mute_silence, self._held_text = state.mute_silence, state.held_text
        self._held_quiet = state.held_quiet
        self._ledgers.restore(state.ledgers)

    def take_latencies(self) -> list[float]:
        """Seconds from each turn's trigger to its first audible output, since the last call."""
        latencies, self._latencies = self._latencies, []
        return latencies

    def move_gate(self, trigger: Trigger) -> None:
        """Move the output gate (an illegal move raises)."""
        self.gate = move(self.gate, trigger)

    def _move(self, trigger: Trigger) -> None:
        self.state = move(self.state, trigger)

    # ------------------------------------------------------------------ opening and ending

    def open(self, *, audio: bool, metadata: dict[str, str] | None, spontaneous: bool,
             output: JsonObject | None = None, out_of_band: bool = False) -> ActiveResponse:
        """Open a response (``response.created`` .. ``response.content_part.added``)."""
        self._on_open()
        self._move(Trigger.CREATE)
        response = ActiveResponse(
            opened=self._conversation.open_response(audio=audio, metadata=metadata,
                                                    output=output, out_of_band=out_of_band),
            spontaneous=spontaneous)
        self.current = response
        opened = response.opened
        self._ledgers.open(opened.id, opened.item_id)
        self.turn = TurnState.ASSISTANT_GENERATING
        return response

    def model_started(self) -> None:
        """The model said it started its turn: it fills the open response, or opens one."""
        self.move_gate(Trigger.CREATE)
        if self.current is None:
            self.open(audio=True, metadata=None, spontaneous=True)
        else:
            self.current.adopted = True

    def cancellable(self) -> OpenResponse | None:
        """The active response, when it may be cancelled now."""
        active = self.current
        if active is None or transition(self.state, Trigger.CANCEL) is None:
            return None
        return active.opened

    def cancel(self, reason: CancelReason, seed_reason: str | None = None) -> None:
        """End the active response ``cancelled`` for ``reason`` (``seed_reason``: the seed's
        name for it, where it differs), and stop the model (or, where it cannot stop
        mid-word, mute the rest of its turn)."""
        self.end(Trigger.CANCEL, ResponseStatus.CANCELLED, reason, seed_reason)
        self.stop_model()

    def lose(self) -> None:
        """End the active response, if any, ``failed`` with error code ``worker_lost`` (its
        worker was lost while it played: the client heard part of it), and stop the model."""
        if self.cancellable() is not None:
            self.end(Trigger.CANCEL, ResponseStatus.FAILED, CloseReason.WORKER_LOST)
            self.stop_model()

    def stop_model(self) -> None:
        """Tell the model to stop its response; one that cannot stop mid-word is muted for
        the rest of its turn."""
        self._model.stop()
        if self._policy.mutes_after_cancel:
            self.move_gate(Trigger.CANCEL)
            self._mute_silence = 0

    def end(self, trigger: Trigger, status: ResponseStatus, reason: str | None,
            seed_reason: str | None = None) -> None:
        """End the active response with ``status`` (``reason``: its ``status_details``;
        ``seed_reason``: the seed's name for a cancel's, where it differs)."""
        response = self.current
        assert response is not None  # callers checked
        # The model never made a sound in it: the seed's listen decision ends it.
        listen = (ListenReason.WITHOUT_OUTPUT
                  if status is ResponseStatus.COMPLETED and self.state is ResponseState.OPEN
                  else None)
        self._move(trigger)
        self.current = None
        self.turn = TurnState.BARGE_IN if status is ResponseStatus.CANCELLED else TurnState.IDLE
        self._conversation.finish_response(response.opened, status=status, reason=reason,
                                           transcript="".join(response.transcript),
                                           seed_reason=seed_reason, listen=listen,
                                           listen_epoch=self._model.epoch if listen else 0)
        self._on_end()
        # ack_only (the seed's playback_commit_policy): a completed answer too keeps only what
        # the client acknowledged, as an interrupted one does.
        ledger = self._ledgers.ended(response.opened.id,
                                     interrupted=status is not ResponseStatus.COMPLETED
                                     or self._ack_only)
        if ledger is not None and ledger.heard_ms is not None:
            # Only what the client acknowledged hearing stays in the history.
            self._conversation.keep_heard(ledger.item_id, ledger.heard_ms)

    def close(self) -> None:
        """``session.close``: the active response ends cancelled, and both machines close."""
        if self.active:
            self.end(Trigger.CLOSE, ResponseStatus.CANCELLED, CancelReason.CLIENT_CANCELLED)
            self._model.stop()
        else:
            self._move(Trigger.CLOSE)
        self.move_gate(Trigger.CLOSE)
        self.turn = TurnState.IDLE

    def clear_refusal(self, response_id: str | None) -> Refusal | None:
        """Why ``output_audio_buffer.clear`` naming ``response_id`` is refused (None: it is
        not): it must name the response playing, or with none active the newest one (whose
        audio the client may still be playing)."""
        active = self.current.opened.id if self.current is not None else None
        if response_id is None or response_id == (active or self._conversation.last_response_id):
            return None
        return Refusal(code=RefusalCode.RESPONSE_CANCEL_NOT_ACTIVE, param="response_id",
                       message=f"Clearing failed: {describe(response_id)} is not the response"
                       " playing")

    def acknowledge(self, command: msg.AckPlayback) -> Ledger | Refusal:
        """``playback.ack``: move the response's ledger (a refusal when it cannot)."""
        active = self.current.opened.id if self.current is not None else None
        return self._ledgers.acknowledge(command, active)

    # ------------------------------------------------------------------ the model's output

    def on_output(self, output: Output, now: float) -> None:
        """One output of the model: into the active response (or one it opens), into the held
        text, or muted."""
        if self.gate is GateState.MUTED:
            self._mute_silence = 0 if output.audible else self._mute_silence + 1
            if self._mute_silence >= self._silence_outputs:
                self.move_gate(Trigger.TURN_OVER)
            return
        response = self.current
        if response is None:
            if not (self._policy.opens_on_output and output.audible):
                self._hold_text(output.text)
                return
            response = self.open(audio=True, metadata=None, spontaneous=True)
        self._stream(response, output, now)
        response.age += 1
        response.silent_run = 0 if output.audible else response.silent_run + 1
        if self._over(response):
            self.end(Trigger.FINISH, ResponseStatus.COMPLETED, None)

    def on_turn_end(self) -> None:
        """The model's turn is over: the mute lifts, or the active response completes."""
        if self.gate is GateState.MUTED:
            self.move_gate(Trigger.TURN_OVER)
        elif self.active:
            self.end(Trigger.FINISH, ResponseStatus.COMPLETED, None)

    def _over(self, response: ActiveResponse) -> bool:
        """Whether the response ends by itself: after sustained silence where the policy ends
        turns so, or left unfilled: a response a client (or turn detection) opened that the
        model neither spoke in nor took up within :data:`REPLY_TIMEOUT_S` completes empty,
        so no response waits forever on a model with nothing to say (the cascade answers
        speech only)."""
        if self.state is ResponseState.SPEAKING:
            return (self._policy.ends_on_silence
                    and response.silent_run >= self._silence_outputs)
        unfilled = not (response.spontaneous or response.adopted)
        return (self._policy.frames and unfilled
                and response.age * self._frame_seconds >= REPLY_TIMEOUT_S)

    def _hold_text(self, text: str) -> None:
        if text:
            self._held_text = (self._held_text + text)[-_MAX_HELD_TEXT:]
            self._held_quiet = 0
            return
        self._held_quiet += 1
        if self._policy.ends_on_silence and self._held_quiet >= self._silence_outputs:
            self._held_text = ""  # text that no speech followed was not said

    def _stream(self, response: ActiveResponse, output: Output, now: float) -> None:
        rid, iid = response.opened.id, response.opened.item_id
        text, self._held_text = self._held_text + output.text, ""
        speak_epoch: int | None = None
        if output.audible and self.state is ResponseState.OPEN:
            # The seed's speak decision rides the first audible audio.
            speak_epoch = self._model.epoch
            self.turn = TurnState.ASSISTANT_PLAYING
        if output.audio:
            self._conversation.audio_delta(response.opened, output.audio, speak_epoch)
            self._ledgers.generated(rid, len(output.audio))
        if text:
            response.transcript.append(text)
            self._conversation.emit(msg.TranscriptDelta(response_id=rid, item_id=iid,
                                                        output_index=0, content_index=0,
                                                        delta=text))
        if output.audible:
            first = self.state is ResponseState.OPEN
            self._move(Trigger.AUDIBLE)
            if first and self.anchor is not None and self._policy.frames:
                self._latencies.append(max(0.0, now - self.anchor))
                self.anchor = None
