"""A Sentinel-watched master and replica, for the tests that fail one over."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from redis import Redis as SyncRedis
from redis.exceptions import ResponseError

from runtime.embedded import EmbeddedServer, start_sentinel, start_server
from tests.replication import wait_for_replica

__all__ = ["SERVICE", "Trio", "start_trio"]

SERVICE = "dg-test"


@dataclass
class Trio:
    """A master, its replica and a Sentinel watching them."""

    master: EmbeddedServer
    replica: EmbeddedServer
    sentinel: EmbeddedServer

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel.port}/{SERVICE}"

    def master_port(self) -> int:
        with SyncRedis(port=self.sentinel.port) as sentinel:
            address: Any = sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME",
                                                    SERVICE)
            return int(address[1])

    def wait_for_replica(self) -> None:
        """Until the replica has acknowledged every write the master took so far."""
        wait_for_replica(self.master.port)

    def fail_over(self) -> None:
        """Let the replica catch up, then promote it; returns once it serves writes."""
        self.wait_for_replica()
        deadline = time.monotonic() + 30
        with SyncRedis(port=self.sentinel.port) as sentinel:
            while True:
                try:
                    sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE)
                    break
                except ResponseError as refused:
                    # Sentinel has not yet seen the replica answer (it learns of it from the
                    # master's INFO, then asks the replica itself): no event to wait on.
                    assert "NOGOODSLAVE" in str(refused) and time.monotonic() < deadline, refused
                    time.sleep(0.05)
        self.wait_for_master(self.replica.port)

    def wait_for_master(self, port: int, timeout: float = 30) -> None:
        """Until Sentinel names the server on ``port`` master and it serves as one."""
        deadline = time.monotonic() + timeout
        with SyncRedis(port=port) as server:
            while self.master_port() != port or server.info("replication")["role"] != "master":
                assert time.monotonic() < deadline, "the failover did not finish"
                time.sleep(0.02)  # polling Sentinel's view; there is no event to wait on

    def stop(self) -> None:
        for server in (self.sentinel, self.replica, self.master):
            server.stop()


def start_trio(kind: str) -> Trio:
    """A master, its replica (``kind`` servers) and a Sentinel watching them."""
    # A replica's first sync starts at once, not after the default 5 s wait for more replicas
    # (both: after a failover the old master is the new one's replica).
    at_once = ["--repl-diskless-sync-delay", "0"]
    master = start_server(kind, extra_args=at_once)
    replica = start_server(kind, extra_args=[*at_once, "--replicaof", "127.0.0.1",
                                             str(master.port)])
    return Trio(master, replica, start_sentinel(master, SERVICE))
