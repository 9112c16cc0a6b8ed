"""``duplex-gateway bench video``: what camera frames cost a session in Redis, second by second.

The seed's camera clients send one JPEG per second of audio on ``input_audio_buffer.append``
(``video_frames``), and every append rides the session's input log in Redis until the worker
has applied it. The bench starts an embedded Redis, one ``recording`` worker (the backend that
sees video) and one gateway, and streams ``--sessions`` sessions in real time for
``--seconds``: each second one append of 1 s of pcm16 24 kHz audio with one image of
``--frame-bytes``. Once a second it reads ``MEMORY USAGE`` of every session's keys (record,
input log, output log) and the input log's length, and reports the largest over the sessions
next to what was sent so far: the input log must stay flat (the worker trims what it applied)
while the video sent grows, and never reach ``INPUT_LOG_MAX_BYTES``, the cap the store
enforces on unread input.

It prints a table, writes JSON (by default ``bench-results/video-<UTC time>.json``); exit 0 when
every session streamed to the end with no error and the input log stayed under the cap, 1
otherwise, 2 for bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from duplex_gateway.bench.kit import (
    output_help,
    output_path,
    positive_int,
    start_http_server,
    start_worker,
)

__all__ = ["add_arguments", "run_video_bench"]

_UPDATE = {"type": "session.update",
           "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}}
_UNIT_BYTES = 48_000  # one second of pcm16 at 24 kHz


def _image(size: int, rng: random.Random) -> str:
    """``size`` bytes that start like a JPEG (the gateway checks the header), as base64."""
    return base64.b64encode(b"\xff\xd8\xff\xe0" + rng.randbytes(max(0, size - 4))).decode()


async def _stream(url: str, seconds: int, frame_bytes: int, started: float,
                  ids: list[str], sent: list[int], problems: list[str]) -> None:
    """One session: ``seconds`` appends of a second of audio and one image, on the clock;
    every event read (and acknowledged, as the seed's client does) so its output log is
    trimmed too."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    rng = random.Random(len(ids))
    audio = base64.b64encode(bytes(_UNIT_BYTES)).decode()
    async with connect(url, max_size=None) as ws:
        await ws.send(json.dumps(_UPDATE))
        created = json.loads(await asyncio.wait_for(ws.recv(), 10))
        ids.append(created["session_id"])

        async def read() -> None:
            with contextlib.suppress(ConnectionClosed):
                async for text in ws:
                    event = json.loads(text)
                    if event["type"] == "error":
                        problems.append(f"{event['error']['code']}: "
                                        f"{event['error']['message']}")
                    if "server_event_seq" in event:
                        await ws.send(json.dumps({
                            "type": "session.event_ack",
                            "server_event_seq": event["server_event_seq"]}))

        reader = asyncio.create_task(read())
        for second in range(seconds):
            await asyncio.sleep(max(0.0, started + second - time.monotonic()))  # the camera
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio,
                                      "video_frames": [_image(frame_bytes, rng)]}))
            sent[0] += 1
        await ws.send(json.dumps({"type": "session.close"}))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(reader, 10)


async def _sample(redis_url: str, ids: list[str]) -> dict[str, int]:
    """The largest memory (and input length) over the sessions' keys now."""
    from redis.asyncio import Redis

    from store.keys import SessionKeys

    client = Redis.from_url(redis_url)
    try:
        row = {"input_bytes": 0, "input_entries": 0, "output_bytes": 0, "record_bytes": 0}
        for session_id in list(ids):
            keys = SessionKeys(session_id)
            for name, key in (("input_bytes", keys.input_log), ("output_bytes", keys.output_log),
                              ("record_bytes", keys.record)):
                row[name] = max(row[name], int(await client.memory_usage(key) or 0))
            row["input_entries"] = max(row["input_entries"], await client.xlen(keys.input_log))
        return row
    finally:
        await client.aclose()


async def _measure(url: str, redis_url: str, sessions: int, seconds: int,
                   frame_bytes: int) -> tuple[list[dict[str, Any]], list[str]]:
    ids: list[str] = []
    sent: list[int] = [0]
    problems: list[str] = []
    started = time.monotonic() + 1.0  # every session opened before the first unit
    streams = asyncio.gather(*(_stream(url, seconds, frame_bytes, started, ids, sent, problems)
                               for _ in range(sessions)))
    rows = []
    for second in range(1, seconds + 1):
        await asyncio.sleep(max(0.0, started + second - 0.5 - time.monotonic()))
        row = await _sample(redis_url, ids)
        rows.append({"second": second, "frames_sent": sent[0],
                     "video_bytes_sent": sent[0] * frame_bytes, **row})
    await streams
    return rows, problems


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``bench video``."""
    parser.add_argument("--sessions", type=positive_int, default=4,
                        help="sessions streaming at once (default: %(default)s)")
    parser.add_argument("--seconds", type=positive_int, default=20,
                        help="seconds each streams, one image a second (default: %(default)s)")
    parser.add_argument("--frame-bytes", type=positive_int, default=60_000,
                        help="bytes of each image (default: %(default)s, a 640x480 JPEG)")
    parser.add_argument("--output", help=output_help("video", plot=""))


def run_video_bench(*, sessions: int, seconds: int, frame_bytes: int,
                    output: str | os.PathLike[str] | None = None) -> int:
    """Run the bench; returns the exit status (0: streamed, and under the cap)."""
    from gateway.settings import GatewaySettings
    from runtime.embedded import free_port, start_server

    cap = GatewaySettings().input_log_max_bytes
    out = output_path(output, "video")
    log_dir = Path(tempfile.mkdtemp(prefix="dg-bench-video-"))
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    with contextlib.ExitStack() as stack:
        redis = start_server("auto")
        stack.callback(redis.stop)
        start_worker(stack, redis.url, sessions, log_dir, backend="recording")
        port = free_port()
        start_http_server(stack, "gateway", [
            "duplex_gateway", "--log-level", "warning", "serve", "--host", "127.0.0.1",
            "--port", str(port), "--redis-url", redis.url], port, log_dir)
        try:
            rows, problems = asyncio.run(_measure(f"ws://127.0.0.1:{port}/v1/realtime",
                                                  redis.url, sessions, seconds, frame_bytes))
        except (RuntimeError, OSError, TimeoutError) as exc:
            problems = [str(exc) or repr(exc)]
    shutil.rmtree(log_dir, ignore_errors=True)
    over = [row["second"] for row in rows if row["input_bytes"] >= cap]
    report = {"config": {"sessions": sessions, "seconds": seconds, "frame_bytes": frame_bytes,
                         "input_log_max_bytes": cap},
              "rows": rows, "problems": problems[:20], "over_cap_at": over}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    _print(report, out)
    return 1 if problems or over or len(rows) < seconds else 0


def _print(report: dict[str, Any], out: Path) -> None:
    config = report["config"]
    print(f"video bench: {config['sessions']} sessions, one {config['frame_bytes']}-byte image"
          f" and 1 s of audio a second each, for {config['seconds']} s (input log cap"
          f" {config['input_log_max_bytes']} bytes)")
    print(f"  {'s':>3} {'frames':>7} {'video sent KB':>14} {'input log KB':>13} "
          f"{'entries':>8} {'output log KB':>14} {'record KB':>10}")
    for row in report["rows"]:
        print(f"  {row['second']:3d} {row['frames_sent']:7d} "
              f"{row['video_bytes_sent'] / 1024:14.0f} {row['input_bytes'] / 1024:13.1f} "
              f"{row['input_entries']:8d} {row['output_bytes'] / 1024:14.1f} "
              f"{row['record_bytes'] / 1024:10.1f}")
    print("  (memory: MEMORY USAGE of one session's key, the largest over the sessions)")
    for problem in report["problems"]:
        print(f"  problem: {problem}", file=sys.stderr)
    print(f"results: {out}")
