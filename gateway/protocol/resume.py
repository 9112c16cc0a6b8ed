"""A resume's protocol policy: the token it rotates to and what each store answer means.

The driver runs the resume script (retrying a lost answer under the same control id) and
hands the store's answer to :meth:`~gateway.protocol.connection.ConnectionCore.resume_answered`
as a :class:`ResumeAnswer`; the refusals below are the client's answer for each outcome that
attaches nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

from contract.messages import JsonObject
from gateway.protocol.errors import ErrorCode
from store.answers import ResumeStatus

__all__ = ["REFUSALS", "ResumeAnswer", "rotated_token"]


def rotated_token(old_token: str, control_id: str) -> str:
    """The token a resume rotates to, derived from the token it presents and its control id.

    A retry of that resume (its answer was lost) through any gateway presents the same two and
    so derives the same new token, whose digest the store then recognises as the one it
    rotated to: the retry gets the same token instead of ``invalid_resume_token``. The old
    token is the secret: only its holder can derive the new one, as only it could resume.
    """
    mac = hmac.new(old_token.encode(), b"session.resume\0" + control_id.encode(),
                   hashlib.sha256)
    return base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode("ascii")


#: The refusal each outcome that attaches nothing is answered with: (code, message).
REFUSALS: dict[ResumeStatus, tuple[ErrorCode, str]] = {
    ResumeStatus.UNKNOWN: (ErrorCode.SESSION_RESUME_EXPIRED, "the session is unknown or expired"),
    ResumeStatus.OTHER_FORMAT: (ErrorCode.SESSION_RESUME_EXPIRED,
                                "the session's record is of a format this gateway does not read"),
    ResumeStatus.STALE: (ErrorCode.SESSION_RESUME_CONFLICT,
                         "a later attempt of this resume attached the session already"),
    ResumeStatus.BAD_TOKEN: (ErrorCode.INVALID_RESUME_TOKEN, "the resume token is not valid"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeAnswer:
    """The store's answer to a resume: the outcome, the lease's generation (None: no lease),
    where the logs stand, and the session object and capabilities the record holds."""

    outcome: ResumeStatus
    generation: int | None = None
    last_client_seq: int = 0
    first_retained_seq: int = 0
    last_server_event_seq: int = 0
    session: JsonObject | None = None
    capabilities: JsonObject | None = None
