"""An open refused because the deployment is overloaded ends with close 1013 (try again later)
and a retryable code, never 1011: a client backs off and opens again, where 1011 says the
server failed (and the project's own client does not open again on it).

``resource_exhausted`` (no worker slot, the tenant's cap) already closes 1013. These are the
other ways an open under load ends.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from inference_worker.backends.fake import FakeBackend, FakeOptions
from inference_worker.settings import WorkerSettings
from inference_worker.worker import Worker
from store import lua
from store.client import COMMAND_TIMEOUT_S
from store.keys import WorkerKeys
from tests.e2e.stack import Stack
from tests.faultproxy import FaultProxy
from tests.gateway.strict import validate_server_event
from tests.store._support import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

#: What a client may retry an open on: the gateway's "later, not no" refusals.
RETRYABLE_CODES = frozenset({"resource_exhausted", "rate_limit_exceeded"})
OPEN_TIMEOUT_S = 0.5
DEADLINE_S = 10.0
#: A store that stopped answering holds the gateway's compensating close of the given-up open
#: too, until its stalled connection is dropped (``store.client.COMMAND_TIMEOUT_S``).
STALLED_STORE_S = COMMAND_TIMEOUT_S + DEADLINE_S


@pytest.fixture
async def proxy(stack: Stack) -> AsyncIterator[FaultProxy]:
    """A proxy in front of the stack's Redis server."""
    fault = FaultProxy("127.0.0.1", stack.redis.port)
    await fault.start()
    yield fault
    fault.release()
    await fault.aclose()


async def until_closed(ws: ClientConnection, timeout: float = DEADLINE_S,
                       ) -> tuple[list[dict[str, Any]], int | None]:
    """Every event up to the close (each strictly valid, each within ``timeout``), and the
    close code received."""
    events: list[dict[str, Any]] = []
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), timeout))
            validate_server_event(event)
            events.append(event)
    received = closed.value.rcvd
    return events, received.code if received is not None else None


def error_codes(events: list[dict[str, Any]]) -> list[str]:
    return [event["error"]["code"] for event in events if event["type"] == "error"]


@pytest.mark.logs_errors
async def test_an_open_the_store_does_not_complete_in_time_is_try_again_later(
    stack: Stack, proxy: FaultProxy,
) -> None:
    """The open script waits in a busy store past ``OPEN_TIMEOUT_S``: the gateway gives the
    open up (a compensating close lands with it, so nothing stays open) and the client is
    told to try again later: a retryable code, close 1013. Opening again then works, and the
    given-up open holds no slot (the worker has one)."""
    stack.env["DUPLEX_GATEWAY_OPEN_TIMEOUT_S"] = str(OPEN_TIMEOUT_S)
    # On a thread: the proxy relays on this event loop, which the start's wait would block.
    gateway = await asyncio.to_thread(stack.gateway, redis_url=proxy.url)
    await asyncio.to_thread(stack.worker, 1)
    proxy.hold_command(hashlib.sha1(lua.OPEN_SESSION.encode()).hexdigest().encode())
    async with connect(gateway.ws_url) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
        await asyncio.wait_for(proxy.holding.wait(), DEADLINE_S)
        events, code = await until_closed(ws, STALLED_STORE_S)
    proxy.release()
    assert [event["type"] for event in events] == ["error"], events
    assert set(error_codes(events)) <= RETRYABLE_CODES, (events, code)
    assert code == 1013
    async with connect(gateway.ws_url + "?model=loopback") as ws:
        created = json.loads(await asyncio.wait_for(ws.recv(), DEADLINE_S))
        assert created["type"] == "session.created", created


async def test_a_session_the_worker_has_no_slot_for_ends_try_again_later(stack: Stack) -> None:
    """The store counts a free slot the worker's model does not have (its record says two
    slots while the engine holds one; in a running fleet, a slot the store freed before the
    worker let its session go): the session placed there ends ``no_free_slot``, and the
    client is told to try again later (close 1013), not that its session ended normally."""
    # One registration, then no heartbeat for the test's length: the record keeps what the
    # test writes into it.
    settings = WorkerSettings(backend="fake", slots=1, heartbeat_interval_s=30.0,
                              heartbeat_ttl_s=60.0)
    redis_client = Redis.from_url(stack.redis.url)
    worker = Worker(settings, redis_client,
                    backend=FakeBackend(max_slots=1, options=FakeOptions(frame_ms=20)))
    task = asyncio.create_task(worker.run())
    record = WorkerKeys(worker.worker_id).record
    try:
        async def registered() -> bool:
            return bool(await redis_client.exists(record))

        await until(registered, "registration")
        gateway = await asyncio.to_thread(stack.gateway)
        async with connect(gateway.ws_url + "?model=fake") as first:
            created = json.loads(await asyncio.wait_for(first.recv(), DEADLINE_S))
            assert created["type"] == "session.created", created
            await redis_client.hset(record, "slots", 2)
            async with connect(gateway.ws_url + "?model=fake") as second:
                events, code = await until_closed(second)
        kinds = [event["type"] for event in events]
        assert kinds[0] == "session.created" and kinds[-1] == "session.closed", events
        assert events[-1]["reason"] == "no_free_slot"
        assert code == 1013
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
        await redis_client.aclose()
