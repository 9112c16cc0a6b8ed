"""store.resp: the subscriber's RESP connection, against real servers and hostile peers.

The subscriber's contract (confirmations, restarts, moves) is tested in test_pubsub.py,
test_cluster.py and test_sentinel.py through this connection; here: the ways in (password,
ACL user, unix socket, TLS), a peer that goes silent without a reset, and peers that answer
with errors or bytes that are no RESP.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, strategies as st
from redis._parsers.encoders import Encoder
from redis.asyncio import Redis
from redis.connection import PythonRespSerializer
from redis.exceptions import (
    AuthenticationError,
    ConnectionError as RedisConnectionError,
    ResponseError,
)

import store.pubsub
from runtime.embedded import EmbeddedServer, free_port, start_server
from store.pubsub import Subscriber
from store.pushes import SessionEnded
from store.resp import Endpoint, PushConnection, endpoint_of, pack
from tests.faultproxy import FaultProxy
from tests.store._support import Notices, spublish

WAIT_S = 5.0
CHANNEL = "{w1}:push-test"


async def delivered_through(client: Redis, publisher: Redis) -> None:
    """A Subscriber on ``client`` gets what ``publisher`` publishes."""
    subscriber = Subscriber(client)
    notices = Notices()
    try:
        await subscriber.subscribe(CHANNEL, notices)
        assert await spublish(publisher, CHANNEL, ["c", "s1"]) == 1
        assert await notices.next() == SessionEnded("s1")
    finally:
        await subscriber.aclose()


@pytest.fixture
def guarded_server() -> Iterator[EmbeddedServer]:
    server = start_server("redis")
    yield server
    server.stop()


async def test_password_and_acl_user_log_in(guarded_server: EmbeddedServer) -> None:
    admin = Redis(port=guarded_server.port)
    await admin.acl_setuser("relay", enabled=True, passwords=["+pw2"], keys=["*"],
                            channels=["*"], commands=["+@all"])
    await admin.config_set("requirepass", "pw1")
    await admin.aclose()
    port = guarded_server.port
    publisher = Redis(port=port, password="pw1")
    for url in (f"redis://:pw1@127.0.0.1:{port}/0", f"redis://relay:pw2@127.0.0.1:{port}/0"):
        client = Redis.from_url(url)
        await delivered_through(client, publisher)
        await client.aclose()
    await publisher.aclose()


async def test_a_refused_password_raises_authentication_error(
        guarded_server: EmbeddedServer) -> None:
    admin = Redis(port=guarded_server.port)
    await admin.config_set("requirepass", "right")
    await admin.aclose()
    endpoint = Endpoint(host="127.0.0.1", port=guarded_server.port, password="wrong")
    with pytest.raises(AuthenticationError):
        await PushConnection.open(endpoint, lambda *push: None)
    assert "wrong" not in repr(endpoint)


async def test_an_unreachable_server_raises_connection_error() -> None:
    endpoint = Endpoint(host="127.0.0.1", port=free_port())
    with pytest.raises(RedisConnectionError):
        await PushConnection.open(endpoint, lambda *push: None)


async def test_unix_socket(tmp_path: Path) -> None:
    socket_path = tmp_path / "redis.sock"
    server = start_server("redis", extra_args=["--unixsocket", str(socket_path),
                                               "--unixsocketperm", "700"])
    try:
        client = Redis.from_url(f"unix://{socket_path}")
        assert (await endpoint_of(client)).path == str(socket_path)
        await delivered_through(client, client)
        await client.aclose()
    finally:
        server.stop()


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, and its key."""
    openssl = shutil.which("openssl")
    assert openssl, "openssl is installed with the test machine's packages (.ci/run)"
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


async def test_tls_with_a_verified_certificate(tls_files: tuple[Path, Path]) -> None:
    cert, key = tls_files
    tls_port = free_port()
    server = start_server("redis", extra_args=[
        "--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
        "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"])
    try:
        client = Redis.from_url(f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={cert}")
        publisher = Redis(port=server.port)
        assert (await endpoint_of(client)).tls is not None
        await delivered_through(client, publisher)
        await client.aclose()
        await publisher.aclose()
    finally:
        server.stop()


@pytest.fixture
async def proxy(redis_server: EmbeddedServer) -> AsyncIterator[FaultProxy]:
    fault = FaultProxy("127.0.0.1", redis_server.port)
    await fault.start()
    yield fault
    await fault.aclose()


async def test_a_silent_connection_is_replaced_and_the_handler_told(
        proxy: FaultProxy, redis_client: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that stops answering (no reset: the peer vanished) gets a PING, then is
    dropped; the subscriber connects again and tells the handler to read its log."""
    monkeypatch.setattr(store.pubsub, "_HEALTH_CHECK_S", 0.2)
    client = Redis.from_url(proxy.url)
    subscriber = Subscriber(client)
    notices = Notices()
    try:
        await subscriber.subscribe(CHANNEL, notices)
        proxy.freeze()
        assert await notices.next() is None  # the re-subscription, on a new connection
        assert await spublish(redis_client, CHANNEL, ["c", "s2"]) >= 1
        while (notice := await notices.next()) is None:
            pass
        assert notice == SessionEnded("s2")
    finally:
        await subscriber.aclose()
        await client.aclose()


class HostilePeer:
    """A server that answers whatever it is sent with ``reply``."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.server: asyncio.Server | None = None
        self._stop = asyncio.Event()
        self._answering: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> Endpoint:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self._answering.add(task)
            await reader.read(1024)
            writer.write(self.reply)
            await writer.drain()
            await self._stop.wait()  # hold the connection open: the client must end it
            writer.close()

        self.server = await asyncio.start_server(answer, "127.0.0.1", 0)
        return Endpoint(host="127.0.0.1", port=self.server.sockets[0].getsockname()[1])

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self._stop.set()
        await asyncio.gather(*self._answering)
        self.server.close()
        await self.server.wait_closed()


@pytest.mark.parametrize(("reply", "error"), [
    (b"-MOVED 1234 127.0.0.1:7001\r\n", ResponseError),
    (b"!!!not resp\r\n", RedisConnectionError),
    (b"*3\r\n$8\r\nsmessage\r\n$2\r\nch\r\n$2\r\nok\r\n-ERR later\r\n", ResponseError),
])
async def test_an_error_or_garbage_ends_the_connection_not_the_process(
        reply: bytes, error: type[Exception]) -> None:
    pushes: list[tuple[Any, ...]] = []
    async with HostilePeer(reply) as endpoint:
        connection = await PushConnection.open(endpoint, lambda *push: pushes.append(push))
        connection.ssubscribe(b"ch")
        why = await asyncio.wait_for(connection.closed, WAIT_S)
        assert isinstance(why, error)
        with pytest.raises(RedisConnectionError):
            connection.ssubscribe(b"ch")
    # What came before the error was delivered, and nothing after it.
    assert pushes == ([(b"smessage", b"ch", b"ok")] if b"smessage" in reply else [])


@pytest.mark.logs_errors
async def test_a_handler_that_raises_costs_the_connection_nothing() -> None:
    reply = b"".join(b"*3\r\n$8\r\nsmessage\r\n$2\r\nch\r\n$1\r\n%d\r\n" % n for n in range(3))
    seen: list[bytes] = []
    all_three = asyncio.Event()

    def handler(kind: bytes, channel: bytes, data: Any) -> None:
        seen.append(data)
        if len(seen) == 3:
            all_three.set()
        if data == b"0":
            raise RuntimeError("a handler bug")

    async with HostilePeer(reply) as endpoint:
        connection = await PushConnection.open(endpoint, handler)
        connection.ssubscribe(b"ch")
        await asyncio.wait_for(all_three.wait(), WAIT_S)
        assert not connection.closed.done()
        connection.abort(RedisConnectionError("test over"))
    assert seen == [b"0", b"1", b"2"]


class _Count(int):
    """An int subclass: hiredis's packer refuses it, the store's loop packs it."""


_ARGUMENT = (st.binary(max_size=64) | st.text(max_size=32) | st.integers()
             | st.floats(allow_nan=False) | st.integers().map(_Count)
             | st.binary(max_size=16).map(bytearray))


@given(st.lists(_ARGUMENT, max_size=24))
def test_a_command_is_packed_byte_for_byte_as_redis_py_packs_it(
        arguments: list[bytes | str | int | float]) -> None:
    """The script lane's and the push connection's commands are the bytes redis-py's own
    packer (its pure-Python one: with hiredis installed, redis-py refuses an int subclass or
    a bytearray) would send for the same arguments, whichever packer (hiredis's, or the loop
    for what hiredis does not take) wrote them."""
    encoder = Encoder("utf-8", "strict", False)  # type: ignore[no-untyped-call]
    redis_py = PythonRespSerializer(6000, encoder.encode)
    expected = b"".join(redis_py.pack("EVALSHA", *arguments))  # type: ignore[no-untyped-call]
    assert pack(["EVALSHA", *arguments]) == expected


@pytest.mark.parametrize("argument", [True, False, None, [1], {"a": 1}, object()])
def test_what_redis_py_refuses_is_refused(argument: object) -> None:
    with pytest.raises(TypeError):
        pack(["SET", "k", argument])  # type: ignore[list-item]
