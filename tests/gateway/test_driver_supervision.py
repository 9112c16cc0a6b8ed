"""A connection task that fails on a bug closes the connection 1011, loudly."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from gateway.app import create_app
from gateway.connection import ConnectionDriver
from gateway.settings import GatewaySettings
from store.embedded import EmbeddedServer


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
