"""Health, readiness and metrics endpoints of a real gateway process."""

from __future__ import annotations

import asyncio
import functools
import json
import urllib.request

import pytest

from duplex_client import DuplexClient, DuplexClientError
from runtime.embedded import free_port
from tests.e2e.helpers import collect_until
from tests.e2e.stack import NO_WORKER, READY, Stack, http_answer, http_ok, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


async def test_health_ready_and_metrics(stack: Stack) -> None:
    """With a worker, /healthz and /readyz answer 200; /metrics counts the session opened."""
    gateway = stack.gateway()
    stack.worker()
    assert get(gateway.http_url + "/healthz") == (200, "ok")
    assert get(gateway.http_url + "/readyz") == READY
    async with await DuplexClient.connect(gateway.ws_url) as client:
        await collect_until(client, "session.updated", [])
    status, text = get(gateway.http_url + "/metrics")
    assert status == 200
    assert "duplex_gateway_sessions_opened_total 1.0" in text
    assert "duplex_gateway_connections" in text


def test_ready_only_while_a_worker_is_live(stack: Stack) -> None:
    """/readyz is 503 "no worker" until a worker registers, 200 while it lives, and 503 again
    once its heartbeat lapses; /healthz answers 200 throughout."""
    gateway = stack.gateway()
    readyz, healthz = gateway.http_url + "/readyz", gateway.http_url + "/healthz"
    assert http_answer(readyz) == NO_WORKER
    assert http_answer(healthz) == (200, "ok")
    worker = stack.worker()
    wait_for(lambda: http_answer(readyz) == READY, "ready once the worker registered")
    worker.kill()
    wait_for(lambda: http_answer(readyz) == NO_WORKER, "not ready once the worker is gone")
    assert http_answer(healthz) == (200, "ok")


def metric_value(text: str, name: str) -> float:
    """One sample's value from Prometheus text (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


async def test_relay_and_resume_latency_histograms(stack: Stack) -> None:
    """Both relay directions and a resume are timed in the gateway's histograms."""
    gateway = stack.gateway()
    stack.worker()
    async with await DuplexClient.connect(gateway.ws_url) as client:
        await collect_until(client, "session.updated", [])
        await client.heartbeat()
        await collect_until(client, "session.heartbeat_ack", [])
        await client.resume()
        await client.heartbeat()
        await collect_until(client, "session.heartbeat_ack", [])
    _, text = get(gateway.http_url + "/metrics")
    assert metric_value(text, 'duplex_gateway_relay_seconds_count{direction="in"}') >= 2
    assert metric_value(text, 'duplex_gateway_relay_seconds_count{direction="out"}') >= 2
    assert metric_value(text, "duplex_gateway_resume_seconds_count") == 1
    assert metric_value(text, 'duplex_gateway_resumes_total{outcome="ok"}') == 1


async def test_both_processes_freeze_their_startup_heap(stack: Stack) -> None:
    """A gateway and a worker freeze what startup built out of the garbage collector's
    passes (runtime/heap.py), and time each pass from then on: the full pass that precedes
    the freeze is the first one observed."""
    gateway = stack.gateway()
    worker = stack.worker(backend="fake", metrics_port=free_port())
    wait_for(lambda: http_answer(gateway.http_url + "/readyz") == READY, "a worker is live")
    wait_for(lambda: http_ok(worker.http_url + "/metrics"), "the worker serves its metrics")
    _, gateway_text = get(gateway.http_url + "/metrics")
    _, worker_text = get(worker.http_url + "/metrics")
    # Tens of thousands of objects: the modules, the app, the backend (a few hundred would
    # mean the freeze came before the imports).
    assert metric_value(gateway_text, "duplex_gateway_gc_frozen_objects") > 20_000
    assert metric_value(worker_text, 'duplex_worker_gc_frozen_objects{backend="fake"}') > 20_000
    assert metric_value(
        gateway_text, 'duplex_gateway_gc_pause_seconds_count{generation="2"}') >= 1
    assert metric_value(
        worker_text,
        'duplex_worker_gc_pause_seconds_count{backend="fake",generation="2"}') >= 1


async def test_both_processes_probe_their_event_loop(stack: Stack) -> None:
    """A gateway and a worker export how late their event loop runs a probe due every 0.1 s
    (runtime/loop_lag.py), from their start."""
    gateway = stack.gateway()
    worker = stack.worker(backend="fake", metrics_port=free_port())
    wait_for(lambda: http_answer(gateway.http_url + "/readyz") == READY, "a worker is live")
    samples = {
        gateway.http_url: "duplex_gateway_event_loop_lag_seconds_count",
        worker.http_url: 'duplex_worker_event_loop_lag_seconds_count{backend="fake"}',
    }
    for url, sample in samples.items():
        wait_for(functools.partial(_probed, url, sample), f"{sample} counting")


def _probed(url: str, sample: str) -> bool:
    """Whether ``url``'s metrics hold ``sample`` counted at least twice."""
    if not http_ok(url + "/metrics"):
        return False
    _, text = get(url + "/metrics")
    return metric_value(text, sample) >= 2


async def test_api_key_required_when_configured(stack: Stack) -> None:
    """With API keys set, a wrong key gets HTTP 401 and the right one a session."""
    stack.env["DUPLEX_GATEWAY_API_KEYS"] = "k1,k2"
    gateway = stack.gateway()
    stack.worker()
    with pytest.raises(Exception, match="401"):
        await DuplexClient.connect(gateway.ws_url, api_key="wrong")
    async with await DuplexClient.connect(gateway.ws_url, api_key="k2") as client:
        await collect_until(client, "session.updated", [])


async def test_browser_subprotocol_key_and_realtime_subprotocol(stack: Stack) -> None:
    """Browsers authenticate with the openai-insecure-api-key subprotocol; we pick "realtime"."""
    import websockets
    from websockets.exceptions import InvalidStatus
    from websockets.typing import Subprotocol

    stack.env["DUPLEX_GATEWAY_API_KEYS"] = "browser-key"
    gateway = stack.gateway()
    stack.worker()
    offered = [Subprotocol("realtime"), Subprotocol("openai-insecure-api-key.browser-key")]
    async with websockets.connect(gateway.ws_url + "?model=loopback",
                                  subprotocols=offered) as ws:
        assert ws.subprotocol == "realtime"
        first = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert first["type"] == "session.created"
    with pytest.raises(InvalidStatus) as refused:
        async with websockets.connect(
                gateway.ws_url,
                subprotocols=[Subprotocol("realtime"), Subprotocol("openai-insecure-api-key.x")]):
            pass
    assert refused.value.response.status_code == 401


async def test_tenant_session_cap(stack: Stack) -> None:
    """A tenant at its cap gets resource_exhausted (1013); others don't; a close frees it."""
    stack.env["DUPLEX_GATEWAY_API_KEYS"] = "k1,k2"
    stack.env["DUPLEX_GATEWAY_TENANT_MAX_SESSIONS"] = "1"
    gateway = stack.gateway()
    stack.worker()
    first = await DuplexClient.connect(gateway.ws_url, api_key="k1")
    await collect_until(first, "session.updated", [])
    with pytest.raises(DuplexClientError) as refused:
        await DuplexClient.connect(gateway.ws_url, api_key="k1")
    assert refused.value.code == "resource_exhausted"
    async with await DuplexClient.connect(gateway.ws_url, api_key="k2") as other:
        await collect_until(other, "session.updated", [])
    await first.close()
    await collect_until(first, "session.closed", [])
    await first.aclose()
    again = await open_with_retry(gateway.ws_url, "k1")
    await again.aclose()


async def open_with_retry(url: str, key: str) -> DuplexClient:
    """Open, retrying while the released reservation is still on its way."""
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        try:
            return await DuplexClient.connect(url, api_key=key)
        except DuplexClientError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.05)  # retry pacing; the condition is the open succeeding
