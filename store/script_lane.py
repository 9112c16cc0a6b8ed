"""Script calls and transactions on one pipelined connection of the store's own
(``store/resp.py``).

redis-py spends client CPU on each call beyond the bytes
(``docs/performance/notes/2026-12-05-relay-cpu.md``): its connection pool, its stream reader
and writer, its command packer. The gateway's input batches and the worker's output flushes
are one call per relayed chunk at real-time load, so :class:`Scripts` sends its scripts here
instead, and the one hot-path call that is no script: a pulling worker's input append, a
``MULTI`` of plain ``XADD``s (``store/input_appends.py``).

This lane is one connection to one node: a single Redis, the master Sentinel names, or one node
of a Cluster. A Cluster gets one lane per node from ``store/cluster_lane.py``, which routes
each call by its keys' slot and follows MOVED and ASK; so one node, Sentinel and Cluster all
take this path.

What redis-py did for these calls, done here:

* Reconnects: a call on a connection that broke fails with ``ConnectionError``, and the next
  call connects again (asking the Sentinels where the master is now). Every script is safe to
  send twice (``store/lua/``), so :meth:`Scripts._run` resends it as after any lost reply; a
  transaction whose reply was lost is settled by its caller.
* A connection that stops answering: calls in flight and nothing heard for ``stall_s``, the
  connection is dropped and its calls fail with ``ConnectionError`` (resent on a new one), as
  redis-py's commands fail after their socket timeout (``store/client.py``).
* NOSCRIPT (Redis restarted, or a script flush): the call is sent again as EVAL, which also
  loads it for the next EVALSHA.
* READONLY (a master demoted under Sentinel): the connection is dropped, so the next call
  goes to the new master, and the error stands for the resend.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import hiredis
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
    ExecAbortError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
)

from store.client import COMMAND_TIMEOUT_S
from store.errors import raise_if_cancelled
from store.resp import Endpoint, RespConnection, error_of

__all__ = ["DEFAULT_STALL_S", "RouteChanged", "ScriptLane"]

#: How long calls may wait with nothing heard from Redis before their connection is dropped:
#: far above any script's run time, and a resend after it is safe. The same bound as redis-py's
#: commands (``store/client.py``).
DEFAULT_STALL_S = COMMAND_TIMEOUT_S


class RouteChanged(RedisError):
    """A call meant for the connections as they stood (``route``) met others: a connection
    was made since, or a Cluster's call was redirected. Nothing was sent."""


class ScriptLane:
    """EVALSHA and MULTI over one connection, made on first use in the running event loop."""

    def __init__(self, endpoint: Callable[[], Awaitable[Endpoint]], *,
                 stall_s: float = DEFAULT_STALL_S) -> None:
        self._endpoint = endpoint
        self._stall_s = stall_s
        self._connection: RespConnection | None = None
        self._connecting: asyncio.Lock | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._closed = False
        #: Connections made: a write answered on one stands while no other was made (see
        #: ``store/output_appends.py``).
        self.route_changes = 0

    async def evalsha(self, sha: str, source: str | bytes, keys: Sequence[str],
                      args: Sequence[Any], *, asking: bool = False,
                      route: int | None = None) -> Any:
        """Run the script whose SHA1 is ``sha`` (``source`` if Redis does not hold it).
        ``asking``: send ASKING just before it, on the same connection (a Cluster node
        importing the keys' slot takes the call only so). ``route``: send it only on the
        connection :attr:`route_changes` counted up to then (None: on any).

        Raises:
            RouteChanged: a connection was made since ``route``; nothing was sent.
            redis.exceptions.ConnectionError: the connection failed or stalled; whether the
                script ran is unknown.
            redis.exceptions.RedisError: what Redis answered (as redis-py would raise it).
        """
        connection = await self._connected()
        if route is not None and route != self.route_changes:
            raise RouteChanged(f"connected again since route {route}")
        try:
            return await self._request(connection, ["EVALSHA", sha, len(keys), *keys, *args],
                                       asking)
        except NoScriptError:
            return await self._request(connection, ["EVAL", source, len(keys), *keys, *args],
                                       asking)
        except ReadOnlyError as exc:
            connection.abort(exc)  # the next call asks where the master is now
            raise

    async def transaction(self, key: str, commands: Sequence[Sequence[Any]], *,
                          asking: bool = False) -> list[Any]:
        """Run ``commands`` in one ``MULTI``/``EXEC``, written in one go; their replies, a
        command's error as the exception redis-py would raise for it (not raised). ``key``:
        one of their keys (a Cluster's lanes route by it, ``store/cluster_lane.py``; one
        node needs none). ``asking``: as :meth:`evalsha`'s (ASKING holds until the
        ``EXEC``).

        Raises:
            redis.exceptions.ConnectionError: the connection failed or stalled; whether the
                transaction ran is unknown.
            redis.exceptions.RedisError: a command Redis refused to queue (a redirection, out
                of memory: nothing ran), or what it answered the ``EXEC``.
        """
        connection = await self._connected()
        framed: list[Sequence[Any]] = [["ASKING"]] if asking else []
        framed += [["MULTI"], *commands, ["EXEC"]]
        *queued, executed = connection.request_many(framed)
        for reply in queued:  # read below once EXEC answered; retrieved in any case
            reply.add_done_callback(_ignore_reply)
        self._watch()
        try:
            replies: list[Any] = await executed
        except ExecAbortError as exc:
            # Nothing ran; the command that was refused says why (a MOVED names its node).
            refused = [reply.exception() for reply in queued
                       if reply.done() and not reply.cancelled()]
            why: BaseException = next((e for e in refused if e is not None), exc)
            if isinstance(why, ReadOnlyError):
                connection.abort(why)  # the next call asks where the master is now
            raise why from None
        except ReadOnlyError as exc:
            connection.abort(exc)
            raise
        return [error_of(reply) if isinstance(reply, hiredis.ReplyError) else reply
                for reply in replies]

    async def aclose(self) -> None:
        """Drop the connection; calls in flight fail with ``ConnectionError``."""
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._connection is not None:
            self._connection.abort(RedisConnectionError("the script lane closed"))
            self._connection = None

    async def _request(self, connection: RespConnection, parts: list[Any],
                       asking: bool = False) -> Any:
        if asking:
            # Written before the call with no await between: ASKING holds for the next
            # command on its connection. Its own reply tells nothing the call's does not: a
            # node that did not take it redirects the call again.
            connection.request(["ASKING"]).add_done_callback(_ignore_reply)
        reply = connection.request(parts)
        self._watch()
        return await reply

    def _watch(self) -> None:
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().call_later(self._stall_s / 2,
                                                                   self._check_stall)

    async def _connected(self) -> RespConnection:
        if self._closed:
            raise RedisConnectionError("the script lane is closed")
        connection = self._connection
        if connection is not None and not connection.closed.done():
            return connection
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:  # one connect for every caller that found none
            connection = self._connection
            if connection is None or connection.closed.done():
                connection = await RespConnection.connect(await self._endpoint(),
                                                          RespConnection)
                if self._closed:
                    connection.abort(RedisConnectionError("the script lane closed"))
                    raise RedisConnectionError("the script lane is closed")
                self._connection = connection
                self.route_changes += 1
                # Asking Sentinel where the master is runs redis-py, which can swallow a
                # cancellation (store.errors.raise_if_cancelled); the calls on this
                # connection itself cannot, so this is the lane's one check.
                raise_if_cancelled()
            return connection

    def _check_stall(self) -> None:
        self._watchdog = None
        connection = self._connection
        if connection is None or connection.closed.done() or not connection.in_flight:
            return
        silent = connection.silent_for()
        if silent >= self._stall_s:
            connection.abort(RedisConnectionError(
                f"no reply from Redis in {silent:.1f} s with {connection.in_flight} calls"
                " in flight"))
            return
        self._watchdog = asyncio.get_running_loop().call_later(self._stall_s / 2,
                                                               self._check_stall)


def _ignore_reply(reply: asyncio.Future[Any]) -> None:
    if not reply.cancelled():
        reply.exception()  # retrieved, so asyncio does not log it as never retrieved
