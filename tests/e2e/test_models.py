"""Models and capacity, with real processes: sessions land on a worker of the model their
client names, an unknown name is refused, each model's capacity is its own, and the fleet's
models are listed (``/v1/models``, ``/readyz``, ``duplex-gateway status``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import pytest
from openai import AsyncOpenAI, NotFoundError
from websockets.asyncio.client import ClientConnection, connect

from contract.models import decode_models
from runtime.embedded import free_port
from store.keys import WorkerKeys, worker_of_session
from tests.e2e.helpers import PUSH_TO_TALK_SESSION
from tests.e2e.stack import Proc, Stack, http_answer, wait_for
from tests.gateway.strict import validate_server_event

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]



async def first_event(ws: ClientConnection) -> dict[str, Any]:
    """The next server event, strictly validated."""
    event: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 10))
    validate_server_event(event)
    return event


async def open_on(gateway: Proc, query: str, session: dict[str, Any] | None = None,
                  ) -> tuple[ClientConnection, dict[str, Any]]:
    """A connection whose first frame is ``session.update`` (``session``, push-to-talk by
    default), and its first answer."""
    ws = await connect(f"{gateway.ws_url}{query}")
    update = {"type": "session.update", "session": session or PUSH_TO_TALK_SESSION}
    await ws.send(json.dumps(update))
    return ws, await first_event(ws)


def model_of_worker(stack: Stack, worker_id: str) -> tuple[str, ...]:
    reader = stack.reader()
    raw = reader.hget(WorkerKeys(worker_id).record, "models")
    reader.close()
    assert raw is None or isinstance(raw, bytes)
    return decode_models(raw)


async def test_sessions_land_by_model_and_each_model_has_its_own_capacity(
    stack: Stack,
) -> None:
    """Two pools of loopback workers (``alpha``; ``beta`` with the alias ``beta-latest``)
    behind one gateway: by URL, by first session.update, by alias; a full pool is
    resource_exhausted naming its model while the other places; an unknown name is
    model_not_found (1008), whether the client sends first or waits; a later update naming
    another model is refused."""
    gateway = stack.gateway()
    alpha = stack.worker(slots=2, models=("alpha",))
    beta = stack.worker(slots=3, models=("beta", "beta-latest"))
    assert alpha.process.poll() is None and beta.process.poll() is None
    held: list[ClientConnection] = []
    for query, session, model, pool in (
            ("?model=alpha", None, "alpha", ("alpha",)),
            ("?model=beta-latest", None, "beta-latest", ("beta", "beta-latest")),
            ("", {**PUSH_TO_TALK_SESSION, "model": "beta"}, "beta", ("beta", "beta-latest")),
            ("?model=alpha", None, "alpha", ("alpha",))):
        ws, created = await open_on(gateway, query, session)
        held.append(ws)
        assert created["type"] == "session.created", created
        assert created["session"]["model"] == model
        assert model_of_worker(stack, worker_of_session(created["session_id"])) == pool

    ws, refused = await open_on(gateway, "?model=alpha")  # both alpha slots are taken
    assert refused["error"]["code"] == "resource_exhausted", refused
    assert "'alpha'" in refused["error"]["message"]
    await ws.wait_closed()
    assert ws.close_code == 1013
    ws, created = await open_on(gateway, "?model=beta")  # beta still has room
    assert created["type"] == "session.created"
    held.append(ws)

    ws, unknown = await open_on(gateway, "?model=gamma")
    assert (unknown["error"]["code"], unknown["error"]["type"]) == (
        "model_not_found", "invalid_request_error")
    assert "alpha" in unknown["error"]["message"] and "beta-latest" in unknown["error"]["message"]
    await ws.wait_closed()
    assert ws.close_code == 1008
    huge = "x" * 1000  # not a model name (over 128): refused without being quoted back
    ws, unknown = await open_on(gateway, "", {**PUSH_TO_TALK_SESSION, "model": huge})
    assert unknown["error"]["code"] == "model_not_found"
    assert len(unknown["error"]["message"]) < 200
    await ws.close()
    async with connect(f"{gateway.ws_url}?model=gamma") as quiet:  # waits for session.created
        assert (await first_event(quiet))["error"]["code"] == "model_not_found"
        await quiet.wait_closed()
        assert quiet.close_code == 1008

    await held[0].send(json.dumps({"type": "session.update",
                                   "session": {"type": "realtime", "model": "beta"}}))
    refusal = await first_event(held[0])
    while refusal["type"] != "error":
        refusal = await first_event(held[0])
    assert refusal["error"]["code"] == "model_update_unsupported"
    for ws in held:
        await ws.close()


def _get_json(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, json.loads(refused.read())


async def test_the_fleet_lists_its_models(stack: Stack) -> None:
    """``client.models.list()`` of the openai SDK, ``/readyz`` per model and in detail, and
    ``duplex-gateway status`` name the same models with their capacity."""
    gateway = stack.gateway()
    alpha = stack.worker(slots=3, models=("alpha",), metrics_port=free_port())
    stack.worker(slots=2, backend="fake", models=("beta", "beta-latest"))
    ws, created = await open_on(gateway, "?model=alpha")
    assert created["type"] == "session.created"

    def exported(line: str) -> bool:
        answer = http_answer(f"http://127.0.0.1:{alpha.port}/metrics")
        return answer is not None and line in answer[1].splitlines()

    # The worker's capacity per model, as the dashboard sums it (set on every heartbeat).
    for line in ('duplex_worker_slots{backend="loopback",model="alpha"} 3.0',
                 'duplex_worker_sessions{backend="loopback",model="alpha"} 1.0',
                 'duplex_worker_free_slots{backend="loopback",model="alpha"} 2.0'):
        wait_for(lambda line=line: exported(line), line)  # type: ignore[misc]

    client = AsyncOpenAI(api_key="sk-test", base_url=gateway.http_url + "/v1", max_retries=0)
    listed = await client.models.list()
    assert [model.id for model in listed.data] == ["alpha", "beta", "beta-latest"]
    alias = await client.models.retrieve("beta-latest")
    assert (alias.id, alias.object, alias.owned_by) == ("beta-latest", "model", "duplex-gateway")
    assert alias.model_dump()["root"] == "beta"
    assert alias.model_dump()["capabilities"]["chunk_period_ms"] == 80  # the fake's frames
    with pytest.raises(NotFoundError):
        await client.models.retrieve("gamma")
    await client.close()

    assert http_answer(gateway.http_url + "/readyz?model=alpha") == (200, "ready")
    status, _ = http_answer(gateway.http_url + "/readyz?model=gamma") or (0, "")
    assert status == 503
    status, detail = _get_json(gateway.http_url + "/readyz?detail=1")
    assert status == 200 and detail["ready"] is True
    assert detail["models"]["alpha"] == {"workers": 1, "admitting": 1, "slots": 3, "used": 1,
                                         "free": 2}
    assert detail["models"]["beta-latest"]["slots"] == 2

    shown = subprocess.run(
        [sys.executable, "-m", "duplex_gateway", "status", "--redis-url", stack.url, "--json"],
        capture_output=True, text=True, timeout=30, check=True)
    document = json.loads(shown.stdout)
    assert document["models"]["alpha"] == detail["models"]["alpha"]
    assert sorted(tuple(w["models"]) for w in document["workers"]) == [
        ("alpha",), ("beta", "beta-latest")]
    await ws.close()
