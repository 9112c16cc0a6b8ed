"""Live wake-ups: sharded pub/sub subscriptions for one process, fanned out to handlers.

Pushes are an optimisation, never the truth: a consumer that misses one (reconnect, slow
handler, Redis restart) catches up from the log. So each connection reconnects on its own,
re-subscribes, and once Redis confirms a re-subscription, calls that channel's handlers with
``None`` ("you may have missed something; read the log"). Pushes are decoded once, here, into
the types of ``store.pushes`` (beside the scripts that publish them); a malformed one reaches its
handlers as ``None`` too.

A channel may have several handlers in one process (a session resumed through the gateway
that still holds its old connection: the old one must hear the lease notice that replaces
it). Each push reaches every handler of its channel, over one Redis subscription per channel,
which is dropped when the last handler leaves.

One connection per Redis node: on a Cluster a sharded channel lives on the node that owns its
slot. The connections are ``store.resp``'s, which hand each push over as its bytes
arrive, without redis-py's reader (a push is the relay's most frequent read).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError, RedisError

from store.client import REDIS_ERRORS
from store.outages import OutageLog
from store.pushes import Push, PushDecodeError, decode_push
from store.resp import Endpoint, PushConnection, endpoint_of

__all__ = ["PushHandler", "Subscriber"]

_log = logging.getLogger(__name__)

#: Takes each push of a channel, decoded, or None: read the log (after a reconnect, a move, or a
#: push that was malformed).
PushHandler: TypeAlias = Callable[[Push | None], None]

_SUBSCRIBE_TIMEOUT_S = 5.0
_RECONNECT_DELAY_S = 0.2
# A push connection silent this long gets a PING; silent twice as long, it is replaced. Pushes
# are only wake-ups (consumers poll their logs too), so this bounds how long a dead connection
# leaves them on their polls, not what they receive.
_HEALTH_CHECK_S = 5.0
# How long a moved channel waits for a slot map that no longer names the node it left: the
# nodes learn a move one after another, within milliseconds (a slot may also come back).
_STALE_MAP_RETRY_S = 0.05
_STALE_MAP_RETRIES = 100


class _Shard:
    """One node's push connection and the task that keeps it: reconnects, subscribes every
    channel again, and sends a PING when Redis has been silent, so a connection that went
    dead without a reset (a host gone, a cut cable) is found and replaced."""

    def __init__(self, endpoint: Callable[[], Awaitable[Endpoint]], owner: Subscriber) -> None:
        self.endpoint = endpoint
        self.owner = owner
        self.channels: set[bytes] = set()
        self.connection: PushConnection | None = None
        self.wake = asyncio.Event()
        self._connecting = asyncio.Lock()
        self.task = asyncio.create_task(self._run(), name="store-subscriber-shard")

    async def connected(self) -> PushConnection:
        """The open connection, made by one caller at a time: concurrent first subscribes
        (sessions resumed at once) must share one, or the subscriptions sent on the others,
        with every push to them, would be lost with them."""
        async with self._connecting:
            if self.connection is None or self.connection.closed.done():
                self.connection = await PushConnection.open(await self.endpoint(),
                                                            self.owner.dispatch)
            return self.connection

    async def aclose(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        if self.connection is not None:
            self.connection.abort(RedisConnectionError("the subscriber closed"))

    async def _run(self) -> None:
        while True:
            if not self.channels:
                self.wake.clear()
                await self.wake.wait()
                continue
            connection = self.connection
            if connection is None or connection.closed.done():
                why = (connection.closed.result() if connection is not None
                       else RedisConnectionError("not connected"))
                await self._recover(why)
                continue
            await self._watch(connection)

    @staticmethod
    async def _watch(connection: PushConnection) -> None:
        """Return once ``connection`` ended, or was silent through a PING and then some."""
        while not connection.closed.done():
            await asyncio.wait([connection.closed], timeout=_HEALTH_CHECK_S)
            silent = connection.silent_for()
            if silent >= 2 * _HEALTH_CHECK_S:
                connection.abort(RedisConnectionError(f"Redis silent for {silent:.1f} s"))
            elif silent >= _HEALTH_CHECK_S:
                with contextlib.suppress(*REDIS_ERRORS):
                    connection.ping()

    async def _recover(self, exc: BaseException) -> None:
        # A shard reconnects every _RECONNECT_DELAY_S while its node is away: the outage log
        # tells the loss once, and the return once.
        self.owner.outages.failed("pub/sub read", exc)
        self.connection = None
        await asyncio.sleep(_RECONNECT_DELAY_S)  # back off; Redis may be restarting
        await self.owner.reroute(self)
        try:
            connection = await self.connected()
            for channel in list(self.channels):
                connection.ssubscribe(channel)
        except (*REDIS_ERRORS, OSError) as exc2:
            self.owner.outages.failed("re-subscription", exc2)
        # Each handler gets None when its re-subscription is confirmed (see dispatch), so a
        # log read it then starts cannot miss a push that the old subscription lost.


def _address_of(client: Redis | RedisCluster) -> str:
    """Where ``client`` connects, for a log line (no credentials)."""
    if isinstance(client, RedisCluster):
        return "the Cluster"
    kwargs = client.connection_pool.connection_kwargs
    host, port = kwargs.get("host"), kwargs.get("port")
    return f"{host}:{port}" if host else "the Sentinels' master"


class Subscriber:
    """Sharded subscriptions for one process, with confirmed subscribe and self-healing.

    Handlers run on the event loop and must not block: they enqueue or set an event. The
    handlers of one channel share each decoded push: they must not change it.
    """

    def __init__(self, client: Redis | RedisCluster, *, outages: OutageLog | None = None) -> None:
        """``outages``: the process's outage log, shared with its other loops (by default
        one of this subscriber's own)."""
        self._client = client
        self.outages = outages or OutageLog(_log, _address_of(client))
        # Per channel, its handlers in the order they subscribed; a channel is listed while
        # it has at least one.
        self._handlers: dict[bytes, list[PushHandler]] = {}
        # Per channel, the SSUBSCRIBE sent and not confirmed yet: True once Redis confirmed
        # it, False when its sender gave up waiting (the handlers then get None on the late
        # confirmation, as after a reconnect).
        self._confirmations: dict[bytes, asyncio.Future[bool]] = {}
        self._shards: dict[str, _Shard] = {}
        self._shard_of: dict[bytes, _Shard] = {}
        self._moves: set[asyncio.Task[None]] = set()
        self._following: set[bytes] = set()  # channels being subscribed again after a move
        # SUNSUBSCRIBEs sent and not answered yet, per channel.
        self._unsubscribing: collections.Counter[bytes] = collections.Counter()

    async def start(self) -> None:
        """Nothing to do until the first subscription; kept for a symmetric lifecycle."""

    async def aclose(self) -> None:
        """Stop reading and close every connection."""
        for task in list(self._moves):
            task.cancel()
        await asyncio.gather(*self._moves, return_exceptions=True)
        shards, self._shards = list(self._shards.values()), {}
        for shard in shards:
            await shard.aclose()

    def _shard_for(self, channel: str) -> _Shard:
        if isinstance(self._client, RedisCluster):
            node = self._client.get_node_from_key(channel)
            if node is None:
                raise RedisError(f"no Cluster node owns {channel}")
            name = node.name
            if name not in self._shards:
                self._shards[name] = _Shard(_node_endpoint(node), self)
        else:
            name = ""
            if name not in self._shards:
                client = self._client
                self._shards[name] = _Shard(lambda: endpoint_of(client), self)
        return self._shards[name]

    async def subscribe(self, channel: str, handler: PushHandler) -> None:
        """Deliver ``channel`` to ``handler`` too; return once Redis confirmed the channel,
        so no later push is missed. Subscribing a handler twice delivers to it once.

        If Redis cannot be reached the subscription is kept and completes when Redis is back
        (the handler then gets None); the caller reads the log meanwhile.
        """
        key = channel.encode()
        handlers = self._handlers.get(key)
        if handlers is None:
            if isinstance(self._client, RedisCluster):
                await self._client.initialize()  # the slot map, if no command read it yet
            shard = self._shard_for(channel)  # before any bookkeeping: it may raise
            self._handlers[key] = [handler]
            await self._ssubscribe(key, shard)
            return
        if handler not in handlers:
            handlers.append(handler)
        # The channel is subscribed on Redis already, or on its way there: wait for the
        # confirmation in flight, if any. Otherwise it is confirmed, or being re-subscribed
        # (a reconnect, a move), which ends with None to every handler, this one included.
        pending = self._confirmations.get(key)
        if pending is not None:
            await asyncio.shield(pending)

    async def _ssubscribe(self, key: bytes, shard: _Shard) -> None:
        """Subscribe ``key`` on ``shard``'s connection and wait for Redis to confirm it."""
        confirmed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._confirmations[key] = confirmed
        self._shard_of[key] = shard
        try:
            (await shard.connected()).ssubscribe(key)
            # Added only now: the reader must not poll a connection with no subscription.
            shard.channels.add(key)
            shard.wake.set()
            await asyncio.wait_for(asyncio.shield(confirmed), _SUBSCRIBE_TIMEOUT_S)
        except (*REDIS_ERRORS, OSError, TimeoutError) as exc:
            # The shard's reader reconnects and re-subscribes every channel it holds.
            shard.channels.add(key)
            shard.wake.set()
            self.outages.failed("subscription", exc)
        finally:
            if self._confirmations.get(key) is confirmed:
                del self._confirmations[key]
            if not confirmed.done():
                # Handlers that joined meanwhile stop waiting with this sender (cancelled
                # too, say, when its connection ended): the late confirmation, now unasked
                # for, tells every handler to read the log.
                confirmed.set_result(False)

    async def unsubscribe(self, channel: str, handler: PushHandler | None = None) -> None:
        """Stop delivering ``channel`` to ``handler``, or with no handler to any; safe to call
        twice. Redis is told once the channel has no handler left.

        A connection that ends after another one (a quick resume through this same process)
        subscribed the channel too takes only its own handler with it.
        """
        key = channel.encode()
        handlers = self._handlers.get(key)
        if handlers is None:
            return
        if handler is not None:
            if handler not in handlers:
                return
            handlers.remove(handler)
            if handlers:
                return
        del self._handlers[key]
        await self._sunsubscribe(key)

    async def _sunsubscribe(self, key: bytes) -> None:
        """Drop ``key``'s subscription on Redis (none of this process's handlers want it)."""
        shard = self._shard_of.pop(key, None)
        if shard is None:
            return
        shard.channels.discard(key)
        if shard.connection is not None:
            # Its answer must not read as Redis dropping the channel (see dispatch), also if
            # the channel is subscribed again before the answer arrives.
            self._unsubscribing[key] += 1
            try:
                shard.connection.sunsubscribe(key)
            except REDIS_ERRORS as exc:
                # The connection broke: the channel went with it, and the shard's reconnect
                # skips it.
                self._unsubscribing[key] -= 1
                _log.debug("sunsubscribe %r failed: %s", key, exc)

    def _start_following(self, channel: bytes) -> None:
        """Move ``channel`` to the node that serves its slot now, in the background."""
        if channel in self._following:
            return
        self._following.add(channel)
        task = asyncio.create_task(self._follow(channel), name="store-subscriber-move")
        self._moves.add(task)
        task.add_done_callback(self._moves.discard)

    async def reroute(self, shard: _Shard) -> None:
        """On a Cluster, hand the channels of ``shard``, whose connection broke, to the nodes
        that serve their slots now. A node that died never says SUNSUBSCRIBE: without this,
        its channels would be subscribed again on its dead address forever, and every push
        to them, made on the replica promoted in its place, would reach no one."""
        if not isinstance(self._client, RedisCluster):
            return
        try:
            await self._client.nodes_manager.initialize()
        except (*REDIS_ERRORS, OSError) as exc:  # the Cluster may still be failing over
            _log.debug("refreshing the Cluster's slots failed: %s", exc)
            return
        for channel in list(shard.channels):
            node = self._client.get_node_from_key(channel.decode())
            if node is not None and self._shards.get(node.name) is not shard:
                shard.channels.discard(channel)  # not to be subscribed here again
                self._start_following(channel)

    async def _follow(self, channel: bytes) -> None:
        """Subscribe again where ``channel``'s slot lives now, then tell the handlers to read
        the log (pushes made during the move reached no one)."""
        old = self._shard_of.pop(channel, None)
        if old is not None:
            old.channels.discard(channel)
        stale_maps = 0
        try:
            while channel in self._handlers:  # else: unsubscribed meanwhile
                try:
                    if isinstance(self._client, RedisCluster):
                        await self._client.nodes_manager.initialize()
                    shard = self._shard_for(channel.decode())
                    if shard is old and stale_maps < _STALE_MAP_RETRIES:
                        # The slot map predates the move: a master demoted by a failover
                        # drops its subscriptions before every node knows, and subscribed
                        # there again (it serves replicas' reads) we would hear no push.
                        stale_maps += 1
                        await asyncio.sleep(_STALE_MAP_RETRY_S)
                        continue
                    await self._ssubscribe(channel, shard)
                except (*REDIS_ERRORS, OSError) as exc:
                    # Consumers read the log on their poll meanwhile.
                    self.outages.failed("subscription on a moved slot's new node", exc)
                    await asyncio.sleep(_RECONNECT_DELAY_S)  # back off; the Cluster may settle
                    continue
                if channel in self._handlers:
                    self._deliver(channel, None)
                else:  # the last handler left while we subscribed: do not keep it
                    await self._sunsubscribe(channel)
                return
        finally:
            self._following.discard(channel)

    def _deliver(self, channel: bytes, push: Push | None) -> None:
        """Call every handler of ``channel``; one that raises costs the others nothing."""
        for handler in list(self._handlers.get(channel, ())):
            try:
                handler(push)
            except Exception:  # a handler bug must not starve its channel's other handlers
                _log.exception("a handler of %r failed on %r", channel, push)

    def dispatch(self, kind: bytes, channel: bytes, data: Any) -> None:
        """Route one push from a shard's connection (called by the connections)."""
        if kind == b"ssubscribe":
            self.outages.succeeded()  # a confirmation: Redis answers again
            future = self._confirmations.get(channel)
            if future is not None and not future.done():
                future.set_result(True)
                return
            # Not asked for by subscribe(): a re-subscription after a reconnect, now
            # confirmed. Pushes may have been missed: read the log.
            self._deliver(channel, None)
            return
        if kind == b"sunsubscribe":
            if self._unsubscribing[channel] > 0:
                self._unsubscribing[channel] -= 1  # the answer to our own unsubscribe()
                if not self._unsubscribing[channel]:
                    del self._unsubscribing[channel]
            elif channel in self._handlers:
                # Not asked for: Redis dropped the subscription because the channel's slot
                # moved to another node (resharding).
                self._start_following(channel)
            return
        if kind == b"smessage" and channel in self._handlers:
            try:
                push = decode_push(data)
            except PushDecodeError as exc:
                # Only our scripts publish here: a bug, logged; the handlers read the log
                # (the truth) instead.
                _log.error("dropped a malformed push on %r: %s", channel, exc)
                self._deliver(channel, None)
                return
            self._deliver(channel, push)


def _node_endpoint(node: ClusterNode) -> Callable[[], Awaitable[Endpoint]]:
    """A Cluster node's address and credentials (the Cluster's, shared by its nodes)."""
    kwargs = node.connection_kwargs
    endpoint = Endpoint(host=node.host, port=int(node.port), username=kwargs.get("username"),
                        password=kwargs.get("password"))

    async def fixed() -> Endpoint:
        return endpoint
    return fixed
