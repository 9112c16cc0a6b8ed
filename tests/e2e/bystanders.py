"""Bystander sessions that stream real-time audio from a process of their own.

They stand for other tenants of a stack under attack (the live fuzz): their own process, so
what they measure is the gateway and the worker, not the test process. On a thread of the
test's process they shared its interpreter with hypothesis, and in a full CI run the test's
work and its collector's pauses held their event loop for up to a second at a time, which
read as a stall of the stack.

Run as ``python -m tests.e2e.bystanders URL COUNT``: it opens COUNT stream-mode sessions,
prints ``ready``, streams 20 ms chunks on an absolute schedule until a line (or the end) on
stdin, closes every session and reads each up to its ``session.closed``, then prints one JSON
line: a list of :class:`StreamReport`. A failure to start is a traceback and exit status 1.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import itertools
import json
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from tests.e2e.helpers import STREAM_SESSION, chunk_index, marked_chunk
from tests.e2e.stack import DEADLINE_S

__all__ = ["TERMINAL_TYPES", "Bystanders", "StreamReport", "close_code_of"]

READY = "ready"
CHUNK_S = 0.02  # marked_chunk() is 20 ms of audio: the bystanders send in real time
ABNORMAL_CLOSURE = 1006  # what websockets reports when no close frame arrived
TERMINAL_TYPES = frozenset({"session.closed", "session.expired"})
_REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class StreamReport:
    """What one bystander sent and got back."""

    bystander: int
    sent: int
    echoed: tuple[int, ...]
    longest_gap_s: float
    problems: tuple[str, ...]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StreamReport:
        return cls(int(data["bystander"]), int(data["sent"]), tuple(data["echoed"]),
                   float(data["longest_gap_s"]), tuple(data["problems"]))


def close_code_of(closed: ConnectionClosed) -> int:
    return closed.rcvd.code if closed.rcvd is not None else ABNORMAL_CLOSURE


def session_of(audio: bytes) -> int:
    """The session number :func:`marked_chunk` wrote (its index is :func:`chunk_index`)."""
    return int(struct.unpack_from("<I", audio, 0)[0])


async def open_stream_session(url: str) -> ClientConnection:
    """A raw connection with a stream-mode session, read up to its ``session.updated``."""
    ws = await websockets.connect(url, max_size=None)
    await ws.send(json.dumps({"type": "session.update", "session": STREAM_SESSION}))
    while True:
        data = json.loads(await asyncio.wait_for(ws.recv(), DEADLINE_S))
        if data.get("type") == "session.updated":
            return ws
        if data.get("type") != "session.created":
            await ws.close()
            raise AssertionError(f"a bystander could not open its session: {data}")


async def stream(number: int, ws: ClientConnection, stop: asyncio.Event) -> StreamReport:
    """Send marked chunks in real time until ``stop``, then close the session and read every
    echo up to ``session.closed`` (the log is in order: every echo comes before it)."""
    arrivals: list[tuple[float, int]] = []
    problems: list[str] = []
    receiver = asyncio.create_task(receive_echoes(number, ws, arrivals, problems))
    loop = asyncio.get_running_loop()
    start, sent = loop.time(), 0
    with contextlib.suppress(ConnectionClosed):  # the receiver reports a lost connection
        while not stop.is_set() and not receiver.done():
            audio = base64.b64encode(marked_chunk(number, sent)).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            sent += 1
            # The real-time send schedule (absolute, so it does not drift), not a wait.
            await asyncio.sleep(max(0.0, start + sent * CHUNK_S - loop.time()))
        await ws.send(json.dumps({"type": "session.close"}))
    try:
        await asyncio.wait_for(receiver, DEADLINE_S)
    except TimeoutError:
        problems.append("no session.closed after session.close")
    await ws.close()
    gaps = [later[0] - earlier[0] for earlier, later in itertools.pairwise(arrivals)]
    return StreamReport(number, sent, tuple(index for _, index in arrivals),
                        max(gaps, default=0.0), tuple(problems))


async def receive_echoes(number: int, ws: ClientConnection, arrivals: list[tuple[float, int]],
                         problems: list[str]) -> None:
    """Record each echo's arrival time and chunk index, until ``session.closed``."""
    last_seq = 1  # session.updated was 1
    try:
        while True:
            data = json.loads(await ws.recv())
            seq = data.get("server_event_seq")
            if isinstance(seq, int):
                if seq != last_seq + 1:
                    problems.append(f"server_event_seq {seq} after {last_seq}")
                last_seq = seq
            type_ = data.get("type")
            if type_ == "response.output_audio.delta":
                audio = base64.b64decode(data["delta"])
                if session_of(audio) != number:
                    problems.append(f"an echo of session {session_of(audio)}'s audio")
                arrivals.append((time.monotonic(), chunk_index(audio)))
            elif type_ == "error":
                problems.append(f"error {data['error'].get('code')!r}")
            elif type_ in TERMINAL_TYPES:
                if data.get("reason") != "client_close":
                    problems.append(f"the session ended: {data.get('reason')}")
                return
    except ConnectionClosed as closed:
        problems.append(f"the connection closed {close_code_of(closed)} before session.closed")


async def _main(url: str, count: int) -> None:
    connections = [await open_stream_session(url) for _ in range(count)]
    stop = asyncio.Event()
    streams = [asyncio.create_task(stream(number, ws, stop))
               for number, ws in enumerate(connections)]
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    print(READY, flush=True)
    await stdin.readline()  # the line that says stop, or the end: the test went away
    stop.set()
    reports = await asyncio.gather(*streams)
    transport.close()
    print(json.dumps([dataclasses.asdict(report) for report in reports]), flush=True)


class Bystanders:
    """``COUNT`` bystanders in a child process, from :meth:`start` to :meth:`stop`."""

    def __init__(self, url: str, count: int, *, log: IO[bytes]) -> None:
        """``log``: where the child's stderr goes (a scanned process log)."""
        self._args = [sys.executable, "-W", "error", "-m", __name__, url, str(count)]
        self._log = log
        self._process: subprocess.Popen[str] | None = None
        self._reports: list[StreamReport] | None = None

    def start(self) -> None:
        """Start streaming; returns once every session is open and sending.

        Raises:
            AssertionError: the child could not open its sessions.
        """
        self._process = subprocess.Popen(self._args, cwd=_REPO, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._log, text=True)
        assert self._process.stdout is not None
        # The child prints the line or exits (every step of its start has a deadline).
        line = self._process.stdout.readline().strip()
        if line != READY:
            self._process.kill()
            self._process.wait()
            raise AssertionError(
                f"the bystanders did not start streaming (exit {self._process.returncode};"
                " see the bystanders log)")

    def stop(self) -> list[StreamReport]:
        """Stop streaming and return what each bystander got back (once; later calls too).

        Raises:
            AssertionError: the child did not report.
        """
        if self._reports is not None:
            return self._reports
        assert self._process is not None, "the bystanders were not started"
        try:
            out, _ = self._process.communicate("stop\n", timeout=2 * DEADLINE_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.communicate()
            raise AssertionError("the bystanders did not stop") from None
        lines = out.splitlines()
        if self._process.returncode != 0 or not lines:
            raise AssertionError(f"the bystanders failed (exit {self._process.returncode};"
                                 " see the bystanders log)")
        self._reports = [StreamReport.from_json(item) for item in json.loads(lines[-1])]
        return self._reports

    def kill(self) -> None:
        """End the child now, whatever it was doing (teardown after a failure)."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.communicate()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], int(sys.argv[2])))
