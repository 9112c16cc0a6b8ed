"""The gateway's sans-I/O protocol layer: wire codec, envelopes and errors (no I/O here)."""

from __future__ import annotations

from gateway.protocol.envelope import (
    ClientEnvelope,
    EventAck,
    Notice,
    ParsedFrame,
    ResumeRequest,
    ResyncRequiredNotice,
    SessionCreatedNotice,
    SessionReplacedNotice,
    SessionResumedNotice,
)
from gateway.protocol.errors import (
    PARSE_ERROR_CODES,
    ClientProtocolError,
    CloseCode,
    ErrorCode,
    GatewayError,
    InternalError,
)
from gateway.protocol.parse import (
    CLIENT_EVENT_TYPES,
    MAX_SEQ,
    UNSUPPORTED_CLIENT_EVENT_TYPES,
    parse_client_frame,
)
from gateway.protocol.render import encode_frame, render_error, render_event, render_notice

__all__ = [
    "CLIENT_EVENT_TYPES",
    "MAX_SEQ",
    "PARSE_ERROR_CODES",
    "UNSUPPORTED_CLIENT_EVENT_TYPES",
    "ClientEnvelope",
    "ClientProtocolError",
    "CloseCode",
    "ErrorCode",
    "EventAck",
    "GatewayError",
    "InternalError",
    "Notice",
    "ParsedFrame",
    "ResumeRequest",
    "ResyncRequiredNotice",
    "SessionCreatedNotice",
    "SessionReplacedNotice",
    "SessionResumedNotice",
    "encode_frame",
    "parse_client_frame",
    "render_error",
    "render_event",
    "render_notice",
]
