"""Typed async wrappers around the Lua scripts: the only code that calls them.

Each wrapper builds the keys from ``store/keys.py``, runs the script once (EVALSHA with a
NOSCRIPT fallback), and turns its small answer into a typed value of ``store/answers.py`` or
one of ``store/errors.py``'s exceptions. The scripts go through redis-py's ``AsyncScript``, or with
``own_connection`` over the store's own pipelined connections (``store/*_lane.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import (
    ClusterError,
    ConnectionError as RedisConnectionError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    TimeoutError as RedisTimeoutError,
    TryAgainError,
)

from contract.messages import JsonObject, SessionClosed, encode_message
from contract.models import encode_models
from contract.reasons import CloseReason
from store import lua
from store.answers import (
    DEFAULT_ATTACHMENT_LEASE_MS,
    AbandonStatus,
    AppendResult,
    AttachmentHolder,
    CloseStatus,
    DetachStatus,
    EndedSession,
    Lease,
    OpenStatus,
    OutputAppend,
    Reaped,
    ResumeResult,
    ResumeStatus,
    SessionPolicy,
    TenantStatus,
    TrimStatus,
    WorkerBeat,
    WorkerState,
    json_argument,
    reply_text,
)
from store.census import NO_ENGINE, TickTime, encode_tick
from store.checkpoints import (
    Adoption,
    CheckpointStatus,
    CheckpointWrite,
    ReserveStatus,
    adopt_session,
    write_checkpoints,
)
from store.client import REDIS_ERRORS
from store.cluster_lane import ClusterLane
from store.directory import WorkerProfile
from store.errors import (
    LeaseLost,
    OutputMismatch,
    SessionGone,
    StoreError,
    StoreUnavailable,
    WorkerFenced,
    raise_if_cancelled,
)
from store.housekeeping import LeaseRenewal, OutputTrim, lease_call
from store.input_appends import OPENED_HELD, InputWriters, append_input
from store.keys import (
    GATEWAY_DIRECTORY,
    SessionKeys,
    WorkerKeys,
    tenant_opens,
    tenant_sessions,
)
from store.output_appends import append_output
from store.reaping import ReplaceSessions, reap
from store.resp import endpoint_of
from store.script_lane import ScriptLane

__all__ = [
    "DEFAULT_REAP_OUTAGE_MS",
    "RESUME_RETRY_WINDOW_MS",
    "Scripts",
]


#: The gap between reaps of one worker that counts as an outage of its slot, unless told
#: otherwise: two of the default reaper's passes (0.25 s apart).
DEFAULT_REAP_OUTAGE_MS = 500


def _holder_args(holder: AttachmentHolder | None) -> tuple[str, int]:
    return ("", 0) if holder is None else (holder.gateway_id, holder.lease_ms)


#: How long after a resume landed a retry of it (same control id, the token it rotated from)
#: is still accepted: long enough for a client to reconnect through another gateway.
RESUME_RETRY_WINDOW_MS = 60_000


#: Pauses before each resend of a script after a transient error; then the error stands.
RESEND_BACKOFF_S = (0.01, 0.05, 0.25)

#: Errors after which a script is sent again: the connection failed, or the Cluster was moving
#: (CLUSTERDOWN or MASTERDOWN in a failover, TRYAGAIN while a slot is half migrated, "TTL
#: exhausted" after too many redirections, a slot no known node covers yet) or the node had just
#: been demoted (READONLY). All of them mean the script did not run or may be resent: every
#: script is safe to resend (``store/lua/``).
_TRANSIENT_ERRORS = (RedisConnectionError, RedisTimeoutError, ClusterError, TryAgainError,
                     ReadOnlyError, RedisClusterException)


# Call ids: unique per process (64 random bits, drawn again in a forked child) and per call (a
# counter): no syscall per call, unlike a fresh random token, on the gateway's hottest path.
_call_prefix = secrets.token_hex(8)
_call_counter = itertools.count()


def _new_call_prefix() -> None:
    global _call_prefix
    _call_prefix = secrets.token_hex(8)


os.register_at_fork(after_in_child=_new_call_prefix)


def _new_call_id() -> str:
    return f"{_call_prefix}.{next(_call_counter):x}"


def _json_object(value: Any) -> JsonObject | None:
    """A JSON object a script returned (None for '' or anything that is not one: only our
    scripts write these fields, so a bad one is treated as absent, never trusted)."""
    if not value:
        return None
    try:
        decoded = json.loads(value)
    except ValueError:
        return None
    return decoded if isinstance(decoded, dict) else None


class Scripts:
    """Every script, registered once per client.

    ``own_connection``: send the scripts over pipelined connections of the store's own
    instead of redis-py's pool (``store/script_lane.py``: less client CPU per call), one per
    Cluster node (``store/cluster_lane.py``). Call :meth:`aclose` when done.
    """

    def __init__(self, client: Redis | RedisCluster, *, own_connection: bool = False) -> None:
        self._client = client
        self._lane: ScriptLane | ClusterLane | None = None
        self._writers = InputWriters()
        if own_connection:
            self._lane = (ClusterLane(client) if isinstance(client, RedisCluster)
                          else ScriptLane(lambda: endpoint_of(client)))

        def register(source: str) -> AsyncScript:
            return client.register_script(source)

        self._open = register(lua.OPEN_SESSION)
        self._resume = register(lua.RESUME)
        self._detach = register(lua.DETACH)
        self._append_input = register(lua.APPEND_INPUT)
        self._append_output = register(lua.APPEND_OUTPUT)
        self._flush_output = register(lua.FLUSH_OUTPUT)
        self._close = register(lua.CLOSE_SESSION)
        self._abandon = register(lua.ABANDON_OPEN)
        self._reap = register(lua.REAP)
        self._reap_sessions = register(lua.REAP_SESSIONS)
        self._heartbeat = register(lua.WORKER_HEARTBEAT)
        self._tenant = register(lua.TENANT_RESERVE)
        self._tenant_opens = register(lua.TENANT_OPEN_RATE)
        self._gateway_lease = register(lua.GATEWAY_LEASE)
        self._gateway_announce = register(lua.GATEWAY_ANNOUNCE)
        self._write_checkpoint = register(lua.WRITE_CHECKPOINT)
        self._adopt = register(lua.ADOPT_SESSION)
        self._reserve_slot = register(lua.RESERVE_SLOT)
        self._release_slot = register(lua.RELEASE_SLOT)

    async def _run(self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any], *,
                   resent: Callable[[], Sequence[Any]] | None = None) -> Any:
        """Run ``script``, sending it again after a transient error (:data:`_TRANSIENT_ERRORS`).
        A pooled connection that went stale (a Redis restart, an idle cut) then costs a
        reconnect, and a Cluster failover or resharding a pause, not a failed call.
        ``resent``: the arguments of a resend, when they differ from the first send's."""
        for pause in (*RESEND_BACKOFF_S, None):
            try:
                answer = await self._call(script, keys, args)
            except _TRANSIENT_ERRORS as exc:
                raise_if_cancelled()
                if pause is None:
                    raise StoreUnavailable(f"script failed: {exc}") from exc
                await asyncio.sleep(pause)
                if resent is not None:
                    args = resent()
                continue
            except REDIS_ERRORS as exc:
                raise_if_cancelled()
                raise StoreUnavailable(f"script failed: {exc}") from exc
            if self._lane is None:  # the lane checks once, where it runs redis-py
                raise_if_cancelled()
            return answer
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        """Close the store's own connection, if any (the client is its owner's to close)."""
        if self._lane is not None:
            await self._lane.aclose()

    async def _call(self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if self._lane is not None:
            source = script.script
            return await self._lane.evalsha(
                script.sha, source if isinstance(source, str | bytes) else bytes(source), keys,
                args)
        try:
            return await script(keys=list(keys), args=list(args))
        except (AttributeError, TypeError) as exc:
            # redis-py lets a connection closed under a command (a disconnect racing its
            # connect or write: a Cluster failover closes every node's connections) escape
            # as these instead of its ConnectionError (redis-py issues 3546, 4287). The
            # arguments were built and checked above, so here they can only be that race:
            # resend it, as any broken connection.
            raise RedisConnectionError(f"redis-py's connection closed mid-command: {exc!r}"
                                       ) from exc
        except NoScriptError:
            # EVALSHA missed and redis-py's SCRIPT LOAD went elsewhere: on a Cluster, to the
            # primaries of a slot map from before a failover, not to the promoted replica that
            # now serves the keys. EVAL carries the source to whichever node serves them.
            return await self._client.eval(script.script, len(keys), *keys, *args)  # type: ignore[arg-type]

    async def open_session(
        self, session_id: str, *, epoch: str, token_digest: str, tenant: str,
        policy: SessionPolicy, holder: AttachmentHolder | None = None,
        session: JsonObject | None = None, capabilities: JsonObject | None = None,
        model: str | None = None,
    ) -> OpenStatus:
        """Place ``session_id`` on the worker named in its id (one CAS in the worker's slot),
        attached under ``holder``'s lease (None: no lease, for callers serving no client).

        ``session`` and ``capabilities`` (from the worker's profile) are stored in the record
        for resumes to announce; None stores none. ``model``: the name the session asks for,
        which the worker must serve (None: any worker).
        """
        k = SessionKeys(session_id)
        w = k.worker
        gateway_id, lease_ms = _holder_args(holder)
        answer = await self._run(
            self._open,
            [w.record, w.sessions, w.deadlines, k.record, k.abandoned, w.input_channel,
             w.gateways, w.held, k.input_log, k.output_log],
            [session_id, epoch, token_digest, tenant, policy.disconnect_grace_ms,
             policy.idle_ttl_ms, policy.output_log_max_entries, policy.closed_retention_ms,
             gateway_id, lease_ms, json_argument(session), json_argument(capabilities),
             model or "", policy.input_log_max_entries, policy.input_log_max_bytes],
        )
        status = OpenStatus(reply_text(answer[0]))
        if status is OpenStatus.OK:
            self._writers.attached(session_id, 1, index=0, client_seq=0, biggest=0,
                                   held=OPENED_HELD)
        return status

    async def resume(
        self, session_id: str, *, tenant: str, presented_digest: str, new_digest: str,
        control_id: str, holder: AttachmentHolder | None = None, attempt: int = 0,
    ) -> ResumeResult:
        """Bump the generation if the presented token is right.

        A retry of a resume that landed (same ``control_id``, presenting the token it rotated
        from, ``new_digest`` the one it rotated to) within :data:`RESUME_RETRY_WINDOW_MS` is
        accepted too, and keeps the token it rotated to, unless its ``attempt`` number (the
        client's count of its tries of this resume; 0: not counted) is below the one that
        landed: that copy is ``STALE``. Another tenant's session is ``UNKNOWN``, whatever
        token is presented (no oracle). Only an ``OK`` or ``CLOSED`` answer carries the
        session object and capabilities.
        """
        k = SessionKeys(session_id)
        gateway_id, lease_ms = _holder_args(holder)
        answer = await self._run(
            self._resume,
            [k.record, k.worker.deadlines, k.output_channel, k.output_log, k.worker.gateways,
             k.worker.held, k.input_log, k.worker.input_channel],
            [presented_digest, new_digest, control_id, session_id, tenant,
             RESUME_RETRY_WINDOW_MS, _new_call_id(), gateway_id, lease_ms, attempt],
        )
        status = ResumeStatus(reply_text(answer[0]))
        lease = None
        if status in (ResumeStatus.OK, ResumeStatus.CLOSED):
            lease = Lease(session_id=session_id, epoch=reply_text(answer[2]),
                          generation=int(answer[1]), tenant=tenant)
            self._writers.attached(session_id, lease.generation, index=int(answer[8]),
                                   client_seq=int(answer[3]), biggest=int(answer[9]))
        return ResumeResult(
            status=status, lease=lease, last_client_seq=int(answer[3]),
            last_server_event_seq=int(answer[4]), first_retained_seq=int(answer[5]),
            session=_json_object(answer[6]), capabilities=_json_object(answer[7]),
        )

    async def detach(self, lease: Lease, *, grace_ms: int = 0) -> DetachStatus:
        """Start the disconnect grace, fenced on ``lease``: ``grace_ms`` long (0: the session's
        own)."""
        k = SessionKeys(lease.session_id)
        answer = await self._run(
            self._detach, [k.record, k.worker.deadlines, k.worker.held, k.input_log,
                           k.worker.input_channel],
            [lease.session_id, lease.epoch, lease.generation, lease.tenant, grace_ms],
        )
        self._writers.forget(lease.session_id)
        return DetachStatus(reply_text(answer))

    async def append_input(
        self, lease: Lease, entries: Sequence[tuple[int | None, bytes]], *, max_entries: int,
        max_bytes: int = 0,
    ) -> AppendResult:
        """Fenced append of encoded commands, each with its optional client seq, refused as a
        whole (``backlog_full``) when they would take the session's unread input past
        ``max_entries`` commands or ``max_bytes`` bytes of Redis memory (0: no byte bound).

        Raises:
            LeaseLost: a newer attach holds the session.
            SessionGone: the session is closed or unknown.
        """
        (outcome,) = await self.append_input_many([(lease, entries)], max_entries=max_entries,
                                                  max_bytes=max_bytes)
        if isinstance(outcome, StoreError):
            raise outcome
        return outcome

    async def append_input_many(
        self, batch: Sequence[tuple[Lease, Sequence[tuple[int | None, bytes]]]], *,
        max_entries: int, max_bytes: int = 0,
    ) -> list[AppendResult | LeaseLost | SessionGone]:
        """One call for several sessions of ONE worker (one hash slot): the input script,
        or for a pulling worker's sessions on the store's own connections a ``MULTI`` of
        plain ``XADD``s (``store/input_appends.py``).

        Returns, per session in order, its result or the error it would raise alone. A
        session whose unread input would pass ``max_entries`` commands or ``max_bytes``
        bytes (its input log's Redis memory with the new commands; 0: no byte bound) appends
        none of its entries (``backlog_full``); the others append theirs.
        """
        # The call id tells a resend of this very call (a lost reply) that its first run
        # landed; a resend reads each log's end (see store/input_appends.py).
        return await append_input(
            self._writers, self._lane, lambda keys, args, resent: self._run(
                self._append_input, keys, args, resent=resent),
            batch, _new_call_id(), max_entries=max_entries, max_bytes=max_bytes)

    async def trim_output(self, lease: Lease, acknowledged_seq: int) -> TrimStatus:
        """Drop output entries up to ``acknowledged_seq``, fenced on ``lease`` (``AHEAD``:
        nothing trimmed): a lease call renewing no lease (a gateway's ride its renewals)."""
        trim = OutputTrim(lease, acknowledged_seq)
        return (await self.renew_attachment_lease(trim.worker_id, None, trims=[trim])).trims[0]

    async def reserve_tenant_slot(self, tenant_id: str, session_id: str, *, cap: int,
                                  lease_ms: int) -> bool:
        """Count ``session_id`` against ``tenant_id``'s cap; False when the tenant is full."""
        answer = await self._run(self._tenant, [tenant_sessions(tenant_id)],
                                 ["reserve", cap, lease_ms, session_id])
        return TenantStatus(reply_text(answer)) is TenantStatus.OK

    async def renew_tenant_slots(self, tenant_id: str, session_ids: Sequence[str], *,
                                 lease_ms: int) -> list[bool]:
        """Keep served sessions counted for ``lease_ms`` more, in one call; per session, False
        when its place was released already (it ended): a renewal never takes a place back."""
        answer = await self._run(self._tenant, [tenant_sessions(tenant_id)],
                                 ["renew", 0, lease_ms, *session_ids])
        return [TenantStatus(reply_text(status)) is TenantStatus.OK for status in answer]

    async def release_tenant_slot(self, tenant_id: str, session_id: str) -> None:
        """Stop counting a session (it ended, or its open did not land)."""
        await self.release_tenant_slots([EndedSession(tenant=tenant_id, session_id=session_id)])

    async def release_tenant_slots(self, ended: Sequence[EndedSession]) -> None:
        """Stop counting sessions that ended, in one pipeline (split by node on a Cluster).
        Releasing twice is harmless: a place is a set member."""
        if not ended:
            return
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for item in ended:
                    pipe.zrem(tenant_sessions(item.tenant), item.session_id)
                await pipe.execute()
        except REDIS_ERRORS as exc:
            raise_if_cancelled()
            raise StoreUnavailable(f"ZREM tenant failed: {exc}") from exc

    async def count_tenant_open(self, tenant_id: str, *, limit: int, window_ms: int) -> int:
        """Count one new session of ``tenant_id`` against ``limit`` opens per sliding window.

        Returns 0 when the open may go ahead (it is counted), else the milliseconds until one
        would be allowed (nothing is counted).
        """
        answer = await self._run(self._tenant_opens, [tenant_opens(tenant_id)],
                                 [limit, window_ms, _new_call_id()])
        return int(answer)

    def _close_keys(self, session_id: str) -> list[str]:
        k = SessionKeys(session_id)
        return [k.record, k.input_log, k.output_log, k.output_channel, *k.worker.ending]

    async def append_output(
        self, session_id: str, payloads: Sequence[bytes], *, first_seq: int = 0,
        close_reason: str | None = None, owner_epoch: int = 1,
    ) -> int:
        """A worker's fenced append of encoded events; returns the first seq (0 if none).

        ``first_seq`` numbers the events (see :class:`OutputAppend`); 0 appends them after
        whatever the log holds, which a resend would duplicate. With ``close_reason`` the
        session then ends with ``session.closed`` (exactly once).

        Raises:
            WorkerFenced: the worker was declared lost.
            SessionGone: the session is closed, unknown or served under another owner epoch
                than ``owner_epoch``.
            OutputMismatch: ``first_seq`` disagrees with the log.
        """
        (outcome,) = await self.append_output_many([OutputAppend(
            session_id=session_id, events=payloads, first_seq=first_seq,
            close_reason=close_reason, owner_epoch=owner_epoch)])
        if isinstance(outcome, StoreError):
            raise outcome
        return outcome

    async def append_output_many(
        self, batch: Sequence[OutputAppend]
    ) -> list[int | SessionGone | OutputMismatch]:
        """One call per home for several sessions a worker writes (two when some go the fast
        way and are refused there: ``store/output_appends.py``).

        Returns per session its first seq (0 if it had no events) or its error; each
        session's input log is trimmed to its ``input_trim_to``.

        Raises:
            WorkerFenced: the worker was declared lost (nothing was written).
        """
        lane, routes, fast = self._lane, self.route_changes, None
        if lane is not None and routes is not None:
            sha, source = self._flush_output.sha, lua.FLUSH_OUTPUT

            def fast(keys: Sequence[str], args: Sequence[Any]) -> Awaitable[Any]:
                # Sent once, and only on the connections the log ends were learnt on: on a
                # new one (a failover may have lost what was answered) it is not sent.
                return lane.evalsha(sha, source, keys, args, route=routes)
        return await append_output(
            batch, careful=lambda keys, args: self._run(self._append_output, keys, args),
            fast=fast, route_changes=routes)

    async def write_checkpoints(self, batch: Sequence[CheckpointWrite],
                                ) -> list[CheckpointStatus]:
        """Record where sessions of one home stand (``store/checkpoints.py``)."""
        return await write_checkpoints(
            lambda keys, args: self._run(self._write_checkpoint, keys, args), batch)

    async def adopt_session(self, session_id: str, *, replaces_epoch: int, adopter: str,
                            checkpoint_seq: int | None = None) -> Adoption:
        """Take a session over from its checkpoint (``store/checkpoints.py``)."""
        return await adopt_session(
            lambda keys, args: self._run(self._adopt, keys, args), session_id,
            replaces_epoch=replaces_epoch, adopter=adopter, checkpoint_seq=checkpoint_seq)

    async def reserve_slot(self, worker_id: str, session_id: str, *,
                           model: str = "") -> ReserveStatus:
        """Reserve a slot on ``worker_id`` for ``session_id``, homed elsewhere, which it is
        about to take over, served as ``model`` ('' any)."""
        w = WorkerKeys(worker_id)
        answer = await self._run(self._reserve_slot, [w.record, w.adopted], [session_id, model])
        return ReserveStatus(reply_text(answer))

    async def release_slot(self, worker_id: str, session_id: str) -> bool:
        """Let go of ``worker_id``'s slot for ``session_id`` (whether it held one)."""
        w = WorkerKeys(worker_id)
        return bool(await self._run(self._release_slot, [w.record, w.adopted], [session_id]))

    @property
    def route_changes(self) -> int | None:
        """How many connections the store's own connections made and redirections they
        followed (``OutputAppend.top_known_at``); None without them (redis-py's pool
        reconnects unseen)."""
        return None if self._lane is None else self._lane.route_changes

    async def close_session(self, session_id: str, reason: CloseReason) -> CloseStatus:
        """End a session with ``session.closed`` unless it already ended. Idempotent."""
        terminal = encode_message(SessionClosed(reason=reason))
        answer = await self._run(
            self._close, self._close_keys(session_id), [session_id, terminal, reason]
        )
        return CloseStatus(reply_text(answer))

    async def abandon_open(self, session_id: str, *,
                           tombstone_ttl_ms: int = 600_000) -> AbandonStatus:
        """Compensate an open whose outcome is unknown: close it, or forbid it from landing."""
        terminal = encode_message(SessionClosed(reason=CloseReason.OPEN_ABANDONED))
        keys = [*self._close_keys(session_id), SessionKeys(session_id).abandoned]
        answer = await self._run(self._abandon, keys, [session_id, terminal, tombstone_ttl_ms])
        return AbandonStatus(reply_text(answer))

    async def reap(self, worker_id: str, *, budget: int = 100,
                   outage_ms: int = DEFAULT_REAP_OUTAGE_MS, release_budget: int = 1000,
                   lease_ms: int = DEFAULT_ATTACHMENT_LEASE_MS,
                   re_place: ReplaceSessions | None = None) -> Reaped:
        """One reap of ``worker_id`` (``store/reaping.py``, which says what it does)."""
        return await reap(
            lambda keys, args: self._run(self._reap, keys, args),
            lambda keys, args: self._run(self._reap_sessions, keys, args),
            lambda keys, args: self._run(self._release_slot, keys, args),
            worker_id, budget=budget, outage_ms=outage_ms, release_budget=release_budget,
            lease_ms=lease_ms, re_place=re_place)

    async def announce_gateway(self, gateway_id: str, *, ttl_ms: int) -> tuple[str, ...]:
        """List ``gateway_id`` among the live gateways for ``ttl_ms``; returns every gateway
        listed live now (this one included), the reapers share the workers out among."""
        answer = await self._run(self._gateway_announce, [GATEWAY_DIRECTORY],
                                 [gateway_id, ttl_ms])
        return tuple(sorted(reply_text(member) for member in answer))

    async def renew_attachment_lease(self, worker_id: str, holder: AttachmentHolder | None, *,
                                     trims: Sequence[OutputTrim] = (),
                                     active: Sequence[str] = ()) -> LeaseRenewal:
        """Renew ``holder``'s lease on every session it serves on ``worker_id`` (None: none),
        trim ``trims`` and mark ``active`` clients active, in one call (store/housekeeping)."""
        keys, args = lease_call(worker_id, holder, trims, active)
        return LeaseRenewal.parse(await self._run(self._gateway_lease, keys, args))

    async def worker_heartbeat(
        self, worker_id: str, *, slots: int, ttl_ms: int, register: bool, drain: bool,
        admit: bool = True, profile: WorkerProfile | None = None, backend: str = "",
        tick: TickTime = NO_ENGINE, models: Sequence[str] = (),
    ) -> WorkerBeat:
        """Register or renew a worker; ``admit=False`` stops placements until the next beat
        says otherwise (no spare tick budget), ``drain=True`` stops them for good. A
        registration publishes ``profile``, ``backend`` (its name) and ``models`` (the model
        names it serves, its own first; renewals leave all three: they never change); every
        beat publishes ``tick``, what its engine's tick time is now (for ``duplex-gateway
        status``: see :mod:`store.census`).

        Raises:
            WorkerFenced: the worker was declared lost (or its record vanished).
            ValueError: ``profile`` is over :data:`store.directory.MAX_PROFILE_BYTES`, or
                ``models`` is not a list of model names (:func:`contract.models.encode_models`).
        """
        published = profile.encode() if register and profile is not None else ""
        served = encode_models(models) if register and models else ""
        answer = await self._run(
            self._heartbeat, [WorkerKeys(worker_id).record],
            [slots, ttl_ms, int(register), int(drain), int(admit), published,
             backend if register else "", encode_tick(tick), served],
        )
        state = WorkerState(reply_text(answer[0]))
        if state is WorkerState.LOST:
            raise WorkerFenced(f"worker {worker_id} was declared lost")
        return WorkerBeat(state=state, alive_until_ms=int(answer[1]))
