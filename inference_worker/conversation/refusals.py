"""Why the worker refuses a client's request: one value every refusal is, whatever decides it
(the session's rules, a format, an item, the conversation core), with its code from one
catalogue (:class:`RefusalCode`). It becomes the ``error`` event the client gets, naming the
command at fault."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

__all__ = [
    "BROKEN_SAMPLE",
    "CREATE_WITHOUT_INPUT",
    "TEXT_INPUT_REFUSAL",
    "Refusal",
    "RefusalCode",
    "already_active",
    "cancel_refusal",
    "commit_too_small",
]


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
    INVALID_INPUT_MODALITY = "invalid_input_modality"
    MODEL_UPDATE_UNSUPPORTED = "model_update_unsupported"
    # The seed's per-backend session refusals (conversation/seed_settings.py).
    INVALID_DUPLEX_RUNTIME_CONFIG = "invalid_duplex_runtime_config"
    INSTRUCTIONS_UPDATE_UNSUPPORTED = "instructions_update_unsupported"
    VOICE_UPDATE_AFTER_AUDIO_UNSUPPORTED = "voice_update_after_audio_unsupported"
    REF_AUDIO_REQUIRED = "ref_audio_required"
    REF_AUDIO_UPDATE_UNSUPPORTED = "ref_audio_update_unsupported"
    TEXT_ONLY_TURN_UNSUPPORTED = "text_only_turn_unsupported"
    # Audio the seed's codes name: samples cut short, a rate out of range.
    BAD_AUDIO = "bad_audio"
    BAD_EVENT = "bad_event"
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


# --------------------------------------------------------------------------- the core's refusals


def commit_too_small(buffered_ms: float) -> Refusal:
    """``input_audio_buffer.commit`` with less than 100 ms buffered (OpenAI's wording)."""
    return Refusal(
        code=RefusalCode.INPUT_AUDIO_BUFFER_COMMIT_EMPTY,
        message="Error committing input audio buffer: buffer too small. Expected at least"
        f" 100ms of audio, but buffer only has {buffered_ms:.2f}ms of audio.",
    )


def already_active(response_id: str) -> Refusal:
    """``response.create`` while a response is active (OpenAI's wording)."""
    return Refusal(
        code=RefusalCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE,
        message=f"Conversation already has an active response in progress: {response_id}."
        " Wait until the response is finished before creating a new one.",
    )


def cancel_refusal(active_id: str | None, requested_id: str | None) -> Refusal | None:
    """Why ``response.cancel`` cannot cancel (None: it can): no response is active, or it
    names another response than the active one."""
    if active_id is None:
        return Refusal(code=RefusalCode.RESPONSE_CANCEL_NOT_ACTIVE,
                       message="Cancellation failed: no active response found")
    if requested_id is not None and requested_id != active_id:
        return Refusal(code=RefusalCode.RESPONSE_CANCEL_NOT_ACTIVE, param="response_id",
                       message=f"Cancellation failed: {requested_id} is not active")
    return None


#: An ``input_audio_buffer.append`` of pcm16 that ends inside a sample.
BROKEN_SAMPLE: Final = Refusal(
    code=RefusalCode.INVALID_VALUE, param="audio",
    message="Invalid value for 'audio': pcm16 audio must be whole 2-byte samples.")

#: ``input.text.append``: no backend takes text into the user's turn.
TEXT_INPUT_REFUSAL: Final = Refusal(
    code=RefusalCode.NATIVE_TEXT_APPEND_UNSUPPORTED, param="text",
    message="this model takes no text in the user's turn; send a user message with"
    " conversation.item.create (an input_text part) instead")


#: The first ``video_frames`` of a session whose model sees no video (once per session: the
#: frames of later appends are dropped without another error, their audio heard).
VIDEO_REFUSAL: Final = Refusal(
    code=RefusalCode.INVALID_INPUT_MODALITY, param="video_frames",
    message="This model does not accept video_frames: its capabilities'"
    " optional_input_modalities has no 'video'. The audio is heard; frames are dropped.")

#: An append of camera frames without audio to a model that sees video: its frames ride an
#: audio unit (the seed's audio-primary contract), so the append does nothing.
VIDEO_ONLY_REFUSAL: Final = Refusal(
    code=RefusalCode.INVALID_INPUT_MODALITY, param="audio",
    message="This model requires audio; an append of video_frames alone is not allowed:"
    " send each frame with the audio of its unit.")

#: ``response.create`` on the loopback with no committed turn to answer.
CREATE_WITHOUT_INPUT: Final = Refusal(
    code=RefusalCode.RESPONSE_CREATE_WITHOUT_INPUT,
    message="The loopback answers a committed user turn; commit input audio first.")
