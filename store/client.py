"""Redis connections: one factory, standalone or Cluster, chosen by the URL."""

from __future__ import annotations

from typing import TypeAlias
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

__all__ = ["CLUSTER_SCHEME", "MAX_CONNECTIONS", "RedisClient", "create_client", "is_cluster_url"]

#: ``redis+cluster://host:port`` selects Redis Cluster; any node serves as the seed.
CLUSTER_SCHEME = "redis+cluster"
RedisClient: TypeAlias = "Redis | RedisCluster"


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster."""
    return urlsplit(url).scheme == CLUSTER_SCHEME


# Each session keeps at most a few commands in flight, and a process serves hundreds of
# sessions: redis-py's default cap of 100 connections would refuse commands past ~100 sessions.
MAX_CONNECTIONS = 4096


def create_client(url: str) -> Redis | RedisCluster:
    """A client that returns bytes (audio and msgpack are binary), for a node or a Cluster."""
    if is_cluster_url(url):
        parts = urlsplit(url)
        return RedisCluster.from_url(urlunsplit(parts._replace(scheme="redis")),
                                     max_connections=MAX_CONNECTIONS)
    return Redis.from_url(url, max_connections=MAX_CONNECTIONS)
