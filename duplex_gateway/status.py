"""``duplex-gateway status``: the workers and sessions of a deployment, read from Redis.

It only reads (``store/census.py``): every worker in the directory with its state, backend,
model names, slots, p99 tick time and heartbeat age, then per model its workers and free
slots, then the sessions per state, per tenant and per gateway, as aligned plain-text tables
or, with ``--json``, one JSON document of the same figures (see :func:`census_document`).

``add_arguments`` runs whenever any command starts, so this module imports only the standard
library at its top; the store is imported inside :func:`run`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from store.census import Census, ModelCensus, TickTime, WorkerCensus

__all__ = ["add_arguments", "census_document", "census_text", "run"]

_DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
_DEFAULT_TIMEOUT_S = 10.0
#: The session states a document always counts, even at zero (so scripts need no default).
_SESSION_STATES = ("attached", "detached")
_PROG = "duplex-gateway status"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the command."""
    parser.description = (
        "Workers (state, backend, models, slots used, p99 tick time, heartbeat age), models "
        "(workers, sessions, free slots) and sessions per state, per tenant and per gateway,"
        " read from Redis only. Exit status: 0 printed; 1 Redis unreachable or too slow to"
        " answer (one line on stderr); 2 a bad flag.")
    parser.add_argument(
        "--redis-url",
        help="redis://, rediss://, redis+sentinel://, redis+cluster:// or unix:// URL, as"
             " for serve (env DUPLEX_GATEWAY_REDIS_URL; default: redis://127.0.0.1:6379/0)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON document instead of tables")
    parser.add_argument("--timeout", type=float, default=_DEFAULT_TIMEOUT_S,
                        help="seconds to wait for Redis before giving up with exit status 1"
                             f" (default: {_DEFAULT_TIMEOUT_S:g})")


def run(args: argparse.Namespace) -> int:
    """Read the census and print it; 1 (one line on stderr) when Redis cannot be read.

    Raises:
        SettingsError: a bad ``--redis-url`` (or variable), or ``--timeout`` not above 0.
    """
    from runtime.config import RedisUrl, SettingsError
    from store.census import take_census
    from store.client import create_client
    from store.errors import StoreUnavailable

    url, source = _redis_url(args)
    rule = RedisUrl()
    if not rule.accepts(url):
        raise SettingsError(f"{source}={rule.shown(url)}: expected {rule.describe()}")
    if not args.timeout > 0:
        raise SettingsError(f"--timeout={args.timeout}: expected a number of seconds above 0")

    async def read() -> Census:
        client = create_client(url)
        try:
            return await asyncio.wait_for(take_census(client), args.timeout)
        finally:
            await client.aclose()

    try:
        census = asyncio.run(read())
    except (StoreUnavailable, OSError, TimeoutError) as exc:
        reason = str(exc) or f"no answer within {args.timeout:g} s"
        print(f"{_PROG}: cannot read Redis at {_without_password(url)}: {reason}",
              file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(census_document(census), indent=2))
    else:
        print(census_text(census), end="")
    return 0


def _redis_url(args: argparse.Namespace) -> tuple[str, str]:
    """The URL to read, and where it came from (for a refusal): the flag over the variable."""
    if args.redis_url is not None:
        return str(args.redis_url), "--redis-url"
    variable = "DUPLEX_GATEWAY_REDIS_URL"
    return os.environ.get(variable, _DEFAULT_REDIS_URL), variable


def _without_password(url: str) -> str:
    """``url`` with any password left out: an error line must not carry a secret."""
    parts = urlsplit(url)
    user, at, host = parts.netloc.rpartition("@")
    if not at:
        return url
    name = user.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{name}:***@{host}" if name else f"***@{host}"))


# ------------------------------------------------------------------------------ JSON


def census_document(census: Census) -> dict[str, Any]:
    """The census as ``--json`` prints it.

    ``{"redis_time_ms": int, "workers": [{"id", "state", "backend", "models", "slots",
    "used", "tick_p99_ms", "engine", "heartbeat_age_ms", "sessions": {state: count}}, ...],
    "models": {name: {"workers", "admitting", "slots", "used", "free"}}, "sessions":
    {"total": int, "by_state": {state: count}, "by_tenant": {tenant: count}, "by_gateway":
    {gateway id: attached count}}}``; ``by_state`` always holds ``attached`` and
    ``detached``; null where the store does not know (a worker whose record is gone or of
    another format).
    """
    sessions = census.sessions
    return {
        "redis_time_ms": census.now_ms,
        "workers": [_worker_document(worker) for worker in census.workers],
        "models": {name: _model_document(model) for name, model in census.models.items()},
        "sessions": {
            "total": sessions.total,
            "by_state": _with_states(sessions.by_state),
            "by_tenant": dict(sessions.by_tenant),
            "by_gateway": dict(sessions.by_gateway),
        },
    }


def _worker_document(worker: WorkerCensus) -> dict[str, Any]:
    return {
        "id": worker.worker_id,
        "state": worker.state,
        "backend": worker.backend,
        "models": list(worker.models),
        "slots": worker.slots,
        "used": worker.used,
        "tick_p99_ms": worker.tick.p99_ms,
        "engine": worker.tick.engine,
        "heartbeat_age_ms": worker.heartbeat_age_ms,
        "sessions": _with_states(worker.sessions.by_state),
    }


def _model_document(model: ModelCensus) -> dict[str, int]:
    return {"workers": model.workers, "admitting": model.admitting, "slots": model.slots,
            "used": model.used, "free": model.free}


def _with_states(counts: Mapping[str, int]) -> dict[str, int]:
    return {**dict.fromkeys(_SESSION_STATES, 0), **counts}


# ------------------------------------------------------------------------------ text


def census_text(census: Census) -> str:
    """The census as aligned plain-text tables, one blank line between them."""
    sessions = census.sessions
    by_state = _with_states(sessions.by_state)
    tables = [
        _table(("WORKER", "STATE", "BACKEND", "MODELS", "SLOTS", "TICK P99 MS",
                "HEARTBEAT AGE S"),
               [_worker_row(worker) for worker in census.workers], empty="no workers listed"),
        _table(("MODEL", "WORKERS", "ADMITTING", "SESSIONS", "FREE SLOTS"),
               [(name, str(model.workers), str(model.admitting),
                 f"{model.used}/{model.slots}", str(model.free))
                for name, model in census.models.items()], empty="no model served"),
        _table(("SESSIONS", "COUNT"),
               [*((state, str(count)) for state, count in by_state.items()),
                ("total", str(sessions.total))]),
        _table(("TENANT", "SESSIONS"),
               [(tenant, str(count)) for tenant, count in sessions.by_tenant.items()],
               empty="no sessions"),
        _table(("GATEWAY", "ATTACHED"),
               [(gateway, str(count)) for gateway, count in sessions.by_gateway.items()],
               empty="no attached sessions"),
    ]
    return "\n".join("".join(line + "\n" for line in table) for table in tables)


def _worker_row(worker: WorkerCensus) -> tuple[str, ...]:
    age = worker.heartbeat_age_ms
    return (worker.worker_id, worker.state, worker.backend or "?",
            ",".join(worker.models) or "?", f"{worker.used}/{worker.slots}",
            _tick_text(worker.tick),
            "-" if age is None else f"{age / 1000:.2f}")


def _tick_text(tick: TickTime) -> str:
    """The p99 in ms; ``-`` without an engine, ``idle`` with too few recent ticks, ``?``
    when the store does not know (the record is gone or of another format)."""
    if tick.engine is None:
        return "?"
    if not tick.engine:
        return "-"
    return "idle" if tick.p99_ms is None else f"{tick.p99_ms:.2f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], *,
           empty: str = "") -> list[str]:
    """Left-aligned columns two spaces apart; ``empty`` under the headers when no rows."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
             .rstrip() for row in (headers, *rows)]
    if not rows and empty:
        lines.append(empty)
    return lines
