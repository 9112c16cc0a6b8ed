"""The Starlette application: routes, lifespan, health, readiness and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from types import FrameType
from typing import NoReturn

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from gateway.auth import Caller, error_response, identify
from gateway.client_secrets import mint_client_secret
from gateway.driver import ConnectionDriver
from gateway.metrics import GatewayMetrics
from gateway.models_api import list_models, model_readiness, retrieve_model
from gateway.protocol.dialect import DUPLEX_PATH, Handshake, parse_handshake
from gateway.protocol.errors import ClientProtocolError, CloseCode
from gateway.reaper import run_reaper
from gateway.reaper_share import ReaperShare
from gateway.services import GatewayServices
from gateway.settings import GatewaySettings
from gateway.web_page import web_page_routes
from runtime.loop_errors import quiet_dropped_cluster_nodes
from runtime.loop_lag import watch_loop_lag
from store import Scripts, StoreError, create_client
from store.client import RedisClient
from store.directory import live_worker_count, unlist_gateway
from store.outages import OutageLog, RedisRefused, redis_address, wait_for_redis
from store.pubsub import Subscriber

__all__ = ["create_app"]

_log = logging.getLogger(__name__)
# The exit status of a gateway that cannot use its Redis: that of any unusable setting.
_UNUSABLE_SETTING = 2
# The exit status of a gateway told to stop before it served: it did as asked.
_STOPPED = 0
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def _stop_signals_set(stop: asyncio.Event) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT set ``stop``, then the handlers before are put back.

    uvicorn takes both signals from its start but looks at them only once the lifespan's
    startup is over, so a wait for Redis inside it would outlast them (up to
    ``REDIS_START_TIMEOUT_S``). Signals reach only the main thread: elsewhere (a lifespan
    run by an in-process test client) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(stop.set)  # a signal handler must not touch the loop itself

    before = {sig: signal.signal(sig, request_stop) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _leave(status: int) -> NoReturn:
    """End the process now, its log flushed. Anything raised out of a lifespan is printed with
    its traceback by Starlette and again by uvicorn; before Redis answered nothing needs
    closing, so leaving at once is both quiet and safe."""
    logging.shutdown()
    os._exit(status)


async def _connect(settings: GatewaySettings, client: RedisClient) -> None:
    """Wait for Redis (bounded) unless told to stop meanwhile; an operator's mistake, or a
    stop, ends the process with one line and no traceback."""
    address = redis_address(settings.redis_url)
    stop = asyncio.Event()
    with _stop_signals_set(stop):
        waiting = asyncio.create_task(wait_for_redis(
            client, _log, address, timeout_s=settings.redis_start_timeout_s))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait([waiting, stopping], return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        # The wait is not awaited: a ping cut short inside redis-py may swallow its cancel.
        _log.warning("stopped while waiting for Redis at %s", address)
        _leave(_STOPPED)
    stopping.cancel()
    try:
        waiting.result()
    except RedisRefused as refused:
        print(f"duplex-gateway: {refused}", file=sys.stderr, flush=True)
        _leave(_UNUSABLE_SETTING)


async def _readiness(services: GatewayServices | None, request: Request) -> Response:
    """/readyz: 200 only while this gateway can place a session, so a balancer sends no
    traffic to one that would answer every open with resource_exhausted. Liveness
    (/healthz) never asks Redis or the workers. Per model on request (``?model=``,
    ``?detail=1``: :func:`gateway.models_api.model_readiness`)."""
    if services is None or services.draining:
        return PlainTextResponse("draining", status_code=503)
    if "model" in request.query_params or "detail" in request.query_params:
        return await model_readiness(request, services.client)
    try:
        live_workers = await live_worker_count(services.client)
    except Exception:  # any failure to reach Redis means not ready
        return PlainTextResponse("redis unreachable", status_code=503)
    if not live_workers:
        return PlainTextResponse("no worker", status_code=503)
    return PlainTextResponse("ready")


async def _admit(settings: GatewaySettings, services: GatewayServices,
                 websocket: WebSocket) -> tuple[Caller, Handshake] | None:
    """Who calls and what its URL asks for (:mod:`gateway.protocol.dialect`); None: refused
    before the upgrade (a wrong key; a query parameter it cannot mean anything by, 400)."""
    caller = await identify(settings, services.client, websocket)
    if isinstance(caller, JSONResponse):
        await websocket.send_denial_response(caller)
        return None
    try:
        return caller, parse_handshake(websocket.url.path, websocket.query_params)
    except ClientProtocolError as exc:
        await websocket.send_denial_response(
            error_response(400, exc.code, exc.message, param=exc.param))
        return None


def _model_routes(settings: GatewaySettings, state: dict[str, GatewayServices]) -> list[Route]:
    """``GET /v1/models`` and ``GET /v1/models/{model}`` (names may hold ``/``)."""

    async def models(request: Request) -> Response:
        return await list_models(request, settings, state["services"].client)

    async def model(request: Request) -> Response:
        return await retrieve_model(request, settings, state["services"].client)

    return [Route("/v1/models", models), Route("/v1/models/{model:path}", model)]


def create_app(settings: GatewaySettings, metrics: GatewayMetrics | None = None) -> Starlette:
    """A gateway application bound to ``settings``; Redis is connected in the lifespan.
    ``metrics``: the process's (``serve`` records its collector passes there), else a fresh
    set."""
    if metrics is None:
        metrics = GatewayMetrics()
    state: dict[str, GatewayServices] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        quiet_dropped_cluster_nodes(asyncio.get_running_loop())
        client = create_client(settings.redis_url)
        await _connect(settings, client)
        # One outage log for the reaper, the lease renewer and the subscriber: an outage is
        # told once per process, not once per loop and retry.
        outages = OutageLog(_log, redis_address(settings.redis_url))
        subscriber = Subscriber(client, outages=outages)
        await subscriber.start()
        # The input batches are a call per relayed chunk: on the store's own connection.
        scripts = Scripts(client, own_connection=True)
        services = GatewayServices(settings, client, scripts, subscriber, metrics)
        state["services"] = services
        reaper = asyncio.create_task(run_reaper(
            client, services.scripts, metrics, settings.reaper_interval_s,
            lease_ms=services.holder.lease_ms, outages=outages,
            share=ReaperShare(services.holder.gateway_id, settings.reapers_per_worker)))
        leases = asyncio.create_task(services.leases.run())
        lag = asyncio.create_task(watch_loop_lag(metrics.event_loop_lag_seconds.observe))
        try:
            yield
        finally:
            services.draining = True
            for task in (reaper, leases, lag):
                task.cancel()
            await asyncio.gather(reaper, leases, lag, return_exceptions=True)
            # Best effort: a gateway that cannot unlist itself lapses from the directory.
            with contextlib.suppress(StoreError, OSError, TimeoutError):
                async with asyncio.timeout(1.0):
                    await unlist_gateway(client, services.holder.gateway_id)
            await services.batcher.aclose()
            await subscriber.aclose()
            await scripts.aclose()
            await client.aclose()

    async def realtime(websocket: WebSocket) -> None:
        services = state["services"]
        if services.draining:
            await websocket.close(CloseCode.TRY_AGAIN_LATER)
            return
        admitted = await _admit(settings, services, websocket)
        if admitted is None:
            return
        caller, handshake = admitted
        offered = websocket.scope.get("subprotocols", [])
        await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)
        # ?resume=1 or ?autostart=0: the URL's model opens nothing before the first client
        # event (a resume's session has its own model; a session.update may name one).
        driver = ConnectionDriver(websocket, services, url_model=handshake.model,
                                  tenant=caller.tenant, initial_session=caller.initial_session,
                                  handshake=handshake)
        metrics.connections.inc()
        started = time.monotonic()
        try:
            await driver.run()
        finally:
            metrics.connections.dec()
            metrics.connection_seconds.observe(time.monotonic() - started)

    async def client_secrets(request: Request) -> Response:
        services = state["services"]
        if services.draining:
            return error_response(503, "internal_error", "This gateway is draining; try"
                                  " another.", error_type="server_error")
        return await mint_client_secret(request, settings, services.client)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        return await _readiness(state.get("services"), request)

    async def metrics_endpoint(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            WebSocketRoute("/v1/realtime", realtime),
            WebSocketRoute(DUPLEX_PATH, realtime),  # the seed's alias of ?duplex=1
            Route("/v1/realtime/client_secrets", client_secrets, methods=["POST"]),
            *_model_routes(settings, state),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics_endpoint),
            *(web_page_routes() if settings.web_page else []),
        ],
        lifespan=lifespan,
    )
