"""Placing a new session on a worker of its model (DESIGN §2.1).

The model is the one the client named (``?model=``, or its first ``session.update``), else the
gateway's ``DEFAULT_MODEL``, else any: a name that no worker serves is refused
``model_not_found``, never placed on another model. Optimistic: read the directory and the
workers' loads, then try the least loaded worker serving the model with one compare-and-set
script in that worker's slot (which checks again that the worker serves it); on refusal try
the next. An open whose
outcome is unknown (timeout, connection error) is compensated with ``abandon_open`` so a late
landing cannot leak a slot (DESIGN §2.10).

The chosen worker's profile (the default session and capabilities it published when it
registered) is what ``session.created`` announces; the open stores it in the session's record
in the same script call, so a resume through any gateway can announce it too.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from contract.messages import JsonObject
from contract.models import is_model_name
from gateway.protocol.errors import ClientProtocolError, CloseCode, ErrorCode
from gateway.protocol.render import public_session
from gateway.services import GatewayServices
from gateway.settings import GatewaySettings
from store import Lease, OpenStatus, SessionPolicy, StoreError, StoreUnavailable
from store.directory import (
    WorkerLoad,
    WorkerProfile,
    list_workers,
    server_time_ms,
    worker_loads,
)
from store.keys import new_session_id

__all__ = ["Placement", "place_session", "policy_of", "session_policy"]

# tenant_sessions_per_minute counts opens in any window this long.
_OPEN_RATE_WINDOW_MS = 60_000


def policy_of(services: GatewayServices) -> SessionPolicy:
    """The per-session limits this gateway writes into new records."""
    return session_policy(services.settings)


def session_policy(s: GatewaySettings) -> SessionPolicy:
    """The per-session limits ``s`` sets (the one home of their defaults)."""
    return SessionPolicy(
        disconnect_grace_ms=int(s.disconnect_grace_s * 1000),
        idle_ttl_ms=int(s.idle_ttl_s * 1000),
        output_log_max_entries=s.output_log_max_entries,
        input_log_max_entries=s.input_log_max_entries,
        input_log_max_bytes=s.input_log_max_bytes,
        closed_retention_ms=int(s.closed_retention_s * 1000),
    )


def _exhausted(why: str) -> ClientProtocolError:
    return ClientProtocolError(
        ErrorCode.RESOURCE_EXHAUSTED, f"{why}; retry later", close_code=CloseCode.TRY_AGAIN_LATER,
    )


def _no_room(model: str | None) -> ClientProtocolError:
    if model is None:
        return _exhausted("no inference worker has a free slot")
    return _exhausted(f"no inference worker serving model {model!r} has a free slot")


def _not_served(model: str, loads: list[WorkerLoad]) -> ClientProtocolError:
    served = sorted({name for load in loads for name in load.models})
    # A name no worker could serve is not quoted back: it is the client's text, of any size.
    asked = f"The model {model!r}" if is_model_name(model) else "The model asked for"
    return ClientProtocolError(
        ErrorCode.MODEL_NOT_FOUND, f"{asked} is not served here; served: {', '.join(served)}",
        param="model", close_code=CloseCode.POLICY_VIOLATION)


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """A session that landed, and what its ``session.created`` announces.

    Attributes:
        lease: its first lease.
        model: the session's model name: the one asked for, else its worker's own (None: a
            worker that publishes no names).
        session: the public session object stored in its record: the worker's default
            session with its ``id``, ``object`` and ``model``; None when the worker published
            no profile.
        capabilities: what sessions on that worker can do (None: no profile).
    """

    lease: Lease
    model: str | None = None
    session: JsonObject | None = None
    capabilities: JsonObject | None = None


def _announced(profile: WorkerProfile | None, session_id: str,
               model: str | None) -> JsonObject | None:
    """The session object a new session on a worker with ``profile`` starts with, as the
    client is shown it: the worker's, with the model the connection asked for."""
    if profile is None:
        return None
    session = profile.session if model is None else {**profile.session, "model": model}
    return public_session(session, session_id=session_id)


async def place_session(
    services: GatewayServices, *, token_digest: str, tenant: str,
    subscribe: Callable[[str], Awaitable[None]], model: str | None = None,
) -> Placement:
    """Open a session on the least loaded live worker serving ``model`` (None: the
    deployment's default model, else any worker).

    ``subscribe`` is called with the session id before the open lands, so not even the
    session's first event can be published before this gateway listens.

    Raises:
        ClientProtocolError: ``model_not_found`` (close 1008) when workers are listed but
            none serves the model; ``resource_exhausted`` (close 1013) when none serving it
            accepted; ``rate_limit_exceeded`` (1013) over the tenant's open rate.
        StoreError: Redis failed.
    """
    client, scripts = services.client, services.scripts
    wanted = model or services.settings.default_model or None
    now_ms = await server_time_ms(client)
    candidates = await worker_loads(client, await list_workers(client, now_ms))
    if wanted is not None and candidates:
        # With no worker listed at all the fleet is starting or down: that is no room, not
        # an unknown name.
        serving = [load for load in candidates if wanted in load.models]
        if not serving:
            raise _not_served(wanted, candidates)
        candidates = serving
    await _count_open(services, tenant)
    policy = policy_of(services)
    epoch = secrets.token_hex(8)
    for load in candidates:
        if load.state != "live" or load.free == 0:
            continue
        name = wanted or (load.models[0] if load.models else None)
        session_id = new_session_id(load.worker_id)
        cap = services.settings.tenant_max_sessions
        # Reserve-then-confirm (DESIGN §2.1): the tenant count lives in another hash slot than
        # the worker, so it is reserved first and released again if the open does not land.
        if cap and not await scripts.reserve_tenant_slot(
                tenant, session_id, cap=cap, lease_ms=services.tenant_lease_ms):
            raise _exhausted(f"the tenant's limit of {cap} concurrent sessions is reached")
        await subscribe(session_id)
        session = _announced(load.profile, session_id, name)
        capabilities = load.profile.capabilities if load.profile is not None else None
        try:
            status = await asyncio.wait_for(
                scripts.open_session(session_id, epoch=epoch, token_digest=token_digest,
                                     tenant=tenant, policy=policy, holder=services.holder,
                                     session=session, capabilities=capabilities, model=wanted),
                services.settings.open_timeout_s)
        except (TimeoutError, StoreError) as exc:
            await _abandon(services, session_id)
            await _release(services, tenant, session_id)
            raise StoreUnavailable(f"open of {session_id} did not complete: {exc!r}") from exc
        if status is OpenStatus.OK:
            lease = Lease(session_id=session_id, epoch=epoch, generation=1, tenant=tenant)
            return Placement(lease=lease, model=name, session=session,
                             capabilities=capabilities)
        await _release(services, tenant, session_id)
    raise _no_room(wanted)


async def _count_open(services: GatewayServices, tenant: str) -> None:
    """Count this open against the tenant's new-sessions-per-minute limit, or refuse it."""
    limit = services.settings.tenant_sessions_per_minute
    if not limit:
        return
    wait_ms = await services.scripts.count_tenant_open(tenant, limit=limit,
                                                       window_ms=_OPEN_RATE_WINDOW_MS)
    if wait_ms:
        raise ClientProtocolError(
            ErrorCode.RATE_LIMIT_EXCEEDED,
            f"the tenant's limit of {limit} new sessions per minute is reached; retry in"
            f" {wait_ms / 1000:.1f} s", close_code=CloseCode.TRY_AGAIN_LATER)


async def _release(services: GatewayServices, tenant: str, session_id: str) -> None:
    if not services.settings.tenant_max_sessions:
        return
    try:
        await services.scripts.release_tenant_slot(tenant, session_id)
    except StoreError:
        pass  # the reservation's lease runs out on its own


async def _abandon(services: GatewayServices, session_id: str) -> None:
    try:
        await services.scripts.abandon_open(session_id)
    except StoreError:
        # Redis is unreachable: the open cannot land either while it is down; if it landed
        # before, the idle TTL (no client ever attached input) reaps the session.
        pass

