"""The chart's containers run as the manifests declare them: command, args, environment,
ports and probes taken from the rendered objects, started as local processes on a local Redis.

What a pod would get is what the process gets: the container's ``command`` + ``args`` (the
``duplex-gateway`` console script, found on the PATH as in the image), the environment the
kubelet builds from the pod spec (the ConfigMaps, the chart's API-key Secret and a Redis
password Secret resolved, ``$(REDIS_PASSWORD)`` expanded), and the declared ports, chosen
free through the values so the manifests declare the ports the processes listen on. Only the
listening addresses are overridden (a pod listens on 0.0.0.0; a test machine keeps it to
127.0.0.1). A renamed subcommand or flag stops a process at start; a renamed or misread
variable shows as a setting not in effect (each test below checks one set through values).
"""

from __future__ import annotations

import base64
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from openai import AsyncOpenAI
from redis import Redis
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from duplex_client import DuplexClient, DuplexClientError
from runtime.embedded import EmbeddedServer, free_port, start_server
from tests.e2e.stack import Proc, print_tail
from tests.gateway.strict import validate_server_event
from tests.helm.render import (
    HttpProbe,
    Rendered,
    container_ports,
    http_probe,
    render,
    run_container,
    wait_for_probe,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

#: The chart creates the API-key Secret from these (apiKeys.create).
API_KEYS = ("sk-chart-process-1", "sk-chart-process-2", "sk-chart-process-3")
#: An existing Secret the values name for the Redis password, as an operator would create it.
REDIS_SECRET = "chart-process-redis"
REDIS_PASSWORD = "chart-process-redis-password"
SUPPLIED_SECRETS = {REDIS_SECRET: {"password": REDIS_PASSWORD}}
#: Non-default settings set through values, each checked in effect below: the gateway's from
#: its ConfigMap (envFrom), the worker's slots from a plain env value.
TENANT_MAX_SESSIONS = 1
WORKER_SLOTS = 2
#: What a pod listens on, and what this machine's processes listen on instead.
POD_ADDRESS = "0.0.0.0"
LOCAL_ADDRESS = "127.0.0.1"


def chart_values(redis: EmbeddedServer, gateway_port: int, metrics_port: int) -> dict[str, Any]:
    """An external Redis (the local one), API keys in a Secret the chart creates, the Redis
    password from an existing Secret, free ports, and the non-default settings above."""
    return {
        "redis": {"mode": "external",
                  "external": {"url": f"redis://127.0.0.1:{redis.port}/0"},
                  "auth": {"existingSecret": REDIS_SECRET,
                           "existingSecretPasswordKey": "password"}},
        "apiKeys": {"create": True, "keys": list(API_KEYS)},
        "gateway": {"port": gateway_port,
                    "settings": {"tenant_max_sessions": TENANT_MAX_SESSIONS}},
        "worker": {"slots": WORKER_SLOTS, "metricsPort": metrics_port},
    }


@dataclass(frozen=True, slots=True)
class LocalRelease:
    """The rendered chart and its gateway and worker containers running locally."""

    rendered: Rendered
    gateway: Proc
    worker: Proc

    def container(self, component: str) -> dict[str, Any]:
        return self.rendered.container(component)

    def probe(self, component: str, probe: str) -> HttpProbe:
        return http_probe(self.container(component), probe)

    @property
    def ws_base(self) -> str:
        """The websocket base URL on the gateway's declared ``http`` port."""
        return f"ws://{LOCAL_ADDRESS}:{container_ports(self.container('gateway'))['http']}/v1"


def start_redis_with_password() -> EmbeddedServer:
    """A local Redis that, like the operator's, refuses clients without the password."""
    server = start_server("auto")
    with Redis(port=server.port) as admin:
        admin.config_set("requirepass", REDIS_PASSWORD)
    return server


def listening_address(container: dict[str, Any], variable: str) -> dict[str, str]:
    """The one override: the pod's all-addresses listener kept to loopback here."""
    declared = {item["name"]: item.get("value") for item in container["env"]}
    assert declared[variable] == POD_ADDRESS, declared[variable]
    return {variable: LOCAL_ADDRESS}


@pytest.fixture
def release() -> Iterator[LocalRelease]:
    """Redis, then the chart's worker and gateway started from their manifests, each
    waited on through its declared probes (the worker's startup probe, the gateway's
    readiness probe)."""
    redis = start_redis_with_password()
    rendered = render(chart_values(redis, free_port(), free_port()))
    procs: list[Proc] = []
    try:
        worker_container = rendered.container("worker")
        worker = run_container("chart-worker", rendered, worker_container,
                               secrets=SUPPLIED_SECRETS,
                               overrides=listening_address(worker_container,
                                                           "DUPLEX_GATEWAY_METRICS_HOST"))
        procs.append(worker)
        wait_for_probe(worker, http_probe(worker_container, "startupProbe"),
                       "the worker's startup probe")
        gateway_container = rendered.container("gateway")
        gateway = run_container("chart-gateway", rendered, gateway_container,
                                secrets=SUPPLIED_SECRETS,
                                overrides=listening_address(gateway_container,
                                                            "DUPLEX_GATEWAY_HOST"))
        procs.append(gateway)
        wait_for_probe(gateway, http_probe(gateway_container, "readinessProbe"),
                       "the gateway's readiness probe")
        yield LocalRelease(rendered, gateway, worker)
    finally:
        for proc in reversed(procs):
            proc.kill()
            if proc.log is not None:
                print_tail(proc.name, proc.log)
        redis.stop()


def api_keys_from_the_secret(rendered: Rendered) -> list[str]:
    """The keys as the rendered Secret holds them (base64, comma-separated)."""
    secret = rendered.component("Secret", "api-keys")
    (encoded,) = secret["data"].values()
    return base64.b64decode(encoded).decode().split(",")


def test_the_declared_probes_answer_on_the_declared_ports(release: LocalRelease) -> None:
    """Gateway liveness (/healthz) and readiness (/readyz), the worker's startup and liveness
    probes (/metrics on its metrics port) pass where the manifests point them."""
    assert release.probe("gateway", "livenessProbe").path == "/healthz"
    assert release.probe("gateway", "readinessProbe").path == "/readyz"
    for component, probe in [("gateway", "livenessProbe"), ("gateway", "readinessProbe"),
                             ("worker", "startupProbe"), ("worker", "livenessProbe")]:
        assert release.probe(component, probe).status() == 200, (component, probe)


@pytest.mark.parametrize(("component", "metrics"),
                         [("gateway", "duplex_gateway_"), ("worker", "duplex_worker_")])
def test_every_service_target_port_is_a_listening_container_port(
        release: LocalRelease, component: str, metrics: str) -> None:
    """Each port of the component's Service targets a port its container declares, and the
    process answers there: /healthz on the websocket port, /metrics (what the ServiceMonitor
    scrapes) with the component's metrics on the metrics port."""
    service = release.rendered.component("Service", component)
    declared = container_ports(release.container(component))
    for port in service["spec"]["ports"]:
        target = port["targetPort"]  # a name must be declared; a number must be one
        number = declared[target] if isinstance(target, str) else int(target)
        assert number in declared.values(), (port, declared)
        path = "/metrics" if port["name"] == "metrics" else "/healthz"
        assert HttpProbe(path, number, 2.0).status() == 200, port
        if path == "/metrics":
            assert metrics in metrics_text(number), port


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://{LOCAL_ADDRESS}:{port}/metrics", timeout=2) as page:
        return str(page.read().decode())


async def test_one_sdk_session_with_the_key_from_the_rendered_secret(
        release: LocalRelease) -> None:
    """The openai SDK runs a turn through the gateway's declared port with a key from the
    chart's Secret, and the loopback worker plays the committed audio back; a key the Secret
    does not hold is refused with HTTP 401, so the keys are in effect."""
    key = api_keys_from_the_secret(release.rendered)[0]
    client = AsyncOpenAI(api_key=key, base_url="http://unused.invalid/v1",
                         websocket_base_url=release.ws_base)
    pcm = bytes(range(256)) * 19  # 4864 bytes: just over the 100 ms commit minimum
    audio = bytearray()
    async with client.realtime.connect(model="loopback") as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"],
                                           "audio": {"input": {"turn_detection": None}}})
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm).decode())
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        async for event in conn:
            validate_server_event(event.to_dict())
            if event.type == "response.output_audio.delta":
                audio += base64.b64decode(event.delta)
            if event.type == "response.done":
                assert event.response.status == "completed"
                break
    await client.close()
    assert bytes(audio) == pcm
    with pytest.raises(InvalidStatus) as refused:
        async with connect(f"{release.ws_base}/realtime?model=loopback",
                           additional_headers={"Authorization": "Bearer sk-not-in-the-secret"}):
            pass
    assert refused.value.response.status_code == 401


async def open_or_refusal(url: str, key: str) -> DuplexClient | str:
    """A session opened with ``key``, or the error code that refused it."""
    try:
        return await DuplexClient.connect(url, api_key=key)
    except DuplexClientError as refused:
        return str(refused.code)


async def test_settings_set_through_values_are_in_effect(release: LocalRelease) -> None:
    """gateway.settings.tenant_max_sessions (1, through the ConfigMap) refuses a tenant's
    second session while another tenant still gets one; worker.slots (2, a plain env value)
    refuses a third tenant once both slots are taken. At the defaults (off, 16 slots) all
    four opens would succeed."""
    url = f"{release.ws_base}/realtime"
    first, second, third = api_keys_from_the_secret(release.rendered)
    opened: list[DuplexClient] = []
    try:
        outcomes = []
        for key in (first, first, second, third):
            outcome = await open_or_refusal(url, key)
            if isinstance(outcome, DuplexClient):
                opened.append(outcome)
            outcomes.append("opened" if isinstance(outcome, DuplexClient) else outcome)
        assert outcomes == ["opened", "resource_exhausted", "opened", "resource_exhausted"]
    finally:
        for client in opened:
            await client.close()
            await client.aclose()
