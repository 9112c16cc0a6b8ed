"""Checkpoints of the conversation core: its state at a safe point, so that another worker
can continue the session from it (DESIGN §2.9; ``docs/design/hand-over.md``).

:class:`CoreState` is the core's data, typed: each part of the core gives its own
(:class:`~inference_worker.conversation.history.HistoryState`,
:class:`~inference_worker.conversation.responses.ResponsesState`,
:class:`~inference_worker.conversation.user_input.BufferState`) and the core adds the rest
(:meth:`~inference_worker.conversation.core.ConversationCore.checkpoint`). What it does not
hold, and why a checkpoint is only taken without it: events not yet taken, an active
response, a user item awaiting its transcript, a turn detector with something in progress,
a model port holding what it has not reported or handed to its engine, a closing session. The
input buffer's bytes are not in it either: the buffer is always the last ``buffer.size`` bytes
of the input audio (a commit or clear empties it, a detected turn takes its head), so the
restorer reads them back from the input log; the turn detector resumes from its place.

:func:`encode` writes it as versioned JSON, at most :data:`MAX_CHECKPOINT_BYTES`;
:func:`decode` reads it back once, checking every field, and refuses a format it does not
know rather than continue a conversation on a guess. A frame backend's session carries its
slot's context too (:attr:`CoreState.model_context`, the format's version 2): a reader that
knows only version 1 refuses it, since it could not continue that session's model. Pure: no
I/O, no clock.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Final, TypeVar

from contract.messages import JsonObject
from inference_worker.conversation.history import HistoryState
from inference_worker.conversation.items import Item
from inference_worker.conversation.model_port import ModelState
from inference_worker.conversation.playback import Ledger
from inference_worker.conversation.responses import ResponsesState
from inference_worker.conversation.seed_settings import VoicePrompt
from inference_worker.conversation.states import GateState, InputState
from inference_worker.conversation.turns import TurnState
from inference_worker.conversation.user_input import BufferState, TurnMarks, UserTurn
from inference_worker.turn_detection.timeline import TimelinePlace
from inference_worker.turn_detection.vad import DetectorPlace

__all__ = ["CHECKPOINT_FORMAT", "MAX_CHECKPOINT_BYTES", "CheckpointError", "CoreState",
           "decode", "encode"]

#: The encoding's newest version, written for a state with a model context; one without is
#: written as version 1, which a worker that knows only that can still continue.
CHECKPOINT_FORMAT: Final = 2
# The versions this reader knows.
_READABLE: Final = (1, 2)
#: The largest encoded checkpoint: a conversation's items are bounded (``MAX_ITEMS``), and a
#: voice prompt or an unanswered turn's audio are what can make one large.
MAX_CHECKPOINT_BYTES: Final = 4 * 1024 * 1024

_T = TypeVar("_T")


class CheckpointError(ValueError):
    """A checkpoint that cannot be written (over the bound) or read (not one, or a format
    this worker does not know): the session cannot continue from it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreState:
    """One session's conversation core at a safe point.

    Attributes:
        history: the session object, the items and the id counters.
        responses: the output gate, the seed's turn state, the playback ledgers.
        buffer: the input machine and what the buffered appends said (not their bytes).
        model: the model port's: the stops so far (frames of older epochs are a cancelled
            response's) and the turns it heard committed.
        timeline: the input timeline's end (every ``audio_*_ms`` counts from its start) and
            its turn detector's place.
        turn_start_ms: where the turn being spoken started.
        idle_from_ms: where the idle timeout counts from (None: not counting).
        model_input_ms: the model's place on the input timeline (None: not said yet).
        heard_input: whether the session heard input audio (some updates are refused after).
        video_refused: whether its first camera frame was refused.
        seed_opened: whether a ``session.update`` was applied.
        seed_spoke: whether the model was seen to answer in audio.
        ref_audio: the voice prompt in effect.
        unanswered: the committed turn the next ``response.create`` answers, with its audio.
        model_context: a frame backend's slot's newest step records, oldest first, from
            which another worker's slot continues it; None for a model port without (the
            loopback's).
        model_unconsumed: the bytes of input audio that slot was given and had not stepped:
            the newest heard, which the slot that continues it is given first.
    """

    history: HistoryState
    responses: ResponsesState
    buffer: BufferState
    model: ModelState
    timeline: TimelinePlace
    turn_start_ms: int
    idle_from_ms: int | None
    model_input_ms: int | None
    heard_input: bool
    video_refused: bool
    seed_opened: bool
    seed_spoke: bool
    ref_audio: VoicePrompt | None
    unanswered: UserTurn | None
    model_context: tuple[bytes, ...] | None = None
    model_unconsumed: int = 0


# ============================================================================ writing


def _bytes(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _item(item: Item) -> JsonObject:
    return {"id": item.id, "role": item.role, "status": item.status,
            "content": list(item.content), "audio_bytes": item.audio_bytes, "kind": item.kind,
            "fields": [list(pair) for pair in item.fields]}


def encode(state: CoreState) -> bytes:
    """``state`` as versioned JSON.

    Raises:
        CheckpointError: the encoding is over :data:`MAX_CHECKPOINT_BYTES`.
    """
    history, responses, buffer = state.history, state.responses, state.buffer
    document: JsonObject = {
        "v": 1 if state.model_context is None else CHECKPOINT_FORMAT,
        "history": {"config": history.config, "items": [_item(i) for i in history.items],
                    "item_count": history.item_count,
                    "response_count": history.response_count,
                    "reserved_item_id": history.reserved_item_id},
        "responses": {"gate": responses.gate.value, "turn": responses.turn.value,
                      "mute_silence": responses.mute_silence,
                      "held_text": responses.held_text, "held_quiet": responses.held_quiet,
                      "ledgers": [asdict(ledger) for ledger in responses.ledgers]},
        "buffer": {"state": buffer.state.value, "size": buffer.size,
                   "marks": asdict(buffer.marks), "taken": asdict(buffer.taken)},
        "model": {"epoch": state.model.epoch, "commits": state.model.commits},
        "timeline": {"fed_bytes": state.timeline.fed_bytes,
                     "detector_origin_ms": state.timeline.detector_origin_ms,
                     "detector": None if state.timeline.detector is None else
                     {"position": state.timeline.detector.position,
                      "origin": state.timeline.detector.origin}},
        "turn_start_ms": state.turn_start_ms, "idle_from_ms": state.idle_from_ms,
        "model_input_ms": state.model_input_ms, "heard_input": state.heard_input,
        "video_refused": state.video_refused, "seed_opened": state.seed_opened,
        "seed_spoke": state.seed_spoke,
        "ref_audio": None if state.ref_audio is None else
        {"mime": state.ref_audio.mime, "data": _bytes(state.ref_audio.data)},
        "unanswered": None if state.unanswered is None else
        {"item_id": state.unanswered.item_id, "audio": _bytes(state.unanswered.audio)},
    }
    if state.model_context is not None:
        document["model_context"] = [_bytes(record) for record in state.model_context]
        document["model_unconsumed"] = state.model_unconsumed
    # ASCII: a client's text may hold a lone surrogate, which no UTF-8 can carry.
    data = json.dumps(document, separators=(",", ":")).encode("ascii")
    if len(data) > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(f"a checkpoint of {len(data)} bytes is over the bound of "
                              f"{MAX_CHECKPOINT_BYTES}")
    return data


# ============================================================================ reading


def _typed(value: Any, kind: type[_T], name: str) -> _T:
    # bool is an int in Python: a count must not be a flag, nor a flag a count.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CheckpointError(f"checkpoint field {name!r} is not {kind.__name__}: {value!r}")
    return value


def _optional(value: Any, kind: type[_T], name: str) -> _T | None:
    return None if value is None else _typed(value, kind, name)


def _count(value: Any, name: str) -> int:
    count = _typed(value, int, name)
    if count < 0:
        raise CheckpointError(f"checkpoint field {name!r} is negative: {count}")
    return count


def _decoded(text: Any, name: str) -> bytes:
    try:
        return base64.b64decode(_typed(text, str, name), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CheckpointError(f"checkpoint field {name!r} is not base64") from exc


def _read_item(value: Any) -> Item:
    item = _typed(value, dict, "items[]")
    content = tuple(_typed(part, dict, "items[].content[]")
                    for part in _typed(item["content"], list, "items[].content"))
    fields = []
    for pair in _typed(item["fields"], list, "items[].fields"):
        key, text = _typed(pair, list, "items[].fields[]")
        fields.append((_typed(key, str, "items[].fields[]"),
                       _typed(text, str, "items[].fields[]")))
    return Item(id=_typed(item["id"], str, "items[].id"),
                role=_typed(item["role"], str, "items[].role"),
                status=_typed(item["status"], str, "items[].status"), content=content,
                audio_bytes=_count(item["audio_bytes"], "items[].audio_bytes"),
                kind=_typed(item["kind"], str, "items[].kind"), fields=tuple(fields))


def _read_ledger(value: Any) -> Ledger:
    ledger = _typed(value, dict, "ledgers[]")
    return Ledger(response_id=_typed(ledger["response_id"], str, "ledgers[].response_id"),
                  item_id=_typed(ledger["item_id"], str, "ledgers[].item_id"),
                  generated=_count(ledger["generated"], "ledgers[].generated"),
                  played_ms=_count(ledger["played_ms"], "ledgers[].played_ms"),
                  committed_ms=_count(ledger["committed_ms"], "ledgers[].committed_ms"),
                  acknowledged=_typed(ledger["acknowledged"], bool, "ledgers[].acknowledged"),
                  ended=_typed(ledger["ended"], bool, "ledgers[].ended"),
                  interrupted=_typed(ledger["interrupted"], bool, "ledgers[].interrupted"))


def _read_marks(value: Any, name: str) -> TurnMarks:
    marks = _typed(value, dict, name)
    return TurnMarks(speech=_typed(marks["speech"], bool, f"{name}.speech"),
                     force_listen=_typed(marks["force_listen"], bool, f"{name}.force_listen"),
                     transcript=_typed(marks["transcript"], str, f"{name}.transcript"))


def _read_model(model: JsonObject) -> ModelState:
    return ModelState(_count(model["epoch"], "model.epoch"),
                      _count(model["commits"], "model.commits"))


def _read_timeline(timeline: JsonObject) -> TimelinePlace:
    detector = _optional(timeline["detector"], dict, "timeline.detector")
    return TimelinePlace(
        fed_bytes=_count(timeline["fed_bytes"], "timeline.fed_bytes"),
        detector_origin_ms=_count(timeline["detector_origin_ms"], "timeline.detector_origin_ms"),
        detector=None if detector is None else DetectorPlace(
            _count(detector["position"], "timeline.detector.position"),
            _count(detector["origin"], "timeline.detector.origin")))


def _symbol(value: Any, kind: Callable[[str], _T], name: str) -> _T:
    try:
        return kind(_typed(value, str, name))
    except ValueError as exc:
        raise CheckpointError(f"checkpoint field {name!r} names no state: {value!r}") from exc


def _read_context(document: JsonObject) -> tuple[bytes, ...] | None:
    if document["v"] == 1:
        return None
    records = _typed(document["model_context"], list, "model_context")
    return tuple(_decoded(record, "model_context") for record in records)


def _read(document: JsonObject) -> CoreState:
    history = _typed(document["history"], dict, "history")
    responses = _typed(document["responses"], dict, "responses")
    buffer = _typed(document["buffer"], dict, "buffer")
    ref_audio = _optional(document["ref_audio"], dict, "ref_audio")
    unanswered = _optional(document["unanswered"], dict, "unanswered")
    return CoreState(
        history=HistoryState(
            config=_typed(history["config"], dict, "history.config"),
            items=tuple(_read_item(item) for item in _typed(history["items"], list, "items")),
            item_count=_count(history["item_count"], "history.item_count"),
            response_count=_count(history["response_count"], "history.response_count"),
            reserved_item_id=_optional(history["reserved_item_id"], str,
                                       "history.reserved_item_id")),
        responses=ResponsesState(
            gate=_symbol(responses["gate"], GateState, "responses.gate"),
            turn=_symbol(responses["turn"], TurnState, "responses.turn"),
            mute_silence=_count(responses["mute_silence"], "responses.mute_silence"),
            held_text=_typed(responses["held_text"], str, "responses.held_text"),
            held_quiet=_count(responses["held_quiet"], "responses.held_quiet"),
            ledgers=tuple(_read_ledger(ledger)
                          for ledger in _typed(responses["ledgers"], list, "ledgers"))),
        buffer=BufferState(state=_symbol(buffer["state"], InputState, "buffer.state"),
                           size=_count(buffer["size"], "buffer.size"),
                           marks=_read_marks(buffer["marks"], "buffer.marks"),
                           taken=_read_marks(buffer["taken"], "buffer.taken")),
        model=_read_model(_typed(document["model"], dict, "model")),
        timeline=_read_timeline(_typed(document["timeline"], dict, "timeline")),
        turn_start_ms=_count(document["turn_start_ms"], "turn_start_ms"),
        idle_from_ms=_optional(document["idle_from_ms"], int, "idle_from_ms"),
        model_input_ms=_optional(document["model_input_ms"], int, "model_input_ms"),
        heard_input=_typed(document["heard_input"], bool, "heard_input"),
        video_refused=_typed(document["video_refused"], bool, "video_refused"),
        seed_opened=_typed(document["seed_opened"], bool, "seed_opened"),
        seed_spoke=_typed(document["seed_spoke"], bool, "seed_spoke"),
        ref_audio=None if ref_audio is None else VoicePrompt(
            _typed(ref_audio["mime"], str, "ref_audio.mime"),
            _decoded(ref_audio["data"], "ref_audio.data")),
        unanswered=None if unanswered is None else UserTurn(
            item_id=_typed(unanswered["item_id"], str, "unanswered.item_id"),
            audio=_decoded(unanswered["audio"], "unanswered.audio")),
        model_context=_read_context(document),
        model_unconsumed=0 if document["v"] == 1 else _count(document["model_unconsumed"],
                                                              "model_unconsumed"),
    )


def decode(data: bytes) -> CoreState:
    """The :class:`CoreState` :func:`encode` wrote.

    Raises:
        CheckpointError: not a checkpoint, over the bound, a field missing or of the wrong
            kind, or a format this reader does not know.
    """
    if len(data) > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(f"a checkpoint of {len(data)} bytes is over the bound of "
                              f"{MAX_CHECKPOINT_BYTES}")
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"not a checkpoint: {exc}") from exc
    version = document.get("v") if isinstance(document, dict) else None
    if type(version) is not int or version not in _READABLE:
        raise CheckpointError(f"checkpoint format {version!r} is not one of {_READABLE}")
    try:
        return _read(document)
    except KeyError as exc:
        raise CheckpointError(f"checkpoint field {exc.args[0]!r} is missing") from exc
    except (TypeError, ValueError) as exc:  # a list of the wrong length, say
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"not a checkpoint: {exc}") from exc
