"""A TCP proxy on 127.0.0.1 between a worker and PostgreSQL that a test can cut (every
connection reset at once), black-hole (the open connections stop forwarding but stay open:
half-open, as a dead network path looks to both ends; new connections go through) or take down
(every connection reset and new ones refused, as a server restarting or failing over looks,
until it is brought up again)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from urllib.parse import parse_qs, urlsplit


async def proxy_for(db_url: str) -> tuple[TcpProxy, str]:
    """A started proxy in front of the server behind `db_url`, and the URL that goes through it."""
    target = urlsplit(db_url)
    socket_dir = parse_qs(target.query).get("host", [None])[0]  # the embedded server's
    proxy = await TcpProxy(
        socket_dir or target.hostname or "127.0.0.1", target.port or 5432
    ).start()
    via_proxy = target._replace(
        netloc=f"{target.username}@127.0.0.1:{proxy.port}", query=""
    ).geturl()
    return proxy, via_proxy


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        """`target_host` may be a folder of PostgreSQL's Unix sockets (the embedded server)."""
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._pairs: list[_Pair] = []
        self._down = False
        self.port = 0

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        self.cut()
        self.release_held()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def cut(self) -> int:
        """Resets every open connection (RST, not FIN). Returns how many."""
        pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.reset()
        return len(pairs)

    def black_hole(self) -> int:
        """The open connections stop forwarding in both directions and are never closed by us:
        nothing sent on them arrives. New connections work. Returns how many."""
        pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.hold()
        self._held = getattr(self, "_held", []) + pairs
        return len(pairs)

    def down(self) -> int:
        """Resets every open connection and refuses new ones until `up`. Returns how many."""
        self._down = True
        return self.cut()

    def up(self) -> None:
        self._down = False

    def release_held(self) -> None:
        for pair in getattr(self, "_held", []):
            pair.reset()
        self._held = []

    @property
    def open_connections(self) -> int:
        return len(self._pairs)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._down:
            _reset(writer)
            return
        host, port = self._target
        try:
            if host.startswith("/"):
                up_reader, up_writer = await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
            else:
                up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            _reset(writer)
            return
        pair = _Pair(reader, writer, up_reader, up_writer)
        self._pairs.append(pair)
        await pair.run()
        if pair in self._pairs:
            self._pairs.remove(pair)


class _Pair:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        self._ends = (writer, up_writer)
        self._tasks = [
            asyncio.ensure_future(self._pipe(reader, up_writer)),
            asyncio.ensure_future(self._pipe(up_reader, writer)),
        ]
        self._held = False

    async def run(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if not self._held:
            for w in self._ends:
                w.close()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while True:
            data = await src.read(65536)
            if not data or self._held:
                if not self._held:
                    with contextlib.suppress(OSError):
                        dst.write_eof()
                return
            dst.write(data)
            await dst.drain()

    def hold(self) -> None:
        self._held = True
        for task in self._tasks:
            task.cancel()

    def reset(self) -> None:
        for task in self._tasks:
            task.cancel()
        for w in self._ends:
            _reset(w)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()
