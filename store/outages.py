"""Redis outages told once per change, and a start-up that waits for Redis.

A process's loops (a worker's heartbeat, input poll and flush; a gateway's reaper, lease
renewer and subscriber) all fail together while Redis is away, several times a second each.
A line per failed try would bury the one fact an operator needs, so :class:`OutageLog` keeps
one state per process: a failure that is still not followed by a success
:data:`TOLD_AFTER_S` later writes "lost Redis at ADDRESS: DUTY failed (REASON)", the first
success after it "Redis at ADDRESS back after N s", and nothing in between. A blip shorter
than that (a pooled connection found broken once, just after an outage) is not told: the
loops retry it anyway, and a line for each would make every outage end in a flutter.

Reasons are said in plain words (:func:`plain_reason`): redis-py's own messages name its
internals ("Connection closed by server", "Error 111 connecting to ..."), which mislead more
than they help. Only Redis not answering is an outage (:func:`is_outage`): a call that Redis
answered with a refusal (a script's error) is its caller's to log. A failure that retrying
cannot mend (Redis refused the password, the user may not run scripts) is an operator's
mistake: :func:`operator_mistake` says it in a sentence, and :func:`wait_for_redis` stops the
start with :class:`RedisRefused` carrying it.

Meant for one event loop (no locking); the I/O is in :func:`wait_for_redis` alone.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

from redis import exceptions as redis_errors
from redis.exceptions import RedisClusterException

from runtime.config import SettingsError
from store.client import REDIS_ERRORS, RedisClient

__all__ = [
    "REDIS_START_TIMEOUT_S",
    "TOLD_AFTER_S",
    "OutageLog",
    "RedisRefused",
    "is_outage",
    "operator_mistake",
    "plain_reason",
    "redis_address",
    "wait_for_redis",
    "wait_for_redis_unless",
]

#: How long store calls must keep failing (no success between) before an outage is told.
TOLD_AFTER_S = 1.0
#: How long a process waits at start for Redis to answer before it gives up (exit status 2).
REDIS_START_TIMEOUT_S = 60.0
# Pauses between start-up tries: quick at first (Redis started alongside), then once a second.
_START_RETRY_S = (0.1, 0.2, 0.5, 1.0)


class RedisRefused(SettingsError):
    """Redis cannot be used as configured; the message is one sentence for the operator.

    A :class:`~runtime.config.SettingsError`, so the command line ends the process with the
    sentence and exit status 2, like any other setting that cannot be used.
    """


def redis_address(url: str) -> str:
    """Where ``url`` points, for a log line: its hosts and port, never its password."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    return hosts or url.partition("://")[0] + "://"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it was raised from (the store wraps redis-py's errors)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def operator_mistake(exc: BaseException) -> str | None:
    """What the operator must fix, when ``exc`` is a refusal that no retry mends; else None."""
    for cause in _causes(exc):
        text = str(cause)
        if isinstance(cause, redis_errors.AuthenticationError | redis_errors.AuthorizationError
                      ) or "WRONGPASS" in text or "NOAUTH" in text:
            return ("Redis refused the credentials: check the user and password in "
                    "DUPLEX_GATEWAY_REDIS_URL")
        if isinstance(cause, redis_errors.AuthenticationWrongNumberOfArgsError) or (
                "without any password configured" in text):
            return ("Redis has no password set but DUPLEX_GATEWAY_REDIS_URL gives one: remove"
                    " it from the URL")
        if isinstance(cause, redis_errors.NoPermissionError) or "NOPERM" in text:
            return ("the Redis user of DUPLEX_GATEWAY_REDIS_URL may not run the commands this"
                    " service needs (scripts, streams, pub/sub): widen its ACL")
        if "DB index is out of range" in text:
            return "the database number in DUPLEX_GATEWAY_REDIS_URL does not exist on that Redis"
    return None


# Plain words for what redis-py reports, checked in order (the first match wins).
_REASONS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...] = (
    (redis_errors.BusyLoadingError, "it is loading its data"),
    (redis_errors.ReadOnlyError, "it answered as a read-only replica (a failover)"),
    (redis_errors.ClusterDownError, "the Cluster is down"),
    (redis_errors.TryAgainError, "a Cluster slot is moving"),
    (ConnectionRefusedError, "connection refused"),
    ((TimeoutError, redis_errors.TimeoutError), "no answer in time"),
    (RedisClusterException, "no Cluster node answers for the slot"),
    ((ConnectionError, redis_errors.ConnectionError, OSError), "the connection broke"),
)


def _outage_reason(exc: BaseException) -> str | None:
    """Why Redis is not answering, in plain words; None when it answered (with an error)."""
    causes = list(_causes(exc))
    for kinds, reason in _REASONS:
        if any(isinstance(cause, kinds) for cause in causes):
            if reason == "the connection broke" and any(
                    "refused" in str(cause).lower() for cause in causes):
                return "connection refused"  # redis-py keeps only errno 111 in its text
            return reason
    for cause in causes:
        if "MASTERDOWN" in str(cause):
            return "its master is down"
    return None


def plain_reason(exc: BaseException) -> str:
    """Why a store call failed, in plain words rather than redis-py's internals."""
    mistake = operator_mistake(exc)
    if mistake is not None:
        return mistake
    return _outage_reason(exc) or "it answered with an error"


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis is not answering (unreachable, too slow, loading its data,
    failing over): what :class:`OutageLog` tells, once per change for the whole process.

    Not an outage: Redis answered and refused (a script's error, a missing permission), or a
    bug. That says something is wrong with this process or its setup, whatever the other
    calls do, so its callers log it as the fault it is.
    """
    return operator_mistake(exc) is None and _outage_reason(exc) is not None


class OutageLog:
    """One process's view of Redis: up or lost, each change written once.

    Args:
        logger: where the lines go.
        address: where Redis is (see :func:`redis_address`), named in each line; empty:
            not named.
        told_after_s: how long failures must last, with no success between, to be told.
        clock: monotonic seconds; injectable so tests can step time.
    """

    def __init__(self, logger: logging.Logger, address: str = "", *,
                 told_after_s: float = TOLD_AFTER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._redis = f"Redis at {address}" if address else "Redis"
        self._told_after_s = told_after_s
        self._clock = clock
        self._failing_since: float | None = None  # the first failure since the last success
        self._told = False

    @property
    def lost(self) -> bool:
        """Whether an outage was told and has not ended."""
        return self._told

    def failed(self, duty: str, exc: BaseException) -> bool:
        """A call made for ``duty`` (a noun: "heartbeat", "reaper pass") failed with ``exc``.

        Returns:
            Whether this told the outage (and so wrote a line).
        """
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = now
        if self._told or now - self._failing_since < self._told_after_s:
            return False
        self._told = True
        self._logger.warning("lost %s: %s failed (%s)", self._redis, duty,
                             plain_reason(exc))
        return True

    def call_failed(self, duty: str, exc: BaseException) -> bool:
        """A call made for ``duty`` failed: if that is an outage (:func:`is_outage`), count it
        towards the process's one line (:meth:`failed`) and return True.

        Otherwise return False and change nothing: a refusal neither starts an outage nor
        ends one, and the caller logs it itself (a WARNING, rate-limited where it repeats).
        """
        if not is_outage(exc):
            return False
        self.failed(duty, exc)
        return True

    def succeeded(self) -> bool:
        """A store call succeeded. Returns whether this ended a told outage (and wrote a
        line)."""
        failing_since, told = self._failing_since, self._told
        self._failing_since, self._told = None, False
        if failing_since is None or not told:
            return False
        self._logger.warning("%s back after %.1f s", self._redis, self._clock() - failing_since)
        return True


async def wait_for_redis_unless(stopping: asyncio.Event, client: RedisClient,
                                logger: logging.Logger, address: str, *,
                                timeout_s: float = REDIS_START_TIMEOUT_S) -> bool:
    """:func:`wait_for_redis`, or False as soon as ``stopping`` is set (a process told to
    stop while it waits for Redis, as a deploy that starts everything at once may).

    Raises:
        RedisRefused: as :func:`wait_for_redis`.
    """
    waiting = asyncio.create_task(wait_for_redis(client, logger, address, timeout_s=timeout_s))
    stopped = asyncio.create_task(stopping.wait())
    await asyncio.wait([waiting, stopped], return_when=asyncio.FIRST_COMPLETED)
    for task in (waiting, stopped):
        task.cancel()
    await asyncio.gather(waiting, stopped, return_exceptions=True)
    if waiting.done() and not waiting.cancelled():
        waiting.result()  # RedisRefused, if that is how it ended
        return True
    return False


async def wait_for_redis(client: RedisClient, logger: logging.Logger, address: str, *,
                         timeout_s: float = REDIS_START_TIMEOUT_S) -> None:
    """Wait until Redis answers PING, writing one line when waiting starts and one when it
    answers; retries are silent.

    Raises:
        RedisRefused: Redis refused this process (credentials, permissions, database), at
            once; or it did not answer within ``timeout_s``.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    waiting_since: float | None = None
    for attempt in itertools.count():
        try:
            await client.ping()
        except (*REDIS_ERRORS, OSError) as exc:
            mistake = operator_mistake(exc)
            if mistake is not None:
                raise RedisRefused(f"cannot use Redis at {address}: {mistake}") from None
            if loop.time() - started >= timeout_s:
                raise RedisRefused(
                    f"Redis at {address} did not answer within {timeout_s:.0f} s"
                    f" ({plain_reason(exc)}): start it, or point DUPLEX_GATEWAY_REDIS_URL"
                    " at a running one") from None
            if waiting_since is None:
                waiting_since = loop.time()
                logger.warning("waiting for Redis at %s (%s); giving up after %.0f s",
                               address, plain_reason(exc), timeout_s)
            await asyncio.sleep(_START_RETRY_S[min(attempt, len(_START_RETRY_S) - 1)])
            continue
        if waiting_since is not None:
            logger.info("connected to Redis at %s after %.1f s", address,
                           loop.time() - waiting_since)
        return
