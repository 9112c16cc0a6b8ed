"""Placing a new session on a worker (DESIGN §2.1).

Optimistic: read the directory and the workers' loads, then try the least loaded worker with
one compare-and-set script in that worker's slot; on refusal try the next. An open whose
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

from gateway.protocol.codec import public_session
from gateway.protocol.errors import ClientProtocolError, CloseCode, ErrorCode
from gateway.services import GatewayServices
from store import Lease, OpenStatus, SessionPolicy, StoreError, StoreUnavailable
from store.directory import WorkerProfile, list_workers, server_time_ms, worker_loads
from store.keys import new_session_id
from store.messages import JsonObject

__all__ = ["Placement", "place_session", "policy_of"]

# tenant_sessions_per_minute counts opens in any window this long.
_OPEN_RATE_WINDOW_MS = 60_000


def policy_of(services: GatewayServices) -> SessionPolicy:
    """The per-session limits this gateway writes into new records."""
    s = services.settings
    return SessionPolicy(
        disconnect_grace_ms=int(s.disconnect_grace_s * 1000),
        idle_ttl_ms=int(s.idle_ttl_s * 1000),
        output_log_max_entries=s.output_log_max_entries,
        input_log_max_entries=s.input_log_max_entries,
        closed_retention_ms=int(s.closed_retention_s * 1000),
    )


def _exhausted(why: str = "no inference worker has a free slot") -> ClientProtocolError:
    return ClientProtocolError(
        ErrorCode.RESOURCE_EXHAUSTED, f"{why}; retry later", close_code=CloseCode.TRY_AGAIN_LATER,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """A session that landed, and what its ``session.created`` announces.

    Attributes:
        lease: its first lease.
        session: the public session object stored in its record: the worker's default
            session with its ``id`` and ``object`` and the connection's ``model``; None when
            the worker published no profile (an older worker, during a rolling upgrade).
        capabilities: what sessions on that worker can do (None: no profile).
    """

    lease: Lease
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
    """Open a session on the least loaded live worker.

    ``subscribe`` is called with the session id before the open lands, so not even the
    session's first event can be published before this gateway listens. ``model`` is what
    the session object reports as its ``model`` (None: the worker's own).

    Raises:
        ClientProtocolError: ``resource_exhausted`` (close 1013) when no worker accepted.
        StoreError: Redis failed.
    """
    client, scripts = services.client, services.scripts
    await _count_open(services, tenant)
    now_ms = await server_time_ms(client)
    candidates = await worker_loads(client, await list_workers(client, now_ms))
    policy = policy_of(services)
    epoch = secrets.token_hex(8)
    for load in candidates:
        if load.state != "live" or load.free == 0:
            continue
        session_id = new_session_id(load.worker_id)
        cap = services.settings.tenant_max_sessions
        # Reserve-then-confirm (DESIGN §2.1): the tenant count lives in another hash slot than
        # the worker, so it is reserved first and released again if the open does not land.
        if cap and not await scripts.reserve_tenant_slot(
                tenant, session_id, cap=cap, lease_ms=services.tenant_lease_ms):
            raise _exhausted(f"the tenant's limit of {cap} concurrent sessions is reached")
        await subscribe(session_id)
        session = _announced(load.profile, session_id, model)
        capabilities = load.profile.capabilities if load.profile is not None else None
        try:
            status = await asyncio.wait_for(
                scripts.open_session(session_id, epoch=epoch, token_digest=token_digest,
                                     tenant=tenant, policy=policy, holder=services.holder,
                                     session=session, capabilities=capabilities),
                services.settings.open_timeout_s)
        except (TimeoutError, StoreError) as exc:
            await _abandon(services, session_id)
            await _release(services, tenant, session_id)
            raise StoreUnavailable(f"open of {session_id} did not complete: {exc!r}") from exc
        if status is OpenStatus.OK:
            lease = Lease(session_id=session_id, epoch=epoch, generation=1, tenant=tenant)
            return Placement(lease=lease, session=session, capabilities=capabilities)
        await _release(services, tenant, session_id)
    raise _exhausted()


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

