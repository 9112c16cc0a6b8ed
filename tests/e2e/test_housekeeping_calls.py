"""Per-session housekeeping rides the per-(gateway, worker) lease call (DESIGN §5: the control
plane grows with workers, never with sessions).

S sessions of one tenant stream on one gateway and one loopback worker while Redis's MONITOR
names every script run. Besides the data path (input and output appends), the reaper, the
worker's heartbeat and its checkpoints (one call per pass for all its sessions), the only
scripts are the lease renewal, one call per round carrying every
session's output trims and client activity, and one tenant renewal per round carrying every
session: no call is made per session, so the calls per round are the same for S = 1 and S = 8.
Asserted as counts, never as times.
"""

from __future__ import annotations

import collections
import hashlib
import re
import threading
from dataclasses import dataclass

import pytest
from redis import Redis

from duplex_client import DuplexClient
from store import lua
from store.keys import SessionKeys
from tests.e2e.helpers import STREAM_SESSION, collect_until, stream_in_real_time
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

KEY = "key-housekeeping"
CHUNK_S = 0.02
CHUNKS = 150  # 3 s of real-time audio per session: several lease rounds
#: Every script's name by the SHA-1 its EVALSHA names.
_SCRIPTS = {hashlib.sha1(getattr(lua, name).encode()).hexdigest(): name
            for name in lua.__all__ if name.isupper()}
#: What runs beside the housekeeping, at rates that do not depend on it.
_OTHERS = {"APPEND_INPUT", "APPEND_OUTPUT", "FLUSH_OUTPUT", "REAP", "REAP_SESSIONS",
           "GATEWAY_ANNOUNCE", "WORKER_HEARTBEAT", "WRITE_CHECKPOINT"}
_START, _END = "housekeeping-window-start", "housekeeping-window-end"
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class ScriptCall:
    """One EVALSHA that MONITOR saw: the script's name, its keys and its arguments."""

    name: str
    keys: tuple[str, ...]
    args: tuple[str, ...]


class ScriptMonitor:
    """Every script call Redis runs between two markers (a thread: MONITOR holds its
    connection)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._ready = threading.Event()
        self.calls: list[ScriptCall] = []
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> ScriptMonitor:
        self._thread.start()
        assert self._ready.wait(10), "MONITOR did not start"
        with Redis.from_url(self._url) as client:
            client.echo(_START)
        return self

    def __exit__(self, *exc: object) -> None:
        with Redis.from_url(self._url) as client:
            client.echo(_END)
        self._thread.join(10)
        assert not self._thread.is_alive(), "MONITOR did not see the window end"

    def _read(self) -> None:
        with Redis.from_url(self._url) as client, client.monitor() as monitor:
            self._ready.set()
            counting = False
            while True:
                line = monitor.connection.read_response()
                text = line.decode(errors="replace") if isinstance(line, bytes) else str(line)
                words = _QUOTED.findall(text)
                if not words:
                    continue
                command = words[0].lower()
                if command == "echo" and words[1:2] in ([_START], [_END]):
                    if words[1] == _END:
                        return
                    counting = True
                elif counting and command == "evalsha":
                    name = _SCRIPTS.get(words[1], words[1])
                    count = int(words[2])
                    self.calls.append(ScriptCall(name, tuple(words[3:3 + count]),
                                                 tuple(words[3 + count:])))


async def _stream(stack: Stack, sessions: int) -> tuple[list[str], list[ScriptCall]]:
    """Open ``sessions`` sessions of one tenant, then watch the scripts while each streams
    :data:`CHUNKS` chunks in real time and reads every echo; their ids and the calls."""
    gateway = stack.gateway()
    stack.worker(slots=sessions)
    clients = [await DuplexClient.connect(gateway.ws_url, session=STREAM_SESSION, api_key=KEY)
               for _ in range(sessions)]
    for client in clients:
        await collect_until(client, "session.updated", [])

    with ScriptMonitor(stack.redis.url) as monitor:
        await stream_in_real_time(clients, CHUNKS, spread_s=CHUNK_S / sessions)
    ids = [str(client.session_id) for client in clients]
    for client in clients:
        await client.aclose()
    return ids, monitor.calls


@pytest.mark.parametrize("sessions", [1, 8])
async def test_housekeeping_is_one_call_per_round_whatever_the_sessions(
    stack: Stack, sessions: int
) -> None:
    """Per lease round one lease call and one tenant renewal, each carrying every session:
    trims and activity of all of them ride the lease calls, no script runs per session."""
    stack.env.update({"DUPLEX_GATEWAY_API_KEYS": KEY,
                      "DUPLEX_GATEWAY_TENANT_MAX_SESSIONS": "16",
                      "DUPLEX_GATEWAY_ATTACH_LEASE_S": "2.5",  # a round every 0.5 s
                      "DUPLEX_GATEWAY_DELIVERED_RETENTION_S": "0.5"})
    ids, calls = await _stream(stack, sessions)
    names = collections.Counter(call.name for call in calls)
    assert set(names) <= _OTHERS | {"GATEWAY_LEASE", "TENANT_RESERVE"}, names
    leases = [call for call in calls if call.name == "GATEWAY_LEASE"]
    tenants = [call for call in calls if call.name == "TENANT_RESERVE"]
    print(f"{sessions} sessions: scripts in the window {dict(names.most_common())}")
    assert len(leases) >= 3, names  # several rounds in the window
    # One tenant renewal per round (the window may cut a round between its two calls).
    assert abs(len(tenants) - len(leases)) <= 1, names
    records = {SessionKeys(sid).record: sid for sid in ids}
    logs = {SessionKeys(sid).output_log for sid in ids}
    for call in tenants:
        mode, _cap, _lease_ms, *renewed = call.args
        assert (mode, sorted(renewed)) == ("renew", sorted(ids)), call
    trimmed: set[str] = set()
    active: set[str] = set()
    for call in leases:
        trims = int(call.args[2])
        assert len(call.args) == 3 + 4 * trims, call
        trim_keys, active_keys = call.keys[1:1 + 2 * trims], call.keys[1 + 2 * trims:]
        assert set(trim_keys[1::2]) <= logs, call
        trimmed.update(records[key] for key in trim_keys[0::2])
        active.update(records[key] for key in active_keys)
    assert trimmed == active == set(ids), "every session's trims and activity rode them"
