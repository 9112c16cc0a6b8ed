"""Bounds on every value of a client frame: one iterative walk, before any field is read.

A frame from ``json.loads`` may still be unusable: a lone surrogate cannot be encoded, inf
(from ``1e400``) cannot be rendered, a huge integer is not exact in Lua, and deep nesting
breaks recursive code downstream. :func:`check_bounds` catches all of these at the edge, so
that nothing the codec accepts can fail later in the store, the worker or on the way back to
the client. :func:`load_json` is the one way client JSON is decoded before that walk (a
websocket frame, a client-secret request's body): safe at any depth the client nests it.

Camera frames (an append's ``video_frames``) have bounds of their own, all refused with the
seed's ``invalid_video_frames``: at most :data:`MAX_VIDEO_FRAMES_PER_APPEND` per append, each a
JPEG or PNG image (:func:`video_frame_problem`), no larger than the gateway's
``MAX_VIDEO_FRAME_BYTES``, and no more than ``MAX_VIDEO_FRAMES_PER_S`` per connection
(:class:`VideoBudget`).
"""

from __future__ import annotations

import binascii
import gc
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeAlias

from contract.messages import AppendAudio
from gateway.protocol.errors import ClientProtocolError, ErrorCode

__all__ = [
    "MAX_APPEND_TEXT_CHARS",
    "MAX_DEPTH",
    "MAX_INT",
    "MAX_PLAYBACK_MS",
    "MAX_SIGNAL_EVENT_CHARS",
    "MAX_STRING_CHARS",
    "MAX_VALUES",
    "MAX_VIDEO_FRAMES_PER_APPEND",
    "TOO_DEEP",
    "VideoBounds",
    "VideoBudget",
    "check_bounds",
    "load_json",
    "video_frame_bytes",
    "video_frame_problem",
    "video_frames_of",
]

JsonDict: TypeAlias = dict[str, Any]

#: Largest integer magnitude anywhere in a frame: beyond it, Lua and JavaScript numbers (doubles)
#: are no longer exact, so a stored value would come back changed.
MAX_INT = 2**53 - 1

#: Deepest nesting of objects and arrays in one frame, the frame's own object being level 1. A
#: JSON-level limit (RFC 8259 §9 lets a parser set one), so deeper is ``invalid_json``, as a
#: frame too deep for ``json.loads`` itself is.
MAX_DEPTH = 32

#: Most JSON values in one frame: object members and array elements, counted at every level.
MAX_VALUES = 10_000

#: Longest string anywhere in a frame, object keys included, in characters. The top-level
#: ``audio`` of ``input_audio_buffer.append``, and of an item's ``input_audio`` part in
#: ``conversation.item.create`` (sent directly or as a ``turn.signal``'s payload), is exempt:
#: only the frame size bounds it. So are an append's ``video_frames``, which
#: :class:`VideoBounds` bounds, and a ``session.update``'s voice prompt
#: (``session.ref_audio``), which the worker bounds itself.
MAX_STRING_CHARS = 65_536

#: Longest ``text`` of one ``input.text.append``: a turn's worth of typed input, far below what
#: a model's context takes, so that a client cannot fill a session's history in a few frames.
MAX_APPEND_TEXT_CHARS = 4_096

#: Longest ``event`` of a ``turn.signal``: a name, not a payload.
MAX_SIGNAL_EVENT_CHARS = 128

#: Largest ``played_ms`` / ``committed_ms`` of a ``playback.ack``: 24 hours of audio, longer
#: than any response; more is a client bug, not a position.
MAX_PLAYBACK_MS = 24 * 60 * 60 * 1000


#: Most camera frames one append may carry: the seed's contract, one frame per audio unit
#: (about a second), optionally followed by that unit's composite of the frames inside it.
MAX_VIDEO_FRAMES_PER_APPEND = 2

# What an image starts with: JPEG's SOI marker, PNG's signature (the seed's check).
_IMAGE_MAGIC = (b"\xff\xd8", b"\x89PNG")
# Base64 characters enough to decode the magic: whole quads.
_MAGIC_CHARS = 64


# A position in a frame: the keys and indices leading to a value, from the frame's object.
_Path: TypeAlias = tuple[str | int, ...]

TOO_DEEP = f"The JSON is nested deeper than {MAX_DEPTH} levels of objects and arrays."


def load_json(text: str, decoder: json.JSONDecoder) -> Any:
    """``text`` decoded by ``decoder``, safe at any depth a client may nest it.

    The decoder recurses once per level, so a text built to be deep takes it to the
    interpreter's recursion limit. A garbage collection that started on an allocation down
    there would run its callbacks (the process's pause metrics) and the finalisers of what it
    frees with no stack left: each would fail with a RecursionError where nothing can catch
    it, printed past the log. So a text with more openers than :data:`MAX_DEPTH` (no audio
    append has; its depth is at most that count) is decoded with the collector paused, and
    one deeper than the decoder can go is refused like any frame deeper than the limit.

    Raises:
        ValueError: not JSON (``json.JSONDecodeError``).
        ClientProtocolError: ``invalid_json``, deeper than the decoder can go.
    """
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return decoder.decode(text)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return decoder.decode(text)
    except RecursionError:
        raise ClientProtocolError(ErrorCode.INVALID_JSON, TOO_DEEP) from None
    finally:
        if was_enabled:
            gc.enable()


# Longest key, and longest path, quoted in a param: keys may be as long as MAX_STRING_CHARS.
_KEY_QUOTE_LIMIT = 64
_PATH_QUOTE_LIMIT = 256

_isfinite = math.isfinite  # one global lookup per float on the scan's hot loop


@dataclass(frozen=True, slots=True)
class _Violation:
    """The first out-of-bounds value found in a frame: where it is and what is wrong."""

    path: _Path
    message: str
    #: A JSON-level limit (depth) is ``invalid_json``; any other is the field's fault.
    json_level: bool = False

    @classmethod
    def at(cls, path: _Path, problem: str) -> _Violation:
        """A value that is ``problem``, in the codec's usual wording."""
        return cls(path, f"Invalid value for '{_render_path(path)}': {problem}.")


def _key_text(key: str) -> str:
    # Shown back to the client in ``param``: make it encodable and short.
    if not key.isascii():
        key = key.encode("utf-8", "replace").decode("utf-8")
    return key if len(key) <= _KEY_QUOTE_LIMIT else key[:_KEY_QUOTE_LIMIT] + "..."


def _render_path(path: _Path) -> str | None:
    """``session.tools[3].name`` for ``("session", "tools", 3, "name")``; None for the frame."""
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else f".{_key_text(step)}"
    text = text.lstrip(".")
    if not text:
        return None
    return text if len(text) <= _PATH_QUOTE_LIMIT else text[:_PATH_QUOTE_LIMIT] + "..."


def _not_utf8(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate (json.loads accepts ``"\\ud800"``), which no
    UTF-8 encoder will write: it would fail at the store or on the wire, far from here."""
    if text.isascii():  # the common case, checked in C without encoding
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _string_problem(text: str, *, exempt_length: bool) -> str | None:
    if len(text) > MAX_STRING_CHARS and not exempt_length:
        return f"longer than {MAX_STRING_CHARS} characters"
    if _not_utf8(text):
        return "not valid Unicode (a lone surrogate)"
    return None


def _value_problem(value: Any, *, exempt_length: bool = False) -> str | None:
    """What is out of bounds about one scalar, or None; containers are scanned separately."""
    kind = type(value)  # exact types: bool is an int subclass but no JSON number
    if kind is str:
        return _string_problem(value, exempt_length=exempt_length)
    if kind is int and not -MAX_INT <= value <= MAX_INT:
        return f"an integer outside [-{MAX_INT}, {MAX_INT}]"
    if kind is float and not math.isfinite(value):  # 1e400 parses as inf
        return "a number too large to represent"
    return None


# Where a ``turn.signal`` carries the fields of the command it is routed to.
_SIGNAL_PAYLOADS = frozenset({"payload", "signal_payload"})


def _holds_frames(path: _Path, key: Any) -> bool:
    """Whether a string at ``(*path, key)`` is one of an append's camera frames (also in a
    ``turn.signal``'s payload), bounded by :class:`VideoBounds` instead."""
    if len(path) == 2 and path[0] in _SIGNAL_PAYLOADS:
        path = path[1:]
    return type(key) is int and path == ("video_frames",)


def _holds_audio(path: _Path) -> bool:
    """Whether an ``audio`` member at ``path`` is client audio, bounded by the frame size
    alone: the top-level one (``input_audio_buffer.append``) or an ``input_audio`` part of a
    ``conversation.item.create`` item (``item.content[i].audio``), also when that item comes
    in the payload of a ``turn.signal`` routed to it, which is validated the same way."""
    if len(path) == 4 and path[0] in _SIGNAL_PAYLOADS:
        path = path[1:]
    return not path or (len(path) == 3 and path[0] == "item" and path[1] == "content")


def _scan_members(
    container: Any, path: _Path, pending: list[tuple[Any, _Path]]
) -> _Violation | None:
    """Check one container's keys and scalars; queue its containers on ``pending``.

    The hot path (an audio append: four ASCII keys, a string, an int) must stay cheap, so each
    value gets an inline check that passes what is certainly fine; only what fails it goes to
    :func:`_value_problem`, which decides and says what is wrong.
    """
    is_object = type(container) is dict  # else a list: the walk queues nothing else
    members: Iterable[tuple[Any, Any]] = container.items() if is_object else enumerate(container)
    for key, value in members:
        if is_object and not (key.isascii() and len(key) <= MAX_STRING_CHARS):
            if problem := _string_problem(key, exempt_length=False):
                return _Violation.at((*path, key), f"the key is {problem}")
        kind = type(value)
        if kind is str:
            if value.isascii() and len(value) <= MAX_STRING_CHARS:
                continue
        elif kind is int:
            if -MAX_INT <= value <= MAX_INT:
                continue
        elif kind is dict or kind is list:
            pending.append((value, (*path, key)))
            continue
        elif kind is not float or _isfinite(value):  # null, a boolean, a finite number
            continue
        exempt = ((key == "audio" and _holds_audio(path)) or _holds_frames(path, key)
                  or (key == "ref_audio" and path == ("session",)))
        if problem := _value_problem(value, exempt_length=exempt):
            return _Violation.at((*path, key), problem)
    return None


def _find_violation(frame: JsonDict) -> _Violation | None:
    """The first value of ``frame`` out of bounds, or None.

    Iterative, with an explicit stack: a recursive walk is what a deep frame is built to break.
    Every value is visited at most once and the count is checked before a container's members
    are, so the walk costs at most :data:`MAX_VALUES` steps whatever the frame holds.
    """
    pending: list[tuple[Any, _Path]] = [(frame, ())]
    values = 0
    while pending:
        container, path = pending.pop()
        if len(path) >= MAX_DEPTH:  # the frame's own object, at path (), is level 1
            return _Violation(path, TOO_DEEP, json_level=True)
        values += len(container)
        if values > MAX_VALUES:
            return _Violation((), f"The JSON holds more than {MAX_VALUES} values.")
        violation = _scan_members(container, path, pending)
        if violation is not None:
            return violation
    return None


def check_bounds(frame: JsonDict) -> None:
    """Refuse a frame with any value out of bounds, before any parser sees it.

    A frame from ``json.loads`` may still be unusable: a lone surrogate cannot be encoded, inf
    (from ``1e400``) cannot be rendered, a huge integer is not exact in Lua, and deep nesting
    breaks recursive code downstream (the worker's). One walk over the whole frame catches all
    of these, so no field parser needs to.

    Raises:
        ClientProtocolError: ``invalid_json`` for nesting deeper than :data:`MAX_DEPTH`,
            ``invalid_session_resume`` for any other violation in a ``session.resume`` (a
            resume that can never work, not a failure to retry), else ``invalid_value``; the
            path to the value is the ``param``.
    """
    violation = _find_violation(frame)
    if violation is None:
        return
    if violation.json_level:
        code = ErrorCode.INVALID_JSON
    elif frame.get("type") == "session.resume":
        code = ErrorCode.INVALID_SESSION_RESUME
    else:
        code = ErrorCode.INVALID_VALUE
    event_id = frame.get("event_id")
    echo = isinstance(event_id, str) and violation.path[:1] != ("event_id",)
    raise ClientProtocolError(code, violation.message, param=_render_path(violation.path),
                              client_event_id=event_id if echo else None)


# --------------------------------------------------------------------------- camera frames


def video_frame_bytes(frame: str) -> int:
    """The size of the image a strictly valid base64 ``frame`` decodes to, without decoding."""
    return len(frame) // 4 * 3 - frame[-2:].count("=")


def video_frame_problem(frame: str) -> str | None:
    """What is wrong with one camera frame (strictly valid base64), or None: it must be a
    JPEG or PNG image, as the seed checks, by its first bytes."""
    head = binascii.a2b_base64(frame[:_MAGIC_CHARS])
    if head.startswith(_IMAGE_MAGIC):
        return None
    return "expected a JPEG or PNG image"


# A camera frame may arrive as a data URL; the log carries bare base64.
_DATA_URL_MARK = ";base64,"


def video_frames_of(raw: list[Any] | None, event_id: str | None) -> tuple[str, ...]:
    """An append's ``video_frames``: at most :data:`MAX_VIDEO_FRAMES_PER_APPEND`, each a
    string of strict base64 (a data URL's prefix stripped) holding a JPEG or PNG image. How
    large a frame may be, and how many a second, :class:`VideoBudget` checks.

    Raises:
        ClientProtocolError: the seed's ``invalid_video_frames``, naming the frame at fault.
    """
    def fail(param: str, problem: str) -> NoReturn:
        raise ClientProtocolError(ErrorCode.INVALID_VIDEO_FRAMES,
                                  f"Invalid value for '{param}': {problem}.", param=param,
                                  client_event_id=event_id)

    if not raw:
        return ()
    if len(raw) > MAX_VIDEO_FRAMES_PER_APPEND:
        fail("video_frames", f"more than {MAX_VIDEO_FRAMES_PER_APPEND} frames in one append;"
             " send about one frame per second of audio")
    frames = []
    for index, frame in enumerate(raw):
        param = f"video_frames[{index}]"
        if type(frame) is not str or not frame:
            fail(param, "expected a non-empty base64 string")
        bare = frame.partition(_DATA_URL_MARK)[2] if frame.startswith("data:") else frame
        try:
            binascii.a2b_base64(bare, strict_mode=True)
        except (binascii.Error, ValueError):
            fail(param, "not base64")
        if problem := video_frame_problem(bare):
            fail(param, problem)
        frames.append(bare)
    return tuple(frames)


@dataclass(frozen=True, slots=True, kw_only=True)
class VideoBounds:
    """The gateway's bounds on camera frames (its settings).

    Attributes:
        max_frame_bytes: the largest image one frame may hold, decoded (0: only the frame
            size bounds it).
        max_frames_per_s: camera frames one connection may send per second, with one second
            of burst (0: no limit).
    """

    max_frame_bytes: int = 3_000_000
    max_frames_per_s: float = 4.0


class VideoBudget:
    """One connection's camera frames against :class:`VideoBounds`: a frame rate with one
    second of burst, and each frame's size. No clock of its own."""

    __slots__ = ("_bounds", "_burst", "_last", "_tokens")

    def __init__(self, bounds: VideoBounds, now: float) -> None:
        self._bounds = bounds
        # One second of the rate, and never less than one full append.
        self._burst = max(bounds.max_frames_per_s, MAX_VIDEO_FRAMES_PER_APPEND)
        self._tokens = self._burst  # a connection starts with its full burst
        self._last = now

    def refusal(self, append: AppendAudio, now: float) -> ClientProtocolError | None:
        """Charge an append's frames at ``now``; None when they are within bounds, else the
        refusal to answer (``invalid_video_frames``: a frame larger than the bound, or more
        frames than the rate allows). A refused append charges nothing."""
        try:
            self.charge(append.video_frames, now, append.event_id)
        except ClientProtocolError as exc:
            return exc
        return None

    def charge(self, frames: tuple[str, ...], now: float, event_id: str | None) -> None:
        """Charge ``frames`` at ``now`` (a refused append charges nothing).

        Raises:
            ClientProtocolError: ``invalid_video_frames``: a frame larger than the bound, or
                more frames than the rate allows; ``event_id`` is echoed.
        """
        bounds = self._bounds
        for index, frame in enumerate(frames):
            if bounds.max_frame_bytes and video_frame_bytes(frame) > bounds.max_frame_bytes:
                param = f"video_frames[{index}]"
                raise ClientProtocolError(
                    ErrorCode.INVALID_VIDEO_FRAMES,
                    f"Invalid value for '{param}': an image larger than "
                    f"{bounds.max_frame_bytes} bytes; lower the capture resolution or quality.",
                    param=param, client_event_id=event_id)
        rate = bounds.max_frames_per_s
        if rate <= 0 or not frames:
            return
        tokens = min(self._burst, self._tokens + (now - self._last) * rate)
        self._last = now
        self._tokens = tokens if tokens < len(frames) else tokens - len(frames)
        if tokens < len(frames):
            raise ClientProtocolError(
                ErrorCode.INVALID_VIDEO_FRAMES,
                f"More than {rate:g} camera frames per second on this connection; send about "
                "one frame per second of audio.", param="video_frames", client_event_id=event_id)
