"""``duplex-gateway``: serve, worker, dev and bench subcommands.

Each subcommand builds its one frozen settings object (flags over ``DUPLEX_GATEWAY_*`` over
defaults) and hands it down. Heavy imports happen inside the subcommand, so a gateway process
never imports a model library.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import importlib
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from duplex_gateway.bench import commands as bench_commands
from duplex_gateway.logs import JsonFormatter, LogSettings, configure_logging
from runtime.config import SettingsError, env_name, from_env
from runtime.embedded import free_port, start_server
from runtime.heap import CollectorPauses, freeze_startup_heap
from runtime.loop_errors import quiet_dropped_cluster_nodes

if TYPE_CHECKING:  # the processes import their own settings, and only their own
    from gateway.settings import GatewaySettings
    from inference_worker.settings import WorkerSettings

__all__ = ["main"]

_log = logging.getLogger("duplex_gateway")


def run_event_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run ``main`` to completion on uvloop where it is installed (a base dependency, but it
    has no Windows build), else on asyncio's loop.

    uvloop runs the same coroutines as asyncio's loop at less CPU per callback and per socket
    read or write, which is what relaying thousands of small chunks a second costs
    (docs/performance/notes/2026-12-05-relay-cpu.md).
    """
    if importlib.util.find_spec("uvloop") is None:
        return asyncio.run(main)
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def gateway_server_options(settings: GatewaySettings) -> dict[str, Any]:
    """The options the gateway runs uvicorn with, apart from the app, address and logging.

    The protocol is uvicorn's websockets-sansio, except that text that is not UTF-8 reaches
    the app (which answers invalid_json, then closes 1007) instead of a traceback in the
    log. uvicorn drains on SIGTERM: it stops accepting, closes websockets with 1012 (the
    session survives, in its disconnect grace) and then runs the lifespan shutdown.
    """
    from gateway.wsprotocol import GatewayWebSocketProtocol

    return {
        # uvloop where installed (a base dependency; a third less CPU per frame for the bare
        # echo, docs/performance/notes/2026-12-05-relay-cpu.md), else asyncio's own loop.
        "loop": "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio",
        "ws": GatewayWebSocketProtocol,
        # The limit itself: the gateway's websocket protocol answers a larger message with
        # event_too_large, then close 1009 (gateway/wsprotocol.py).
        "ws_max_size": settings.max_frame_bytes,
        "ws_per_message_deflate": settings.ws_per_message_deflate,
        "timeout_graceful_shutdown": 5,
        "lifespan": "on",
    }


def keep_startup_heap_out_of_collections(observe_pause: Callable[[int, float], None],
                                         frozen: Callable[[float], None]) -> None:
    """Once a process has built what it serves with: freeze it out of the garbage collector's
    passes and observe every pass from now on (``runtime/heap.py``). A process-wide policy, so
    the entry points apply it, not the gateway's app or the worker (tests run many of those
    in one process)."""
    CollectorPauses(observe_pause).install()
    frozen(freeze_startup_heap())


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.logredact import DropQueryStrings, log_config
    from gateway.metrics import GatewayMetrics
    from gateway.settings import GatewaySettings

    settings = from_env(GatewaySettings, host=args.host, port=args.port,
                        redis_url=args.redis_url)
    logs = _log_settings(args)
    # Before the lifespan waits for Redis: a taken port or a foreign address is a sentence
    # now, not uvicorn's bind error once Redis answers (a race after this check still gets
    # uvicorn's one line).
    _check_can_listen(settings.host, settings.port, args)
    for handler in logging.getLogger().handlers:  # our own loggers' lines, too
        handler.addFilter(DropQueryStrings())
    metrics = GatewayMetrics()
    app = create_app(settings, metrics)
    keep_startup_heap_out_of_collections(metrics.observe_gc_pause, metrics.gc_frozen_objects.set)
    uvicorn.run(app, host=settings.host, port=settings.port,
                log_level=logs.log_level,
                # JSON: uvicorn's lines too; text: uvicorn's own, as they always were.
                log_config=log_config(JsonFormatter if logs.log_format == "json" else None),
                **gateway_server_options(settings))
    return 0


async def _run_worker(args: argparse.Namespace) -> int:
    from inference_worker.backend import Backend
    from inference_worker.backends.registry import (
        BackendRequest,
        create_backend,
        parse_options,
    )
    from inference_worker.metrics import WorkerMetrics, serve_metrics
    from inference_worker.settings import TORCH_BACKENDS, WorkerSettings, check_torch_device
    from inference_worker.worker import Worker
    from store import create_client

    settings = from_env(WorkerSettings, redis_url=args.redis_url, backend=args.backend,
                        slots=args.slots, drain_timeout_s=args.drain_timeout,
                        model_path=args.model_path, device=args.device, dtype=args.dtype,
                        backend_options=args.backend_options, metrics_port=args.metrics_port,
                        metrics_host=args.metrics_host,
                        served_model_names=_names(args.served_model_name),
                        moshi_cuda_graphs=args.moshi_cuda_graphs)
    if settings.backend in TORCH_BACKENDS:  # before loading weights onto a device it lacks
        check_torch_device(settings.device, _source("device", args.device))
    backend: Backend | None = None
    if settings.backend != "loopback":
        try:  # weights load off the event loop; a bad path or option stops here, named
            request = BackendRequest(
                name=settings.backend, slots=settings.slots, model_path=settings.model_path,
                device=settings.device, dtype=settings.dtype,
                options=parse_options(settings.backend_options),
                cuda_graphs=settings.moshi_cuda_graphs)
            backend = await asyncio.to_thread(create_backend, request)
        except (ValueError, ImportError, OSError) as exc:
            raise SettingsError(f"cannot load the {settings.backend} backend: {exc}") from exc
    metrics = WorkerMetrics(settings.backend, model=settings.models[0])
    if settings.metrics_port:
        try:
            serve_metrics(metrics, settings.metrics_port, settings.metrics_host)
        except OSError as exc:  # taken, or an address that is not this machine's
            where = f"{settings.metrics_host}:{settings.metrics_port}"
            not_here = isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL
            source = (_source("metrics_host", args.metrics_host) if not_here
                      else _source("metrics_port", args.metrics_port))
            raise SettingsError(f"{source}: cannot listen on {where}: {exc.strerror or exc}"
                                ) from None
    client = create_client(settings.redis_url)
    worker = Worker(settings, client, backend=backend, metrics=metrics)
    # The model is loaded: the bulk of what a full collector pass would walk.
    keep_startup_heap_out_of_collections(metrics.observe_gc_pause, metrics.gc_frozen_objects.set)
    loop = asyncio.get_running_loop()
    quiet_dropped_cluster_nodes(loop)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    # The worker says it serves once it is registered (Redis may not answer yet).
    try:
        await worker.run()
    finally:
        await client.aclose()
    return 0


def _worker(args: argparse.Namespace) -> int:
    return run_event_loop(_run_worker(args))


def _source(field_name: str, flag_value: object) -> str:
    """Where a setting came from, for a refusal: its flag if one was given, else its variable."""
    return "--" + field_name.replace("_", "-") if flag_value is not None else env_name(field_name)


# How long `dev` waits for its gateway and worker to serve, and how often it looks. A worker
# of a model backend loads its weights before it registers, which takes longer.
_DEV_START_TIMEOUT_S = 60.0
_DEV_MODEL_START_TIMEOUT_S = 180.0
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


def _await_serving(gateway_http: str, redis_url: str, running: Callable[[], bool], *,
                   timeout_s: float = _DEV_START_TIMEOUT_S) -> bool:
    """Wait until the stack can place a session: a worker is registered and the gateway
    answers /readyz 200. False if ``running`` turns false (a signal, a dead child) or the
    start takes longer than ``timeout_s``."""
    deadline = time.monotonic() + timeout_s

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
    from inference_worker.backends.cascade_models import missing_cascade_package

    missing = missing_cascade_package()
    backend, note = _dev_backend(args, missing)
    server = start_server("auto")
    try:  # the children's settings, checked here: a mistake is one line, not "did not start"
        gateway, worker = _dev_settings(args, server.url, backend, missing)
    except SettingsError:
        server.stop()
        raise
    host, port = gateway.host, gateway.port or free_port()
    try:  # a taken port is one sentence here, not a child that dies among the others' lines
        _check_can_listen(host, port, args)
    except SettingsError:
        server.stop()
        raise
    if note is not None:  # once nothing can refuse to start: a refusal stays one line
        print(note, file=sys.stderr, flush=True)
    python = [sys.executable, "-m", "duplex_gateway"]
    # The children log to our stderr (uvicorn writes its access log to stdout), so our stdout
    # carries the URL line alone, for a script to wait on. They log as we do: a --log-level or
    # --log-format given to dev reaches them as the variable they read.
    env = {**os.environ, **_log_environment(_log_settings(args))}
    # dev serves the browser page at / unless its variable says otherwise (serve's default is
    # off: a production gateway serves only the API).
    page_variable = env_name("web_page")
    page_on = gateway.web_page if page_variable in os.environ else True
    env[page_variable] = "true" if page_on else "false"
    children = [
        subprocess.Popen([*python, "serve", "--host", host, "--port", str(port),
                          "--redis-url", server.url], stdout=_STDERR_FD, env=env),
        subprocess.Popen([*python, "worker", *_dev_worker_flags(worker)], stdout=_STDERR_FD,
                         env=env),
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
        serving = _await_serving(f"http://{host}:{port}", server.url, running,
                                 timeout_s=_dev_start_timeout(worker.backend))
        if serving:
            page = f"; talk to it at http://{host}:{port}/" if page_on else ""
            print(f"duplex-gateway dev: ws://{host}:{port}/v1/realtime "
                  f"(redis {server.url}, {server.binary.name}){page}", flush=True)
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


def _check_can_listen(host: str, port: int, args: argparse.Namespace) -> None:
    """Refuse an address the gateway could not listen on, naming the setting to change: the
    host when it is not this machine's (or does not resolve), else the port (taken, or
    privileged). The probe binds as uvicorn does (SO_REUSEADDR), so a port a closed socket
    left in TIME_WAIT still counts as free."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.create_server((host, port), family=family):
            pass
    except OSError as exc:
        not_here = isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL
        source = _source("host", args.host) if not_here else _source("port", args.port)
        advice = "an address of this machine" if not_here else "another port (0: a free one)"
        raise SettingsError(f"{source}: cannot listen on {host}:{port}:"
                            f" {exc.strerror or exc}; choose {advice}") from None


# Ctrl-C stops the whole product: no other worker will take over, so `dev` drains briefly.
_DEV_DRAIN_TIMEOUT_S = 1.0
# What `dev` runs when no backend is asked for: real speech a newcomer can talk to, or, where
# the cascade extra is not installed, the loopback (with a line saying how to get speech).
_DEV_BACKEND = "cascade"
_DEV_FALLBACK_BACKEND = "loopback"


def _dev_backend(args: argparse.Namespace, missing: str | None) -> tuple[str | None, str | None]:
    """The backend `dev` asks its worker settings for, and a line to print about it.

    ``--backend`` or ``DUPLEX_GATEWAY_BACKEND`` when given (None here: the settings read the
    variable themselves, so a refusal names it); otherwise the cascade, or the loopback when
    ``missing`` (a module the cascade needs) is not installed, with the line saying so.
    """
    if args.backend is not None or env_name("backend") in os.environ:
        return args.backend, None
    if missing is None:
        return _DEV_BACKEND, None
    return _DEV_FALLBACK_BACKEND, (
        f"duplex-gateway dev: running the {_DEV_FALLBACK_BACKEND} backend: the {_DEV_BACKEND}"
        f" backend (real speech) needs {missing!r}, which is not installed; for real speech:"
        f" pip install 'duplex-gateway[{_DEV_BACKEND}]'")


def _dev_settings(args: argparse.Namespace, redis_url: str, backend: str | None,
                  missing: str | None) -> tuple[GatewaySettings, WorkerSettings]:
    """What `dev`'s gateway and worker will run with: its flags over ``DUPLEX_GATEWAY_*``.

    ``backend`` is :func:`_dev_backend`'s; ``missing``, a module the cascade needs that is
    not installed, refuses a cascade that was asked for (a fallback is only for the default).
    """
    from gateway.settings import GatewaySettings
    from inference_worker.settings import WorkerSettings

    gateway = from_env(GatewaySettings, host=args.host, port=args.port, redis_url=redis_url)
    worker = from_env(WorkerSettings, redis_url=redis_url, backend=backend, slots=args.slots,
                      model_path=args.model_path, device=args.device, dtype=args.dtype,
                      backend_options=args.backend_options,
                      drain_timeout_s=_DEV_DRAIN_TIMEOUT_S,
                      served_model_names=_names(args.served_model_name))
    if worker.backend == _DEV_BACKEND and missing is not None:
        raise SettingsError(
            f"{_source('backend', args.backend)}: the {_DEV_BACKEND} backend needs {missing!r},"
            f" which is not installed: pip install 'duplex-gateway[{_DEV_BACKEND}]'")
    return gateway, worker


def _dev_start_timeout(backend: str) -> float:
    """How long `dev` waits for its stack: a model backend loads its weights first."""
    return _DEV_START_TIMEOUT_S if backend == "loopback" else _DEV_MODEL_START_TIMEOUT_S


def _dev_worker_flags(worker: WorkerSettings) -> list[str]:
    """The worker command line of ``worker``, resolved here (flags over variables), so the
    child runs what was checked."""
    flags = ["--redis-url", worker.redis_url, "--backend", worker.backend,
             "--slots", str(worker.slots), "--drain-timeout", str(worker.drain_timeout_s),
             "--device", worker.device, "--dtype", worker.dtype]
    if worker.model_path:
        flags += ["--model-path", worker.model_path]
    if worker.backend_options:
        flags += ["--backend-options", worker.backend_options]
    if worker.served_model_names:
        flags += ["--served-model-name", ",".join(worker.served_model_names)]
    return flags


def _names(flag: str | None) -> tuple[str, ...] | None:
    """A comma-separated names flag as its setting holds it (None: not given)."""
    if flag is None:
        return None
    return tuple(part.strip() for part in flag.split(",") if part.strip())


def _log_settings(args: argparse.Namespace) -> LogSettings:
    """How this process logs: the global flags over ``DUPLEX_GATEWAY_LOG_*``."""
    return from_env(LogSettings, log_level=args.log_level, log_format=args.log_format)


def _log_environment(settings: LogSettings) -> dict[str, str]:
    """The variables that make a child process log as ``settings`` say."""
    return {env_name("log_level"): settings.log_level,
            env_name("log_format"): settings.log_format}


_SETTINGS_EPILOG = ("Every setting also has a DUPLEX_GATEWAY_* variable (see"
                    " docs/reference/settings.md); a flag wins over its variable.")


def _setting(text: str, variable: str, default: str) -> str:
    """A flag's help: what it sets, its variable and its default."""
    return f"{text} (env {env_name(variable.lower())}; default: {default})"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="duplex-gateway", description=__doc__)
    # No argparse choices: a bad value is refused by LogSettings, one line like any setting.
    parser.add_argument("--log-level", help=_setting("debug, info, warning or error",
                                                     "LOG_LEVEL", "info"))
    parser.add_argument("--log-format", help=_setting("text, or json (one object per line)",
                                                      "LOG_FORMAT", "text"))
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run one gateway process", epilog=_SETTINGS_EPILOG)
    serve.add_argument("--host", help=_setting("address to listen on", "HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, help=_setting("TCP port", "PORT", "8000"))
    serve.add_argument("--redis-url", help=_setting("redis://, rediss://, redis+sentinel://,"
                                                    " redis+cluster:// or unix:// URL",
                                                    "REDIS_URL", "redis://127.0.0.1:6379/0"))
    serve.set_defaults(func=_serve)

    worker = sub.add_parser("worker", help="run one inference worker", epilog=_SETTINGS_EPILOG)
    worker.add_argument("--redis-url", help=_setting("as for serve", "REDIS_URL",
                                                     "redis://127.0.0.1:6379/0"))
    worker.add_argument("--backend", help=_setting("loopback, fake, moshi or cascade", "BACKEND",
                                                   "loopback"))
    worker.add_argument("--slots", type=int, help=_setting("concurrent sessions", "SLOTS", "16"))
    worker.add_argument("--drain-timeout", type=float,
                        help=_setting("seconds running sessions get to finish on SIGTERM",
                                      "DRAIN_TIMEOUT_S", "30"))
    worker.add_argument("--model-path", help=_setting("weights of the backend", "MODEL_PATH",
                                                      "none"))
    worker.add_argument("--device", help=_setting("torch device (moshi)", "DEVICE", "cpu"))
    worker.add_argument("--dtype", help=_setting("torch dtype (moshi): float32, bfloat16,"
                                                 " float16", "DTYPE", "float32"))
    worker.add_argument("--backend-options", help=_setting("key=value,... for the backend",
                                                           "BACKEND_OPTIONS", "none"))
    worker.add_argument("--served-model-name", help=_setting(
        "model names served, comma-separated: its own first, then aliases",
        "SERVED_MODEL_NAMES", "the backend's name"))
    worker.add_argument("--moshi-cuda-graphs", action="store_true", default=None,
                        help=_setting("moshi: replay the model as CUDA graphs (needs --device"
                                      " cuda)", "MOSHI_CUDA_GRAPHS", "false"))
    worker.add_argument("--metrics-port", type=int,
                        help=_setting("Prometheus /metrics port; 0: off", "METRICS_PORT", "0"))
    worker.add_argument("--metrics-host", help=_setting("address /metrics binds", "METRICS_HOST",
                                                        "127.0.0.1"))
    worker.set_defaults(func=_worker)

    dev = sub.add_parser("dev", help="embedded Redis + gateway + worker on this machine",
                         epilog=_SETTINGS_EPILOG)
    dev.add_argument("--host", help=_setting("address the gateway listens on", "HOST",
                                             "127.0.0.1"))
    dev.add_argument("--port", type=int,
                     help=_setting("the gateway's port; 0: a free one", "PORT", "8000"))
    dev.add_argument("--slots", type=int, help=_setting("the worker's slots", "SLOTS", "16"))
    dev.add_argument("--backend", help=_setting(
        "the worker's backend: cascade (real speech), loopback, fake or moshi", "BACKEND",
        "cascade; loopback where the cascade extra is not installed"))
    dev.add_argument("--model-path", help=_setting(
        "weights of the backend (cascade: a transformers causal LM that answers; moshi: a"
        " save_pretrained directory)", "MODEL_PATH", "none"))
    dev.add_argument("--device", help=_setting("torch device (moshi)", "DEVICE", "cpu"))
    dev.add_argument("--dtype", help=_setting("torch dtype (moshi): float32, bfloat16,"
                                              " float16", "DTYPE", "float32"))
    dev.add_argument("--backend-options", help=_setting(
        "key=value,... for the backend (cascade: responder=echo or causal_lm, vad_path,"
        " asr_path, voice_path, responder_path)", "BACKEND_OPTIONS", "none"))
    dev.add_argument("--served-model-name", help=_setting(
        "the worker's model names, comma-separated: its own first, then aliases",
        "SERVED_MODEL_NAMES", "the backend's name"))
    dev.set_defaults(func=_dev)

    talk = sub.add_parser("talk", help="stream a WAV to a gateway and save the spoken answer")
    _add_client_command(talk, "duplex_gateway.talk")
    status = sub.add_parser("status", help="workers and sessions, from Redis, as a table")
    _add_client_command(status, "duplex_gateway.status")

    bench_commands.add_parsers(sub)
    return parser


def _add_client_command(parser: argparse.ArgumentParser, module: str) -> None:
    """A subcommand whose flags and body live in ``module`` (``add_arguments(parser)`` and
    ``run(args) -> int``), imported when it runs, so other commands never load it."""
    importlib.import_module(module).add_arguments(parser)

    def run(args: argparse.Namespace) -> int:
        result: int = importlib.import_module(module).run(args)
        return result

    parser.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``duplex-gateway`` command."""
    args = _parser().parse_args(argv)
    logs: LogSettings | None = None
    try:
        logs = _log_settings(args)
        configure_logging(logs)  # before anything runs: every line in the chosen format
        sys.exit(args.func(args))
    except SettingsError as exc:
        _refuse(f"duplex-gateway: {exc}", json_log=logs is not None and logs.log_format == "json")


def _refuse(line: str, *, json_log: bool) -> None:
    """Stop over an operator's mistake: one line on stderr, exit status 2. In a JSON log it is
    a JSON line like the others, so a log pipeline reads why the process stopped."""
    if json_log:
        _log.error("%s", line)
    else:
        print(line, file=sys.stderr)
    sys.exit(2)
