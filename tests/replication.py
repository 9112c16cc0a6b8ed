"""Waiting on replication, for the tests that fail a master over."""

from __future__ import annotations

import time

from redis import Redis as SyncRedis

__all__ = ["wait_for_replica"]


def wait_for_replica(master_port: int, timeout: float = 30) -> None:
    """Until a replica has acknowledged every write the master on ``master_port`` took so far."""
    deadline = time.monotonic() + timeout
    with SyncRedis(port=master_port) as master:
        # WAIT blocks until the acknowledgement or its own timeout; it is asked again while a
        # replica's first sync is still under way (a loaded machine).
        while master.execute_command("WAIT", 1, 1000) < 1:
            assert time.monotonic() < deadline, "the replica did not catch up"
