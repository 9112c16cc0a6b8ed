"""A session the worker stops serving is closed even when Redis is away at that moment.

The worker ends a session it can no longer serve truthfully (its input log went back behind
what it applied: a failover lost writes) with ``session.closed`` alone. If that one write
fails, nothing else would ever end the session: the worker has forgotten it, its heartbeat
goes on, and the client would wait on a silent session. So the close is tried again until it
lands. Here the close is held by a TCP proxy between the worker and a real Redis, then the
proxy cuts every connection and refuses new ones for a while: the close must land once
Redis can be reached again.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from contract import messages as msg
from inference_worker.worker import Worker
from runtime.embedded import EmbeddedServer
from store import Scripts, create_client
from store.keys import SessionKeys
from tests.faultproxy import FaultProxy
from tests.store._support import assert_one_terminal, open_session, until
from tests.worker.test_session_isolation import append, ended, events, serving, settings

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def proxy(redis_server: EmbeddedServer, redis_client: Redis) -> AsyncIterator[FaultProxy]:
    """A proxy in front of the test's Redis server."""
    fault = FaultProxy("127.0.0.1", redis_server.port)
    await fault.start()
    yield fault
    fault.restore()
    fault.release()
    await fault.aclose()


@pytest.mark.logs_errors
async def test_a_close_that_fails_is_tried_again_until_it_lands(
    redis_client: Redis, proxy: FaultProxy, caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker applied a command, then the record says the input log holds none (lost
    writes): the worker ends the session log_rewound. Its close is held, then cut with every
    connection, and refused for a while; once the proxy serves again the session ends, with
    exactly one terminal event."""
    scripts = Scripts(redis_client)
    lossy = create_client(proxy.url)
    assert isinstance(lossy, Redis)
    worker = Worker(settings(), lossy)
    try:
        async with serving(worker, redis_client):
            opened = await open_session(scripts, worker.worker_id)
            await append(scripts, opened.lease, msg.UpdateSession(
                session={"extra_body": {"loopback_mode": "stream"},
                         "audio": {"input": {"turn_detection": None}}}))

            async def applied() -> bool:
                return any(isinstance(e, msg.SessionUpdated)
                           for e in await events(redis_client, opened.session_id))

            await until(applied, "the worker to apply the command")
            proxy.hold_command(b"log_rewound")
            # A failover to a replica that lacked the append: the log ends before index 1
            # (it holds only the marker its open wrote).
            log = SessionKeys(opened.session_id).input_log
            rows: Any = await redis_client.xrange(log, count=1)
            ((marker_id, marker),) = rows
            await redis_client.delete(log)
            await redis_client.xadd(log, marker, id=marker_id)
            await until(proxy.holding.is_set, "the worker to send its close")
            with caplog.at_level(logging.WARNING, logger="inference_worker.worker"):
                proxy.cut()
                await until(lambda: "closing " in caplog.text, "a failed close, logged")
            assert not await ended(redis_client, opened.session_id)
            proxy.restore()
            await until(lambda: ended(redis_client, opened.session_id),
                        "the close to land once Redis is back")
            await assert_one_terminal(redis_client, opened.session_id, "session.closed",
                                      "log_rewound")
    finally:
        await lossy.aclose()
