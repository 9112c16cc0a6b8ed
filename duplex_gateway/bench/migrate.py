"""``duplex-gateway bench migrate``: a worker drained, or killed, under talking sessions.

The project's design targets: a drained worker's sessions each continue on another worker of
their model at a pause, 0 lost and 0 duplicated events, every response ended once, hand-over
p99 <= 1 s; a lost worker's continue too, from their checkpoints, the first new output within
two heartbeat periods and an adoption. For each ``--event`` and each N of ``--sessions`` the
bench starts its own stack (embedded Redis, a gateway, a worker with N slots), opens N
sessions that talk in turns, starts a second worker, then sends the first one SIGTERM
(``drain``: it hands each session over at a pause and exits) or SIGKILL (``kill``: the reapers
re-place its sessions, and an answer it cut short ends ``failed`` ``worker_lost`` having
played a prefix of its turn). Each client times every event it receives; a session's **stall**
is the longest time it went without an event from the signal to the end of the window, beside
its longest over an equal window before (what a talking session's pauses between turns are
anyway). It checks every session's events: ``server_event_seq`` without a gap or a repeat,
every answer its own turn's audio (or a prefix of it, cut by the kill), every response done
once, no session ended.

``--backend`` picks the worker: ``loopback`` (a turn is marked 20 ms chunks, a commit and a
response that plays them back, the next turn the moment the answer ends) or ``fake``, the
frame path (a turn is a word of marked 80 ms frames and a pause, all sent at once, which the
fake's slot echoes as the model's answer: its session moves with its engine slot, and after a
kill only where its model said nothing past its last checkpoint).

It prints a table, writes JSON (by default ``bench-results/migrate-<UTC time>.json``) and a
plot of the stalls against N next to it, and exits 0 when it ran and lost nothing (it
asserts nothing about speed: a MISSED target is a finding about this machine), 1 when an
event was lost, duplicated or reordered or a session ended, 2 when its arguments are out of
range.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from duplex_gateway.bench.kit import (
    distribution,
    output_help,
    output_path,
    positive_int_list,
    start_http_server,
    start_worker,
)
from duplex_gateway.bench.svgplot import Chart, write_chart

__all__ = ["add_arguments", "run_migrate_bench"]

TARGET_HAND_OVER_P99_MS = 1000.0
#: Loss to first new output: two heartbeat periods (the default 1 s) and an adoption (1 s).
TARGET_LOSS_P99_MS = 3000.0
#: What happens to the first worker: SIGTERM (it hands its sessions over) or SIGKILL.
EVENTS = ("drain", "kill")
#: The workers' backends it runs: the loopback, or the frame path's fake echo.
BACKENDS = ("loopback", "fake")
_SESSION = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
_CHUNK = 960
_TURN_CHUNKS = 5
# How long each window lasts: before the signal (the baseline) and from it; a kill's takes
# the heartbeat's lapse as well.
_WINDOW_S = {"drain": 3.0, "kill": 5.0}


@dataclass(slots=True)
class _Talk:
    """One session's view: when each event came, its numbers, and its turns."""

    session_id: str = ""
    times: list[float] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    turns: int = 0
    cut_short: int = 0  # answers ended failed worker_lost (a kill's)
    problems: list[str] = field(default_factory=list)


def _chunk(session: int, index: int) -> bytes:
    return struct.pack("<II", session, index) + bytes(_CHUNK - 8)


# The fake's turn: a word of this many 80 ms frames, then this many of silence, which end
# its echo (the conversation core ends a frame model's answer on silence).
_WORD_FRAMES = 4
_PAUSE_FRAMES = 12
_FRAME_BYTES = 3840


def _frame(session: int, index: int) -> bytes:
    """One loud 80 ms frame, its samples all one value that marks it: audible, and echoed
    byte for byte (24 kHz in and out, no resampling)."""
    value = 4000 + (session * 1009 + index * 7) % 24000
    return struct.pack("<h", value) * (_FRAME_BYTES // 2)


@dataclass(slots=True)
class _Start:
    """Sessions that finished their first turn; ``all`` is set once every one did."""

    sessions: int
    done: int = 0
    all: asyncio.Event = field(default_factory=asyncio.Event)

    def one(self) -> None:
        self.done += 1
        if self.done == self.sessions:
            self.all.set()


async def _talk(index: int, url: str, stop: asyncio.Event, start: _Start,
                backend: str) -> _Talk:
    """Talk in turns until ``stop``."""
    from duplex_client import DuplexClient

    talk = _Talk()
    client = await DuplexClient.connect(url, session=_SESSION)
    talk.session_id = client.session_id or ""
    if backend == "fake":
        await _say_words(index, client, stop, start, talk)
        return talk
    while not stop.is_set():
        chunks = [_chunk(index, talk.turns * _TURN_CHUNKS + i) for i in range(_TURN_CHUNKS)]
        for chunk in chunks:
            await client.append_audio(chunk)
        await client.commit()
        await client.create_response()
        answer = await _answer(index, client, talk)
        if answer is None:
            return talk
        played, response = answer
        if response.get("status") == "failed" and talk.cut_short == 0 and (
                (response.get("status_details") or {}).get("error", {}).get("code")
                == "worker_lost"):
            talk.cut_short += 1  # a kill cut it short: a prefix of the turn was played
            if not b"".join(chunks).startswith(played):
                talk.problems.append(f"session {index}: turn {talk.turns} cut, other audio")
        elif played != b"".join(chunks):
            talk.problems.append(f"session {index}: turn {talk.turns} played other audio")
        talk.turns += 1
        if talk.turns == 1:
            start.one()
    await client.close()
    await client.aclose()
    return talk


async def _answer(index: int, client: Any, talk: _Talk) -> tuple[bytes, dict[str, Any]] | None:
    """The next answer's audio and its ``response`` as ``response.done`` ends it, each event
    timed and numbered in ``talk``; None: the session ended (a problem, noted)."""
    played = b""
    while True:
        event = await asyncio.wait_for(client.recv(), 30)
        talk.times.append(time.monotonic())
        if event.server_event_seq is not None:
            talk.seqs.append(event.server_event_seq)
        if event.type in ("session.closed", "session.expired"):
            talk.problems.append(f"session {index} ended: {event.data.get('reason')}")
            return None
        played += event.audio
        if event.type == "response.done":
            response: dict[str, Any] = event.data.get("response") or {}
            return played, response


async def _say_words(index: int, client: Any, stop: asyncio.Event, start: _Start,
                     talk: _Talk) -> None:
    """The fake's turns until ``stop``: a word and its pause sent at once, its echo awaited
    and checked: the word's frames, once, in order."""
    while not stop.is_set():
        word = [_frame(index, talk.turns * _WORD_FRAMES + i) for i in range(_WORD_FRAMES)]
        for frame in [*word, *[bytes(_FRAME_BYTES)] * _PAUSE_FRAMES]:
            await client.append_audio(frame)
        answer = await _answer(index, client, talk)
        if answer is None:
            return
        played = answer[0]
        frames = [played[i:i + _FRAME_BYTES] for i in range(0, len(played), _FRAME_BYTES)]
        if [frame for frame in frames if any(frame)] != word:
            talk.problems.append(f"session {index}: word {talk.turns} echoed other audio")
        talk.turns += 1
        if talk.turns == 1:
            start.one()
    await client.close()
    await client.aclose()


def _longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest time without an event between ``start`` and ``end`` (seconds)."""
    inside = [t for t in times if start <= t <= end]
    marks = [start, *inside, end]
    return max(b - a for a, b in itertools.pairwise(marks))


async def _drive(sessions: int, url: str, move: Any, window_s: float,
                 backend: str) -> tuple[list[_Talk], float]:
    stop, start = asyncio.Event(), _Start(sessions)
    tasks = [asyncio.create_task(_talk(i, url, stop, start, backend))
             for i in range(sessions)]
    await asyncio.wait_for(start.all.wait(), 60)
    await asyncio.sleep(window_s)  # the baseline window: talking, nothing moved
    sent = time.monotonic()
    await asyncio.to_thread(move)
    await asyncio.sleep(max(0.0, sent + window_s - time.monotonic()))
    stop.set()
    return list(await asyncio.gather(*tasks)), sent


def _measure(sessions: int, event: str, backend: str, log_dir: Path) -> dict[str, Any]:
    from runtime.embedded import free_port, start_server

    with contextlib.ExitStack() as stack:
        redis = start_server("auto")
        stack.callback(redis.stop)
        first = start_worker(stack, redis.url, sessions, log_dir, backend=backend,
                             name="worker-first")
        port = free_port()
        start_http_server(stack, "gateway", [
            "duplex_gateway", "--log-level", "warning", "serve", "--host", "127.0.0.1",
            "--port", str(port), "--redis-url", redis.url], port, log_dir)
        url = f"ws://127.0.0.1:{port}/v1/realtime"

        def move() -> None:
            # The replacement first, as a rolling update with surge starts it (and as a
            # fleet with room has).
            start_worker(stack, redis.url, sessions, log_dir, backend=backend, listed=2,
                         name="worker-second")
            first.process.send_signal(signal.SIGTERM if event == "drain" else signal.SIGKILL)
            first.process.wait(timeout=60)

        window_s = _WINDOW_S[event]
        talks, sent = asyncio.run(_drive(sessions, url, move, window_s, backend))
        moved = _moved(redis.url, [talk.session_id for talk in talks])
    problems = [problem for talk in talks for problem in talk.problems]
    problems += [f"session {index}: not moved" for index, ok in enumerate(moved) if not ok]
    for index, talk in enumerate(talks):
        if talk.seqs != list(range(talk.seqs[0], talk.seqs[0] + len(talk.seqs))):
            problems.append(f"session {index}: server_event_seq with a gap or a repeat")
        if event == "drain" and talk.cut_short:
            problems.append(f"session {index}: an answer cut short by a drain")
    # Why, where something went wrong: what the processes logged (at warning and above).
    logged = [line for path in sorted(log_dir.glob("*.log")) if problems
              for line in path.read_text(errors="replace").splitlines()
              if " ERROR " in line or " WARNING " in line]
    before = [_longest_gap(t.times, sent - window_s, sent) for t in talks]
    during = [_longest_gap(t.times, sent, sent + window_s) for t in talks]
    return {"event": event, "sessions": sessions, "stall_ms": distribution(during),
            "baseline_gap_ms": distribution(before), "turns": sum(t.turns for t in talks),
            "cut_short": sum(t.cut_short for t in talks),
            "events_checked": sum(len(t.seqs) for t in talks), "problems": problems,
            "logged": logged[:20]}


def _moved(redis_url: str, session_ids: list[str]) -> list[bool]:
    """Whether each session is served by another worker than the one that opened it."""
    from redis import Redis

    from store.keys import SessionKeys, worker_of_session

    with Redis.from_url(redis_url) as client:
        owners: list[Any] = [client.hget(SessionKeys(sid).record, "owner")
                             for sid in session_ids]
    return [owner is not None and owner.decode() != worker_of_session(sid)
            for sid, owner in zip(session_ids, owners, strict=True)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``bench migrate``."""
    parser.add_argument("--sessions", type=positive_int_list, default=[1, 10, 20, 40],
                        help="talking sessions on the drained worker, one run each "
                             "(comma-separated; default: 1,10,20,40)")
    parser.add_argument("--event", type=_events, default=list(EVENTS),
                        help="what happens to the first worker: drain (SIGTERM), kill "
                             "(SIGKILL), or both (comma-separated; default: drain,kill)")
    parser.add_argument("--backend", choices=BACKENDS, default="loopback",
                        help="the workers' backend: loopback (turns answered by playback) or "
                             "fake (the frame path: words echoed by the fake's slot); "
                             "default: loopback")
    parser.add_argument("--output", help=output_help("migrate"))


def _events(text: str) -> list[str]:
    """An argparse type: ``"kill,drain"`` -> ``["drain", "kill"]``."""
    chosen = {part.strip() for part in text.split(",") if part.strip()}
    if not chosen or chosen - set(EVENTS):
        raise argparse.ArgumentTypeError(f"expected drain, kill or both, got {text!r}")
    return [event for event in EVENTS if event in chosen]


def run_migrate_bench(*, sessions: list[int], events: list[str] | None = None,
                      backend: str = "loopback",
                      output: str | os.PathLike[str] | None = None) -> int:
    """Run the bench; returns the exit status (0 ran cleanly, 1 something was lost or a
    session ended, 2 the counts are out of range)."""
    events = list(EVENTS) if events is None else events
    if (not sessions or min(sessions) < 1 or not events or set(events) - set(EVENTS)
            or backend not in BACKENDS):
        print("bench migrate: need --sessions >= 1, --event drain, kill or both, and"
              f" --backend one of {', '.join(BACKENDS)}", file=sys.stderr)
        return 2
    out = output_path(output, "migrate")
    log_dir = Path(tempfile.mkdtemp(prefix="dg-bench-migrate-"))
    try:
        rows = [_measure(n, event, backend, log_dir) for event in events for n in sessions]
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    targets = {"drain": TARGET_HAND_OVER_P99_MS, "kill": TARGET_LOSS_P99_MS}
    report = {"config": {"sessions": sessions, "events": events,
                         "window_s": {e: _WINDOW_S[e] for e in events},
                         "turn_chunks": _TURN_CHUNKS, "backend": backend},
              "target_p99_ms": {e: targets[e] for e in events}, "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    plot = out.with_suffix(".svg")
    series: dict[str, list[tuple[float, float]]] = {}
    for event in events:
        mine = [r for r in rows if r["event"] == event]
        series[f"{event}: stall p50"] = [(r["sessions"], r["stall_ms"]["p50"]) for r in mine]
        series[f"{event}: stall p99"] = [(r["sessions"], r["stall_ms"]["p99"]) for r in mine]
        series[f"{event}: between turns before, p99"] = [
            (r["sessions"], r["baseline_gap_ms"]["p99"]) for r in mine]
    write_chart(plot, Chart(
        title="a worker drained or killed under talking sessions: longest time without an"
              " event", x_label="sessions on the first worker", y_label="ms", series=series,
        reference=(TARGET_HAND_OVER_P99_MS, "drain target p99"), integer_x=True))
    _print(report, out, plot)
    return 1 if any(row["problems"] for row in rows) else 0


def _print(report: dict[str, Any], out: Path, plot: Path) -> None:
    windows = ", ".join(f"{event} {seconds:g} s"
                        for event, seconds in report["config"]["window_s"].items())
    print(f"migrate bench: a {report['config']['backend']} worker drained (each session handed"
          " over) or killed (each re-placed) under N talking sessions (windows before and from"
          f" the signal: {windows})")
    print(f"  {'event':>5}  {'sessions':>8}  {'stall p50':>10}  {'stall p99':>10}"
          f"  {'baseline p99':>12}  {'turns':>6}  {'cut':>4}  {'problems':>8}")
    for row in report["rows"]:
        stall, base = row["stall_ms"], row["baseline_gap_ms"]
        print(f"  {row['event']:>5}  {row['sessions']:>8}  {stall['p50']:>8.0f}ms"
              f"  {stall['p99']:>8.0f}ms  {base['p99']:>10.0f}ms  {row['turns']:>6}"
              f"  {row['cut_short']:>4}  {len(row['problems']):>8}")
        for problem in row["problems"][:5]:
            print(f"    {problem}")
        for line in row["logged"][:5]:
            print(f"    logged: {line}")
    for event, target in report["target_p99_ms"].items():
        worst = max(row["stall_ms"]["p99"] or 0.0 for row in report["rows"]
                    if row["event"] == event)
        verdict = "met" if worst <= target else "MISSED"
        what = ("hand-over" if event == "drain"
                else "loss to first new output (heartbeat lapse and adoption)")
        print(f"  target ({event}): {what} p99 <= {target:g} ms (the stall bounds it from"
              f" above: it adds the session's own pause): {verdict}")
    print(f"results: {out}")
    print(f"plot: {plot}")
