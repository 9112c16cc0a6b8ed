"""The ``bench`` subcommands of ``duplex-gateway``: their parsers, each bench module declaring
its own flags; a bench module is imported when its subcommand runs or parses."""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_parsers"]


def _relay(args: argparse.Namespace) -> int:
    from duplex_gateway.bench.relay import run_relay_bench

    if args.io_threads and not args.busy:
        print("bench relay: --io-threads needs --busy", file=sys.stderr)
        return 2
    if args.backend != "loopback" and not (args.busy or args.spread):
        print("bench relay: --backend needs --busy or --spread (the regimes it runs)",
              file=sys.stderr)
        return 2
    return run_relay_bench(sessions=args.sessions, gateways=args.gateways, seconds=args.seconds,
                           output=args.output, profile=args.profile, busy=args.busy,
                           spread=args.spread, server=args.server, io_threads=args.io_threads,
                           backend=args.backend)


def _resume(args: argparse.Namespace) -> int:
    from duplex_gateway.bench.resume import run_resume_bench

    return run_resume_bench(sessions=args.sessions, disconnects=args.disconnects,
                            output=args.output)


def _leases(args: argparse.Namespace) -> int:
    from duplex_gateway.bench.leases import run_leases_bench

    return run_leases_bench(sessions=args.sessions, workers=args.workers, seconds=args.seconds,
                            output=args.output)


def _calls(args: argparse.Namespace) -> int:
    from duplex_gateway.bench.calls import run_calls_bench

    return run_calls_bench(args)


def _open(args: argparse.Namespace) -> int:
    from duplex_gateway.bench.open import run_open_bench

    return run_open_bench(connections=args.connections, output=args.output)


def _worker(args: argparse.Namespace) -> int:
    from duplex_gateway.bench.worker import run_worker_bench

    return run_worker_bench(args)


def _migrate(args: argparse.Namespace) -> int:
    from duplex_gateway.bench.migrate import run_migrate_bench

    return run_migrate_bench(sessions=args.sessions, events=args.event, backend=args.backend,
                             output=args.output)


def _video(args: argparse.Namespace) -> int:
    from duplex_gateway.bench.video import run_video_bench

    return run_video_bench(sessions=args.sessions, seconds=args.seconds,
                           frame_bytes=args.frame_bytes, output=args.output)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``bench relay|resume|leases|worker|calls|open|video|migrate``: each bench module
    declares its own flags."""
    from duplex_gateway.bench import (
        calls,
        leases,
        migrate,
        open as open_bench,
        relay,
        resume,
        video,
        worker,
    )

    parser = sub.add_parser("bench", help="benchmarks (each starts the processes it measures)",
                            description="Benchmarks. Each prints a table and writes its "
                            "results (JSON, and a plot where it draws one) to "
                            "bench-results/<name>-<UTC time>.json unless --output is given.")
    bench_sub = parser.add_subparsers(dest="bench", required=True)
    commands = (
        ("relay", "relay cost swept over sessions and gateways, vs an echo and a peer",
         relay.add_arguments, _relay),
        ("resume", "forced disconnects resumed elsewhere", resume.add_arguments, _resume),
        ("leases", "Redis cost of attachment leases, per count", leases.add_arguments, _leases),
        ("worker", "batched step time per batch size", worker.add_arguments, _worker),
        ("calls", "Redis CPU per chunk against sessions per script call, and the client's"
         " per call", calls.add_arguments, _calls),
        ("open", "time to the first answer of ?model= connections, by client and quiet"
         " period", open_bench.add_arguments, _open),
        ("video", "Redis memory per session streaming camera frames, second by second",
         video.add_arguments, _video),
        ("migrate", "a worker drained or killed under talking sessions: how long each goes"
         " without an event while it moves", migrate.add_arguments, _migrate),
    )
    for name, summary, add_arguments, run in commands:
        command = bench_sub.add_parser(name, help=summary, description=summary)
        add_arguments(command)
        command.set_defaults(func=run)
