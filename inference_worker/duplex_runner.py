"""The I/O-free conversational state of one session served by a frame backend.

The worker feeds commands in log order with :meth:`DuplexRunner.receive` and each tick's
output of the session's slot with :meth:`DuplexRunner.on_frame`; it drains typed events with
:meth:`DuplexRunner.events_to_send` and the audio to hand the engine with
:meth:`DuplexRunner.take_input`. Nothing here reads a clock or touches Redis or threads
(style rule 1): time is passed in as ``now``. The runner never emits a terminal event.

A full-duplex model (Moshi) listens all the time and speaks when it decides to, so its
responses are cut out of one continuous output stream (the ``audio`` turn mode):

* **Opening.** A response opens (``response.created`` .. ``response.content_part.added``,
  Realtime GA order) on the first tick whose audio is audible (RMS above -50 dBFS). Text the
  model produced before that (Moshi's text runs ahead of its audio) leads the transcript.
* **Streaming.** Every tick's audio inside the response is an ``AudioDelta`` (pcm16 24 kHz),
  pauses included; text is a ``TranscriptDelta``. Outside a response, silent output is dropped.
* **Ending.** The model's ``end_of_turn`` signal, or ``extra_body.end_of_turn_silence_ms`` of
  sustained silence (default 800 ms), completes the response.
* **response.cancel** ends the active response as ``cancelled`` (``client_cancelled``) and
  mutes the model's output until its turn is over (end of turn or sustained silence): a
  full-duplex model cannot be told to stop mid-word, but the client never hears the rest.
* **response.create** with no active response opens one at once; the model's next audible
  output fills it. If the model stays silent for 5 s the response completes empty. With a
  response active it is refused (``conversation_already_has_active_response``). Responses
  are audio only: ``output_modalities: ["text"]`` is refused.
* **Input.** Appended audio goes to the model as it arrives (a duplex model hears the user
  while it talks). ``commit`` turns the audio appended since the last commit into a user item
  (at least 100 ms, as OpenAI requires); ``clear`` also drops the audio the model has not
  consumed yet.

* **Turn detection.** With ``turn_detection`` on (``server_vad`` / ``semantic_vad``) an
  energy VAD hears the appended audio: ``speech_started`` (then, with ``interrupt_response``
  and a response active, that response ends ``cancelled`` ``turn_detected`` and the model is
  muted, as after ``response.cancel``); on ``speech_stopped`` the turn is committed as a
  manual commit would be and, with ``create_response`` and no response active, a response
  opens exactly as ``response.create`` opens one. Manual commits still work.

A backend that takes turns itself (the cascade: VAD -> ASR -> responder -> TTS) runs in the
``events`` turn mode: its ``SlotResult.events`` drive the turns instead of the audio level.
Its own ``speech_started``/``speech_stopped`` become ``input_audio_buffer.speech_started`` /
``.speech_stopped`` whatever ``turn_detection`` says (the energy VAD never runs there; the
times are the input the worker had received when the backend reported, so they run late by
the backend's detection delay). ``speech_stopped`` commits a user item (its ``transcript``
event completes it), ``response_started``/``response_done`` open and complete a response, and
``barge_in`` cancels the active one (``turn_detected``). The backend decides when it answers
and when it is interrupted, so ``create_response`` and ``interrupt_response`` are echoed but
do not change what it does.

* **Items.** ``conversation.item.create`` / ``.retrieve`` / ``.delete`` / ``.truncate`` keep
  the conversation's history (the shared conversation layer); a created message is history
  only: the model hears appended audio, never an item. Truncating the active response's item
  cancels it first, as ``response.cancel`` does (``client_cancelled``, muted);
  ``output_audio_buffer.clear`` does the same after ``output_audio_buffer.cleared``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Final, assert_never

from inference_worker.conversation import (
    Conversation,
    InputTimeline,
    ItemCommand,
    OpenResponse,
    PendingInput,
    UserItem,
    already_active,
    cancel_refusal,
    commit_too_small,
    turn_detection_of,
)
from inference_worker.frames import FrameOutput
from inference_worker.session_config import (
    MIN_COMMIT_BYTES,
    Refusal,
    apply_session_patch,
    check_session_patch,
    default_session,
    response_options,
    too_deep,
)
from inference_worker.untrusted import close_reason, describe
from inference_worker.vad import SpeechStarted, VadEvent
from store import messages as msg
from store.messages import JsonObject

__all__ = ["SILENCE_LEVEL", "DuplexRunner", "PendingInput"]

#: RMS below which a tick's output counts as silence (-50 dBFS).
SILENCE_LEVEL: Final = 10 ** (-50 / 20)
_DEFAULT_SILENCE_MS: Final = 800
_SILENCE_MS_RANGE: Final = (80, 10_000)
# A response.create the model does not fill within this long completes empty.
_REPLY_TIMEOUT_S: Final = 5.0
# Text the model produced while no response was open; bounded so silence cannot grow it.
_MAX_HELD_TEXT: Final = 2000
# The loopback's own extension keys: the base session check knows only these.
_LOOPBACK_EXTRA: Final = {"loopback_mode": "turn", "auto_response": False}


@dataclass(slots=True, kw_only=True)
class _Response:
    """The one active response and how far the model's turn has got."""

    opened: OpenResponse
    transcript: list[str] = field(default_factory=list)
    heard: bool = False  # audible output seen
    silent_run: int = 0  # consecutive silent ticks since the last audible one
    age: int = 0  # ticks since it opened


class DuplexRunner:
    """Conversational state of one session on a frame backend (see the module docstring)."""

    def __init__(self, session_id: str, *, model: str, frame_seconds: float, now: float,
                 explicit_turns: bool = False) -> None:
        """Open the runner of ``session_id`` on a backend named ``model``.

        Args:
            session_id: the session's id, reported in the session object.
            model: the backend's name, reported as the session's ``model``.
            frame_seconds: the backend's tick period (to count silence in ticks).
            now: monotonic seconds; no timed state starts here.
            explicit_turns: the backend signals turns in its events (``events`` mode).
        """
        del now
        config = default_session(session_id)
        config["model"] = model
        config["extra_body"] = {"end_of_turn_silence_ms": _DEFAULT_SILENCE_MS}
        self._conversation = Conversation(config)
        self._frame_seconds = frame_seconds
        self._explicit = explicit_turns
        self._close_reason: str | None = None
        self._input = bytearray()
        self._clear = False
        self._uncommitted = 0  # bytes appended since the last commit or clear
        self._timeline = InputTimeline()
        self._response: _Response | None = None
        # A user item added on end of speech, completed when its transcript arrives.
        self._user_item: UserItem | None = None
        self._muted = False
        self._mute_silence = 0
        self._held_text = ""
        self._held_quiet = 0  # silent ticks since the held text last grew
        self._anchor: float | None = None  # the trigger time-to-first-audio is measured from
        self._heard_input = False
        self._latencies: list[float] = []

    # ------------------------------------------------------------------ public API

    @property
    def _config(self) -> JsonObject:
        return self._conversation.config

    @property
    def close_requested(self) -> str | None:
        """The reason of the ``CloseSession`` received, or None while the session is open
        (``client_close`` for a reason that is not a short valid UTF-8 string)."""
        return self._close_reason

    @property
    def session(self) -> JsonObject:
        """A copy of the effective Realtime GA session object."""
        return copy.deepcopy(self._config)

    @property
    def responding(self) -> bool:
        """Whether a response is active."""
        return self._response is not None

    def receive(self, command: msg.Command, now: float) -> None:
        """Apply one command, in log order (``now``: monotonic seconds)."""
        if self._close_reason is not None:
            return  # after session.close every command is ignored: the session is ending
        match command:
            case msg.UpdateSession():
                self._update(command)
            case msg.AppendAudio():
                self._append(command, now)
            case msg.CommitInput():
                self._commit(command, now)
            case msg.ClearInput():
                self._input.clear()
                self._clear, self._uncommitted = True, 0
                self._timeline.reset()
                self._conversation.emit(msg.InputCleared())
            case msg.CreateResponse():
                self._create(command, now)
            case msg.CancelResponse():
                self._cancel(command)
            case msg.Heartbeat():
                self._conversation.emit(msg.HeartbeatAck())
            case msg.CloseSession():
                self._close(command)
            case msg.CreateItem() | msg.RetrieveItem() | msg.DeleteItem() | msg.TruncateItem():
                self._item_command(command)
            case msg.ClearOutputAudio():
                self._clear_output()
            case _:
                assert_never(command)

    def on_frame(self, frame: FrameOutput, now: float) -> None:
        """Map one tick's output of this session's slot to events (``now``: its arrival)."""
        if self._close_reason is not None:
            return
        if self._explicit:
            self._turn_events(frame.events, now)
        audible = bool(frame.audio) and frame.level > SILENCE_LEVEL
        if self._muted:
            self._mute_step(frame, audible)
            return
        if self._response is None:
            if not audible:
                self._hold_text(frame.text)
                return
            self._open()
        response = self._response
        assert response is not None  # opened above
        self._stream(response, frame, audible, now)
        self._maybe_finish(response, frame.events, audible)

    def take_input(self) -> PendingInput:
        """The input the engine should apply for this session now, and forget it."""
        pending = PendingInput(clear=self._clear, audio=bytes(self._input))
        self._input.clear()
        self._clear = False
        return pending

    def events_to_send(self) -> list[msg.Event]:
        """Return the events produced since the last call, in order, and forget them."""
        return self._conversation.take_events()

    def take_first_audio_latencies(self) -> list[float]:
        """Seconds from each turn's trigger to its first audible output, since the last call."""
        latencies, self._latencies = self._latencies, []
        return latencies

    def next_deadline(self) -> float | None:
        """Always None: a frame backend's runner is driven by ticks, not timers."""
        return None

    def tick(self, now: float) -> None:
        """Nothing to do (see :meth:`next_deadline`); present so drivers treat runners alike."""

    # ------------------------------------------------------------------ commands

    def _update(self, command: msg.UpdateSession) -> None:
        refusal = _check_patch(command.session, self._config)
        if refusal is not None:
            self._refuse(command.event_id, refusal)
            return
        extra = command.session.get("extra_body", {})
        rest = {k: v for k, v in command.session.items() if k != "extra_body"}
        config = apply_session_patch(rest, {**self._config, "extra_body": {}})
        config["extra_body"] = {**self._config["extra_body"], **extra}
        self._conversation.config = config
        if not self._explicit:  # an events-mode backend detects speech itself
            self._timeline.configure(turn_detection_of(config))
        self._conversation.session_updated()

    def _append(self, command: msg.AppendAudio, now: float) -> None:
        if not command.audio:
            return
        if not self._heard_input:
            self._heard_input = True
            if self._anchor is None:
                self._anchor = now  # the session's first words: the model's first reply
        self._input += command.audio
        self._uncommitted += len(command.audio)
        for event in self._timeline.feed(command.audio):
            self._on_speech(event, now)

    def _commit(self, command: msg.CommitInput, now: float) -> None:
        if self._uncommitted < MIN_COMMIT_BYTES:
            self._refuse(command.event_id, commit_too_small(self._uncommitted))
            return
        self._uncommitted = 0
        self._timeline.reset()  # a turn in progress was committed with the rest
        self._conversation.add_user_item(done=True)
        self._anchor = now

    def _on_speech(self, event: VadEvent, now: float) -> None:
        settings = self._timeline.settings
        assert settings is not None  # only a detector makes events
        if isinstance(event, SpeechStarted):
            # GA order: speech_started first, then the interrupted response's response.done.
            self._conversation.speech_started(event.audio_start_ms)
            if settings.interrupt_response and self._response is not None:
                self._finish("cancelled", "turn_detected")
                self._muted, self._mute_silence = True, 0
            return
        self._conversation.speech_stopped(event.audio_end_ms)
        # Audio after the turn's end (in the same chunk) belongs to the next turn.
        after = self._timeline.fed_bytes - self._timeline.byte_at(event.audio_end_ms)
        self._uncommitted = max(0, min(self._uncommitted, after))
        self._conversation.add_user_item(done=True)
        self._anchor = now
        if settings.create_response and self._response is None:
            self._muted = False  # as response.create: the model's next audible output fills it
            self._open()

    def _create(self, command: msg.CreateResponse, now: float) -> None:
        if self._response is not None:
            self._refuse(command.event_id, already_active(self._response.opened.id))
            return
        options = response_options(command.response, self._config)
        if isinstance(options, Refusal):
            self._refuse(command.event_id, options)
            return
        audio, metadata = options
        if not audio:
            self._refuse(command.event_id, Refusal(
                code="invalid_value", param="response.output_modalities",
                message="this model answers in audio: output_modalities must be ['audio']"))
            return
        self._muted = False  # an explicit request wants to hear the model again
        self._open(metadata)
        self._anchor = now

    def _cancel(self, command: msg.CancelResponse) -> None:
        active = self._response
        refusal = cancel_refusal(active.opened.id if active is not None else None,
                                 command.response_id)
        if refusal is not None:
            self._refuse(command.event_id, refusal)
            return
        self._cancel_active()

    def _item_command(self, command: ItemCommand) -> None:
        active = self._response
        self._conversation.item_command(
            command, active=active.opened if active is not None else None,
            cancel_active=self._cancel_active)

    def _clear_output(self) -> None:
        active = self._response
        self._conversation.output_cleared(active.opened.id if active is not None else None)
        if active is not None:
            self._cancel_active()

    def _cancel_active(self) -> None:
        """End the active response ``client_cancelled`` and mute the rest of the model's turn:
        a full-duplex model cannot be told to stop mid-word, but the client never hears it."""
        self._finish("cancelled", "client_cancelled")
        self._muted, self._mute_silence = True, 0

    def _close(self, command: msg.CloseSession) -> None:
        if self._response is not None:
            self._finish("cancelled", "client_cancelled")
        self._complete_user_item(None)
        self._input.clear()
        # The store writes the reason back as session.closed: one it cannot encode is replaced.
        self._close_reason = close_reason(command.reason)

    # ------------------------------------------------------------------ model output

    def _turn_events(self, events: dict[str, Any], now: float) -> None:
        """The ``events`` turn mode: the backend says when turns start and end."""
        error = events.get("error")
        if isinstance(error, str) and error:
            self._conversation.emit(msg.ErrorEvent(code="model_error", message=error,
                                                   error_type="server_error"))
        for key in events:  # in the order they happened: speech_started precedes barge_in
            if key == "speech_started" and events[key]:
                self._conversation.speech_started(self._timeline.fed_ms)
            elif key == "barge_in" and events[key] and self._response is not None:
                self._finish("cancelled", "turn_detected")
            elif key == "speech_stopped" and events[key]:
                self._conversation.speech_stopped(self._timeline.fed_ms)
                self._complete_user_item(None)
                self._user_item = self._conversation.add_user_item(done=False)
                self._uncommitted = 0
                self._anchor = now
        transcript = events.get("transcript")
        if isinstance(transcript, str):
            self._complete_user_item(transcript)
        if events.get("response_started"):
            self._muted = False
            if self._response is None:
                self._open()

    def _mute_step(self, frame: FrameOutput, audible: bool) -> None:
        self._mute_silence = 0 if audible else self._mute_silence + 1
        if _turn_over(frame.events) or self._mute_silence >= self._silence_ticks():
            self._muted = False

    def _hold_text(self, text: str) -> None:
        if text:
            self._held_text = (self._held_text + text)[-_MAX_HELD_TEXT:]
            self._held_quiet = 0
            return
        self._held_quiet += 1
        if not self._explicit and self._held_quiet >= self._silence_ticks():
            self._held_text = ""  # text that no speech followed was not said

    def _stream(self, response: _Response, frame: FrameOutput, audible: bool,
                now: float) -> None:
        rid, iid = response.opened.id, response.opened.item_id
        text, self._held_text = self._held_text + frame.text, ""
        if frame.audio:
            self._conversation.audio_delta(response.opened, frame.audio)
        if text:
            response.transcript.append(text)
            self._conversation.emit(msg.TranscriptDelta(response_id=rid, item_id=iid,
                                                        output_index=0, content_index=0,
                                                        delta=text))
        if audible and not response.heard and self._anchor is not None:
            self._latencies.append(max(0.0, now - self._anchor))
            self._anchor = None
        response.heard |= audible

    def _maybe_finish(self, response: _Response, events: dict[str, Any], audible: bool) -> None:
        response.age += 1
        response.silent_run = 0 if audible else response.silent_run + 1
        if _turn_over(events):
            self._finish("completed", None)
        elif self._explicit:
            return  # the backend says when its turn ends
        elif response.heard and response.silent_run >= self._silence_ticks():
            self._finish("completed", None)
        elif not response.heard and response.age * self._frame_seconds >= _REPLY_TIMEOUT_S:
            self._finish("completed", None)

    def _silence_ticks(self) -> int:
        silence_ms: int = self._config["extra_body"]["end_of_turn_silence_ms"]
        return max(1, math.ceil(silence_ms / 1000 / self._frame_seconds))

    # ------------------------------------------------------------------ responses and items

    def _open(self, metadata: dict[str, str] | None = None) -> None:
        self._complete_user_item(None)
        self._response = _Response(
            opened=self._conversation.open_response(audio=True, metadata=metadata))

    def _finish(self, status: str, reason: str | None) -> None:
        response = self._response
        assert response is not None  # callers checked
        self._response = None
        self._conversation.finish_response(response.opened, status=status, reason=reason,
                                           transcript="".join(response.transcript))

    def _complete_user_item(self, transcript: str | None) -> None:
        pending, self._user_item = self._user_item, None
        if pending is not None:
            self._conversation.complete_user_item(pending, transcript)

    def _refuse(self, client_event_id: str | None, refusal: Refusal) -> None:
        self._conversation.refuse(client_event_id, refusal)


def _turn_over(events: dict[str, Any]) -> bool:
    return bool(events.get("end_of_turn") or events.get("response_done"))


def _check_patch(patch: Any, current: JsonObject) -> Refusal | None:
    """The loopback's ``session.update`` rules, with this runner's own ``extra_body``.

    ``extra_body`` takes ``end_of_turn_silence_ms`` only (the loopback's modes mean nothing
    to a model), and responses are audio only.
    """
    if not isinstance(patch, dict):
        return Refusal(code="invalid_type", message="expected an object", param="session")
    deep = too_deep(patch, "session")
    if deep is not None:
        return deep
    extra = patch.get("extra_body", {})
    if not isinstance(extra, dict):
        return Refusal(code="invalid_type", message="expected an object",
                       param="session.extra_body")
    for key, value in extra.items():
        param = f"session.extra_body.{key}"
        if key != "end_of_turn_silence_ms":
            return Refusal(code="unknown_parameter",
                           message=f"unknown parameter {describe(key)}", param=param)
        low, high = _SILENCE_MS_RANGE
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            return Refusal(code="invalid_value", param=param,
                           message=f"must be an integer from {low} to {high}")
    rest = {k: v for k, v in patch.items() if k != "extra_body"}
    refusal = check_session_patch(rest, {**current, "extra_body": dict(_LOOPBACK_EXTRA)})
    if refusal is not None:
        return refusal
    if rest.get("output_modalities", ["audio"]) != ["audio"]:
        return Refusal(code="invalid_value", param="session.output_modalities",
                       message="this model answers in audio: output_modalities must be ['audio']")
    return None
