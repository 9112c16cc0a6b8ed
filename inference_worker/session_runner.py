"""The I/O-free conversational state of one worker session (like the seed's DuplexSessionRunner).

The worker's asyncio driver feeds commands in log order with :meth:`SessionRunner.receive`,
calls :meth:`SessionRunner.tick` when :meth:`SessionRunner.next_deadline` is reached, and drains
typed events with :meth:`SessionRunner.events_to_send`. Nothing here reads a clock, sleeps or
touches Redis (style rule 1): time is passed in as ``now``, monotonic seconds.

Event order follows the Realtime GA order for one spoken turn (openai_realtime.md §2a). The runner
never emits ``SessionClosed``/``SessionExpired``: a store script writes the single terminal event.

With ``turn_detection`` on (``server_vad`` / ``semantic_vad``, turn mode only), appended audio
is heard by an energy VAD on the input timeline: ``speech_started`` (then, with
``interrupt_response``, the active response ends ``cancelled`` ``turn_detected``), and on
``speech_stopped`` the turn's audio, from ``audio_start_ms`` to ``audio_end_ms``, is committed
as a manual commit would be; with ``create_response`` it is played back as ``response.create``
would. A turn that ends while a response is still active (``interrupt_response`` false) is
left for a later ``response.create``, as OpenAI's automatic response may fail then.

Items (:meth:`~inference_worker.conversation.Conversation.item_command`): a user message
created with ``conversation.item.create`` is the turn the next ``response.create`` answers,
as a commit's is: its ``input_audio`` is played back (a text-only message: an audio response
with no audio, or the empty text response). Deleting the unanswered turn's item leaves nothing
to answer. ``output_audio_buffer.clear`` ends the active response ``cancelled``
(``client_cancelled``) after ``output_audio_buffer.cleared``: the paced audio not yet released
is dropped.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import assert_never

from inference_worker.conversation import (
    Conversation,
    InputTimeline,
    ItemCommand,
    OpenResponse,
    already_active,
    cancel_refusal,
    commit_too_small,
    turn_detection_of,
)
from inference_worker.loopback import PacedPlayback
from inference_worker.session_config import (
    MAX_BUFFER_BYTES,
    MIN_COMMIT_BYTES,
    Refusal,
    apply_session_patch,
    check_session_patch,
    default_session,
    response_options,
)
from inference_worker.states import InputState, ResponseState, Trigger, transition
from inference_worker.untrusted import close_reason
from inference_worker.vad import SpeechStarted, VadEvent
from store import messages as msg
from store.messages import JsonObject

__all__ = ["SessionRunner"]

# One conversation per session: the Realtime default conversation.


@dataclass(slots=True, kw_only=True)
class _Response:
    """The one active response and its audio (None when streamed, or text-only)."""

    opened: OpenResponse
    playback: PacedPlayback | None


@dataclass(frozen=True, slots=True, kw_only=True)
class _UserTurn:
    """A committed user item that no response has answered yet."""

    item_id: str
    audio: bytes


class SessionRunner:
    """Conversational state of one session served by the loopback backend.

    Holds the effective session object, the input buffer, the conversation tail and at most one
    active response, and turns each command into the Realtime-ordered events it causes.
    Refusals become :class:`~store.messages.ErrorEvent` carrying the command's ``event_id``.
    """

    def __init__(self, session_id: str, *, now: float) -> None:
        """Open the runner of ``session_id`` at ``now`` (monotonic seconds).

        The loopback has no timed state at open; ``now`` keeps the driver's calls uniform.
        """
        del now
        self._conversation = Conversation(default_session(session_id))
        self._input = InputState.EMPTY
        self._response_state = ResponseState.IDLE
        self._buffer = bytearray()
        self._timeline = InputTimeline()
        self._buffer_start = 0  # the timeline position, in bytes, of the buffer's first byte
        self._turn_start_ms = 0  # where the turn being spoken started (its speech_started)
        self._unanswered: _UserTurn | None = None
        self._response: _Response | None = None
        self._close_reason: str | None = None

    @property
    def _config(self) -> JsonObject:
        return self._conversation.config

    # ------------------------------------------------------------------ public API

    @property
    def close_requested(self) -> str | None:
        """The reason of the ``CloseSession`` received, or None while the session is open
        (``client_close`` for a reason that is not a short valid UTF-8 string)."""
        return self._close_reason

    @property
    def session(self) -> JsonObject:
        """A copy of the effective Realtime GA session object (for ``session.created``)."""
        return copy.deepcopy(self._config)

    def receive(self, command: msg.Command, now: float) -> None:
        """Apply one command, in log order.

        Args:
            command: the next command of the session's input log.
            now: monotonic seconds; a response created now starts its playback clock here.
        """
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
                self._clear()
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

    def tick(self, now: float) -> None:
        """Release the output audio that is due at ``now`` (and finish a played-out response)."""
        self._pace(now)

    def events_to_send(self) -> list[msg.Event]:
        """Return the events produced since the last call, in order, and forget them."""
        return self._conversation.take_events()

    def next_deadline(self) -> float | None:
        """When :meth:`tick` next has work to do, or None when nothing is scheduled."""
        response = self._response
        if response is None or response.playback is None:
            return None
        return response.playback.next_due()

    # ------------------------------------------------------------------ commands

    def _update(self, command: msg.UpdateSession) -> None:
        # session.update: all or nothing, answered by session.updated with the full object.
        refusal = check_session_patch(command.session, self._config)
        if refusal is not None:
            self._refuse(command.event_id, refusal)
            return
        self._conversation.config = apply_session_patch(command.session, self._config)
        self._timeline.configure(turn_detection_of(self._config))
        self._conversation.session_updated()

    def _append(self, command: msg.AppendAudio, now: float) -> None:
        if not command.audio:
            return  # nothing to buffer or echo
        self._move_input(Trigger.APPEND)
        self._buffer += command.audio
        if len(self._buffer) > MAX_BUFFER_BYTES:
            dropped = len(self._buffer) - MAX_BUFFER_BYTES
            del self._buffer[:dropped]  # keep the newest audio
            self._buffer_start += dropped
        if self._config["extra_body"]["loopback_mode"] == "stream":
            self._echo(command.audio)
        for event in self._timeline.feed(command.audio):
            self._on_speech(event, now)

    def _commit(self, command: msg.CommitInput, now: float) -> None:
        if len(self._buffer) < MIN_COMMIT_BYTES or not self._move_input(Trigger.COMMIT):
            self._refuse(command.event_id, commit_too_small(len(self._buffer)))
            return
        audio = bytes(self._buffer)
        self._empty_buffer()
        extra = self._config["extra_body"]
        self._commit_turn(audio, now, respond=extra["loopback_mode"] == "turn"
                          and extra["auto_response"])

    def _commit_turn(self, audio: bytes, now: float, *, respond: bool) -> None:
        """The user item of a committed turn, then its answer when ``respond`` and idle."""
        item_id = self._conversation.add_user_item(done=True).id
        if self._response_state is ResponseState.STREAMING:
            # The streamed response already echoed this turn: the commit completes it.
            self._unanswered = None
            self._end_response(Trigger.FINISH, "completed")
            return
        self._unanswered = _UserTurn(item_id=item_id, audio=audio)
        if respond and self._response_state is ResponseState.IDLE:
            self._play(self._config["output_modalities"] == ["audio"], None, now)

    def _clear(self) -> None:
        self._move_input(Trigger.CLEAR)
        self._empty_buffer()
        self._conversation.emit(msg.InputCleared())

    def _empty_buffer(self) -> None:
        # The detector forgets a turn in progress with it: that audio is gone.
        self._buffer.clear()
        self._buffer_start = self._timeline.fed_bytes
        self._timeline.reset()

    # ------------------------------------------------------------------ turn detection

    def _on_speech(self, event: VadEvent, now: float) -> None:
        settings = self._timeline.settings
        assert settings is not None  # only a detector makes events
        if isinstance(event, SpeechStarted):
            self._turn_start_ms = event.audio_start_ms
            # GA order: speech_started first, then the interrupted response's response.done.
            self._conversation.speech_started(event.audio_start_ms)
            if settings.interrupt_response and self._response is not None:
                self._end_response(Trigger.CANCEL, "cancelled", reason="turn_detected")
            return
        self._conversation.speech_stopped(event.audio_end_ms)
        audio = self._take_turn_audio(self._turn_start_ms, event.audio_end_ms)
        self._move_input(Trigger.COMMIT)
        if self._buffer:
            self._move_input(Trigger.APPEND)  # what followed the turn stays buffered
        self._commit_turn(audio, now, respond=settings.create_response)

    def _take_turn_audio(self, start_ms: int, end_ms: int) -> bytes:
        """Cut the turn's audio out of the buffer; what came before it is dropped, what came
        after it stays for the next turn."""
        size = len(self._buffer)
        begin = min(size, max(0, self._timeline.byte_at(start_ms) - self._buffer_start))
        end = min(size, max(begin, self._timeline.byte_at(end_ms) - self._buffer_start))
        audio = bytes(self._buffer[begin:end])
        del self._buffer[:end]
        self._buffer_start += end
        return audio

    def _create(self, command: msg.CreateResponse, now: float) -> None:
        active = self._response
        if active is not None or transition(self._response_state, Trigger.CREATE) is None:
            self._refuse(command.event_id,
                         already_active(active.opened.id if active is not None else "?"))
            return
        options = response_options(command.response, self._config)
        if isinstance(options, Refusal):
            self._refuse(command.event_id, options)
        elif self._unanswered is None or self._conversation.item(self._unanswered.item_id) is None:
            self._refuse(command.event_id, Refusal(
                code="response_create_without_input",
                message="The loopback answers a committed user turn; commit input audio first.",
            ))
        else:
            self._play(*options, now)

    def _cancel(self, command: msg.CancelResponse) -> None:
        active = self._response
        active_id = None
        if active is not None and transition(self._response_state, Trigger.CANCEL) is not None:
            active_id = active.opened.id
        refusal = cancel_refusal(active_id, command.response_id)
        if refusal is not None:
            self._refuse(command.event_id, refusal)
            return
        self._end_response(Trigger.CANCEL, "cancelled")  # unreleased audio is dropped

    def _item_command(self, command: ItemCommand) -> None:
        turn = self._conversation.item_command(
            command, active=self._cancellable(),
            cancel_active=lambda: self._end_response(Trigger.CANCEL, "cancelled"))
        if turn is not None:
            self._unanswered = _UserTurn(item_id=turn.item_id, audio=turn.audio)

    def _clear_output(self) -> None:
        active = self._cancellable()
        self._conversation.output_cleared(active.id if active is not None else None)
        if active is not None:
            self._end_response(Trigger.CANCEL, "cancelled")  # unreleased audio is dropped

    def _cancellable(self) -> OpenResponse | None:
        """The active response, when it may be cancelled now."""
        active = self._response
        if active is None or transition(self._response_state, Trigger.CANCEL) is None:
            return None
        return active.opened

    def _close(self, command: msg.CloseSession) -> None:
        if self._response is not None:
            self._end_response(Trigger.CLOSE, "cancelled")
        else:
            self._move_response(Trigger.CLOSE)
        self._move_input(Trigger.CLOSE)
        self._empty_buffer()
        self._unanswered = None
        # The store writes the reason back as session.closed: one it cannot encode is replaced.
        self._close_reason = close_reason(command.reason)

    # ------------------------------------------------------------------ responses

    def _echo(self, audio: bytes) -> None:
        # Stream mode, the relay-latency path: no buffering, no pacing.
        opening = self._response_state is ResponseState.IDLE
        if not self._move_response(Trigger.STREAM):
            return  # a played-back turn owns the output; the audio still goes to the buffer
        if opening:
            self._open_response(audio=True, metadata=None, playback=None)
        response = self._response
        assert response is not None  # STREAMING always has its response
        self._delta(response.opened, audio)

    def _play(self, audio: bool, metadata: dict[str, str] | None, now: float) -> None:
        """Answer the unanswered user turn: play its audio back (or an empty text answer)."""
        turn = self._unanswered
        assert turn is not None  # callers checked
        self._unanswered = None
        self._move_response(Trigger.CREATE)
        playback = PacedPlayback(turn.audio, start=now) if audio else None
        self._open_response(audio=audio, metadata=metadata, playback=playback)
        if audio:
            self._pace(now)  # the first chunk is due at once
        else:
            # No text events exist in store.messages, so a text answer is empty and done at once.
            self._end_response(Trigger.FINISH, "completed")

    def _pace(self, now: float) -> None:
        response = self._response
        if response is None or response.playback is None:
            return
        for chunk in response.playback.release(now):
            self._delta(response.opened, chunk)
        if response.playback.finished:
            self._end_response(Trigger.FINISH, "completed")

    def _delta(self, response: OpenResponse, audio: bytes) -> None:
        self._conversation.audio_delta(response, audio)

    def _open_response(self, *, audio: bool, metadata: dict[str, str] | None,
                       playback: PacedPlayback | None) -> None:
        opened = self._conversation.open_response(audio=audio, metadata=metadata)
        self._response = _Response(opened=opened, playback=playback)

    def _end_response(self, trigger: Trigger, status: str,
                      reason: str = "client_cancelled") -> None:
        response = self._response
        assert response is not None  # callers checked
        self._move_response(trigger)
        self._response = None
        self._conversation.finish_response(
            response.opened, status=status, reason=reason if status == "cancelled" else None)

    # ------------------------------------------------------------------ helpers

    def _move_input(self, trigger: Trigger) -> bool:
        target = transition(self._input, trigger)
        if target is not None:
            self._input = target
        return target is not None

    def _move_response(self, trigger: Trigger) -> bool:
        target = transition(self._response_state, trigger)
        if target is not None:
            self._response_state = target
        return target is not None

    def _refuse(self, client_event_id: str | None, refusal: Refusal) -> None:
        self._conversation.refuse(client_event_id, refusal)
