"""Script calls and transactions on a Redis Cluster over the store's own connections: one lane
per node.

The scripts' per-call cost on redis-py's cluster client is its slot lookup, its connection
pool and its command packer, as on one node (``store/script_lane.py``). Here each call is
routed by the hash slot of its first key (every key of a call shares one slot: the session's
or worker's hash tag, ``store/keys.py``) to a :class:`ScriptLane` on the node that serves the
slot, pipelined with every other call to that node.

The slot map comes from the process's redis-py cluster client (its nodes manager asks the
Cluster), which also carries every other command; a refresh here refreshes the
map it routes by too. What the Cluster answers while it changes:

* MOVED: the slot lives on another node now. The map takes the named node for that slot at
  once, and the call goes there; a refresh in the background picks up whatever else moved
  with it (a failover moves all of a node's slots).
* ASK: the slot is being migrated and the keys are on the importing node. The call goes there
  after ASKING, back to back on that node's connection, and the map stays as it is (the
  slot is still served where it was until the migration ends).
* A connection that fails, CLUSTERDOWN, MASTERDOWN or READONLY (a node gone, a failover under
  way, a master demoted): the error stands, so :meth:`Scripts._run` resends the call after its
  pause, and the map is refreshed before that next call is routed. Every script is safe to
  send twice (``store/lua/``).
* NOSCRIPT: each node's lane sends the call again as EVAL.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import SSLConnection
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    ConnectionError as RedisConnectionError,
    MovedError,
    ReadOnlyError,
    TimeoutError as RedisTimeoutError,
)

from store.client import CONNECT_TIMEOUT_S, REDIS_ERRORS
from store.errors import raise_if_cancelled
from store.resp import Endpoint
from store.script_lane import DEFAULT_STALL_S, RouteChanged, ScriptLane

__all__ = ["MAX_REDIRECTIONS", "ClusterLane"]

_log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Redirections one call follows before its error stands (and ``Scripts._run`` resends it, on
#: a refreshed map): as many as redis-py's cluster client follows.
MAX_REDIRECTIONS = 16

# Errors after which the map is refreshed before the next call is routed: the node is gone or
# no longer serves its slots.
_NODE_CHANGED = (RedisConnectionError, RedisTimeoutError, ClusterDownError, ReadOnlyError)


class ClusterLane:
    """EVALSHA and MULTI over one :class:`ScriptLane` per Cluster node, routed by slot."""

    def __init__(self, client: RedisCluster, *, stall_s: float = DEFAULT_STALL_S) -> None:
        self._client = client
        self._stall_s = stall_s
        # The node ("host:port") serving each slot, or None before the first refresh.
        self._slots: list[str | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        self._lanes: dict[str, ScriptLane] = {}
        self._stale = True
        self._refreshing: asyncio.Lock | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._tls: ssl.SSLContext | None = None
        self._closed = False
        #: How many calls were redirected, by kind ("moved", "ask"), and how many maps were
        #: read: for tests and benchmarks.
        self.redirections = {"moved": 0, "ask": 0}
        self.refreshes = 0
        #: Calls routed, by kind ("script", "transaction"): for tests and benchmarks.
        self.calls = {"script": 0, "transaction": 0}

    @property
    def route_changes(self) -> int:
        """Connections made to any node, redirections followed and maps read: a write answered
        on one stands while none of these happened (see ``store/output_appends.py``)."""
        return (sum(lane.route_changes for lane in self._lanes.values()) + self.refreshes
                + self.redirections["moved"] + self.redirections["ask"])

    async def evalsha(self, sha: str, source: str | bytes, keys: Sequence[str],
                      args: Sequence[Any], *, route: int | None = None) -> Any:
        """Run the script whose SHA1 is ``sha`` on the node that serves its keys' slot.
        ``route``: only while :attr:`route_changes` stays at it, on the node's connection as
        it stood (None: wherever the call is routed).

        Raises:
            ValueError: the call has no key to route it by.
            RouteChanged: a map was read, a call redirected or a connection made since
                ``route``; nothing was sent.
            redis.exceptions.ConnectionError: a connection failed or stalled; whether the
                script ran is unknown.
            redis.exceptions.ClusterError: the Cluster is down, or redirected the call more
                than :data:`MAX_REDIRECTIONS` times.
            redis.exceptions.RedisError: what Redis answered (as redis-py would raise it).
        """
        if not keys:
            raise ValueError("a script call on a Cluster needs a key to route it by")

        def send(lane: ScriptLane, asking: bool) -> Awaitable[Any]:
            if route is None:
                return lane.evalsha(sha, source, keys, args, asking=asking)
            if route != self.route_changes:
                raise RouteChanged(f"the Cluster's routes changed since route {route}")
            return lane.evalsha(sha, source, keys, args, asking=asking,
                                route=lane.route_changes)
        self.calls["script"] += 1
        return await self._routed(keys[0], send)

    async def transaction(self, key: str, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Run ``commands`` (every key in ``key``'s slot) in one ``MULTI`` on the node that
        serves that slot: :meth:`ScriptLane.transaction`, redirected as :meth:`evalsha`."""

        def send(lane: ScriptLane, asking: bool) -> Awaitable[list[Any]]:
            return lane.transaction(key, commands, asking=asking)
        self.calls["transaction"] += 1
        return await self._routed(key, send)

    async def _routed(self, key: str, send: Callable[[ScriptLane, bool], Awaitable[_T]]) -> _T:
        """``send`` on the lane of the node serving ``key``'s slot, following redirections."""
        if self._stale:
            await self._refresh()
        slot = key_slot(key.encode())
        node = self._slots[slot]
        if node is None:
            self._stale = True
            raise ClusterError(f"no known node serves slot {slot}")
        asking = False
        for _ in range(MAX_REDIRECTIONS):
            try:
                return await send(self._lane(node), asking)
            except MovedError as exc:
                self.redirections["moved"] += 1
                node = _name(exc)
                self._slots[exc.slot_id] = node
                asking = False
                self._refresh_soon()
            except AskError as exc:
                self.redirections["ask"] += 1
                node = _name(exc)
                asking = True
            except _NODE_CHANGED:
                self._stale = True
                raise
        raise ClusterError(f"slot {slot}: more than {MAX_REDIRECTIONS} redirections")

    async def aclose(self) -> None:
        """Drop every node's connection; calls in flight fail with ``ConnectionError``."""
        self._closed = True
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            await lane.aclose()

    def _lane(self, node: str) -> ScriptLane:
        lane = self._lanes.get(node)
        if lane is None:
            if self._closed:
                raise RedisConnectionError("the script lane is closed")
            endpoint = self._endpoint(node)

            async def fixed() -> Endpoint:
                return endpoint
            lane = self._lanes[node] = ScriptLane(fixed, stall_s=self._stall_s)
        return lane

    def _endpoint(self, node: str) -> Endpoint:
        """Where ``node`` ("host:port") listens, with the Cluster's credentials and TLS."""
        kwargs = self._client.nodes_manager.connection_kwargs
        host, _, port = node.rpartition(":")
        if self._tls is None and issubclass(kwargs.get("connection_class", object),
                                            SSLConnection):
            # The same context redis-py builds for its own connections, from the URL's options.
            options = {key: value for key, value in kwargs.items() if key.startswith("ssl_")}
            self._tls = SSLConnection(**options).ssl_context.get()
        return Endpoint(host=host, port=int(port), username=kwargs.get("username"),
                        password=kwargs.get("password"), tls=self._tls,
                        connect_timeout_s=float(kwargs.get("socket_connect_timeout")
                                                or CONNECT_TIMEOUT_S))

    async def _refresh(self, *, again: bool = False) -> None:
        """Read the slot map if it is stale (``again``: in any case), once for every caller
        that found it so."""
        if self._refreshing is None:
            self._refreshing = asyncio.Lock()
        async with self._refreshing:
            if self._stale or again:
                await self._read_map()
        # The nodes manager runs redis-py, which can swallow a cancellation
        # (store.errors.raise_if_cancelled); the lanes' own calls cannot, so this is the one
        # check.
        raise_if_cancelled()

    async def _read_map(self) -> None:
        self._stale = False  # an error meanwhile marks it stale again
        try:
            if self.refreshes == 0:
                await self._client.initialize()  # the client's own first map, if it has one
            else:
                await self._client.nodes_manager.initialize()
        except BaseException:
            self._stale = True
            raise
        self.refreshes += 1
        slots: list[str | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        for slot, nodes in self._client.nodes_manager.slots_cache.items():
            slots[slot] = nodes[0].name  # the primary
        self._slots = slots

    def _refresh_soon(self) -> None:
        """Read the map again in the background, unless that is under way: calls meanwhile
        go by the map as it is, with the slot a MOVED named already updated."""
        if self._background or self._closed:
            return
        task = asyncio.create_task(self._refresh_quietly(), name="store-cluster-lane-refresh")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _refresh_quietly(self) -> None:
        try:
            await self._refresh(again=True)
        except (*REDIS_ERRORS, OSError) as exc:  # the next call reads it again (it stays stale)
            _log.debug("refreshing the Cluster's slot map failed: %s", exc)


def _name(redirection: AskError) -> str:
    host, port = redirection.node_addr
    return f"{host}:{port}"
