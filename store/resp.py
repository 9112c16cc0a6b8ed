"""The store's own Redis connections for its two hottest paths, parsed without redis-py.

Per relayed chunk a gateway reads one push and makes about one script call, and so does a
worker. Through redis-py each costs its stream reader, a timeout per read, its connection pool
and command packer: client CPU per push and per call beyond the bytes, more than the relay's
own work (``docs/performance/notes/2026-12-05-relay-cpu.md``). Here the bytes go from the socket
straight into hiredis's reader inside the protocol's ``data_received``, and each reply is
handed over there.

Two shapes, one core (:class:`RespConnection`):

* :class:`PushConnection`: a subscriber. After the handshake everything Redis sends is a push
  (``smessage``, ``ssubscribe``, ``sunsubscribe``), a PING's answer or an error; an error ends
  the connection (its owner reconnects).
* :class:`RespConnection` itself: commands pipelined on one connection, their replies matched
  in order (Redis answers a connection's commands in the order it sent them). A caller that
  stops waiting leaves its place in the queue, so the next reply still finds its own caller.

RESP2, as redis-py's clients speak it. Where to connect comes from the process's redis-py
client (:func:`endpoint_of`): host and port or a unix socket, TLS, username, password and
database, and for Sentinel the master the Sentinels name now, asked again at every connect.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import (
    AskError,
    AuthenticationError,
    BusyLoadingError,
    ClusterCrossSlotError,
    ClusterDownError,
    ConnectionError as RedisConnectionError,
    ExecAbortError,
    MasterDownError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)

from store.client import CONNECT_TIMEOUT_S

__all__ = ["Endpoint", "PushConnection", "PushHandler", "RespConnection", "endpoint_of",
           "error_of"]

_log = logging.getLogger(__name__)

#: Called with (kind, channel, data) for every push, on the event loop, from the protocol:
#: it must not block. ``data`` is the message for ``smessage``, the subscription count for
#: ``ssubscribe`` and ``sunsubscribe``.
PushHandler = Callable[[bytes, bytes, Any], None]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """Where one connection goes, and how it logs in."""

    host: str = ""
    port: int = 6379
    path: str = ""  # a unix socket, instead of host and port
    username: str | None = None
    password: str | None = None
    db: int = 0
    tls: ssl.SSLContext | None = None
    connect_timeout_s: float = CONNECT_TIMEOUT_S

    def __repr__(self) -> str:  # never the password
        where = self.path or f"{self.host}:{self.port}"
        return f"Endpoint({where}{', tls' if self.tls else ''})"


async def endpoint_of(client: Redis) -> Endpoint:
    """Where ``client`` connects now (a Sentinel-managed client: the current master)."""
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    login = Endpoint(username=kwargs.get("username"), password=kwargs.get("password"),
                     db=int(kwargs.get("db") or 0),
                     connect_timeout_s=float(kwargs.get("socket_connect_timeout")
                                             or CONNECT_TIMEOUT_S))
    if issubclass(pool.connection_class, UnixDomainSocketConnection):
        return dataclasses.replace(login, path=str(kwargs["path"]))
    if isinstance(pool, SentinelConnectionPool):
        host, port = await pool.get_master_address()  # type: ignore[no-untyped-call]
    else:
        host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    tls = None
    if issubclass(pool.connection_class, SSLConnection):
        # The same context redis-py builds for its own connections, from the URL's options.
        options = {key: value for key, value in kwargs.items() if key.startswith("ssl_")}
        tls = SSLConnection(**options).ssl_context.get()
    return dataclasses.replace(login, host=str(host), port=int(port), tls=tls)


# Redis's error prefixes as redis-py's exceptions, so that callers (store/scripts.py's resends)
# treat an error the same whichever client carried the command. A Cluster's redirections
# carry their slot and node after the prefix, which their exceptions parse.
_ERRORS: dict[str, type[RedisError]] = {
    "NOSCRIPT": NoScriptError,
    "READONLY": ReadOnlyError,
    "LOADING": BusyLoadingError,
    "TRYAGAIN": TryAgainError,
    "NOAUTH": AuthenticationError,
    "WRONGPASS": AuthenticationError,
    "NOPERM": NoPermissionError,
    "CLUSTERDOWN": ClusterDownError,
    "MASTERDOWN": MasterDownError,
    "CROSSSLOT": ClusterCrossSlotError,
    "EXECABORT": ExecAbortError,
    "OOM": OutOfMemoryError,
}


def error_of(reply: hiredis.ReplyError) -> RedisError:
    """An error reply as the exception redis-py would raise for it."""
    text = str(reply)
    code, _, rest = text.partition(" ")
    if code in ("MOVED", "ASK"):
        try:
            return (MovedError if code == "MOVED" else AskError)(rest)
        except ValueError:  # no "slot host:port": not a redirection we can follow
            return ResponseError(text)
    return _ERRORS.get(code, ResponseError)(text)


def pack(parts: Sequence[bytes | str | int | float]) -> bytes:
    """One command in RESP, as redis-py writes it: bytes-likes as they are, str as UTF-8, int
    and float as ``repr`` writes them; anything else, a bool included (True is no Redis value),
    raises ``TypeError`` where redis-py raises its ``DataError``.

    hiredis writes it in C: the hot paths pack one command per relayed chunk, and the loop
    below, over a call's ~20 arguments, cost ~120 interpreted calls (``bench relay
    --profile``). hiredis takes exact ints and bytes only, so the rare call with a subclass or
    a bytearray goes through the loop.
    """
    command: Any = tuple(parts)  # hiredis's stub types it as a tuple of one argument
    try:
        packed: bytes = hiredis.pack_command(command)  # (typing.cast would be a Python call)
    except TypeError:
        return _pack_each(command)
    return packed


def _pack_each(parts: Sequence[bytes | str | int | float]) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        if isinstance(part, bytes | bytearray | memoryview):
            data = bytes(part)
        elif isinstance(part, str):
            data = part.encode()
        elif isinstance(part, bool) or not isinstance(part, int | float):
            raise TypeError(f"not a Redis argument: {type(part).__name__}")
        else:
            data = repr(part).encode()
        out += (b"$%d\r\n" % len(data), data, b"\r\n")
    return b"".join(out)


class RespConnection(asyncio.Protocol):
    """One connection: :meth:`open` it, :meth:`request` replies, await :attr:`closed`.

    Writes never wait; one on a closed connection raises redis-py's ``ConnectionError``, so
    callers catch one family of errors. :attr:`closed` resolves, never raises, with why the
    connection ended (Redis closed it, bytes that are no RESP, :meth:`abort`); every request
    still waiting then fails with a ``ConnectionError``: whether Redis ran it is unknown.
    """

    def __init__(self) -> None:
        self._reader = hiredis.Reader()
        self._transport: asyncio.Transport | None = None
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._last_heard = time.monotonic()
        self.closed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    @classmethod
    async def connect(cls, endpoint: Endpoint, factory: Callable[[], RespConnection],
                      ) -> RespConnection:
        """Connect with ``factory``'s protocol, log in and choose the database.

        Raises:
            redis.exceptions.ConnectionError: Redis could not be reached in time.
            redis.exceptions.AuthenticationError: Redis refused the credentials.
        """
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(endpoint.connect_timeout_s):
                if endpoint.path:
                    _, connection = await loop.create_unix_connection(factory, endpoint.path)
                else:
                    _, connection = await loop.create_connection(
                        factory, endpoint.host, endpoint.port, ssl=endpoint.tls)
                await connection._hello(endpoint)
        except (OSError, TimeoutError) as exc:
            raise RedisConnectionError(f"connection to {endpoint!r}: {exc}") from exc
        return connection

    async def _hello(self, endpoint: Endpoint) -> None:
        steps: list[list[bytes | str | int | float]] = []
        if endpoint.password is not None:
            steps.append(["AUTH", *([endpoint.username] if endpoint.username else []),
                          endpoint.password])
        if endpoint.db:
            steps.append(["SELECT", endpoint.db])
        for answer in await asyncio.gather(*(self.request(step) for step in steps),
                                           return_exceptions=True):
            if isinstance(answer, BaseException):
                self.abort(answer)
                raise answer

    def request(self, parts: Sequence[bytes | str | int | float]) -> asyncio.Future[Any]:
        """Send one command; the future resolves with its reply, or fails with the error
        Redis answered (as redis-py's exception) or a ``ConnectionError``."""
        data = pack(parts)
        if not self._waiting:
            self._last_heard = time.monotonic()  # silence counts from the first request
        self._write(data)
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        return waiter

    def request_many(self, commands: Sequence[Sequence[bytes | str | int | float]]
                     ) -> list[asyncio.Future[Any]]:
        """Send ``commands`` back to back in one write; one future per command, as
        :meth:`request`'s."""
        data = b"".join(pack(parts) for parts in commands)
        if not self._waiting:
            self._last_heard = time.monotonic()
        self._write(data)
        loop = asyncio.get_running_loop()
        waiters = [loop.create_future() for _ in commands]
        self._waiting.extend(waiters)
        return waiters

    @property
    def in_flight(self) -> int:
        """Requests sent and not answered yet."""
        return len(self._waiting)

    def silent_for(self) -> float:
        """Seconds since Redis last sent anything."""
        return time.monotonic() - self._last_heard

    def abort(self, why: BaseException) -> None:
        """Drop the connection now; :attr:`closed` resolves with ``why``."""
        if not self.closed.done():
            self.closed.set_result(why)
        self._fail_waiting(why)
        if self._transport is not None:
            self._transport.abort()

    def _write(self, data: bytes) -> None:
        if self._transport is None or self.closed.done() or self._transport.is_closing():
            raise RedisConnectionError("the connection is closed")
        self._transport.write(data)

    def _fail_waiting(self, why: BaseException) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_exception(RedisConnectionError(f"connection lost: {why}"))

    def _take(self, reply: Any) -> None:
        """Hand one reply to the request it answers."""
        if not self._waiting:
            self.abort(RedisConnectionError(f"a reply nothing asked for: {reply!r:.80}"))
            return
        waiter = self._waiting.popleft()
        if waiter.done():  # its caller stopped waiting
            return
        if isinstance(reply, hiredis.ReplyError):
            waiter.set_exception(error_of(reply))
        else:
            waiter.set_result(reply)

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports have asyncio.Transport's methods without being one.
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        why = exc or RedisConnectionError("Redis closed the connection")
        if not self.closed.done():
            self.closed.set_result(why)
        self._fail_waiting(why)

    def data_received(self, data: bytes) -> None:
        self._last_heard = time.monotonic()
        self._reader.feed(data)
        while not self.closed.done():
            try:
                reply = self._reader.gets()
            except hiredis.ProtocolError as exc:
                self.abort(RedisConnectionError(f"unparsable bytes from Redis: {exc}"))
                return
            if reply is False:
                return
            self._take(reply)


class PushConnection(RespConnection):
    """A subscriber connection: :meth:`open` it, :meth:`ssubscribe`, await :attr:`closed`."""

    def __init__(self, on_push: PushHandler) -> None:
        super().__init__()
        self._on_push = on_push

    @classmethod
    async def open(cls, endpoint: Endpoint, on_push: PushHandler) -> PushConnection:
        """Connect and log in (see :meth:`RespConnection.connect`)."""
        connection = await cls.connect(endpoint, lambda: cls(on_push))
        return cast(PushConnection, connection)

    def ssubscribe(self, channel: bytes) -> None:
        self._write(pack([b"SSUBSCRIBE", channel]))

    def sunsubscribe(self, channel: bytes) -> None:
        self._write(pack([b"SUNSUBSCRIBE", channel]))

    def ping(self) -> None:
        self._write(pack([b"PING"]))

    def _take(self, reply: Any) -> None:
        if self._waiting:  # the handshake, before any subscription
            super()._take(reply)
            return
        if isinstance(reply, hiredis.ReplyError):
            # A refused subscription (MOVED: the slot is served elsewhere now): the owner
            # reconnects where the slot lives and subscribes every channel again.
            self.abort(error_of(reply))
            return
        if isinstance(reply, list) and len(reply) == 3:
            try:
                self._on_push(reply[0], reply[1], reply[2])
            except Exception:  # a bad push or handler must not end every delivery
                _log.exception("dropped a push: %r", reply[:2])
        # Anything else is a PING's answer ("pong"), only a sign of life.
