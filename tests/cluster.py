"""A real Redis Cluster of Debian ``redis-server`` processes, for the store and e2e tests.

The nodes are driven the way an operator would: ``redis-cli --cluster create`` (redis-cli is
installed with redis-server), ``CLUSTER SETSLOT`` and ``MIGRATE`` for a reshard, ``CLUSTER
FAILOVER`` on a replica.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis import Redis as SyncRedis

from runtime.embedded import EmbeddedServer, free_port, start_server

__all__ = ["Cluster", "cluster_state_ok", "redis_cli", "start_cluster", "wait_until"]

READY_DEADLINE_S = 30.0
#: How long a node may stay unreachable before the others call it failing: small, so the
#: automatic failover after a primary dies finishes within a test.
NODE_TIMEOUT_MS = 2000


def redis_cli(*args: str) -> str:
    """Run redis-cli; its stdout. A missing redis-cli is a failure, not a skip."""
    binary = shutil.which("redis-cli")
    assert binary is not None, "redis-cli is not installed"
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def node_cli(port: int, *args: str) -> str:
    """One command on the node listening on ``port``."""
    return redis_cli("-p", str(port), *args)


def cluster_state_ok(port: int) -> bool:
    """Whether one node reports ``cluster_state:ok``."""
    return "cluster_state:ok" in node_cli(port, "CLUSTER", "INFO")


def wait_until(condition: Callable[[], bool], what: str,
               timeout: float = READY_DEADLINE_S) -> None:
    """Poll a node's state until ``condition`` holds (a child process's state: nothing to
    await), failing with ``what`` after ``timeout``."""
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, f"timed out waiting for {what}"
        time.sleep(0.05)


@dataclass
class Cluster:
    """The nodes of one running cluster: its primaries at creation, then their replicas."""

    masters: list[EmbeddedServer]
    replicas: list[EmbeddedServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        """What the product is given: any node serves as the seed."""
        return f"redis+cluster://127.0.0.1:{self.masters[0].port}"

    @property
    def nodes(self) -> list[EmbeddedServer]:
        """Every node, in whatever role it has now."""
        return [*self.masters, *self.replicas]

    def node(self, port: int) -> EmbeddedServer:
        """The node listening on ``port``."""
        return next(n for n in self.nodes if n.port == port)

    def node_id(self, port: int) -> str:
        """The cluster's id of the node on ``port``."""
        return node_cli(port, "CLUSTER", "MYID").strip()

    def is_primary(self, port: int) -> bool:
        """Whether the node on ``port`` is a primary now (a failover swaps the roles)."""
        return "role:master" in node_cli(port, "INFO", "replication")

    def primary_ports(self) -> list[int]:
        """The ports of the primaries now."""
        return [n.port for n in self.nodes if self.is_primary(n.port)]

    def port_serving(self, slot: int) -> int:
        """The port of the primary that serves ``slot``, as the first running node sees it."""
        viewer = next(n.port for n in self.nodes if n.process.poll() is None)
        # CLUSTER NODES: id, ip:port@bus, flags, master, ping, pong, epoch, link, ranges...
        for line in node_cli(viewer, "CLUSTER", "NODES").splitlines():
            fields = line.split()
            if "master" not in fields[2].split(","):
                continue
            for served in fields[8:]:  # "[slot->-node]" marks a migration: not a range
                low, _, high = served.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    return int(fields[1].split("@")[0].rsplit(":", 1)[1])
        raise AssertionError(f"no primary serves slot {slot}")

    def replica_of(self, port: int) -> int:
        """The port of a replica of the primary on ``port`` (as the replicas themselves say:
        the primary's own view may lag)."""
        for node in self.nodes:
            if (node.port != port and node.process.poll() is None
                    and not self.is_primary(node.port) and self.primary_of(node.port) == port):
                return node.port
        raise AssertionError(f"the primary on {port} has no replica")

    def primary_of(self, replica: int) -> int:
        """The port of the primary that the replica on port ``replica`` follows."""
        info = node_cli(replica, "INFO", "replication")
        return int(info.split("master_port:", 1)[1].split()[0])

    def fail_over(self, replica: int) -> None:
        """Promote the replica on port ``replica`` the way an operator does for maintenance
        (``CLUSTER FAILOVER``: its primary stops taking writes until the replica has them
        all, so nothing acknowledged is lost); returns once the two have swapped roles."""
        primary = self.primary_of(replica)
        # A replica out of sync lets a manual failover time out, silently.
        wait_until(lambda: self.in_sync(replica), "the replica to be in sync")
        node_cli(replica, "CLUSTER", "FAILOVER")
        wait_until(lambda: self.is_primary(replica) and not self.is_primary(primary),
                   "the replica to take over")
        wait_until(lambda: self.seen_as(replica, "master"), "every node to know it")

    def in_sync(self, replica: int) -> bool:
        """Whether the replica on port ``replica`` has its link to its primary up."""
        return "master_link_status:up" in node_cli(replica, "INFO", "replication")

    def seen_as(self, port: int, role: str) -> bool:
        """Whether every running node's view flags the node on ``port`` with ``role``
        (``master`` or ``slave``)."""
        wanted = self.node_id(port)
        for node in self.nodes:
            if node.process.poll() is not None:
                continue
            for line in node_cli(node.port, "CLUSTER", "NODES").splitlines():
                fields = line.split()
                if fields[0] == wanted and role not in fields[2].split(","):
                    return False
        return True

    def flushall(self) -> None:
        """Empty every primary (replicas follow), so each test starts from nothing."""
        for port in self.primary_ports():
            node_cli(port, "FLUSHALL")

    def migrate_slot(self, slot: int, source: int, target: int) -> None:
        """Move ``slot`` and its keys from the primary on port ``source`` to the one on
        ``target``, as ``redis-cli --cluster reshard`` does: IMPORTING on the target,
        MIGRATING on the source, MIGRATE every key, then SETSLOT NODE on every primary.

        Like redis-cli, over one open connection per node: while the slot is half moved,
        scripts on it get TRYAGAIN, so that window lasts milliseconds, not process starts.
        """
        ids = {port: self.node_id(port) for port in (source, target)}
        others = [port for port in self.primary_ports() if port not in (source, target)]
        nodes = {port: SyncRedis(port=port) for port in (target, source, *others)}

        def run(port: int, *command: object) -> Any:
            return nodes[port].execute_command(*command)  # type: ignore[no-untyped-call]

        try:
            run(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
            run(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
            while keys := run(source, "CLUSTER", "GETKEYSINSLOT", slot, 1000):
                run(source, "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
            for port in (target, source, *others):
                run(port, "CLUSTER", "SETSLOT", slot, "NODE", ids[target])
        finally:
            for node in nodes.values():
                node.close()

    def stop(self) -> None:
        """Stop every node (a killed one too) and remove its folder."""
        for node in reversed(self.nodes):
            node.stop()


def _start_node(port: int, bus: int) -> EmbeddedServer:
    # The bus port is named explicitly: the default (port + 10000) may be taken.
    # A replica's first sync starts at once, not after the default 5 s wait for more replicas.
    extra = ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
             "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--cluster-port", str(bus),
             "--repl-diskless-sync-delay", "0"]
    return start_server("redis", port=port, extra_args=extra)


def start_cluster(masters: int = 3, replicas_per_master: int = 0) -> Cluster:
    """Start ``masters`` primaries (each with ``replicas_per_master`` replicas), joined into
    one cluster; returns once every node reports ``cluster_state:ok`` and every replica is
    in sync with its primary."""
    count = masters * (1 + replicas_per_master)
    ports: set[int] = set()
    while len(ports) < 2 * count:
        ports.add(free_port())
    pairs = sorted(ports)
    servers: list[EmbeddedServer] = []
    cluster = Cluster(masters=servers)  # every node, until each one's role is known
    try:
        for port, bus in zip(pairs[:count], pairs[count:], strict=True):
            servers.append(_start_node(port, bus))
        redis_cli("--cluster", "create", *(f"127.0.0.1:{n.port}" for n in servers),
                  "--cluster-replicas", str(replicas_per_master), "--cluster-yes")
        # redis-cli picks which nodes replicate which: ask each node what it became.
        cluster.masters = [n for n in servers if cluster.is_primary(n.port)]
        cluster.replicas = [n for n in servers if n not in cluster.masters]
        wait_until(lambda: all(cluster_state_ok(n.port) for n in servers),
                   "cluster_state:ok on every node")
        wait_until(lambda: all(cluster.in_sync(n.port) for n in cluster.replicas),
                   "every replica in sync")
        # The primaries vote in a failover only for a node they know as a replica.
        wait_until(lambda: all(cluster.seen_as(n.port, "slave") for n in cluster.replicas),
                   "every node to know every replica")
    except BaseException:
        cluster.stop()
        raise
    return cluster
