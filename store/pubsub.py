"""Live wake-ups: one sharded pub/sub connection per process, fanned out to handlers.

Pushes are an optimisation, never the truth: a consumer that misses one (reconnect, slow
handler, Redis restart) catches up from the log. So the subscriber reconnects on its own,
re-subscribes, and then calls every handler with ``None`` ("you may have missed something;
read the log").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeAlias

import msgpack  # type: ignore[import-untyped]
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterPubSub, RedisCluster
from redis.exceptions import RedisError

__all__ = ["Notice", "NoticeHandler", "Subscriber"]

_log = logging.getLogger(__name__)

#: A decoded push notice (a MessagePack array, see ``store/lua.py``), or None after a reconnect.
Notice: TypeAlias = "list[Any] | None"
NoticeHandler: TypeAlias = Callable[["list[Any] | None"], None]

_SUBSCRIBE_TIMEOUT_S = 5.0
_RECONNECT_DELAY_S = 0.2


class Subscriber:
    """Sharded subscriptions for one process, with confirmed subscribe and self-healing.

    Handlers run on the event loop and must not block: they enqueue or set an event.
    """

    def __init__(self, client: Redis | RedisCluster) -> None:
        self._client = client
        self._handlers: dict[bytes, NoticeHandler] = {}
        self._confirmations: dict[bytes, asyncio.Future[None]] = {}
        self._pubsub: PubSub | ClusterPubSub | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    async def start(self) -> None:
        """Start the reader task."""
        self._task = asyncio.create_task(self._run(), name="store-subscriber")

    async def aclose(self) -> None:
        """Stop reading and close the connection."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._pubsub is not None:
            await self._pubsub.aclose()  # type: ignore[no-untyped-call]

    async def subscribe(self, channel: str, handler: NoticeHandler) -> None:
        """Subscribe and return only once Redis confirmed it, so no later push is missed.

        Raises:
            TimeoutError: no confirmation in time (Redis down); the caller reads the log.
        """
        key = channel.encode()
        confirmed = asyncio.get_running_loop().create_future()
        self._confirmations[key] = confirmed
        pubsub = self._ensure_pubsub()
        try:
            await pubsub.ssubscribe(channel)
            # Registered only now: the reader must not poll a connection that has no
            # subscription yet. A push that raced ahead of this line is in the log.
            self._handlers[key] = handler
            self._wake.set()
            await asyncio.wait_for(asyncio.shield(confirmed), _SUBSCRIBE_TIMEOUT_S)
        except (RedisError, OSError) as exc:
            # The reader task reconnects and re-subscribes every handler it knows.
            self._handlers[key] = handler
            self._wake.set()
            _log.warning("ssubscribe %s failed: %s", channel, exc)
        finally:
            self._confirmations.pop(key, None)

    async def unsubscribe(self, channel: str) -> None:
        """Stop delivering ``channel``; safe to call twice."""
        key = channel.encode()
        if self._handlers.pop(key, None) is None or self._pubsub is None:
            return
        try:
            await self._pubsub.sunsubscribe(channel)
        except RedisError as exc:
            _log.debug("sunsubscribe %s failed: %s", channel, exc)

    def _ensure_pubsub(self) -> PubSub | ClusterPubSub:
        if self._pubsub is None:
            self._pubsub = self._client.pubsub()
        return self._pubsub

    async def _next(self, pubsub: PubSub | ClusterPubSub) -> dict[str, Any] | None:
        message: dict[str, Any] | None
        if isinstance(pubsub, ClusterPubSub):
            message = await pubsub.get_sharded_message(timeout=1.0)
        else:
            message = await pubsub.get_message(timeout=1.0)
        return message

    async def _run(self) -> None:
        while True:
            if not self._handlers:
                self._wake.clear()
                await self._wake.wait()
                continue
            pubsub = self._ensure_pubsub()
            try:
                message = await self._next(pubsub)
            except (RedisError, OSError, RuntimeError) as exc:
                await self._recover(exc)
                continue
            if message is not None:
                try:
                    self._dispatch(message)
                except Exception:  # a bad notice or handler must not stop every delivery
                    _log.exception("dropped a pub/sub message: %r", message)

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        kind = kind.decode() if isinstance(kind, bytes) else kind
        channel = message["channel"]
        if kind == "ssubscribe":
            future = self._confirmations.get(channel)
            if future is not None and not future.done():
                future.set_result(None)
                return
            # Not asked for by subscribe(): a re-subscription after a reconnect (ours or
            # redis-py's own), now confirmed. Pushes may have been missed: read the log.
            resubscribed = self._handlers.get(channel)
            if resubscribed is not None:
                resubscribed(None)
            return
        if kind != "smessage":
            return
        handler = self._handlers.get(channel)
        if handler is not None:
            handler(msgpack.unpackb(message["data"], raw=True))

    async def _recover(self, exc: BaseException) -> None:
        _log.warning("pub/sub connection lost (%s); re-subscribing", exc)
        old, self._pubsub = self._pubsub, None
        if old is not None:
            try:
                await old.aclose()  # type: ignore[no-untyped-call]
            except (RedisError, OSError):
                pass
        await asyncio.sleep(_RECONNECT_DELAY_S)  # back off; Redis may be restarting
        pubsub = self._ensure_pubsub()
        try:
            for channel in list(self._handlers):
                await pubsub.ssubscribe(channel.decode())
        except (RedisError, OSError) as exc2:
            _log.warning("re-subscribe failed: %s", exc2)
        # Each handler gets None when its re-subscription is confirmed (see _dispatch), so
        # a log read it then starts cannot miss a push that the old subscription lost.
