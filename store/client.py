"""Redis connections: one factory for one node, Sentinel or Cluster, chosen by the URL.

* ``redis://[:password@]host:port/db`` (or ``rediss://``): one node.
* ``redis+sentinel://[:password@]host:port[,host:port...]/service[/db]``: the master that the
  listed Sentinels name for ``service``. After a failover the pool asks them again and
  reconnects to the new master; a write that reached the demoted one is refused
  (``READONLY``), never applied, and ``Scripts`` sends it again. The password is the master's.
* ``redis+cluster://host:port``: a Cluster; any node serves as the seed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias
from urllib.parse import unquote, urlsplit, urlunsplit

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import RedisClusterException, RedisError

from store.errors import StoreUnavailable, raise_if_cancelled

__all__ = [
    "CLUSTER_SCHEME",
    "COMMAND_TIMEOUT_S",
    "CONNECT_TIMEOUT_S",
    "MAX_CONNECTIONS",
    "REDIS_ERRORS",
    "SENTINEL_SCHEME",
    "RedisClient",
    "SentinelTarget",
    "create_client",
    "is_cluster_url",
    "parse_sentinel_url",
    "store_call",
]

CLUSTER_SCHEME = "redis+cluster"
SENTINEL_SCHEME = "redis+sentinel"
RedisClient: TypeAlias = "Redis | RedisCluster"
#: What redis-py raises for a command that failed: a Cluster client also raises
#: ``RedisClusterException``s that are no ``RedisError`` (a slot no known node covers yet, in a
#: failover), which would otherwise escape every handler as a crash.
REDIS_ERRORS = (RedisError, RedisClusterException)


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster."""
    return urlsplit(url).scheme == CLUSTER_SCHEME


#: How long a command may wait on a connection that went silent (a peer gone without a reset:
#: a host lost, a partition) before it fails with redis-py's ``TimeoutError``, which the store
#: resends like a lost reply on a new connection. Far above any command's or script's run time
#: (the store sends no blocking commands), and the same bound the store's own connections keep
#: (``store/script_lane.py``). Set here, not left to redis-py: its default was "for ever"
#: before 6.0, which the dependency's floor still allows.
COMMAND_TIMEOUT_S = 10.0
#: How long opening a connection may take.
CONNECT_TIMEOUT_S = 5.0

# Each session keeps at most a few commands in flight, and a process serves hundreds of
# sessions: redis-py's default cap of 100 connections would refuse commands past ~100 sessions.
MAX_CONNECTIONS = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class SentinelTarget:
    """What a ``redis+sentinel://`` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    password: str | None = None


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Read a ``redis+sentinel://`` URL.

    Raises:
        ValueError: not that scheme, no Sentinel address, or no service name.
    """
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        raise ValueError(f"not a {SENTINEL_SCHEME}:// URL: {url!r}")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    password = unquote(userinfo.partition(":")[2]) or None
    sentinels = []
    for address in filter(None, hosts.split(",")):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"Sentinel address {address!r} is not host:port")
        sentinels.append((host.strip("[]"), int(port)))
    path = [segment for segment in parts.path.split("/") if segment]
    if not sentinels or not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(f"expected {SENTINEL_SCHEME}://host:port[,host:port]/service[/db],"
                         f" got {url!r}")
    return SentinelTarget(sentinels=tuple(sentinels), service=path[0],
                          db=int(path[1]) if len(path) == 2 else 0, password=password)


class _SentinelMaster(Redis):
    """The master's client; closing it also closes the Sentinel connections behind it."""

    sentinel_manager: Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        if self.sentinel_manager is not None:
            for node in self.sentinel_manager.sentinels:
                await node.aclose()


def create_client(url: str, *, command_timeout_s: float = COMMAND_TIMEOUT_S
                  ) -> Redis | RedisCluster:
    """A client that returns bytes (audio and msgpack are binary), for any of the URL kinds,
    whose commands fail after ``command_timeout_s`` on a silent connection (see
    :data:`COMMAND_TIMEOUT_S`); the Sentinels are asked with the same bounds."""
    timeouts: dict[str, Any] = {"socket_timeout": command_timeout_s,
                                "socket_connect_timeout": CONNECT_TIMEOUT_S}
    scheme = urlsplit(url).scheme
    if scheme == CLUSTER_SCHEME:
        parts = urlsplit(url)
        return RedisCluster.from_url(urlunsplit(parts._replace(scheme="redis")),
                                     max_connections=MAX_CONNECTIONS, **timeouts)
    if scheme == SENTINEL_SCHEME:
        target = parse_sentinel_url(url)
        sentinel = Sentinel(list(target.sentinels),
                            sentinel_kwargs=dict(timeouts))
        kwargs: dict[str, Any] = {"db": target.db, "max_connections": MAX_CONNECTIONS,
                                  **timeouts}
        if target.password is not None:
            kwargs["password"] = target.password
        client: _SentinelMaster = sentinel.master_for(target.service, redis_class=_SentinelMaster,
                                                      **kwargs)
        client.sentinel_manager = sentinel
        return client
    return Redis.from_url(url, max_connections=MAX_CONNECTIONS, **timeouts)


@contextlib.contextmanager
def store_call(what: str) -> Iterator[None]:
    """Around one plain Redis command: a Redis error becomes :class:`StoreUnavailable` naming
    ``what``, and a cancellation redis-py swallowed mid-command is raised again on the way out
    (see :func:`store.errors.raise_if_cancelled`), whether the command failed or not."""
    try:
        yield
    except REDIS_ERRORS as exc:
        raise_if_cancelled()
        raise StoreUnavailable(f"{what} failed: {exc}") from exc
    raise_if_cancelled()
