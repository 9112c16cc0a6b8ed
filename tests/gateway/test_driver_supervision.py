"""A connection that fails (a task on a bug, Redis on an append) closes 1011, loudly, and
sends nothing more upstream."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from typing import Any

import pytest
from redis.asyncio import Redis
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from gateway.app import create_app
from gateway.batcher import InputBatcher
from gateway.driver import ConnectionDriver
from gateway.input_writer import InputWriter
from gateway.settings import GatewaySettings
from runtime.embedded import EmbeddedServer
from store import Lease, Scripts, StoreUnavailable
from store.directory import announce_worker
from store.keys import SessionKeys, new_worker_id


@pytest.mark.logs_errors
@pytest.mark.timeout(30)
def test_a_failed_task_closes_the_connection_1011(redis_server: EmbeddedServer,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault: the housekeeping task raises at once (a bug). The client gets an
    internal_error event and close 1011 instead of a connection that half works."""
    async def broken(self: ConnectionDriver) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(ConnectionDriver, "_housekeeping", broken)
    app = create_app(GatewaySettings(redis_url=redis_server.url))
    with TestClient(app) as client, client.websocket_connect("/v1/realtime") as ws:
        error = json.loads(ws.receive_text())
        assert error["type"] == "error" and error["error"]["code"] == "internal_error"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
        assert closed.value.code == 1011


@pytest.mark.timeout(30)
def test_nothing_goes_upstream_after_a_failed_append(redis_server: EmbeddedServer,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault: Redis fails the session's first append while a second command is queued
    behind it. The connection closes 1011 and appends nothing more: had the second landed,
    last_client_seq would pass the failed command and a resuming client would never resend
    it."""
    worker_id = new_worker_id()

    async def register() -> None:
        client = Redis.from_url(redis_server.url)
        beat = await Scripts(client).worker_heartbeat(worker_id, slots=4, ttl_ms=60_000,
                                                      register=True, drain=False)
        await announce_worker(client, worker_id, beat.alive_until_ms)
        await client.aclose()

    asyncio.run(register())
    first_started, queued, release = threading.Event(), threading.Event(), threading.Event()
    calls: list[int] = []
    original_append, original_queue = InputBatcher.append, InputWriter.queue

    async def failing_first(self: InputBatcher, lease: Lease, entries: Any) -> Any:
        calls.append(len(entries))
        if len(calls) > 1:
            return await original_append(self, lease, entries)
        first_started.set()
        await asyncio.to_thread(release.wait, 10)
        raise StoreUnavailable("injected: Redis failed the append")

    def queue_and_tell(self: InputWriter, entries: Any) -> None:
        original_queue(self, entries)
        if first_started.is_set():
            queued.set()

    monkeypatch.setattr(InputBatcher, "append", failing_first)
    monkeypatch.setattr(InputWriter, "queue", queue_and_tell)
    app = create_app(GatewaySettings(redis_url=redis_server.url))
    with TestClient(app) as client, client.websocket_connect("/v1/realtime") as ws:
        ws.send_text(json.dumps({"type": "session.update", "session": {"type": "realtime"},
                                 "client_seq": 1}))
        created = json.loads(ws.receive_text())
        assert created["type"] == "session.created"
        assert first_started.wait(10)
        ws.send_text(json.dumps({"type": "input_audio_buffer.append",
                                 "audio": base64.b64encode(bytes(960)).decode(),
                                 "client_seq": 2}))
        assert queued.wait(10)
        release.set()
        frames = []
        with pytest.raises(WebSocketDisconnect) as closed:
            while True:
                frames.append(json.loads(ws.receive_text()))
        assert closed.value.code == 1011
        assert any(f.get("error", {}).get("code") == "internal_error" for f in frames)

        async def record() -> tuple[bytes | None, int]:
            client = Redis.from_url(redis_server.url)
            keys = SessionKeys(created["session_id"])
            state: Any = await client.hget(keys.record, "state")
            # Commands only: the log's fence markers (its open's, its detach's) carry none.
            rows: Any = await client.xrange(keys.input_log)
            length = sum(b"d" in fields for _, fields in rows)
            await client.aclose()
            return state, length

        # Wait for the driver to have let the session go (detached), then look at its log.
        deadline = time.monotonic() + 10
        while (answer := asyncio.run(record()))[0] != b"detached":
            assert time.monotonic() < deadline, answer
            time.sleep(0.02)  # polling another process's state from a sync test
    assert calls == [1]
    assert answer == (b"detached", 0)
