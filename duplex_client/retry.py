"""How the client retries: its settings, which failures another attempt can cure, and the loop
that tries gateway after gateway with jittered exponential backoff."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidMessage, InvalidStatus

from duplex_client.errors import DuplexClientError, RetriesExhausted

__all__ = [
    "ATTEMPT_ERRORS",
    "RETRYABLE_RESUME_CODES",
    "Attempt",
    "ClientClosing",
    "ClientSettings",
    "Connected",
    "Failure",
    "NoAnswer",
    "as_client_error",
    "failure_of",
    "open_may_retry",
    "resume_may_retry",
    "retrying",
]

#: Close codes after which the session is still there to resume: a gateway or store failure
#: (1011), a draining gateway (1012), try again later (1013).
_RETRYABLE_CLOSE_CODES = frozenset({1011, 1012, 1013})
#: Refusals of an open that say "later", not "no": nothing was opened, so opening again is safe.
#: ``engine_backpressure`` is the seed's (its engine's mailbox was full).
_TRY_LATER_CODES = frozenset({"resource_exhausted", "rate_limit_exceeded", "engine_backpressure"})
#: Error answers to a resume that another attempt can cure; every other code is final.
RETRYABLE_RESUME_CODES = _TRY_LATER_CODES | {"internal_error"}


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How :meth:`DuplexClient.events` (and ``connect(retry_open=True)``) retries.

    The defaults fit the gateway's: a detached session is kept ``DISCONNECT_GRACE_S`` (30 s),
    so retrying longer than that cannot succeed.
    """

    #: Connection attempts after the first one, per outage (or per open): enough that
    #: ``retry_deadline_s`` ends the tries first, also through a Redis Cluster failover
    #: (cluster-node-timeout, 15 s by default, plus the election).
    max_retries: int = 20
    #: Give up an outage this long after it began.
    retry_deadline_s: float = 30.0
    #: The first backoff ceiling; it doubles per retry up to ``backoff_cap_s``.
    backoff_base_s: float = 0.05
    backoff_cap_s: float = 2.0
    #: One attempt: the websocket handshake plus the gateway's first answer.
    attempt_timeout_s: float = 10.0
    #: While :meth:`DuplexClient.events` runs, a ``session.heartbeat`` goes out whenever
    #: nothing was sent for this long, so a client that only listens keeps its session from
    #: the gateway's ``IDLE_TTL_S`` (300 s); None: never.
    heartbeat_interval_s: float | None = 10.0
    #: Leaving ``async with``: wait this long for the session's terminal event after
    #: ``session.close`` (a resume included, when the connection was gone).
    close_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if min(self.retry_deadline_s, self.attempt_timeout_s, self.close_timeout_s) <= 0:
            raise ValueError("retry_deadline_s, attempt_timeout_s and close_timeout_s must be > 0")
        if not 0 < self.backoff_base_s <= self.backoff_cap_s:
            raise ValueError("need 0 < backoff_base_s <= backoff_cap_s")
        if self.heartbeat_interval_s is not None and self.heartbeat_interval_s <= 0:
            raise ValueError("heartbeat_interval_s must be > 0 (or None: no heartbeats)")

    def backoff_s(self, retry: int, jitter: float) -> float:
        """The pause before retry ``retry`` (0 for the first), ``jitter`` in [0, 1).

        "Full jitter": uniform below a ceiling that doubles per retry, so the clients a gateway
        dropped all at once do not all come back at once.
        """
        ceiling = min(self.backoff_cap_s, self.backoff_base_s * 2.0 ** min(retry, 62))
        return ceiling * jitter


class FailureKind(enum.Enum):
    UNREACHABLE = "unreachable"  # the handshake never completed: nothing reached the gateway
    HTTP = "http"  # the gateway answered the upgrade with an HTTP status
    CLOSED = "closed"  # an open websocket dropped or was closed
    REFUSED = "refused"  # the gateway answered with an ``error`` event


@dataclass(frozen=True, slots=True)
class Failure:
    """Why one connection attempt, or a connection, failed."""

    kind: FailureKind
    reason: str
    code: str | None = None
    close_code: int | None = None
    http_status: int | None = None


class NoAnswer(TimeoutError):
    """The handshake worked and the first frame went out, but no answer came in time: as
    ambiguous as a connection dropped at that point."""


def failure_of(exc: Exception) -> Failure:
    if isinstance(exc, NoAnswer):
        return Failure(FailureKind.CLOSED, "no answer")
    if isinstance(exc, ConnectionClosed):
        close_code = exc.rcvd.code if exc.rcvd is not None else None
        reason = "dropped" if close_code is None else f"closed {close_code}"
        return Failure(FailureKind.CLOSED, reason, close_code=close_code)
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        return Failure(FailureKind.HTTP, f"http {status}", http_status=status)
    if isinstance(exc, DuplexClientError):
        return Failure(FailureKind.REFUSED, f"refused: {exc.code}", code=exc.code,
                        close_code=exc.close_code)
    return Failure(FailureKind.UNREACHABLE, f"unreachable: {exc!r}")


def _http_may_retry(status: int | None) -> bool:
    # 503 while a gateway drains or its Redis is away; 429 from a balancer. A 401 is final.
    return status is not None and (status >= 500 or status == 429)


def resume_may_retry(failure: Failure) -> bool:
    """Whether another resume attempt can succeed after ``failure``."""
    if failure.kind is FailureKind.REFUSED:
        return failure.code in RETRYABLE_RESUME_CODES
    if failure.kind is FailureKind.HTTP:
        return _http_may_retry(failure.http_status)
    if failure.kind is FailureKind.CLOSED:
        return failure.close_code is None or failure.close_code in _RETRYABLE_CLOSE_CODES
    return True


def open_may_retry(failure: Failure) -> bool:
    """Whether opening again is safe and may succeed: only when nothing can have been opened.
    A connection that drops after the ``session.update`` went out may have opened a session;
    a second open would leave that one orphaned, so that is the caller's call."""
    if failure.kind is FailureKind.REFUSED:
        return failure.code in _TRY_LATER_CODES
    if failure.kind is FailureKind.HTTP:
        return _http_may_retry(failure.http_status)
    return failure.kind is FailureKind.UNREACHABLE


def as_client_error(exc: Exception, failure: Failure) -> DuplexClientError:
    if isinstance(exc, DuplexClientError):
        return exc
    return DuplexClientError(f"connection failed: {failure.reason}", code=failure.code,
                             close_code=failure.close_code)


#: What a failed attempt may raise: everything else is a bug, not a connection problem.
ATTEMPT_ERRORS = (OSError, InvalidMessage, InvalidStatus, ConnectionClosed, DuplexClientError)
Attempt = Callable[[str, float], Awaitable[tuple[ClientConnection, dict[str, Any]]]]


@dataclass(frozen=True, slots=True)
class Connected:
    """A connection the gateway answered: its first answer, where, after how many tries."""

    ws: ClientConnection
    answer: dict[str, Any]
    url: str
    attempts: int


class ClientClosing(Exception):
    """:meth:`DuplexClient.detach` was called while a reconnection was under way."""


async def retrying(attempt: Attempt, may_retry: Callable[[Failure], bool], *,
                   settings: ClientSettings, jitter: Callable[[], float],
                   first_url: str | None, next_url: Callable[[], str],
                   closing: Callable[[], bool]) -> Connected:
    """Run ``attempt`` on URL after URL, backing off between tries, until one answers.

    The first try goes to ``first_url`` (None: to ``next_url()`` as every retry does).

    Raises:
        DuplexClientError: a failure no retry can help, or :class:`RetriesExhausted`.
        ClientClosing: ``closing()`` turned true meanwhile.
    """
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + settings.retry_deadline_s
    last: Failure | None = None
    tries = 0
    for retry in range(-1, settings.max_retries):
        if retry >= 0:
            pause = settings.backoff_s(retry, jitter())
            if loop.time() + pause >= give_up_at:
                break
            await asyncio.sleep(pause)
        if closing():
            raise ClientClosing
        url = first_url if retry < 0 and first_url is not None else next_url()
        budget = min(settings.attempt_timeout_s, max(give_up_at - loop.time(), 0.001))
        tries += 1
        try:
            ws, answer = await attempt(url, budget)
        except ATTEMPT_ERRORS as exc:
            last = failure_of(exc)
            if not may_retry(last):
                raise as_client_error(exc, last) from exc
            continue
        return Connected(ws, answer, url, tries)
    reason = last.reason if last is not None else "no attempt fitted the deadline"
    raise RetriesExhausted(f"gave up after {tries} attempts: {reason}", attempts=tries,
                           code=last.code if last else None,
                           close_code=last.close_code if last else None)
