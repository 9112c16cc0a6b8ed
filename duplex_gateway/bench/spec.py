"""The relay benchmark's fixed figures: its chunk, its timings, the design targets it
compares with, the setups it sweeps, and its error.

Shared by :mod:`duplex_gateway.bench.relay` (the sweep), :mod:`duplex_gateway.bench.load` (the load
sessions), :mod:`duplex_gateway.bench.peer` and :mod:`duplex_gateway.bench.relay_report`, so
none of those needs another one's internals.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Final

__all__ = [
    "CHUNK_BYTES",
    "CHUNK_S",
    "DRAIN_S",
    "MAX_ERRORS",
    "OPEN_TIMEOUT_S",
    "RAMP_S",
    "SCALE_SESSIONS",
    "SESSIONS_PER_CLIENT",
    "SHARD_COMMANDS_PER_S",
    "TARGETS_NOTE",
    "TARGET_ADDED_RTT_P99_MS",
    "TARGET_CPU_RATIO",
    "TARGET_MAX_SESSIONS",
    "TARGET_REDIS_US_PER_CHUNK",
    "TARGET_REDIS_WRITES_PER_SESSION_S",
    "TARGET_SESSION_MEMORY_KIB",
    "BenchError",
    "Setup",
    "client_count",
]

CHUNK_S: Final = 0.020
#: 20 ms of pcm16 mono at 24 kHz.
CHUNK_BYTES: Final = 960
RAMP_S: Final = 1.0
#: After the last send, returned chunks are awaited this long; later ones count as lost.
DRAIN_S: Final = 5.0
OPEN_TIMEOUT_S: Final = 10.0
#: Client errors kept per point, for the report.
MAX_ERRORS: Final = 5

# The project's design targets for the relay, at up to 200 real-time sessions on one machine.
TARGET_MAX_SESSIONS: Final = 200
TARGET_ADDED_RTT_P99_MS: Final = 4.0  # 2 ms per direction, and a round trip is two
TARGET_CPU_RATIO: Final = 2.0  # gateway CPU per chunk, as a multiple of the bare echo's
#: Redis CPU per 20 ms chunk round trip with 20 ms log entries, what this bench's loopback
#: worker relays (a frame backend's 80 ms entries have their own, lower target, DESIGN §5).
TARGET_REDIS_US_PER_CHUNK: Final = 20.0
#: Client calls (Redis's reads) per second of one streaming session with 20 ms entries: one
#: write per chunk per direction, 50 chunks a second each way.
TARGET_REDIS_WRITES_PER_SESSION_S: Final = 100.0
#: Redis memory per attached, streaming session, steady state.
TARGET_SESSION_MEMORY_KIB: Final = 256.0
#: DESIGN §5's scale on paper: this many concurrent streaming sessions...
SCALE_SESSIONS: Final = 100_000
#: ...on Redis shards that each run this many commands a second (pipelined), one core each.
SHARD_COMMANDS_PER_S: Final = 200_000
#: Printed under the table: what the target column is and what its verdicts mean.
TARGETS_NOTE: Final = (
    "target: the project's design targets for the relay, at up to 200 real-time sessions on one "
    "machine.\n"
    "  met: this run's figure is within its target. MISSED: above it, on this machine at this\n"
    "  load (a finding, not a failure: the exit status reports lost chunks only). n/a: not\n"
    "  measured, or the run lost chunks, so its figures are not comparable.")


@dataclass(frozen=True, slots=True)
class Setup:
    """One series of the sweep: ``echo``, ``peer`` or ``project``, with its server count."""

    name: str
    gateways: int

    @property
    def label(self) -> str:
        """How the table and the plots name it."""
        if self.name == "echo":
            return "echo"
        noun = "gateway" if self.name == "project" else "server"
        return f"{self.name} ({self.gateways} {noun}{'s' if self.gateways > 1 else ''})"


class BenchError(Exception):
    """The benchmark could not run (a process did not start, a client failed)."""


#: Sessions one load-client process drives: a client's send and receive per chunk is cheap
#: next to the server's, and this many keep it well inside one core, so it stays on its clock.
SESSIONS_PER_CLIENT: Final = 100


def client_count(sessions: int) -> int:
    """One client process per :data:`SESSIONS_PER_CLIENT` sessions, at most one per CPU."""
    return max(1, min(os.cpu_count() or 1, math.ceil(sessions / SESSIONS_PER_CLIENT)))
