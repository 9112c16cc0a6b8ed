"""Conversation items as the conversation keeps them, and reading the items clients send
(the Realtime object shapes built from them are :mod:`~inference_worker.conversation.objects`).

:class:`Item` is one item of a session's history (no audio bytes: their length only).
:func:`parse_message` reads a ``message`` a client sends (``conversation.item.create``, or a
``response.create``'s ``input``): its role, its content parts, and its audio in the session's
input format as pcm16 24 kHz; :data:`FUNCTION_ITEMS` are the function items' fields. Every
refusal names the path of the value at fault. Pure: no I/O, no clock.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Final

from contract import messages as msg
from contract.messages import JsonObject
from inference_worker.audio_formats import AudioFormat, InputDecoder, parse_format
from inference_worker.conversation.profiles import BYTES_PER_SECOND
from inference_worker.conversation.refusals import Refusal, RefusalCode
from inference_worker.untrusted import describe

__all__ = [
    "FUNCTION_ITEMS",
    "PART_TYPES",
    "CreatedUserTurn",
    "Item",
    "cut_transcript",
    "format_of",
    "parse_message",
    "truncate_refusal",
]

#: Bytes of pcm16 24 kHz mono per millisecond of audio.
_BYTES_PER_MS: Final = BYTES_PER_SECOND // 1000


#: The content part types each role's message may carry (openai_realtime.md §1c).
PART_TYPES: Final = {
    "user": ("input_text", "input_audio"),
    "system": ("input_text",),
    "assistant": ("output_text", "output_audio"),
}


#: The function items ``conversation.item.create`` takes, with their string fields in GA order.
FUNCTION_ITEMS: Final[dict[str, tuple[str, ...]]] = {
    "function_call": ("call_id", "name", "arguments"),
    "function_call_output": ("call_id", "output"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Item:
    """One conversation item, as the conversation keeps it (no audio bytes).

    Attributes:
        id: the item's id.
        role: a message's ``user``, ``system`` or ``assistant`` ("" for the function items).
        status: ``in_progress``, ``completed`` or ``incomplete``.
        content: a message's GA content parts, without their ``audio``.
        audio_bytes: assistant audio: the bytes generated so far (or sent with a created
            item), cut to the heard length by a truncation.
        kind: its GA ``type``: ``message``, ``function_call`` or ``function_call_output``.
        fields: a function item's own fields (``call_id``, ``name``, ``arguments``;
            ``call_id``, ``output``).
    """

    id: str
    role: str
    status: str
    content: tuple[JsonObject, ...]
    audio_bytes: int = 0
    kind: str = "message"
    fields: tuple[tuple[str, str], ...] = ()

    def with_audio_bytes(self, audio_bytes: int) -> Item:
        """This item with ``audio_bytes`` instead: ``dataclasses.replace(self,
        audio_bytes=...)`` without its walk over the fields, as it runs once per audio delta.
        It names every field (tests/worker/test_items.py checks it against ``replace``)."""
        return Item(id=self.id, role=self.role, status=self.status, content=self.content,
                    audio_bytes=audio_bytes, kind=self.kind, fields=self.fields)

    @property
    def audio_ms(self) -> int:
        """Milliseconds of audio, rounded up: a client that played every byte it got may
        say so in whole milliseconds without exceeding it."""
        return -(-self.audio_bytes // _BYTES_PER_MS)

    @property
    def truncatable(self) -> bool:
        """Whether it is an assistant audio item (the only kind GA truncates)."""
        return self.role == "assistant" and any(part["type"] == "output_audio"
                                                for part in self.content)

    def realtime(self) -> JsonObject:
        """The GA item object (``realtime.item``)."""
        if self.kind != "message":
            return {"id": self.id, "object": "realtime.item", "type": self.kind,
                    "status": self.status, **dict(self.fields)}
        return {"id": self.id, "object": "realtime.item", "type": "message", "role": self.role,
                "status": self.status, "content": [dict(part) for part in self.content]}


@dataclass(frozen=True, slots=True, kw_only=True)
class CreatedUserTurn:
    """A user message a ``conversation.item.create`` added, for a core that answers user
    turns: its id and the pcm16 audio of its ``input_audio`` parts (empty for text)."""

    item_id: str
    audio: bytes


def cut_transcript(text: str, share: float) -> str:
    """The first ``share`` of ``text``, at a word boundary: no half-heard words."""
    end = int(len(text) * share)
    if end >= len(text):
        return text
    return text[:end].rsplit(" ", 1)[0] if " " in text[:end] else ""


def truncate_refusal(item: Item, command: msg.TruncateItem) -> Refusal | None:
    """Why ``item`` cannot be cut to ``command.audio_end_ms`` (None: it can)."""
    if not item.truncatable:
        return Refusal(code=RefusalCode.INVALID_VALUE, param="item_id",
                       message=f"Only assistant audio items can be truncated; {item.id} is not"
                       " one.")
    if command.content_index != 0:
        return Refusal(code=RefusalCode.INVALID_VALUE, param="content_index",
                       message="Invalid value for 'content_index': audio is content part 0.")
    if command.audio_end_ms > item.audio_ms:
        return Refusal(code=RefusalCode.INVALID_VALUE, param="audio_end_ms",
                       message=f"audio_end_ms {command.audio_end_ms} is longer than the"
                       f" {item.audio_ms} ms of audio of item {item.id}.")
    return None


def parse_message(item: JsonObject,
                fmt: AudioFormat) -> tuple[str, tuple[JsonObject, ...], bytes] | Refusal:
    """A created message's role, its content parts without audio, and the pcm16 audio its
    parts carried; or why it is refused (the function items are read apart)."""
    kind = _string_field(item, "type", "item.type")
    if isinstance(kind, Refusal):
        return kind
    if kind != "message":
        return Refusal(code=RefusalCode.INVALID_VALUE, param="item.type",
                       message=f"unsupported item type {describe(kind)}: expected 'message',"
                       " 'function_call' or 'function_call_output'")
    role = _string_field(item, "role", "item.role")
    if isinstance(role, Refusal):
        return role
    if role not in PART_TYPES:
        return Refusal(code=RefusalCode.INVALID_VALUE, param="item.role",
                       message=f"unsupported role {describe(role)}: expected one of"
                       " 'user', 'system', 'assistant'")
    parts = item.get("content")
    if parts is None:
        return Refusal(code=RefusalCode.MISSING_REQUIRED_PARAMETER, param="item.content",
                       message="Missing required parameter: 'item.content'.")
    if not isinstance(parts, list):
        return Refusal(code=RefusalCode.INVALID_TYPE, param="item.content",
                       message="expected an array")
    if not parts:
        return Refusal(code=RefusalCode.INVALID_VALUE, param="item.content",
                       message="a message needs at least one content part")
    content: list[JsonObject] = []
    audio = bytearray()
    for index, part in enumerate(parts):
        parsed = _parse_part(part, PART_TYPES[role], f"item.content[{index}]", fmt)
        if isinstance(parsed, Refusal):
            return parsed
        content.append(parsed[0])
        audio += parsed[1]
    return role, tuple(content), bytes(audio)


def _parse_part(part: Any, allowed: tuple[str, ...], param: str,
                fmt: AudioFormat) -> tuple[JsonObject, bytes] | Refusal:
    """One content part without its audio, and the audio; or why it is refused."""
    if not isinstance(part, dict):
        return Refusal(code=RefusalCode.INVALID_TYPE, param=param, message="expected an object")
    kind = _string_field(part, "type", f"{param}.type")
    if isinstance(kind, Refusal):
        return kind
    if kind not in allowed:
        return Refusal(code=RefusalCode.INVALID_VALUE, param=f"{param}.type",
                       message=f"unsupported part type {describe(kind)} for this role:"
                       f" expected one of {', '.join(allowed)}")
    if kind.endswith("_text"):
        text = _string_field(part, "text", f"{param}.text")
        return text if isinstance(text, Refusal) else ({"type": kind, "text": text}, b"")
    transcript = part.get("transcript")
    if transcript is not None and not isinstance(transcript, str):
        return Refusal(code=RefusalCode.INVALID_TYPE, param=f"{param}.transcript",
                       message="expected a string or null")
    audio = _audio(part.get("audio"), f"{param}.audio", fmt)
    if isinstance(audio, Refusal):
        return audio
    if kind == "output_audio":
        transcript = transcript or ""  # assistant audio always has a transcript, maybe empty
    return {"type": kind, "transcript": transcript}, audio


def _string_field(obj: JsonObject, key: str, param: str) -> str | Refusal:
    value = obj.get(key)
    if value is None:
        return Refusal(code=RefusalCode.MISSING_REQUIRED_PARAMETER, param=param,
                       message=f"Missing required parameter: '{param}'.")
    if not isinstance(value, str):
        return Refusal(code=RefusalCode.INVALID_TYPE, param=param, message="expected a string")
    return value


def _audio(value: Any, param: str, fmt: AudioFormat) -> bytes | Refusal:
    """The optional base64 ``audio`` of a part, in the session's input format, as pcm16
    24 kHz (b"" when absent)."""
    if value is None:
        return b""
    if not isinstance(value, str):
        return Refusal(code=RefusalCode.INVALID_TYPE, param=param,
                       message="expected a base64 string")
    try:
        audio = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return Refusal(code=RefusalCode.INVALID_VALUE, param=param, message="not base64")
    if len(audio) % fmt.bytes_per_sample:
        return Refusal(code=RefusalCode.INVALID_VALUE, param=param,
                       message=f"audio must be whole {fmt.bytes_per_sample}-byte samples")
    return InputDecoder(fmt).decode(audio)


def format_of(value: JsonObject) -> AudioFormat:
    """The format of an accepted session's format object."""
    parsed = parse_format(value, "format")
    assert isinstance(parsed, AudioFormat)  # the session only holds accepted formats
    return parsed
