"""What the client raises when the session cannot go on for it."""

from __future__ import annotations

__all__ = [
    "DuplexClientError",
    "ResumeRefused",
    "RetriesExhausted",
    "SessionClosedError",
    "SessionReplaced",
]


class DuplexClientError(Exception):
    """The gateway refused the session (open or resume), or the session is over for this client.

    Attributes:
        code: the ``error.code`` the gateway sent, or a client-side code
            (``session_replaced``, ``resend_buffer_overflow``); None when there was none.
        close_code: the websocket close code that ended the connection, None when the socket
            dropped without a close frame or the refusal came as an ``error`` event.
    """

    def __init__(self, message: str, *, code: str | None = None,
                 close_code: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.close_code = close_code


class ResumeRefused(DuplexClientError):
    """The gateway refused a resume for good: the session ended or is unknown
    (``session_resume_expired``), the token is void (``invalid_resume_token``), or the request
    is malformed (``invalid_session_resume``)."""


class SessionClosedError(DuplexClientError):
    """A command was submitted after the session ended (``code`` ``session_closed``, as the
    seed's handle raises it); ``__cause__`` is what ended it for this client, if not its
    terminal event."""


class SessionReplaced(DuplexClientError):
    """Another connection resumed this session (``session.replaced``); this client is done."""


class RetriesExhausted(DuplexClientError):
    """Every attempt failed, or the retry deadline passed; ``code`` and ``close_code`` are the
    last attempt's, ``attempts`` how many connections were tried."""

    def __init__(self, message: str, *, attempts: int, code: str | None = None,
                 close_code: int | None = None) -> None:
        super().__init__(message, code=code, close_code=close_code)
        self.attempts = attempts
