"""Gateway exceptions, the error codes they carry, and the websocket close codes we use.

Blame is split the way h11 splits Local/Remote errors, and every exception carries the
remedy as a ``close_code`` hint::

    GatewayError                      base of everything the gateway raises on purpose
     +-- ClientProtocolError          the client's fault: becomes a Realtime ``error`` event
     |                                (close_code None: the session stays usable; 1009: frame
     |                                too large; 1007: a text frame not UTF-8; 1008: policy;
     |                                1013: try again later)
     +-- InternalError                our fault: close 1011, no details on the wire (they may
                                      be security-sensitive, so they go to the log only)

Error codes
-----------

Every ``error`` event the gateway itself produces uses one of these ``code`` values. Errors
decided by the worker (``input_audio_buffer_commit_empty``, ``response_cancel_not_active``, ...)
reach the client through the output log and are not listed here.

| code | `error.type` | close | when |
| --- | --- | --- | --- |
| `event_too_large` | invalid_request_error | 1009 | frame over the size limit |
| `invalid_json` | invalid_request_error | - | not UTF-8 JSON, or nested deeper than 32 levels |
| `invalid_json` | invalid_request_error | 1007 | a text frame that is not UTF-8 (RFC 6455 §8.1) |
| `invalid_event` | invalid_request_error | - | not an object, or no string `type` |
| `unknown_event` | invalid_request_error | - | `type` is not a client event type |
| `unsupported_event` | invalid_request_error | - | a Realtime client event not implemented yet |
| `missing_required_parameter` | invalid_request_error | - | a required field is absent |
| `invalid_type` | invalid_request_error | - | a field has the wrong JSON type |
| `invalid_value` | invalid_request_error | - | bad `audio` or `client_seq`; a value out of bounds |
| `invalid_video_frames` | invalid_request_error | - | an append's camera frames out of bounds |
| `invalid_session_resume` | invalid_request_error | - | `session.resume` malformed or too long |
| `unsupported_session_resume` | invalid_request_error | - | `session.resume` not sent first |
| `session_resume_expired` | invalid_request_error | 1008 | resumed session unknown or ended |
| `invalid_resume_token` | invalid_request_error | 1008 | resume token does not match |
| `session_resume_conflict` | invalid_request_error | 1008 | a racing or later `attempt` won |
| `invalid_event_ack` | invalid_request_error | - | acknowledges an event never sent |
| `model_not_found` | invalid_request_error | 1008 | no worker serves the model asked for |
| `resource_exhausted` | rate_limit_error | 1013 | no slot for the model, tenant cap, store busy |
| `rate_limit_exceeded` | rate_limit_error | 1013 | the tenant's new sessions per minute |
| `input_backpressure` | rate_limit_error | 1013 | the worker is behind: resume, resend |
| `internal_error` | server_error | 1011 | any `InternalError` (no details on the wire) |
| `config_timeout` | invalid_request_error | 1008 | no first client event in time |
| `session_lost` | server_error | 1011 | the store no longer has the session (data loss) |

Every error names the client event at fault in ``error.event_id`` when the frame's ``event_id``
could be read, and the offending field in ``error.param`` when one is to blame.

The codes that :func:`gateway.protocol.parse.parse_client_frame` can raise are exactly
:data:`PARSE_ERROR_CODES`; nothing else escapes it.

Close reasons go through :func:`fit_close_reason`: a close frame carries at most 123 bytes of
UTF-8 reason, and a longer one makes the whole frame invalid (the client would see 1006).
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

__all__ = [
    "MAX_CLOSE_REASON_BYTES",
    "PARSE_ERROR_CODES",
    "ClientProtocolError",
    "CloseCode",
    "ErrorCode",
    "GatewayError",
    "InternalError",
    "fit_close_reason",
]


class CloseCode(IntEnum):
    """The websocket close codes the gateway sends (RFC 6455 §7.4.1)."""

    #: Normal end: the session ended (terminal event sent) or was replaced by a resume.
    NORMAL = 1000
    #: A text frame that is not UTF-8 (RFC 6455 §8.1: the endpoint must fail the connection).
    INVALID_PAYLOAD_DATA = 1007
    #: Policy violation: a resume refused, a model no worker serves, no first event in time.
    POLICY_VIOLATION = 1008
    #: A frame over ``max_frame_bytes``.
    MESSAGE_TOO_BIG = 1009
    #: An internal error; the session may be resumable elsewhere.
    INTERNAL_ERROR = 1011
    #: Gateway draining (SIGTERM): the session lives on, resume through another gateway.
    SERVICE_RESTART = 1012
    #: Retry later: overloaded (no worker slot, a tenant limit), or backpressure (the worker
    #: is behind on the input; the client took no output for ``OUTPUT_STALL_TIMEOUT_S``,
    #: reason ``output_stalled``), where the session is detached: resume it.
    TRY_AGAIN_LATER = 1013


class ErrorCode(StrEnum):
    """The ``error.code`` values the gateway itself emits (see the module docstring)."""

    EVENT_TOO_LARGE = "event_too_large"
    INVALID_JSON = "invalid_json"
    INVALID_EVENT = "invalid_event"
    UNKNOWN_EVENT = "unknown_event"
    UNSUPPORTED_EVENT = "unsupported_event"
    MISSING_REQUIRED_PARAMETER = "missing_required_parameter"
    INVALID_TYPE = "invalid_type"
    INVALID_VALUE = "invalid_value"
    INVALID_VIDEO_FRAMES = "invalid_video_frames"
    INVALID_SESSION_RESUME = "invalid_session_resume"
    UNSUPPORTED_SESSION_RESUME = "unsupported_session_resume"
    SESSION_RESUME_EXPIRED = "session_resume_expired"
    INVALID_RESUME_TOKEN = "invalid_resume_token"
    SESSION_RESUME_CONFLICT = "session_resume_conflict"
    INVALID_EVENT_ACK = "invalid_event_ack"
    MODEL_NOT_FOUND = "model_not_found"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    INPUT_BACKPRESSURE = "input_backpressure"
    INTERNAL_ERROR = "internal_error"
    CONFIG_TIMEOUT = "config_timeout"
    SESSION_LOST = "session_lost"


#: Every code ``parse_client_frame`` may raise; the fuzz tests hold it to this set.
PARSE_ERROR_CODES: frozenset[str] = frozenset(
    {
        ErrorCode.EVENT_TOO_LARGE,
        ErrorCode.INVALID_JSON,
        ErrorCode.INVALID_EVENT,
        ErrorCode.UNKNOWN_EVENT,
        ErrorCode.UNSUPPORTED_EVENT,
        ErrorCode.MISSING_REQUIRED_PARAMETER,
        ErrorCode.INVALID_TYPE,
        ErrorCode.INVALID_VALUE,
        ErrorCode.INVALID_VIDEO_FRAMES,
        ErrorCode.INVALID_SESSION_RESUME,
    }
)

# OpenAI's error classes by code; anything not listed is the client's request at fault.
_ERROR_TYPE_BY_CODE: dict[str, str] = {
    ErrorCode.RESOURCE_EXHAUSTED: "rate_limit_error",
    ErrorCode.RATE_LIMIT_EXCEEDED: "rate_limit_error",
    ErrorCode.INPUT_BACKPRESSURE: "rate_limit_error",
    ErrorCode.INTERNAL_ERROR: "server_error",
    ErrorCode.SESSION_LOST: "server_error",
}


class GatewayError(Exception):
    """Base of every exception the gateway raises deliberately.

    Attributes:
        close_code: how the connection should end: ``None`` keeps it open after an ``error``
            event; otherwise a :class:`CloseCode` value to close with.
    """

    close_code: int | None = None


class ClientProtocolError(GatewayError):
    """The client sent something wrong; it becomes a Realtime ``error`` event.

    Args:
        code: the ``error.code`` (an :class:`ErrorCode` value for the gateway's own errors).
        message: human-readable text, safe to show the client.
        param: the offending field, if one is to blame.
        client_event_id: the ``event_id`` of the client event at fault, echoed as
            ``error.event_id``.
        error_type: the ``error.type``; derived from ``code`` when omitted
            (``rate_limit_error`` for ``resource_exhausted``, else ``invalid_request_error``).
        close_code: ``None`` to keep the session, else the close code to end the connection
            with (1009 frame too large, 1007 text not UTF-8, 1008 policy, 1013 try again
            later).
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        client_event_id: str | None = None,
        error_type: str | None = None,
        close_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = str(code)  # a plain str, also when given an ErrorCode member
        self.message = message
        self.param = param
        self.client_event_id = client_event_id
        self.error_type = error_type or _ERROR_TYPE_BY_CODE.get(code, "invalid_request_error")
        self.close_code = close_code

    def __repr__(self) -> str:
        return (
            f"ClientProtocolError(code={self.code!r}, message={self.message!r}, "
            f"param={self.param!r}, client_event_id={self.client_event_id!r}, "
            f"close_code={self.close_code!r})"
        )


class InternalError(GatewayError):
    """A gateway bug or an undecodable input from our own side: close 1011, no details.

    The message goes to the log only; the client sees a generic ``server_error``.
    """

    close_code: int | None = CloseCode.INTERNAL_ERROR


#: The longest close reason, in UTF-8 bytes: a control frame's payload is at most 125 bytes
#: (RFC 6455 §5.5), two of which are the close code.
MAX_CLOSE_REASON_BYTES = 123


def fit_close_reason(reason: str) -> str:
    """``reason`` cut to fit a close frame: at most :data:`MAX_CLOSE_REASON_BYTES` UTF-8 bytes,
    never ending in part of a character. A lone surrogate, which UTF-8 cannot carry, becomes
    ``?``.
    """
    if reason.isascii():  # the usual case: one byte per character
        return reason[:MAX_CLOSE_REASON_BYTES]
    cut = reason.encode("utf-8", "replace")[:MAX_CLOSE_REASON_BYTES]
    # A character cut in the middle leaves an incomplete sequence at the end: drop it.
    return cut.decode("utf-8", "ignore")
