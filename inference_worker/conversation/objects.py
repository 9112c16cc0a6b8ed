"""Realtime GA object shapes the conversation core emits (response, user and assistant items,
content parts, usage).

Built here once (:mod:`inference_worker.conversation.history` uses them), so every backend's
sessions produce identical, strictly valid shapes.
"""

from __future__ import annotations

import copy
import enum
from typing import Final

from contract.messages import JsonObject

__all__ = [
    "CONVERSATION_ID",
    "CancelReason",
    "ResponseStatus",
    "assistant_item",
    "content_part",
    "item_content",
    "response_object",
    "user_audio_content",
    "user_item_object",
    "zero_usage",
]

#: One conversation per session (the default conversation of the Realtime API).
CONVERSATION_ID: Final = "conv_1"


class ResponseStatus(enum.StrEnum):
    """How a response ended (its ``status`` in ``response.done``)."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    #: Ended before its model finished, for a reason other than a cancel.
    FAILED = "failed"


class CancelReason(enum.StrEnum):
    """Why a response was cancelled (``status_details.reason``)."""

    #: The user spoke (turn detection, a barge-in).
    TURN_DETECTED = "turn_detected"
    #: The client asked (``response.cancel``, a cleared buffer, the session ending).
    CLIENT_CANCELLED = "client_cancelled"


def response_object(response_id: str, config: JsonObject, audio: bool,
                     metadata: dict[str, str] | None,
                     output: JsonObject | None = None) -> JsonObject:
    """The GA response object; ``output`` (``format``, ``voice``) overrides the session's
    audio output for this response."""
    output = {**config["audio"]["output"], **(output or {})}
    return {
        "id": response_id, "object": "realtime.response", "status": "in_progress",
        "status_details": None, "output": [], "conversation_id": CONVERSATION_ID,
        "output_modalities": ["audio"] if audio else ["text"],
        "max_output_tokens": config["max_output_tokens"],
        "audio": {"output": {"format": dict(output["format"]),
                             "voice": copy.deepcopy(output["voice"])}},
        "metadata": metadata, "usage": None,
    }


def assistant_item(item_id: str, status: str, content: list[JsonObject]) -> JsonObject:
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": "assistant",
            "status": status, "content": content}


def content_part(audio: bool) -> JsonObject:
    # Content-part events use "audio"/"text"; items use "output_audio"/"output_text"
    # (openai_realtime.md §8.3: mixing them fails strict validation).
    return {"type": "audio", "transcript": ""} if audio else {"type": "text", "text": ""}


def item_content(audio: bool) -> JsonObject:
    part = content_part(audio)
    return {**part, "type": f"output_{part['type']}"}


def zero_usage() -> JsonObject:
    # The loopback spends no tokens; the full shape keeps response.done strict-valid.
    tokens = {"text_tokens": 0, "audio_tokens": 0}
    return {
        "total_tokens": 0, "input_tokens": 0, "output_tokens": 0,
        "input_token_details": {**tokens, "image_tokens": 0, "cached_tokens": 0,
                                "cached_tokens_details": {**tokens, "image_tokens": 0}},
        "output_token_details": dict(tokens),
    }


def user_audio_content(transcript: str | None) -> tuple[JsonObject, ...]:
    return ({"type": "input_audio", "transcript": transcript},)


def user_item_object(item_id: str, transcript: str | None) -> JsonObject:
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": "user",
            "status": "completed",
            "content": [{"type": "input_audio", "transcript": transcript}]}
