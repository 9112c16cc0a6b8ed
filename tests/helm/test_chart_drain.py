"""A gateway pod's drain, as the kubelet runs it, driven by the rendered values.

Two gateways and a worker run as the chart's containers (tests/helm/render.py): each gateway
rendered with its own free port, so each manifest declares the port its process listens on
(two pods of one Deployment share a port number on different addresses; one machine cannot).
Sessions stream on gateway A. Then the kubelet's part: the pod is deleted, its rendered
``preStop`` hook runs for real (``sleep N``, N set small through values), then SIGTERM. The
budget is the rendered ``terminationGracePeriodSeconds``, counted from the deletion (the
preStop wait is part of it): whatever has not happened by then, the kubelet SIGKILLs.

What "readiness drops first" means for this product: on SIGTERM the gateway stops accepting
connections before it closes any websocket (uvicorn closes its listener, then sends each
websocket close 1012), so when a client sees its close, a readiness probe of that gateway
already fails and no balancer that probes it sends it the resume. The client then resumes
through the other gateway, as a balancer would send it there. (Kubernetes itself marks a
deleted pod's endpoints not ready at once; the preStop wait is for the balancers to follow.)
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from duplex_client import DuplexClient, RealtimeEvent, Resumed
from runtime.embedded import EmbeddedServer, free_port, start_server
from tests.e2e.helpers import STREAM_SESSION, chunk_index, marked_chunk
from tests.e2e.stack import Proc, print_tail
from tests.gateway.strict import validate_server_event
from tests.helm.render import (
    HttpProbe,
    Rendered,
    container_env,
    container_ports,
    http_probe,
    render,
    run_container,
    wait_for_probe,
)
from tests.store._support import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

API_KEY = "sk-chart-drain"
SESSIONS = 3
#: Small, so the test runs the real wait quickly; the grace period must exceed it plus the
#: gateway's own 5 s shutdown (the chart refuses less).
PRE_STOP_SECONDS = 1
GRACE_SECONDS = 8
#: Echoes each session must get through gateway A before the drain, and after its resume.
ECHOES_BEFORE = 10
ECHOES_AFTER = 10
ECHO = "response.output_audio.delta"
DRAIN = 1012
LOCAL_ADDRESS = "127.0.0.1"


def chart_values(redis: EmbeddedServer, gateway_port: int, metrics_port: int) -> dict[str, Any]:
    """The local Redis as an external one, a created API-key Secret, a short preStop."""
    return {
        "redis": {"mode": "external",
                  "external": {"url": f"redis://127.0.0.1:{redis.port}/0"}},
        "apiKeys": {"create": True, "keys": [API_KEY]},
        "gateway": {"port": gateway_port,
                    "drain": {"preStopSeconds": PRE_STOP_SECONDS,
                              "terminationGracePeriodSeconds": GRACE_SECONDS}},
        "worker": {"metricsPort": metrics_port},
    }


@dataclass(frozen=True, slots=True)
class GatewayPod:
    """One gateway's manifest and its running process."""

    rendered: Rendered
    proc: Proc

    @property
    def container(self) -> dict[str, Any]:
        return self.rendered.container("gateway")

    @property
    def readiness(self) -> HttpProbe:
        return http_probe(self.container, "readinessProbe")

    @property
    def ws_url(self) -> str:
        return f"ws://{LOCAL_ADDRESS}:{container_ports(self.container)['http']}/v1/realtime"

    @property
    def pre_stop(self) -> list[str]:
        return list(self.container["lifecycle"]["preStop"]["exec"]["command"])

    @property
    def grace_s(self) -> int:
        pod = self.rendered.component("Deployment", "gateway")["spec"]["template"]["spec"]
        return int(pod["terminationGracePeriodSeconds"])


@dataclass(frozen=True, slots=True)
class Close:
    """How one session's connection to the draining gateway ended, and when."""

    code: int | None
    at: float
    #: What the draining gateway's readiness probe answered right then (None: refused).
    readiness_status: int | None


class StreamedSession:
    """A stream-mode session: a sender appending marked chunks every 20 ms, and a reader that,
    when the connection closes, records the close and resumes through the other gateway."""

    def __init__(self, index: int, client: DuplexClient, draining: GatewayPod,
                 other: GatewayPod) -> None:
        self.index = index
        self.client = client
        self.draining = draining
        self.other = other
        self.events: list[RealtimeEvent] = []
        self.closes: list[Close] = []
        self.resumes: list[Resumed] = []
        self.echoes_at_resume = 0
        self.sent = 0
        self.stop_sending = asyncio.Event()

    def echoes(self) -> int:
        return sum(event.type == ECHO for event in self.events)

    async def send(self) -> None:
        while not self.stop_sending.is_set():
            await self.client.append_audio(marked_chunk(self.index, self.sent))
            self.sent += 1
            await asyncio.sleep(0.02)  # real-time pacing of the sender, not a wait

    async def read(self) -> None:
        while True:
            try:
                event = await self.client.recv()
            except ConnectionClosed as lost:
                await self.resume_elsewhere(lost)
                continue
            validate_server_event(event.data)
            self.events.append(event)
            if event.type == "session.closed":
                return

    async def resume_elsewhere(self, lost: ConnectionClosed) -> None:
        at = time.monotonic()
        status = await asyncio.to_thread(self.draining.readiness.status)
        code = lost.rcvd.code if lost.rcvd is not None else None
        self.closes.append(Close(code, at, status))
        self.echoes_at_resume = self.echoes()
        self.resumes.append(await self.client.resume(self.other.ws_url))


@dataclass(frozen=True, slots=True)
class Release:
    """The worker and two gateways, started from the chart's manifests."""

    gateway_a: GatewayPod
    gateway_b: GatewayPod


def start_gateway(rendered: Rendered, name: str) -> GatewayPod:
    container = rendered.container("gateway")
    # A pod listens on all its addresses; this machine's processes on loopback only.
    proc = run_container(name, rendered, container,
                         overrides={"DUPLEX_GATEWAY_HOST": LOCAL_ADDRESS})
    return GatewayPod(rendered, proc)


@pytest.fixture
def release() -> Iterator[Release]:
    """Redis, the chart's worker (waited on through its startup probe), and gateways A and
    B, each rendered with its own port (waited on through their readiness probes)."""
    redis = start_server("auto")
    metrics_port = free_port()
    rendered_a = render(chart_values(redis, free_port(), metrics_port))
    rendered_b = render(chart_values(redis, free_port(), metrics_port))
    procs: list[Proc] = []
    try:
        worker_container = rendered_a.container("worker")
        worker = run_container("chart-worker", rendered_a, worker_container,
                               overrides={"DUPLEX_GATEWAY_METRICS_HOST": LOCAL_ADDRESS})
        procs.append(worker)
        wait_for_probe(worker, http_probe(worker_container, "startupProbe"),
                       "the worker's startup probe")
        pods = []
        for name, rendered in (("chart-gateway-a", rendered_a), ("chart-gateway-b", rendered_b)):
            pod = start_gateway(rendered, name)
            procs.append(pod.proc)
            wait_for_probe(pod.proc, pod.readiness, f"{name}'s readiness probe")
            pods.append(pod)
        yield Release(*pods)
    finally:
        for proc in reversed(procs):
            proc.kill()
            if proc.log is not None:
                print_tail(proc.name, proc.log)
        redis.stop()


def api_key(pod: GatewayPod) -> str:
    """The key the gateway's container gets from the chart's Secret."""
    return container_env(pod.rendered, pod.container)["DUPLEX_GATEWAY_API_KEYS"]


async def open_sessions(release: Release) -> list[StreamedSession]:
    sessions = []
    for index in range(SESSIONS):
        client = await DuplexClient.connect(release.gateway_a.ws_url, session=STREAM_SESSION,
                                            api_key=api_key(release.gateway_a))
        sessions.append(StreamedSession(index, client, release.gateway_a, release.gateway_b))
    return sessions


async def delete_pod(pod: GatewayPod) -> tuple[float, float]:
    """The kubelet's termination: the rendered preStop command, run to its end, then SIGTERM.
    Returns when the deletion began and when SIGTERM was sent."""
    deleted_at = time.monotonic()
    # The chart's own preStop (`sleep N`), run for real: the wait balancers get.
    hook = await asyncio.create_subprocess_exec(*pod.pre_stop, stdout=subprocess.DEVNULL)
    assert await hook.wait() == 0, pod.pre_stop
    sigterm_at = time.monotonic()
    pod.proc.process.send_signal(signal.SIGTERM)
    return deleted_at, sigterm_at


async def wait_for_exit(pod: GatewayPod, deadline: float) -> int:
    """The gateway's exit status, if it exits before the kubelet would SIGKILL it."""
    try:
        return await asyncio.to_thread(pod.proc.process.wait,
                                       timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise AssertionError("the gateway outlived its grace period: it would be "
                             "SIGKILLed") from None


def check_nothing_lost(session: StreamedSession, other: GatewayPod) -> None:
    """Every event once and in order, every chunk echoed once and in order, one resume on the
    other gateway, and the session's close last."""
    seqs = [e.server_event_seq for e in session.events if e.server_event_seq is not None]
    assert seqs == list(range(1, len(seqs) + 1)), "a server_event_seq lost or repeated"
    echoed = [chunk_index(e.audio) for e in session.events if e.type == ECHO]
    assert echoed == list(range(session.sent)), "a chunk lost or echoed twice"
    assert [resumed.url for resumed in session.resumes] == [other.ws_url]
    assert session.events[-1].type == "session.closed"


async def test_a_drained_gateway_closes_1012_in_budget_and_sessions_resume_elsewhere(
        release: Release) -> None:
    """Sessions streaming on gateway A while its pod is deleted: nothing closes during the
    preStop wait; after SIGTERM each websocket closes with 1012 and, when it does, A's
    readiness probe already fails; every close and A's exit come before the grace period
    would end in SIGKILL; each session resumes on B and loses nothing."""
    gateway_a, gateway_b = release.gateway_a, release.gateway_b
    assert gateway_a.pre_stop == ["sleep", str(PRE_STOP_SECONDS)]
    sessions = await open_sessions(release)
    tasks = [asyncio.create_task(job()) for s in sessions for job in (s.read, s.send)]
    try:
        await until(lambda: all(s.echoes() >= ECHOES_BEFORE for s in sessions),
                    "echoes through gateway A")
        deleted_at, sigterm_at = await delete_pod(gateway_a)
        kill_at = deleted_at + gateway_a.grace_s
        # uvicorn raises SIGTERM again once its graceful shutdown is done: either status.
        assert await wait_for_exit(gateway_a, kill_at) in (0, -signal.SIGTERM)
        await until(lambda: all(s.resumes and s.echoes() >= s.echoes_at_resume + ECHOES_AFTER
                                for s in sessions), "echoes through gateway B")
        for session in sessions:
            session.stop_sending.set()
        await until(lambda: all(s.echoes() == s.sent for s in sessions), "every echo")
        for session in sessions:
            await session.client.close()
        await asyncio.wait_for(asyncio.gather(*tasks), 20)
    finally:
        for task in tasks:
            task.cancel()
        for session in sessions:
            await session.client.aclose()
    for session in sessions:
        print(f"session {session.index}: sent={session.sent} closes={session.closes} "
              f"sigterm_at={sigterm_at:.3f} kill_at={kill_at:.3f}")
        (close,) = session.closes
        assert close.code == DRAIN, close
        assert sigterm_at < close.at < kill_at, (close, sigterm_at, kill_at)
        assert close.readiness_status != 200, close
        check_nothing_lost(session, gateway_b)
    assert gateway_b.readiness.passes()
