"""The conversation core: one session's conversational state, the same for every backend
(the seed's ``DuplexSessionRunner``).

It is I/O-free (style rule 1): the worker's driver feeds it commands in log order
(:meth:`ConversationCore.receive`), what the model did (:meth:`ConversationCore.on_frame`
per engine tick; :meth:`ConversationCore.tick` for the loopback's own clock) and the time
(``now``, monotonic seconds), and drains the events to send
(:meth:`ConversationCore.events_to_send`) and what the engine must do
(:meth:`ConversationCore.take_input`). It imports no asyncio, Redis, Starlette or torch, and
never emits ``session.closed`` / ``session.expired`` (a store script writes the terminal).

A backend reports what its model did (:mod:`~inference_worker.conversation.reports`) and
obeys the core (:class:`~inference_worker.conversation.model_port.ModelPort`), which decides
every event, following the session's :class:`~inference_worker.conversation.turns.TurnPolicy`:

* **Input.** Appended audio goes to the model as it arrives (a duplex model hears the user
  while it talks; the loopback's model echoes it in stream mode). ``commit`` turns the audio
  appended since the last commit into a user item (at least 100 ms, as OpenAI requires);
  ``clear`` drops it, and the audio the model has not consumed yet.
* **Turn detection.** With ``turn_detection`` on, a detector hears the input and its speech
  start and stop become events, commits and answers, as the manual ones would; a backend that
  detects speech itself (the cascade) reports them instead; ``idle_timeout_ms`` answers a
  silence (:mod:`~inference_worker.conversation.server_turns`,
  :mod:`~inference_worker.conversation.model_turns`).
* **The seed's options.** A commit's ``create_response`` and ``is_speech`` (a silent commit
  is answered by ``response.listen``), an append's hints
  (:mod:`~inference_worker.conversation.user_input`), ``response.speak`` /
  ``response.listen``, ``turn.event``, and the seed's cancel reason beside GA's.
* **Responses.** ``response.create`` opens one at once, in GA order, and the model fills it
  (:mod:`~inference_worker.conversation.responses`); its options are honoured or refused.
* **Cancel.** ``response.cancel``, an interrupting speech start, ``output_audio_buffer.clear``
  and a truncation of the active item end it ``cancelled`` and stop the model; each stop
  advances the epoch, and a frame of an older epoch is fenced. ``output.backpressure`` ends
  it ``failed`` the same way, as does a lost worker's take-over.
* **Playback, formats, items.** ``playback.ack`` moves the response's ledger
  (:mod:`~inference_worker.conversation.playback`: an interrupted answer keeps only what was
  acknowledged); G.711 is decoded at the edge and output encoded per response;
  ``conversation.item.*`` keep the history (a created user message is the turn the next
  ``response.create`` answers, where responses answer turns). At a safe point the state is
  data another worker's core continues from (:mod:`~inference_worker.conversation.checkpoint`).

Every move of the input (:mod:`~inference_worker.conversation.user_input`), response and gate
machines is looked up in :data:`~inference_worker.conversation.states.TRANSITIONS`; an illegal
move raises :class:`~inference_worker.conversation.states.IllegalTransition`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final, TypeAlias, assert_never

from contract import messages as msg
from contract.messages import JsonObject
from inference_worker.audio_formats import AppendDecoder
from inference_worker.audio_frames import FrameOutput
from inference_worker.conversation.checkpoint import CoreState
from inference_worker.conversation.history import Conversation, ItemCommand
from inference_worker.conversation.items import Item
from inference_worker.conversation.model_port import ModelPort, PendingInput
from inference_worker.conversation.model_turns import ModelTurns
from inference_worker.conversation.objects import CancelReason, ResponseStatus
from inference_worker.conversation.playback import signalled_ack
from inference_worker.conversation.profiles import BYTES_PER_SECOND, SessionProfile, default_session
from inference_worker.conversation.refusals import (
    CREATE_WITHOUT_INPUT,
    TEXT_INPUT_REFUSAL,
    Refusal,
    already_active,
    cancel_refusal,
    commit_too_small,
)
from inference_worker.conversation.reports import (
    BargedIn,
    Failed,
    Output,
    Report,
    ResponseStarted,
    TurnEnded,
    UserSpeechStarted,
    UserSpeechStopped,
    UserTranscript,
    UserTranscriptFailed,
)
from inference_worker.conversation.response_options import parse_response_options
from inference_worker.conversation.responses import Responses
from inference_worker.conversation.seed_settings import SeedSettings, SlotConfig
from inference_worker.conversation.server_turns import ServerTurns
from inference_worker.conversation.session_update import apply_session_patch, check_session_patch
from inference_worker.conversation.states import Trigger, transition
from inference_worker.conversation.turns import (
    SIGNALLED,
    ListenReason,
    SeedReason,
    TurnPolicy,
    TurnSignal,
    TurnState,
)
from inference_worker.conversation.user_input import UserInput, UserTurn
from inference_worker.conversation.video import VideoGate
from inference_worker.turn_detection.timeline import InputTimeline, turn_detection_of
from inference_worker.turn_detection.vad import EnergyVad, Vad, VadConfig
from inference_worker.untrusted import close_reason

__all__ = ["COMMANDS", "ConversationCore"]

# What the model says (fenced after a stop), as opposed to what it heard of the user.
_MODEL_SPEECH: Final = (Output, ResponseStarted, TurnEnded, BargedIn)


class ConversationCore:
    """One session's conversation, on any backend (see the module docstring).

    Args:
        session_id: the session's id, reported in its session object.
        model: the session's model.
        profile: what the backend's sessions can be (their session object's rules).
        policy: how the backend's sessions take turns.
        frame_seconds: how long one model output lasts (silence is counted in outputs).
        detector: makes the turn detector of ``turn_detection`` (the energy VAD by default).
    """

    def __init__(self, session_id: str, *, model: ModelPort, profile: SessionProfile,
                 policy: TurnPolicy, frame_seconds: float,
                 detector: Callable[[VadConfig], Vad] = EnergyVad) -> None:
        config = default_session(session_id, profile)
        self._conversation = Conversation(config)
        self._profile = profile
        self._model = model
        self._policy = policy
        self._frame_seconds = frame_seconds
        self._responses = Responses(self._conversation, model, policy, frame_seconds,
                                    on_open=lambda: self._model_turns.complete(None),
                                    on_end=lambda: self._server_turns.response_ended())
        self._input = UserInput(keep=policy.keeps_turn_audio)
        # The client's audio -> pcm16 24 kHz.
        self._decoder = AppendDecoder(self._conversation.input_format)
        self._timeline = InputTimeline(detector)
        self._model_turns = ModelTurns(self._conversation, self._responses, self._input,
                                       self._timeline)
        if not policy.model_detects_speech:  # a new session may start with server_vad on
            self._timeline.configure(turn_detection_of(config))
        self._server_turns = ServerTurns(
            self._conversation, self._responses, self._input, self._timeline,
            lambda audio, now, respond: self._commit_turn(audio, now, respond=respond))
        self._unanswered: UserTurn | None = None  # answers_turns: the turn to answer next
        self._heard_input = False
        self._video = VideoGate(sees=profile.sees_video)
        self._close_reason: str | None = None
        self._seed = SeedSettings(profile.config)  # the seed's settings and refusals
        self._responses.configure(config)
        model.configure(config)

    def name(self, model: str) -> None:
        """Name the session's ``model`` (its client's name) before any command."""
        self._conversation.config["model"] = model

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
    def active_response(self) -> str | None:
        """The active response's id (None: none is active)."""
        return self._responses.active_id

    def lose_response(self) -> None:
        """End the active response ``failed`` ``worker_lost`` (``Responses.lose``)."""
        self._responses.lose()

    @property
    def history(self) -> list[Item]:
        """The conversation's items, in order, as the history holds them."""
        return self._conversation.items

    def history_item(self, item_id: str) -> Item | None:
        """The item ``item_id`` as the history holds it (None: not in the conversation)."""
        return self._conversation.item(item_id)

    @property
    def input_audio(self) -> tuple[int, int]:
        """Bytes of input audio heard, and how many of the newest a restore needs back."""
        return self._input.heard, self._input.kept

    @property
    def epoch(self) -> int:
        """How many times the model was told to stop (a frame of an older epoch is fenced)."""
        return self._model.epoch

    def receive(self, command: msg.Command, now: float) -> None:
        """Apply one command, in log order (``now``: monotonic seconds)."""
        if self._close_reason is not None:  # after session.close every command is ignored
            return
        COMMANDS[type(command)](self, command, now)
        self._drain_model(now)

    def on_frame(self, frame: FrameOutput, now: float) -> None:
        """One engine tick's output of this session's slot (``now``: its arrival). A frame of
        an older epoch than the model's (stepped before the engine applied the last stop) is
        fenced: only what it heard of the user (speech, transcript) and its failures count."""
        if self._close_reason is not None:
            return
        reports = frame.all_reports()
        if frame.epoch < self._model.epoch:
            reports = [r for r in reports if not isinstance(r, _MODEL_SPEECH)]
        self._model_turns.input_ms = frame.input_ms
        self._on_reports(reports, now)

    def tick(self, now: float) -> None:
        """Collect what the model did by ``now`` (the loopback's paced playback)."""
        if self._close_reason is None:
            self._drain_model(now)

    def next_deadline(self) -> float | None:
        """When :meth:`tick` next has work to do, or None when nothing is scheduled."""
        return None if self._close_reason is not None else self._model.next_deadline()

    def events_to_send(self) -> list[msg.Event]:
        """Return the events produced since the last call, in order, and forget them."""
        return self._conversation.take_events()

    def take_input(self) -> PendingInput:
        """What the engine must do for this session's slot now; forgets it."""
        return self._model.take_input()

    def checkpoint(self) -> CoreState | None:
        """The state another core continues from; None off a safe point (``checkpoint.py``)."""
        timeline, model = self._timeline.place, self._model.checkpoint()
        if (timeline is None or model is None or self._close_reason is not None
                or not self._conversation.quiet or self._responses.current is not None
                or self._model_turns.awaiting_transcript):
            return None
        return CoreState(
            history=self._conversation.snapshot(), responses=self._responses.snapshot(),
            buffer=self._input.snapshot(), model=model, timeline=timeline,
            turn_start_ms=self._server_turns.turn_start_ms,
            idle_from_ms=self._server_turns.idle_from_ms,
            model_input_ms=self._model_turns.input_ms, heard_input=self._heard_input,
            video_refused=self._video.refused, seed_opened=self._seed.opened,
            seed_spoke=self._seed.spoke, ref_audio=self._seed.ref_audio,
            unanswered=self._unanswered)

    def restore(self, state: CoreState, buffered: bytes = b"") -> None:
        """Continue from ``state`` (another core's :meth:`checkpoint`) on a fresh core of the
        same backend; ``buffered``: the input buffer's audio where the policy keeps it."""
        self._conversation.restore(state.history)
        self._responses.restore(state.responses)
        self._input.restore(state.buffer, buffered)
        self._server_turns.restore(state.turn_start_ms, state.idle_from_ms)
        self._model_turns.input_ms, self._heard_input = state.model_input_ms, state.heard_input
        self._unanswered = state.unanswered
        self._video.restore(refused=state.video_refused)
        self._model.restore(state.model)
        self._configure(self._seed.restore(opened=state.seed_opened, spoke=state.seed_spoke,
                                           ref_audio=state.ref_audio, config=self._config))
        self._timeline.resume(state.timeline)

    def take_first_audio_latencies(self) -> list[float]:
        """Seconds from each turn's trigger to its first audible output, since the last call."""
        return self._responses.take_latencies()

    # ------------------------------------------------------------------ commands

    def _update(self, command: msg.UpdateSession) -> None:
        # session.update: all or nothing, answered by session.updated with the full object.
        refusal = self._patch_refusal(command.session)
        if refusal is not None:
            self._refuse(command.event_id, refusal)
            return
        self._conversation.config = self._patched(command.session)
        self._configure(self._seed.applied(command.session, self._config))
        self._conversation.session_updated()

    def _configure(self, slot: SlotConfig) -> None:
        """Every part follows the session object; the model's slot gets ``slot``."""
        self._decoder.configure(self._conversation.input_format)
        if not self._policy.model_detects_speech:
            self._timeline.configure(turn_detection_of(self._config))
        self._responses.configure(self._config)
        self._model.configure(self._config)
        self._model.configure_slot(slot)

    def _append(self, command: msg.AppendAudio, now: float) -> None:
        audio = self._decoder.decode(command.audio, command.format, command.sample_rate_hz)
        if isinstance(audio, Refusal):
            self._refuse(command.event_id, audio)
            return
        video: tuple[bytes, ...] = ()
        if command.video_frames:  # most appends carry none: no call for them
            video, refusal = self._video.admit(command.video_frames,
                                               with_audio=bool(command.audio))
            if refusal is not None:
                self._refuse(command.event_id, refusal)
        if not audio:
            return  # nothing to buffer or hear
        if not self._heard_input:
            self._heard_input = True
            if self._responses.anchor is None:
                self._responses.anchor = now  # the session's first words: the model's first reply
        meaning = self._input.append(audio, command)
        if meaning.barge_in and self._responses.cancellable() is not None:
            # The client says its user talks over the answer: the seed's overlap barge-in.
            self._responses.cancel(CancelReason.TURN_DETECTED, SeedReason.BARGE_IN)
        if meaning.speech is not False:
            self._responses.turn = TurnState.USER_SPEAKING
        self._model.hear(audio, video)
        self._drain_model(now)  # an echo answers at once, before the turn detector's events
        self._server_turns.hear(audio, now)

    def _commit(self, command: msg.CommitInput, now: float) -> None:
        """``is_speech: false``, or appends that all said so, make a silent commit;
        ``create_response`` answers the turn or not whatever the session says. ``final`` is
        the seed's: its released server seals the turn on every commit, and so does this."""
        if self._input.silent(command.is_speech):
            self._silent_commit()
            return
        if not self._input.committable:
            buffered_ms = self._input.size * 1000 / BYTES_PER_SECOND
            self._refuse(command.event_id, commit_too_small(buffered_ms))
            return
        audio = self._input.commit()
        self._timeline.reset()  # a turn in progress was committed with the rest
        asked = command.create_response
        self._commit_turn(audio, now, respond=self._model.auto_respond if asked is None else asked,
                          asked=command if asked else None)

    def _silent_commit(self) -> None:
        """A turn the client declared silence: its audio is dropped, its user item's commit
        says so, and no response follows: the seed's listen decision instead."""
        self._input.clear()
        self._timeline.reset()
        self._model.forget_input()
        self._conversation.add_user_item(
            done=True, silent=True, listen=ListenReason.SILENCE_OR_NOISE, listen_epoch=self.epoch)

    def _commit_turn(self, audio: bytes, now: float, *, respond: bool,
                     asked: msg.CommitInput | None = None) -> None:
        """The user item of a committed turn (with the transcript its appends gave), then its
        answer when ``respond`` and idle, unless its appends said ``force_listen`` and the
        commit did not ask for one (``asked``): the seed's listen decision instead. A commit
        that asked while a response is active is refused its answer as ``response.create``
        would be (the turn stays committed)."""
        marks = self._input.taken
        listen = marks.force_listen and asked is None
        item_id = self._conversation.add_user_item(
            done=True, transcript=marks.transcript or None,
            listen=ListenReason.MODEL_LISTEN if listen else None,
            listen_epoch=self.epoch if listen else 0).id
        self._responses.turn = TurnState.USER_COMMITTED
        self._responses.anchor = now
        if self._policy.answers_turns:
            active = self._responses.current
            answered = active is not None and active.spontaneous
            self._unanswered = None if answered else UserTurn(item_id=item_id, audio=audio)
        self._model.committed()
        self._drain_model(now)
        active = self._responses.current
        if respond and active is None and not listen:
            self._start_response(self._config["output_modalities"] == ["audio"], None, now)
        elif asked is not None and active is not None:
            self._refuse(asked.event_id, already_active(active.opened.id))

    def _clear(self, *, idle: bool = False) -> None:
        """Drop the input (``idle``: ``input_audio_buffer.clear``, which idles the seed's
        turn state too)."""
        if idle:
            self._responses.turn = TurnState.IDLE
        self._input.clear()
        self._timeline.reset()  # the detector forgets a turn in progress with its audio
        self._model.forget_input()
        self._conversation.emit(msg.InputCleared())

    def _create(self, command: msg.CreateResponse, now: float) -> None:
        active = self._responses.current
        if active is not None or transition(self._responses.state, Trigger.CREATE) is None:
            self._refuse(command.event_id,
                         already_active(active.opened.id if active is not None else "?"))
            return
        options = parse_response_options(command.response, self._config, self._profile)
        if isinstance(options, Refusal):
            self._refuse(command.event_id, options)
            return
        metadata = dict(options.metadata) if options.metadata is not None else None
        output = {"format": options.output_format, "voice": options.voice}
        if options.input is not None:
            # The response answers these items instead of the conversation (GA's ``input``).
            heard = self._conversation.audio_of_input(options.input)
            if isinstance(heard, Refusal):
                self._refuse(command.event_id, heard)
                return
            self._start_response(options.audio, metadata, now, output,
                                 out_of_band=options.out_of_band, answer=heard)
        elif self._policy.answers_turns and (
                self._unanswered is None
                or self._conversation.item(self._unanswered.item_id) is None):
            self._refuse(command.event_id, CREATE_WITHOUT_INPUT)
        elif options.out_of_band and self._unanswered is not None:
            # Out of band: it answers the turn without taking it from the conversation.
            self._start_response(options.audio, metadata, now, output, out_of_band=True,
                                 answer=self._unanswered.audio)
        else:
            self._start_response(options.audio, metadata, now, output)

    def _cancel(self, command: msg.CancelResponse) -> None:
        active = self._responses.cancellable()
        refusal = cancel_refusal(active.id if active is not None else None, command.response_id)
        if refusal is not None:
            self._refuse(command.event_id, refusal)
            return
        self._responses.cancel(CancelReason.CLIENT_CANCELLED)

    def _item_command(self, command: ItemCommand) -> None:
        turn = self._conversation.item_command(
            command, active=self._responses.cancellable(),
            cancel_active=lambda: self._responses.cancel(CancelReason.CLIENT_CANCELLED))
        if turn is not None and self._policy.answers_turns:
            self._unanswered = UserTurn(item_id=turn.item_id, audio=turn.audio)

    def _clear_output(self, command: msg.ClearOutputAudio) -> None:
        refusal = self._responses.clear_refusal(command.response_id)
        if refusal is not None:
            self._refuse(command.event_id, refusal)
            return
        active = self._responses.cancellable()
        self._conversation.output_cleared(active.id if active is not None else None)
        if active is not None:  # unreleased audio is dropped
            self._responses.cancel(CancelReason.CLIENT_CANCELLED,
                                   SeedReason.OUTPUT_AUDIO_BUFFER_CLEAR)

    def _cancel_input(self) -> None:
        """``input.cancel``: the response ends ``client_cancelled``, pending input and an
        unanswered turn are dropped, the epoch advances even when nothing ran."""
        if self._responses.cancellable() is not None:
            self._responses.cancel(CancelReason.CLIENT_CANCELLED, SeedReason.BARGE_IN)
        else:
            self._model.stop()  # work in flight for the input (a turn being answered) stops
            self._responses.turn = TurnState.IDLE
        self._unanswered = None
        self._clear()

    def _barge_in(self) -> None:
        """``barge_in``: the active response ends ``turn_detected`` (the seed's ``barge_in``),
        the input buffered before the interruption dropped."""
        if self._responses.cancellable() is not None:
            self._responses.cancel(CancelReason.TURN_DETECTED, SeedReason.BARGE_IN)
        else:
            self._responses.turn = TurnState.IDLE
        self._clear()

    def _signal_turn(self, command: msg.SignalTurn) -> None:
        """``turn.signal``: the seed's turn-event names set the turn state (``playback_ack``
        acknowledges first); each is echoed as ``turn.event`` with that state and the epoch."""
        if command.event == TurnSignal.PLAYBACK_ACK:
            ack = signalled_ack(command.payload, command.event_id)
            if isinstance(ack, Refusal):
                self._refuse(command.event_id, ack)
                return
            self._ack_playback(ack)
        self._responses.turn = SIGNALLED.get(command.event, self._responses.turn)
        self._conversation.emit(msg.TurnEvent(
            event=command.event, turn_state=self._responses.turn.value, payload=command.payload,
            epoch=self.epoch))

    def _output_backpressure(self) -> None:
        """The client is not reading its output: the active response ends ``failed``
        (``output_backpressure``) and the model stops; what was written stays in the log."""
        if self._responses.cancellable() is None:
            return
        self._responses.end(Trigger.CANCEL, ResponseStatus.FAILED, "output_backpressure")
        self._responses.stop_model()

    # ------------------------------------------------------------------ playback ledger

    def _ack_playback(self, command: msg.AckPlayback) -> None:
        ledger = self._responses.acknowledge(command)
        if isinstance(ledger, Refusal):
            self._refuse(command.event_id, ledger)
            return
        if ledger.heard_ms is not None:  # a late ack of an interrupted answer cuts it too
            self._conversation.keep_heard(ledger.item_id, ledger.heard_ms)
        self._conversation.emit(ledger.acknowledgement())

    def _close(self, command: msg.CloseSession) -> None:
        self._responses.close()
        self._input.close()
        self._model_turns.complete(None)
        self._model.forget_input()
        self._unanswered = None
        # The store writes the reason back as session.closed: one it cannot encode is replaced.
        self._close_reason = close_reason(command.reason)

    # ------------------------------------------------------------------ model reports

    def _drain_model(self, now: float) -> None:
        reports = self._model.reports(now)
        if reports:
            self._on_reports(reports, now)

    def _on_reports(self, reports: list[Report], now: float) -> None:
        for report in reports:
            match report:
                case Output():
                    self._responses.on_output(report, now)
                case TurnEnded():
                    self._responses.on_turn_end()
                case Failed():
                    self._conversation.emit(msg.ErrorEvent(
                        code="model_error", message=report.message, error_type="server_error"))
                case ResponseStarted():
                    self._responses.model_started()
                case (UserSpeechStarted() | UserSpeechStopped() | UserTranscript()
                      | UserTranscriptFailed() | BargedIn()):
                    if self._policy.model_detects_speech:
                        self._model_turns.on_report(report, now)
                case _:
                    assert_never(report)

    # ------------------------------------------------------------------ responses

    def _start_response(self, audio: bool, metadata: dict[str, str] | None, now: float,
                        output: JsonObject | None = None, *, out_of_band: bool = False,
                        answer: bytes | None = None) -> None:
        """Open a response for the model to fill (``response.create``, or an automatic one).

        Args:
            audio: an audio response (else text).
            metadata: echoed in its response object.
            now: when it opens.
            output: the format and voice ``response.create`` set (None: the session's).
            out_of_band: it stays out of the conversation (``conversation: "none"``).
            answer: the audio it answers (``input`` items, or an out-of-band look at the
                unanswered turn); None: the unanswered turn, which it takes.
        """
        if answer is None:
            turn, self._unanswered = self._unanswered, None
            answer = turn.audio if turn is not None else b""
        # An explicit request wants to hear the model again.
        self._responses.move_gate(Trigger.CREATE)
        self._responses.open(audio=audio, metadata=metadata, spontaneous=False, output=output,
                             out_of_band=out_of_band)
        self._responses.anchor = now
        self._model.answer(answer, spoken=audio, now=now)
        self._drain_model(now)  # the first chunk is due at once

    # ------------------------------------------------------------------ updates, refusals

    def _patch_refusal(self, patch: JsonObject) -> Refusal | None:
        refusal = check_session_patch(patch, self._config, self._profile)
        if refusal is not None:
            return refusal
        return self._seed.refusal(patch, self._config, self._patched(patch),
                                  heard=self._heard_input, history=self.history)

    def _patched(self, patch: JsonObject) -> JsonObject:
        return apply_session_patch(patch, self._config, self._profile)

    def _refuse(self, client_event_id: str | None, refusal: Refusal) -> None:
        self._conversation.refuse(client_event_id, refusal)


_Handler: TypeAlias = Callable[[ConversationCore, Any, float], None]

#: What each command does: every command type has its entry (the tests check it).
COMMANDS: Final[Mapping[type[msg.Command], _Handler]] = MappingProxyType({
    msg.UpdateSession: lambda core, command, now: core._update(command),
    msg.AppendAudio: lambda core, command, now: core._append(command, now),
    msg.CommitInput: lambda core, command, now: core._commit(command, now),
    msg.ClearInput: lambda core, command, now: core._clear(idle=True),
    msg.CreateResponse: lambda core, command, now: core._create(command, now),
    msg.CancelResponse: lambda core, command, now: core._cancel(command),
    msg.Heartbeat: lambda core, command, now: core._conversation.emit(msg.HeartbeatAck()),
    msg.CloseSession: lambda core, command, now: core._close(command),
    msg.CreateItem: lambda core, command, now: core._item_command(command),
    msg.RetrieveItem: lambda core, command, now: core._item_command(command),
    msg.DeleteItem: lambda core, command, now: core._item_command(command),
    msg.TruncateItem: lambda core, command, now: core._item_command(command),
    msg.ClearOutputAudio: lambda core, command, now: core._clear_output(command),
    msg.CancelInput: lambda core, command, now: core._cancel_input(),
    msg.BargeIn: lambda core, command, now: core._barge_in(),
    msg.AppendText: lambda core, command, now: core._refuse(command.event_id,
                                                           TEXT_INPUT_REFUSAL),
    msg.SignalTurn: lambda core, command, now: core._signal_turn(command),
    msg.AckPlayback: lambda core, command, now: core._ack_playback(command),
    msg.OutputBackpressure: lambda core, command, now: core._output_backpressure(),
})
