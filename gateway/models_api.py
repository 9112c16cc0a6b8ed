"""``GET /v1/models`` (OpenAI's model list) and the per-model detail of ``/readyz``.

Both read the fleet as it is now (:func:`store.directory.fleet_models`): the model names that
live workers serve. ``/v1/models`` answers in OpenAI's shape, so ``client.models.list()`` of the
openai SDK works, with each model's ``capabilities`` (what its sessions can do, as
``session.created`` carries them) and ``root`` (vLLM's field: the worker's own name an alias
stands for). It asks for the same key as a websocket.

Readiness stays as cheap as before unless asked for more: ``/readyz?model=NAME`` is 200 only
while NAME has a live worker, and ``/readyz?detail=1`` answers JSON with every model's workers
and slots.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from contract.models import is_model_name
from gateway.auth import error_response, identify
from gateway.settings import GatewaySettings
from store.client import RedisClient
from store.directory import ModelFleet, fleet_models
from store.errors import StoreError

__all__ = ["OWNED_BY", "list_models", "model_readiness", "render_model", "retrieve_model"]

#: ``owned_by`` of every model the gateway lists.
OWNED_BY = "duplex-gateway"


def render_model(model: ModelFleet) -> dict[str, Any]:
    """One model as OpenAI's ``Model`` object, plus ``root`` and ``capabilities``."""
    rendered: dict[str, Any] = {"id": model.name, "object": "model",
                                "created": model.since_ms // 1000, "owned_by": OWNED_BY,
                                "root": model.root}
    if model.capabilities is not None:
        rendered["capabilities"] = model.capabilities
    return rendered


def _unavailable() -> Response:
    return error_response(503, "internal_error", "Could not read the workers; try again.",
                          error_type="server_error")


async def _fleet(settings: GatewaySettings, client: RedisClient,
                 request: Request) -> Mapping[str, ModelFleet] | Response:
    """The fleet's models, or the HTTP answer that refuses the caller (401) or says Redis
    did not answer (503)."""
    caller = await identify(settings, client, request)
    if isinstance(caller, Response):
        return caller
    try:
        return await fleet_models(client)
    except StoreError:
        return _unavailable()


async def list_models(request: Request, settings: GatewaySettings,
                      client: RedisClient) -> Response:
    """``GET /v1/models``: ``{"object": "list", "data": [Model, ...]}``, sorted by id."""
    fleet = await _fleet(settings, client, request)
    if isinstance(fleet, Response):
        return fleet
    return JSONResponse({"object": "list",
                         "data": [render_model(model) for model in fleet.values()]})


async def retrieve_model(request: Request, settings: GatewaySettings,
                         client: RedisClient) -> Response:
    """``GET /v1/models/{model}``: the Model, or 404 ``model_not_found`` as OpenAI answers."""
    fleet = await _fleet(settings, client, request)
    if isinstance(fleet, Response):
        return fleet
    name = request.path_params["model"]
    model = fleet.get(name)
    if model is None:
        asked = f"The model {name!r}" if is_model_name(name) else "The model asked for"
        return error_response(404, "model_not_found", f"{asked} is not served here.",
                              param="model")
    return JSONResponse(render_model(model))


async def model_readiness(request: Request, client: RedisClient) -> Response:
    """``/readyz?model=NAME`` (200 while NAME has a live worker) or ``/readyz?detail=1``
    (every model's workers and slots as JSON; 200 while any model has a live worker)."""
    try:
        fleet = await fleet_models(client)
    except Exception:  # any failure to reach Redis means not ready
        return PlainTextResponse("redis unreachable", status_code=503)
    name = request.query_params.get("model")
    if name is not None:
        if name in fleet:
            return PlainTextResponse("ready")
        return PlainTextResponse("the model has no live worker", status_code=503)
    detail = {model.name: {"workers": model.workers, "admitting": model.admitting,
                           "slots": model.slots, "used": model.used, "free": model.free}
              for model in fleet.values()}
    return JSONResponse({"ready": bool(fleet), "models": detail},
                        status_code=200 if fleet else 503)
