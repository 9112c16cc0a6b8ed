"""What streaming sessions cost Redis, in commands per session-second (DESIGN §5).

A real server, one gateway and one loopback worker at the product's default timings; each
session streams 20 ms chunks in real time (the load, not a threshold) and reads every echo.
The frame path the same way, to a frame backend's worker (the fake: 80 ms frames).
Redis's MONITOR names every command it runs, marks those a script ran (``[0 lua]``), and shows
a transaction's commands after its MULTI from the same client, before its EXEC; so the count
splits into the calls clients made (a script call or a MULTI ... EXEC is one, a write of the
connection each), what ran inside transactions and what ran inside scripts. The assertions
are on counts only: stable on a noisy machine.
"""

from __future__ import annotations

import asyncio
import collections
import re
import threading
import time
from dataclasses import dataclass

import pytest
from redis import Redis

from duplex_client import DuplexClient
from tests.e2e.helpers import STREAM_SESSION, collect_until, stream_in_real_time
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CHUNK_S = 0.02  # 20 ms of pcm16 at 24 kHz: 50 chunks a second each way
CHUNKS = 200  # per session: 4 s of audio
#: DESIGN §5: per second of one streaming session, both directions, at most this many calls
#: (one write each); asserted where arrivals are dense enough for the batching to work
#: (sessions whose chunks reach the gateway together, as many sessions on one gateway do).
SENT_GOAL = 30
#: Calls with no coalescing at all (each chunk its own call each way, 100 a second) plus one
#: gateway's and one worker's fixed costs: what a lone session costs, whatever the timing. A
#: call more per chunk (a log read after each push, say) fails it.
SENT_UNCOALESCED = 130
#: Run inside transactions per session-second, at most: per input chunk its XADD, and the
#: push of each call (store/input_appends.py: no script on the input path).
IN_TRANSACTIONS_REACHED = 100
#: Run inside scripts per session-second, the level reached: per output chunk the output
#: flush's HGET of its worker's state (the lost-worker fence, once per call), XADD and
#: SPUBLISH, no read of the log's end or of the session record (store/output_appends.py);
#: plus a trim of the input every INPUT_TRIM_EVERY commands and one gateway's and one
#: worker's fixed costs, which a lone session carries alone. One command more per chunk
#: fails it.
IN_SCRIPTS_REACHED = 240

_START, _END = "cost-window-start", "cost-window-end"
# A MONITOR line: '<time> [<db> <client or lua>] "<COMMAND>" ...'; only the head is parsed.
_MONITOR_LINE = re.compile(r'^\S+ \[\d+ ([^\]]*)\] "([^"]+)"(?: "([^"]*)")?')


@dataclass(frozen=True)
class CommandCount:
    """The commands Redis ran in a window, by name: the calls clients made (a transaction
    counted as its EXEC), what ran inside transactions, what scripts ran."""

    sent: collections.Counter[str]
    in_transactions: collections.Counter[str]
    in_scripts: collections.Counter[str]

    def per_session_second(self, session_seconds: float) -> tuple[float, float, float]:
        return (sum(self.sent.values()) / session_seconds,
                sum(self.in_transactions.values()) / session_seconds,
                sum(self.in_scripts.values()) / session_seconds)

    def breakdown(self, session_seconds: float) -> str:
        """Per command, per session-second: what a failure shows."""
        def rows(counts: collections.Counter[str]) -> str:
            return ", ".join(f"{name} {n / session_seconds:.1f}"
                             for name, n in counts.most_common())
        return (f"calls: {rows(self.sent)}; inside transactions:"
                f" {rows(self.in_transactions)}; inside scripts: {rows(self.in_scripts)}")


class CommandMonitor:
    """Counts what Redis runs between two markers, over one MONITOR connection (a thread:
    MONITOR holds its connection)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._ready = threading.Event()
        self._sent: collections.Counter[str] = collections.Counter()
        self._in_transactions: collections.Counter[str] = collections.Counter()
        self._in_scripts: collections.Counter[str] = collections.Counter()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> CommandMonitor:
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

    def count(self) -> CommandCount:
        return CommandCount(sent=self._sent, in_transactions=self._in_transactions,
                            in_scripts=self._in_scripts)

    def _read(self) -> None:
        with Redis.from_url(self._url) as client, client.monitor() as monitor:
            self._ready.set()
            counting = False
            in_multi: set[str] = set()  # clients whose MULTI has not ended yet
            while True:
                line = monitor.connection.read_response()
                if isinstance(line, bytes):
                    line = line.decode(errors="replace")
                match = _MONITOR_LINE.match(str(line))
                if match is None:
                    continue
                source, command, first_arg = match.groups()
                command = command.lower()
                if command == "echo" and first_arg in (_START, _END):
                    if first_arg == _END:
                        return
                    counting = True
                    continue
                if command == "multi":
                    in_multi.add(source)
                elif command in ("exec", "discard") and source in in_multi:
                    in_multi.discard(source)
                    if counting:
                        self._sent[command] += 1
                elif counting:
                    counter = (self._in_scripts if source == "lua" else
                               self._in_transactions if source in in_multi else self._sent)
                    counter[command] += 1


async def stream_sessions(stack: Stack, sessions: int, *, aligned: bool) -> CommandCount:
    """Open ``sessions`` stream-mode sessions on one gateway and one loopback worker, then
    count what Redis runs while each streams :data:`CHUNKS` chunks in real time and reads
    every echo. ``aligned``: every session sends on the same 20 ms clock (dense arrivals);
    else their phases are spread over a chunk's period, as independent clients."""
    gateway = stack.gateway()
    stack.worker(slots=sessions)
    clients = [await DuplexClient.connect(gateway.ws_url, session=STREAM_SESSION)
               for _ in range(sessions)]
    for client in clients:
        await collect_until(client, "session.updated", [])

    with CommandMonitor(stack.redis.url) as monitor:
        await stream_in_real_time(clients, CHUNKS,
                                  spread_s=0.0 if aligned else CHUNK_S / sessions)
    for client in clients:
        await client.aclose()
    return monitor.count()


@pytest.mark.parametrize(("sessions", "aligned"), [(1, False), (10, False), (10, True)],
                         ids=["one", "ten-independent", "ten-aligned"])
async def test_redis_commands_per_session_second(stack: Stack, sessions: int,
                                                 aligned: bool) -> None:
    """What a streaming session costs Redis per session-second, fixed costs (heartbeats,
    reaper, leases, polls) shared by the sessions of one gateway and worker included: never
    more than SENT_UNCOALESCED calls, SENT_GOAL where chunks arrive together (one call carries
    many sessions), at most IN_TRANSACTIONS_REACHED run inside transactions and
    IN_SCRIPTS_REACHED inside scripts."""
    stack.env.clear()  # the product's default timings: their fixed costs are part of the bill
    count = await stream_sessions(stack, sessions, aligned=aligned)
    session_seconds = sessions * CHUNKS * CHUNK_S
    sent, in_transactions, in_scripts = count.per_session_second(session_seconds)
    bill = (f"{sent:.1f} calls, {in_transactions:.1f} inside transactions and"
            f" {in_scripts:.1f} inside scripts per session-second;"
            f" {count.breakdown(session_seconds)}")
    print(f"{sessions} sessions ({'aligned' if aligned else 'independent'}): {bill}")
    sent_bound = SENT_GOAL if aligned else SENT_UNCOALESCED
    assert sent <= sent_bound, f"sent over {sent_bound}: {bill}"
    assert in_transactions <= IN_TRANSACTIONS_REACHED, (
        f"inside transactions over {IN_TRANSACTIONS_REACHED}: {bill}")
    assert in_scripts <= IN_SCRIPTS_REACHED, f"inside scripts over {IN_SCRIPTS_REACHED}: {bill}"


#: The frame path (a frame backend's worker: 80 ms model frames, its input read once per
#: tick, one output flush per tick for all its sessions), per session-second at ten sessions
#: on one gateway and one worker, the levels reached: calls, per session its input appends
#: (a frame each, 12.5) and its share of the worker's reads and flushes (one each per tick)
#: and of the fixed costs; inside transactions its input entries (one per frame); inside
#: scripts per session its events (XADD and SPUBLISH per frame) and the flush's share of its
#: worker's state read. One command more per frame and session (12.5) fails each.
FRAME_SENT_REACHED = 25
FRAME_IN_TRANSACTIONS_REACHED = 20
FRAME_IN_SCRIPTS_REACHED = 45


async def stream_to_a_frame_backend(stack: Stack, sessions: int) -> CommandCount:
    """Open ``sessions`` sessions on one gateway and one fake-backend worker, then count
    what Redis runs while each streams :data:`CHUNKS` chunks in real time, spread over a
    chunk's period, and until a heartbeat after them is answered (every chunk appended)."""
    gateway = stack.gateway()
    stack.worker(slots=sessions, backend="fake")
    clients = [await DuplexClient.connect(gateway.ws_url) for _ in range(sessions)]
    for client in clients:
        await collect_until(client, "session.updated", [])

    async def stream(n: int, client: DuplexClient, start: float) -> None:
        for i in range(CHUNKS):
            # Real-time pacing is the load itself, not a wait for a condition.
            await asyncio.sleep(max(0.0, start + i * CHUNK_S - time.monotonic()))
            await client.append_audio(b"\x00\x10" * 480)
        await client.heartbeat()
        await collect_until(client, "session.heartbeat_ack", [])

    with CommandMonitor(stack.redis.url) as monitor:
        start = time.monotonic() + 0.1
        await asyncio.gather(*(stream(n, client, start + n * CHUNK_S / sessions)
                               for n, client in enumerate(clients)))
    for client in clients:
        await client.aclose()
    return monitor.count()


async def test_redis_commands_per_session_second_on_the_frame_path(stack: Stack) -> None:
    """Ten sessions stream to a frame backend's worker: what they cost Redis per
    session-second, fixed costs included, stays at the frame path's levels
    (FRAME_SENT_REACHED calls, FRAME_IN_TRANSACTIONS_REACHED inside transactions,
    FRAME_IN_SCRIPTS_REACHED inside scripts): one input append and one flush share a
    frame, not a chunk."""
    stack.env.clear()  # the product's default timings: their fixed costs are part of the bill
    sessions = 10
    count = await stream_to_a_frame_backend(stack, sessions)
    sent, in_transactions, in_scripts = count.per_session_second(sessions * CHUNKS * CHUNK_S)
    bill = (f"{sent:.1f} calls, {in_transactions:.1f} inside transactions and"
            f" {in_scripts:.1f} inside scripts per session-second;"
            f" {count.breakdown(sessions * CHUNKS * CHUNK_S)}")
    print(f"{sessions} sessions on the frame path: {bill}")
    assert sent <= FRAME_SENT_REACHED, f"sent over {FRAME_SENT_REACHED}: {bill}"
    assert in_transactions <= FRAME_IN_TRANSACTIONS_REACHED, (
        f"inside transactions over {FRAME_IN_TRANSACTIONS_REACHED}: {bill}")
    assert in_scripts <= FRAME_IN_SCRIPTS_REACHED, (
        f"inside scripts over {FRAME_IN_SCRIPTS_REACHED}: {bill}")
