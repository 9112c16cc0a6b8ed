"""A real loopback worker, in process on a real Redis, for tests that write around the scripts.

Entries written straight into an input log push no notice, so the worker's safety poll reads
the logs often here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from contract import messages as msg
from contract.messages import encode_message
from inference_worker.settings import WorkerSettings
from inference_worker.worker import Worker
from store import Lease, Scripts
from store.keys import WorkerKeys
from tests.store._support import events_of, until

HEARTBEAT = encode_message(msg.Heartbeat())


@dataclass
class Running:
    """A loopback worker serving on a task, and the store it serves from."""

    worker: Worker
    scripts: Scripts
    client: Redis


@asynccontextmanager
async def running_worker(client: Redis, *, slots: int,
                         **changes: Any) -> AsyncIterator[Running]:
    """Run a loopback worker with ``slots`` slots (and settings ``changes``) until the block
    ends."""
    settings = WorkerSettings(**{
        "backend": "loopback", "slots": slots, "heartbeat_interval_s": 0.2,
        "heartbeat_ttl_s": 5.0, "input_poll_interval_s": 0.05, "drain_timeout_s": 0.1,
        **changes})
    worker = Worker(settings, client)
    task = asyncio.create_task(worker.run())

    async def registered() -> bool:
        return bool(await client.exists(WorkerKeys(worker.worker_id).record))

    await until(registered, "registration")
    try:
        yield Running(worker, Scripts(client), client)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)


async def acks(running: Running, session_id: str) -> int:
    """How many heartbeats the worker answered in the session's output log."""
    return sum(isinstance(event, msg.HeartbeatAck)
               for _, event in await events_of(running.client, session_id))


async def heartbeat(running: Running, lease: Lease, want_acks: int) -> None:
    """Append a heartbeat through the script under ``lease``; wait for its answer."""
    await running.scripts.append_input(lease, [(None, HEARTBEAT)], max_entries=1000)

    async def answered() -> bool:
        return await acks(running, lease.session_id) >= want_acks

    await until(answered, f"heartbeat answer {want_acks}")
