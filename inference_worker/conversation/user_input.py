"""The user's side of a session's input: the input audio buffer and its machine
(``input_audio_buffer.*``, :class:`~inference_worker.conversation.states.InputState`).

:class:`UserInput` keeps the audio appended since the last commit or clear (its bytes where
the policy keeps them, the newest 60 s; else only their count) and moves the input machine
with every change, through the table (an illegal move raises). Pure: no I/O, no clock.

It also keeps what the client's appends said of the turn (:class:`TurnMarks`, read from each
append by :func:`append_meaning`): the seed's ``is_speech`` and its hints are a client's own
verdicts, which a server may use or ignore. Used: the speech verdict (``is_speech``,
``speech``, ``vad.is_speech``, ``vad.speech_probability`` / ``vad.probability`` /
``speech_probability`` of at least 0.5; an ``overlap_action`` of ``drop``, ``ignore`` or
``silence`` says the audio is not speech), ``force_listen``, ``force_barge_in`` and an
``overlap_action`` (or ``overlap``) of ``barge_in``, ``interrupt`` or ``cancel``, and the
``transcript`` (else ``text``) of the appends, which becomes the committed item's transcript.
Ignored, as they do not change what the audio means: ``duration_ms``, ``audio_duration_ms``,
``audio_start_ms``, ``audio_end_ms`` (the audio's own length is what counts) and the
``overlap_action`` values that keep listening (``listen``, ``continue``, ...: an append never
interrupts an answer unless a hint or turn detection says so).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from contract import messages as msg
from inference_worker.conversation.profiles import MAX_BUFFER_BYTES, MIN_COMMIT_BYTES
from inference_worker.conversation.states import InputState, Trigger, move, transition

__all__ = ["AppendMeaning", "BufferState", "TurnMarks", "UserInput", "UserTurn", "append_meaning"]

#: The longest transcript the appends' hints give a turn; the rest is dropped.
MAX_HINT_TRANSCRIPT: Final = 4096
_BARGE_IN_ACTIONS: Final = frozenset({"barge_in", "interrupt", "cancel"})
_NOT_SPEECH_ACTIONS: Final = frozenset({"drop", "ignore", "silence"})


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendMeaning:
    """What one append's ``is_speech`` and hints say (see the module docstring).

    Attributes:
        speech: the client's speech verdict (None: it gave none, and the audio counts as
            speech).
        force_listen: the turn is not to be answered.
        barge_in: the audio interrupts the answer being given.
        transcript: what the client says was said in it.
    """

    speech: bool | None = None
    force_listen: bool = False
    barge_in: bool = False
    transcript: str = ""


_PLAIN: Final = AppendMeaning()


@dataclass(frozen=True, slots=True, kw_only=True)
class UserTurn:
    """A committed user item that no response has answered yet, and its audio."""

    item_id: str
    audio: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnMarks:
    """What the appends of one turn said of it, together."""

    speech: bool = False  # some append was not declared silence
    force_listen: bool = False
    transcript: str = ""


def _probability(value: object) -> bool | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value >= 0.5
    return None


def _speech(command: msg.AppendAudio, hints: msg.JsonObject) -> bool | None:
    """The seed's order: an explicit boolean, then the VAD object, then a probability."""
    for value in (command.is_speech, hints.get("speech")):
        if isinstance(value, bool):
            return value
    vad = hints.get("vad")
    if isinstance(vad, dict):
        if isinstance(vad.get("is_speech"), bool):
            return bool(vad["is_speech"])
        verdict = _probability(vad.get("speech_probability", vad.get("probability")))
        if verdict is not None:
            return verdict
    return _probability(hints.get("speech_probability"))


def append_meaning(command: msg.AppendAudio) -> AppendMeaning:
    """Read an append's ``is_speech`` and hints."""
    hints = command.hints or {}
    action = hints.get("overlap_action", hints.get("overlap"))
    action = action.strip().lower() if isinstance(action, str) else ""
    speech = _speech(command, hints)
    if speech is None and action in _NOT_SPEECH_ACTIONS:
        speech = False
    transcript = hints.get("transcript")
    if not isinstance(transcript, str):
        transcript = hints.get("text")
    return AppendMeaning(
        speech=speech, force_listen=hints.get("force_listen") is True,
        barge_in=hints.get("force_barge_in") is True or action in _BARGE_IN_ACTIONS,
        transcript=transcript if isinstance(transcript, str) else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class BufferState:
    """What a checkpoint keeps of the input: the machine's state, how many bytes are
    buffered (not the bytes: the input log holds them) and what their appends said, and what
    the turn last committed said."""

    state: InputState
    size: int
    marks: TurnMarks
    taken: TurnMarks


class UserInput:
    """The input appended since the last commit or clear, and the input machine's state.

    Args:
        keep: keep the bytes (a backend that answers committed turns with their audio), not
            only their count.
    """

    __slots__ = ("_audio", "_keep", "_marks", "_size", "heard", "state", "taken")

    def __init__(self, *, keep: bool) -> None:
        self._keep = keep
        self._audio = bytearray()
        self._size = 0
        self.state = InputState.EMPTY
        self._marks = TurnMarks()  # of the appends buffered
        #: What the appends of the turn last committed said of it.
        self.taken = TurnMarks()
        #: Bytes of audio appended since this machine began (a restore counts its buffer).
        self.heard = 0

    @property
    def size(self) -> int:
        """Bytes buffered."""
        return self._size

    @property
    def kept(self) -> int:
        """Bytes buffered whose audio a restore needs back (none where they are not kept)."""
        return self._size if self._keep else 0

    @property
    def marks(self) -> TurnMarks:
        """What the appends buffered said of the turn so far."""
        return self._marks

    def snapshot(self) -> BufferState:
        """The input as a checkpoint keeps it."""
        return BufferState(state=self.state, size=self._size, marks=self._marks,
                           taken=self.taken)

    def restore(self, state: BufferState, buffered: bytes) -> None:
        """Continue from ``state``; where the bytes are kept, ``buffered`` is the buffer again
        (the audio of the appends since it began, as decoded), else it is not read.

        Raises:
            ValueError: bytes are kept and ``buffered`` is not the buffer ``state`` counts.
        """
        if self._keep and len(buffered) != state.size:
            raise ValueError(f"{len(buffered)} bytes given for a buffer of {state.size}")
        self.state, self._size, self._marks, self.taken = (state.state, state.size,
                                                            state.marks, state.taken)
        self._audio = bytearray(buffered) if self._keep else bytearray()
        self.heard = state.size

    def silent(self, verdict: bool | None) -> bool:
        """Whether a commit with the client's ``verdict`` (its ``is_speech``) is a silent one:
        the client says so, or said so of every append buffered."""
        return verdict is False or (verdict is None and self._size > 0
                                    and not self._marks.speech)

    def append(self, audio: bytes, command: msg.AppendAudio | None = None) -> AppendMeaning:
        """Buffer ``audio`` (not empty), and what its append (``command``) said of it; what
        the append said."""
        self.state = move(self.state, Trigger.APPEND)
        self.heard += len(audio)
        meaning = _PLAIN
        if command is not None and (command.hints is not None or command.is_speech is not None):
            meaning = append_meaning(command)
        marks = self._marks
        if meaning is not _PLAIN or not marks.speech:  # a GA append changes nothing after one
            transcript = (marks.transcript + meaning.transcript)[:MAX_HINT_TRANSCRIPT]
            self._marks = replace(marks, speech=marks.speech or meaning.speech is not False,
                                  force_listen=marks.force_listen or meaning.force_listen,
                                  transcript=transcript)
        if self._keep:
            self._audio += audio
            if len(self._audio) > MAX_BUFFER_BYTES:
                del self._audio[:len(self._audio) - MAX_BUFFER_BYTES]  # keep the newest
            self._size = len(self._audio)
        else:
            self._size += len(audio)
        return meaning

    @property
    def committable(self) -> bool:
        """Whether a manual commit may take the buffer (at least 100 ms, as OpenAI requires)."""
        return (self._size >= MIN_COMMIT_BYTES
                and transition(self.state, Trigger.COMMIT) is not None)

    def commit(self) -> bytes:
        """A manual commit (checked :attr:`committable` first): the whole buffer."""
        self.state = move(self.state, Trigger.COMMIT)
        audio = bytes(self._audio)
        self._drop()
        return audio

    def take_turn(self, begin: int, end: int, fed: int, *, rest_stays: bool) -> bytes:
        """Turn detection committed the turn between timeline bytes ``begin`` and ``end``
        (``fed``: the timeline's end): what came before it is dropped; what came after stays
        buffered, and counts as buffered input when ``rest_stays``."""
        start = fed - self._size  # the timeline position of the buffer's first byte
        first = min(self._size, max(0, begin - start))
        last = min(self._size, max(first, end - start))
        audio = bytes(self._audio[first:last])
        if self._keep:
            del self._audio[:last]
        self._size -= last
        self._taken()
        self._take_marks()
        if rest_stays and self._size:
            self.state = move(self.state, Trigger.APPEND)
        return audio

    def taken_by_model(self) -> None:
        """A backend that detects speech itself committed the turn: the buffer empties."""
        self._drop()
        self._taken()

    def clear(self) -> None:
        """``input_audio_buffer.clear``: drop the buffer."""
        self.state = move(self.state, Trigger.CLEAR)
        self._drop()

    def close(self) -> None:
        """``session.close``: drop the buffer; the machine closes."""
        self.state = move(self.state, Trigger.CLOSE)
        self._drop()

    def _taken(self) -> None:
        # The machine commits when it held input: a turn can end with nothing buffered (the
        # turn before it in the same append, or a clear, took the audio).
        if self.state is InputState.BUFFERED:
            self.state = move(self.state, Trigger.COMMIT)

    def _take_marks(self) -> None:
        # What the appends said goes with the turn that took them.
        self.taken, self._marks = self._marks, TurnMarks()

    def _drop(self) -> None:
        self._audio.clear()
        self._size = 0
        self._take_marks()
