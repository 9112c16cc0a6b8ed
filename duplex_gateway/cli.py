"""``duplex-gateway``: serve, worker, dev and bench subcommands.

Each subcommand builds its one frozen settings object (flags over ``DUPLEX_GATEWAY_*`` over
defaults) and hands it down. Heavy imports happen inside the subcommand, so a gateway process
never imports a model library.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

from store.config import SettingsError, from_env
from store.embedded import free_port, start_server

__all__ = ["main"]

_log = logging.getLogger("duplex_gateway")


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.logredact import DropQueryStrings, log_config
    from gateway.settings import GatewaySettings
    from gateway.wsprotocol import GatewayWebSocketProtocol

    settings = from_env(GatewaySettings, host=args.host, port=args.port,
                        redis_url=args.redis_url)
    for handler in logging.getLogger().handlers:  # our own loggers' lines, too
        handler.addFilter(DropQueryStrings())
    # uvicorn drains on SIGTERM: it stops accepting, closes websockets with 1012 (the session
    # survives, in its disconnect grace) and then runs the lifespan shutdown. The protocol is
    # uvicorn's websockets-sansio, except that text that is not UTF-8 reaches the app (which
    # answers invalid_json, then closes 1007) instead of a traceback in the log.
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                log_level=args.log_level, ws_max_size=settings.max_frame_bytes + 1024,
                timeout_graceful_shutdown=5, lifespan="on", ws=GatewayWebSocketProtocol,
                log_config=log_config())
    return 0


async def _run_worker(args: argparse.Namespace) -> int:
    from inference_worker.backend import Backend
    from inference_worker.backends.registry import (
        BACKENDS,
        BackendRequest,
        create_backend,
        parse_options,
    )
    from inference_worker.metrics import WorkerMetrics, serve_metrics
    from inference_worker.settings import WorkerSettings
    from inference_worker.worker import Worker
    from store import create_client

    settings = from_env(WorkerSettings, redis_url=args.redis_url, backend=args.backend,
                        slots=args.slots, drain_timeout_s=args.drain_timeout,
                        model_path=args.model_path, device=args.device, dtype=args.dtype,
                        backend_options=args.backend_options, metrics_port=args.metrics_port)
    if settings.backend not in BACKENDS:
        raise SettingsError(f"unknown backend {settings.backend!r}; available: "
                            + ", ".join(BACKENDS))
    backend: Backend | None = None
    if settings.backend != "loopback":
        try:  # weights load off the event loop; a bad path or option stops here, named
            request = BackendRequest(
                name=settings.backend, slots=settings.slots, model_path=settings.model_path,
                device=settings.device, dtype=settings.dtype,
                options=parse_options(settings.backend_options))
            backend = await asyncio.to_thread(create_backend, request)
        except (ValueError, ImportError, OSError) as exc:
            raise SettingsError(f"cannot load the {settings.backend} backend: {exc}") from exc
    metrics = WorkerMetrics(settings.backend)
    if settings.metrics_port:
        serve_metrics(metrics, settings.metrics_port)
    client = create_client(settings.redis_url)
    worker = Worker(settings, client, backend=backend, metrics=metrics)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    _log.info("worker %s serving %d slots", worker.worker_id, settings.slots)
    try:
        await worker.run()
    finally:
        await client.aclose()
    return 0


def _worker(args: argparse.Namespace) -> int:
    return asyncio.run(_run_worker(args))


# How long `dev` waits for its gateway and worker to serve, and how often it looks.
_DEV_START_TIMEOUT_S = 60.0
_DEV_POLL_S = 0.05
_STDERR_FD = 2  # the descriptor itself: sys.stderr may be a stand-in without one


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError as error:  # 503: not ready yet
        error.close()
        return False
    except (urllib.error.URLError, OSError):  # not listening yet
        return False


async def _worker_listed(redis_url: str, starting: Callable[[], bool]) -> bool:
    """Wait until a worker is live in the directory; False once ``starting`` says stop."""
    from store import create_client
    from store.directory import live_worker_count
    from store.errors import StoreUnavailable

    client = create_client(redis_url)
    try:
        while starting():
            with contextlib.suppress(StoreUnavailable):
                if await live_worker_count(client):
                    return True
            await asyncio.sleep(_DEV_POLL_S)  # polling another process; no event to wait on
        return False
    finally:
        await client.aclose()


def _await_serving(gateway_http: str, redis_url: str, running: Callable[[], bool]) -> bool:
    """Wait until the stack can place a session: a worker is registered and the gateway
    answers /readyz 200. False if ``running`` turns false (a signal, a dead child) or the
    start takes too long."""
    deadline = time.monotonic() + _DEV_START_TIMEOUT_S

    def starting() -> bool:
        return running() and time.monotonic() < deadline

    if not asyncio.run(_worker_listed(redis_url, starting)):
        return False
    while not _http_ok(gateway_http + "/readyz"):
        if not starting():
            return False
        time.sleep(_DEV_POLL_S)  # polling another process; no event to wait on
    return True


def _dev(args: argparse.Namespace) -> int:
    """Redis-compatible server + one gateway + one worker, until Ctrl-C or SIGTERM.

    The URL is printed only once a session can be opened: a client started on that line
    must not meet a gateway that is not listening yet, or resource_exhausted because the
    worker has not registered.
    """
    server = start_server("auto")
    port = args.port or free_port()
    python = [sys.executable, "-m", "duplex_gateway"]
    # The children log to our stderr (uvicorn writes its access log to stdout), so our stdout
    # carries the URL line alone, for a script to wait on.
    children = [
        subprocess.Popen([*python, "serve", "--host", args.host, "--port", str(port),
                          "--redis-url", server.url], stdout=_STDERR_FD),
        # Ctrl-C stops the whole product: no other worker will take over, so drain briefly.
        subprocess.Popen([*python, "worker", "--redis-url", server.url, "--backend",
                          "loopback", "--slots", str(args.slots), "--drain-timeout", "1"],
                         stdout=_STDERR_FD),
    ]
    stop = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    def running() -> bool:
        return not stop and all(child.poll() is None for child in children)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    serving = False
    try:
        serving = _await_serving(f"http://{args.host}:{port}", server.url, running)
        if serving:
            print(f"duplex-gateway dev: ws://{args.host}:{port}/v1/realtime "
                  f"(redis {server.url}, {server.binary.name})", flush=True)
        elif not stop:
            print("duplex-gateway dev: the gateway or the worker did not start",
                  file=sys.stderr, flush=True)
        while serving and running():
            time.sleep(0.2)  # a supervisor loop: wakes for a signal or a dead child
    finally:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
        server.stop()
    failed = [c.returncode for c in children if c.returncode not in (0, -signal.SIGTERM)]
    return 1 if (failed or not serving) and not stop else 0


def _bench(args: argparse.Namespace) -> int:
    from duplex_gateway.bench import run_relay_bench

    return run_relay_bench(sessions=args.sessions, seconds=args.seconds, output=args.output)


def _bench_resume(args: argparse.Namespace) -> int:
    from duplex_gateway.bench_resume import run_resume_bench

    return run_resume_bench(sessions=args.sessions, disconnects=args.disconnects,
                            output=args.output)


def _bench_leases(args: argparse.Namespace) -> int:
    from duplex_gateway.bench_leases import run_leases_bench

    return run_leases_bench(sessions=args.sessions, workers=args.workers, seconds=args.seconds,
                            output=args.output)


def _session_counts(text: str) -> list[int]:
    from duplex_gateway.bench_leases import parse_session_counts

    try:
        return parse_session_counts(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _bench_worker(args: argparse.Namespace) -> int:
    from duplex_gateway.bench_worker import run_worker_bench

    return run_worker_bench(args)


def _add_bench_worker_args(parser: argparse.ArgumentParser) -> None:
    from duplex_gateway.bench_worker import add_arguments

    add_arguments(parser)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="duplex-gateway", description=__doc__)
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run one gateway process")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--redis-url")
    serve.set_defaults(func=_serve)

    worker = sub.add_parser("worker", help="run one inference worker")
    worker.add_argument("--redis-url")
    worker.add_argument("--backend")
    worker.add_argument("--slots", type=int)
    worker.add_argument("--drain-timeout", type=float,
                        help="seconds running sessions get to finish on SIGTERM")
    worker.add_argument("--model-path")
    worker.add_argument("--device")
    worker.add_argument("--dtype")
    worker.add_argument("--backend-options", help="key=value,... for the backend")
    worker.add_argument("--metrics-port", type=int, help="Prometheus /metrics port; 0: off")
    worker.set_defaults(func=_worker)

    dev = sub.add_parser("dev", help="embedded Redis + gateway + worker on this machine")
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--port", type=int, default=8000)
    dev.add_argument("--slots", type=int, default=16)
    dev.set_defaults(func=_dev)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    relay = bench_sub.add_parser("relay", help="relay latency and CPU vs a bare echo")
    relay.add_argument("--sessions", type=int, default=50)
    relay.add_argument("--seconds", type=float, default=10.0)
    relay.add_argument("--output", default="bench-results/relay.json")
    relay.set_defaults(func=_bench)
    resume = bench_sub.add_parser("resume", help="forced disconnects resumed elsewhere")
    resume.add_argument("--sessions", type=int, default=20)
    resume.add_argument("--disconnects", type=int, default=1000)
    resume.add_argument("--output", default="bench-results/resume.json")
    resume.set_defaults(func=_bench_resume)
    leases = bench_sub.add_parser("leases", help="Redis cost of attachment leases, per count")
    leases.add_argument("--sessions", type=_session_counts, default=[100, 1000, 2000],
                        help="idle session counts, comma-separated, measured in ascending order")
    leases.add_argument("--workers", type=int, default=4)
    leases.add_argument("--seconds", type=float, default=10.0, help="measured window per count")
    leases.add_argument("--output", default="bench-results/leases.json")
    leases.set_defaults(func=_bench_leases)
    bench_worker = bench_sub.add_parser("worker", help="batched step time per batch size")
    bench_worker.set_defaults(func=_bench_worker)
    _add_bench_worker_args(bench_worker)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``duplex-gateway`` command."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        sys.exit(args.func(args))
    except SettingsError as exc:
        print(f"duplex-gateway: {exc}", file=sys.stderr)
        sys.exit(2)
