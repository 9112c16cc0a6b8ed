"""``duplex-gateway bench open``: what the quiet period of a ``?model=`` URL costs and saves.

A ``?model=`` connection (the openai SDK's every connection) opens its session at its first
client frame that is not ``session.resume``, or after ``URL_OPEN_DELAY_S`` with no frame
(``docs/reference/protocol.md``, "Opening"). The bench starts an embedded Redis, one loopback
worker and two gateways, one opening at once (``URL_OPEN_DELAY_S=0``) and one with the default, and
through each, one connection after another, times three kinds of client from the start of the
websocket handshake to their first answer:

* ``waits``: sends nothing until ``session.created`` (a browser page that waits for it);
* ``sends``: sends ``session.update`` at once (the SDK's usual first step);
* ``resumes``: sends ``session.resume`` at once (a client whose connection dropped).

Per row it also counts the sessions the gateway placed (``duplex_gateway_sessions_opened_total``
on its ``/metrics``): for ``resumes``, URL sessions opened only to be given up, each a slot, a
tenant place and an open counted against the tenant's rate, for nothing.

It prints a table, writes JSON (by default ``bench-results/open-<UTC time>.json``) and a CDF
plot next to it; exit 0 when every connection got its answer, 1 otherwise, 2 for bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from duplex_gateway.bench.kit import (
    distribution,
    output_help,
    output_path,
    positive_int,
    start_http_server,
    start_worker,
)
from duplex_gateway.bench.svgplot import Chart, cdf, write_chart

__all__ = ["KINDS", "add_arguments", "run_open_bench"]

#: The clients timed, in the order the table shows them.
KINDS = ("waits", "sends", "resumes")
_UPDATE = {"type": "session.update",
           "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}}
# The resumed session keeps its full grace between the bench's connections.
_KEEP_SESSION = 4000


async def _answer(ws: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 10))
    return data


def _sessions_opened(url: str) -> float:
    """The gateway's count of sessions it placed, from its ``/metrics``."""
    metrics = url.replace("ws://", "http://").removesuffix("/v1/realtime") + "/metrics"
    with urllib.request.urlopen(metrics, timeout=10) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("duplex_gateway_sessions_opened_total "):
                return float(line.split()[1])
    raise RuntimeError(f"no duplex_gateway_sessions_opened_total at {metrics}")


async def _open(url: str, kind: str, resumable: dict[str, str]) -> float:
    """One connection of ``kind``: seconds to its first answer."""
    from websockets.asyncio.client import connect

    started = time.perf_counter()
    async with connect(url + "?model=loopback") as ws:
        if kind == "sends":
            await ws.send(json.dumps(_UPDATE))
        elif kind == "resumes":
            await ws.send(json.dumps({"type": "session.resume", **resumable,
                                      "last_received_server_event_seq": 0}))
        answer = await _answer(ws)
        while kind == "resumes" and answer["type"] == "session.created":
            answer = await _answer(ws)  # a URL session opened first, given up for the resume
        elapsed = time.perf_counter() - started
        wanted = "session.resumed" if kind == "resumes" else "session.created"
        if answer["type"] != wanted:
            raise RuntimeError(f"{kind}: {answer}")
        if kind == "resumes":
            resumable["resume_token"] = answer["resume_token"]
            await ws.close(_KEEP_SESSION)
        else:
            await ws.send(json.dumps({"type": "session.close"}))
    return elapsed


async def _measure(gateways: dict[str, str], connections: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, url in gateways.items():
        from websockets.asyncio.client import connect

        async with connect(url + "?model=loopback") as ws:  # the session `resumes` takes
            await ws.send(json.dumps(_UPDATE))
            created = await _answer(ws)
            resumable = {"session_id": created["session_id"],
                         "resume_token": created["resume_token"]}
            await ws.close(_KEEP_SESSION)
        for kind in KINDS:
            before = _sessions_opened(url)
            timed = [await _open(url, kind, resumable) for _ in range(connections)]
            results[f"{name}/{kind}"] = {
                "first_answer_ms": distribution(timed),
                "samples_ms": [seconds * 1000 for seconds in timed],
                "sessions_opened": int(_sessions_opened(url) - before)}
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``bench open``."""
    parser.add_argument("--connections", type=positive_int, default=100,
                        help="connections per kind of client and gateway (default: "
                             "%(default)s)")
    parser.add_argument("--output", help=output_help("open"))


def run_open_bench(*, connections: int, output: str | os.PathLike[str] | None = None) -> int:
    """Run the bench; returns the exit status (0 every connection answered, 1 not)."""
    from gateway.settings import GatewaySettings
    from runtime.embedded import free_port, start_server

    delays = {"at-once": 0.0, "quiet": GatewaySettings().url_open_delay_s}
    out = output_path(output, "open")
    log_dir = Path(tempfile.mkdtemp(prefix="dg-bench-open-"))
    problem = ""
    with contextlib.ExitStack() as stack:
        redis = start_server("auto")
        stack.callback(redis.stop)
        start_worker(stack, redis.url, 8, log_dir)
        gateways = {}
        for name, delay in delays.items():
            port = free_port()
            start_http_server(stack, name, [
                "duplex_gateway", "--log-level", "warning", "serve", "--host", "127.0.0.1",
                "--port", str(port), "--redis-url", redis.url], port, log_dir,
                settings={"DUPLEX_GATEWAY_URL_OPEN_DELAY_S": str(delay)})
            gateways[name] = f"ws://127.0.0.1:{port}/v1/realtime"
        try:
            results = asyncio.run(_measure(gateways, connections))
        except (RuntimeError, OSError, TimeoutError) as exc:
            results, problem = {}, str(exc) or repr(exc)
    shutil.rmtree(log_dir, ignore_errors=True)
    report = {"config": {"connections": connections, "url_open_delay_s": delays},
              "results": results, "problem": problem}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    plot = out.with_suffix(".cdf.svg")
    if results:
        write_chart(plot, Chart(
            title="connect to the first answer, by client and URL_OPEN_DELAY_S",
            x_label="from the handshake's start (ms, log scale)",
            y_label="fraction of connections",
            series={name: cdf(row["samples_ms"]) for name, row in results.items()},
            log_x=True))
    _print(report, out, plot if plot.exists() else None)
    return 1 if problem else 0


def _print(report: dict[str, Any], out: Path, plot: Path | None) -> None:
    config = report["config"]
    delays = ", ".join(f"{name} {delay:g} s" for name, delay in config["url_open_delay_s"].items())
    print(f"open bench: {config['connections']} connections per row (URL_OPEN_DELAY_S: "
          f"{delays})")
    print(f"  {'gateway/client':20} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'sessions opened':>16}")
    for name, row in report["results"].items():
        d = row["first_answer_ms"]
        print(f"  {name:20} {d['p50']:8.2f} {d['p99']:8.2f} {d['max']:8.2f} "
              f"{row['sessions_opened']:16d}")
    print("  (first answer: session.created, or session.resumed for resumes, timed from the"
          " handshake's start; sessions opened for resumes are URL sessions given up)")
    if report["problem"]:
        print(f"  stopped: {report['problem']}", file=sys.stderr)
    print(f"results: {out}" + (f"\nplot: {plot}" if plot is not None else ""))
