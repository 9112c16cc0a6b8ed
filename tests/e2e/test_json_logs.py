"""JSON logs end to end: a gateway and a worker at ``info`` with ``DUPLEX_GATEWAY_LOG_FORMAT=json``
write nothing but JSON lines (uvicorn's access lines included), the worker's lines about a
session carry its id, and no API key or token reaches either log."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from duplex_client import DuplexClient
from store.keys import worker_of_session
from tests.conftest import secrets_in_logs
from tests.e2e.helpers import collect_until
from tests.e2e.stack import READY, Proc, Stack, http_answer, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

KEY = "sk-test-Jq4nW8rT2xV6bM3kP9yH5"
KEYS = ("ts", "level", "logger", "message")


def json_lines(proc: Proc) -> list[dict[str, Any]]:
    """Every non-empty line of the process's log, each parsed as a JSON object."""
    lines = []
    for text in proc.output().splitlines():
        if text.strip():
            line = json.loads(text)  # a line that is not JSON fails the test here, quoted
            assert isinstance(line, dict), text
            lines.append(line)
    return lines


def has_line(proc: Proc, **fields: str) -> bool:
    """Whether some JSON line of the process has these fields (a substring of its message)."""
    message = fields.pop("message", "")
    return any(all(line.get(k) == v for k, v in fields.items())
               and message in line.get("message", "") for line in json_lines(proc))


def start_worker(stack: Stack) -> Proc:
    """A loopback worker at ``info`` (Stack.worker starts them at ``warning``), once it
    serves."""
    worker = stack._spawn("worker", ["worker", "--redis-url", stack.url, "--backend",
                                     "loopback", "--slots", "2"], log_level="info")
    wait_for(lambda: has_line(worker, logger="inference_worker.worker", message="registered")
             or worker.process.poll() is not None, "the worker's registration")
    assert worker.process.poll() is None, worker.output()
    return worker


async def test_gateway_and_worker_write_json_lines_with_session_ids_and_no_secrets(
        stack: Stack) -> None:
    """Every line of both logs is a JSON object with ts, level, logger and message; uvicorn's
    lines too, without the query string a refused client put its key in; the worker's lines
    about the session name it in session_id; nothing is logged at ERROR; no key or token."""
    stack.env["DUPLEX_GATEWAY_API_KEYS"] = KEY
    stack.env["DUPLEX_GATEWAY_LOG_FORMAT"] = "json"
    gateway = stack.gateway(log_level="info")
    worker = start_worker(stack)
    wait_for(lambda: http_answer(gateway.http_url + "/readyz") == READY, "a ready gateway")
    with pytest.raises(InvalidStatus):  # a key in the query is refused, and must not be logged
        await connect(f"{gateway.ws_url}?model=loopback&api_key={KEY}")
    client = await DuplexClient.connect(f"{gateway.ws_url}?model=loopback", api_key=KEY)
    session_id, token = str(client.session_id), str(client.resume_token)
    await client.close()
    await collect_until(client, "session.closed", [])
    await client.aclose()

    wait_for(lambda: has_line(worker, session_id=session_id, message="no longer serving"),
             "the worker's line that the session left")
    wait_for(lambda: sum("WebSocket /v1/realtime" in line["message"]
                         for line in json_lines(gateway)) >= 2, "the gateway's access lines")
    # Stopped gracefully first: their logs are complete (no line half written when read), and
    # the shutdown lines are checked too.
    # (uvicorn ends by re-raising the SIGTERM it handled.)
    assert {gateway.terminate(), worker.terminate()} <= {0, -signal.SIGTERM}
    worker_lines, gateway_lines = json_lines(worker), json_lines(gateway)
    assert any("Shutting down" in line["message"] for line in gateway_lines), gateway_lines
    for line in worker_lines + gateway_lines:
        assert all(isinstance(line.get(key), str) for key in KEYS), line
        assert line["level"] != "ERROR", line
    served = [line for line in worker_lines if line.get("session_id") == session_id]
    assert any("serving session" in line["message"] for line in served), worker_lines
    assert {line.get("worker_id") for line in served} == {worker_of_session(session_id)}, served
    uvicorn = [line for line in gateway_lines if line["logger"].startswith("uvicorn")]
    assert any(" 401" in line["message"] or "403" in line["message"] for line in uvicorn), \
        gateway_lines
    assert not any("?" in line["message"] for line in uvicorn), uvicorn
    for proc in (gateway, worker):
        text = proc.output()
        assert KEY not in text and token not in text
    assert gateway.log is not None
    assert secrets_in_logs(gateway.log.parent, {KEY, token}) == []
