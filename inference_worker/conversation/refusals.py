"""Why the worker refuses a client's request: one value every refusal is, whatever decides it
(the session's rules, a format, an item, the conversation core), with its code from one
catalogue (:class:`RefusalCode`). It becomes the ``error`` event the client gets, naming the
command at fault."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Refusal", "RefusalCode"]


class RefusalCode(StrEnum):
    """Every ``error.code`` the worker refuses a request with: OpenAI's own codes where it has
    one, the seed's or ours where it does not (docs/protocol.md lists each)."""

    # A value, its type or its key (the session object, response.create, items).
    INVALID_VALUE = "invalid_value"
    INVALID_TYPE = "invalid_type"
    UNKNOWN_PARAMETER = "unknown_parameter"
    MISSING_REQUIRED_PARAMETER = "missing_required_parameter"
    # What the session's backend cannot do.
    UNSUPPORTED_AUDIO_FORMAT = "unsupported_audio_format"
    UNSUPPORTED_TURN_DETECTION = "unsupported_turn_detection"
    UNSUPPORTED_NATIVE_RESPONSE_OPTIONS = "unsupported_native_response_options"
    NATIVE_TEXT_APPEND_UNSUPPORTED = "native_text_append_unsupported"
    MODEL_UPDATE_UNSUPPORTED = "model_update_unsupported"
    # The conversation's state.
    INPUT_AUDIO_BUFFER_COMMIT_EMPTY = "input_audio_buffer_commit_empty"
    CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE = "conversation_already_has_active_response"
    RESPONSE_CANCEL_NOT_ACTIVE = "response_cancel_not_active"
    RESPONSE_CREATE_WITHOUT_INPUT = "response_create_without_input"
    ITEM_NOT_FOUND = "item_not_found"
    # playback.ack.
    PLAYBACK_ITEM_NOT_FOUND = "playback_item_not_found"
    PLAYBACK_ITEM_MISMATCH = "playback_item_mismatch"


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """Why a request was refused: its code, a message and the ``param``."""

    code: RefusalCode
    message: str
    param: str | None = None
