"""A TCP proxy in front of a real server that loses one reply, or holds one command, on purpose.

The failures it makes are the ones a retrying client cannot see through. A lost reply: the
server received the command and executed it, and the connection broke before the reply came
back (a network blip, a proxy restart, a killed client connection); a client that resends must
not apply it twice. A held command: it reaches the server late, long after its sender gave up
on it (a call that waited out a failover inside its client); it must not undo what came since.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["FaultProxy"]

_READ = 65536


class FaultProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream``; :meth:`lose_reply_to` arms one fault."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._server: asyncio.Server | None = None
        self._marker: bytes | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()  # closed by aclose, whatever ran
        #: Replies dropped so far (each with its connection).
        self.lost_replies = 0
        #: True during an outage (see :meth:`cut`).
        self.refusing = False
        self._hold_marker: bytes | None = None
        #: Set once the command armed by :meth:`hold_command` arrived (and is being held).
        self.holding = asyncio.Event()
        self._released = asyncio.Event()
        # Connections numbered below this forward nothing more (see freeze).
        self._connections_made = 0
        self._frozen_below = 0

    async def start(self) -> None:
        """Listen on a free port."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    @property
    def url(self) -> str:
        """``redis://`` URL of the proxy."""
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}/0"

    def cut(self) -> None:
        """An outage: drop every connection and refuse new ones until :meth:`restore`."""
        self.refusing = True
        for task in list(self._conns):
            task.cancel()

    def restore(self) -> None:
        """End the outage."""
        self.refusing = False

    def freeze(self) -> None:
        """Every connection open now goes silent both ways, and stays open: a peer that
        vanished without a reset (a host gone, a cable cut). New connections work."""
        self._frozen_below = self._connections_made

    def lose_reply_to(self, marker: bytes) -> None:
        """The next command whose bytes contain ``marker`` runs, but its reply is lost."""
        self._marker = marker

    def hold_command(self, marker: bytes) -> None:
        """The next command whose bytes contain ``marker`` (and whatever follows it on its
        connection) waits in the proxy until :meth:`release`."""
        self._hold_marker = marker
        self.holding.clear()
        self._released.clear()

    def release(self) -> None:
        """Forward the held command at last."""
        self._released.set()

    async def aclose(self) -> None:
        """Stop listening and cut every connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()

    async def _unless_frozen(self, number: int) -> None:
        """Forward nothing more on connection ``number`` once it is frozen."""
        if number < self._frozen_below:
            await asyncio.Event().wait()  # until the proxy closes the connection

    def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        if self.refusing:
            writer.close()
            return
        task = asyncio.create_task(self._relay(reader, writer))
        self._conns.add(task)
        task.add_done_callback(self._conns.discard)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        self._writers.add(up_writer)
        tripped = asyncio.Event()  # this connection carried the marked command
        number = self._connections_made
        self._connections_made += 1

        async def upstream() -> None:
            tail = b""  # a marker may straddle two reads
            while data := await reader.read(_READ):
                await self._unless_frozen(number)
                held = self._hold_marker
                if held is not None and held in data:
                    self._hold_marker = None
                    self.holding.set()
                    await self._released.wait()
                marker = self._marker
                if marker is not None and marker in tail + data:
                    self._marker = None
                    tripped.set()
                    tail = b""
                elif marker is not None:
                    tail = (tail + data)[-len(marker):]
                up_writer.write(data)
                await up_writer.drain()

        async def downstream() -> None:
            while data := await up_reader.read(_READ):
                await self._unless_frozen(number)
                if tripped.is_set():
                    # The server answered, so it executed the command: drop the answer with
                    # the connection, as a network failure would.
                    self.lost_replies += 1
                    return
                writer.write(data)
                await writer.drain()

        pumps = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for w in (writer, up_writer):
                w.close()
                with contextlib.suppress(OSError):
                    await w.wait_closed()
