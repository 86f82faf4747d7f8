"""A hostile stand-in for any of the outside services (AI gateway, Forgejo, whisper, LiveKit):
a raw HTTP/1.1 server on 127.0.0.1 that answers every request with the bytes it is told to,
however wrong: an enormous or endless body, an absurd header, a redirect to another host,
NUL bytes, invalid UTF-8, malformed JSON, or a body dripped a byte at a time.

Raw sockets rather than a framework, as a framework would refuse to send most of these."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass
class Answer:
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    # Content-Length sent as given (absurd values included); None: the body's true length;
    # "": none sent.
    content_length: str | None = None
    # Streams this many bytes of `body` repeated (an endless or enormous body), ignoring length.
    stream_bytes: int = 0
    drip_s: float = 0.0  # a pause before each byte of the body


def json_answer(body: bytes, status: int = 200, **more: object) -> Answer:
    return Answer(status, [("Content-Type", "application/json")], body, **more)  # type: ignore[arg-type]


@dataclass
class HostileServer:
    answer: Answer = field(default_factory=Answer)
    url: str = ""
    requests: list[bytes] = field(default_factory=list)  # request heads, in order

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.requests.append(head)
            await _drain_body(reader, head)
            await self._send(writer, self.answer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the client hung up, as it should on a body over its limit
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _send(self, writer: asyncio.StreamWriter, a: Answer) -> None:
        length = a.content_length
        if length is None:
            length = str(a.stream_bytes or len(a.body))
        lines = [f"HTTP/1.1 {a.status} Whatever", "Connection: close"]
        if length != "":  # "": no length at all, the body ends when the connection does
            lines.append(f"Content-Length: {length}")
        lines += [f"{k}: {v}" for k, v in a.headers]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if a.stream_bytes:
            chunk = (a.body or b"x") * max(1, (1 << 16) // max(len(a.body), 1))
            sent = 0
            while sent < a.stream_bytes:
                piece = chunk[: a.stream_bytes - sent]
                writer.write(piece)
                await writer.drain()
                sent += len(piece)
            return
        if not a.drip_s:
            writer.write(a.body)
            await writer.drain()
            return
        for i in range(len(a.body)):
            await asyncio.sleep(a.drip_s)
            writer.write(a.body[i : i + 1])
            await writer.drain()


async def _drain_body(reader: asyncio.StreamReader, head: bytes) -> None:
    text = head.decode("latin-1").lower()
    if "transfer-encoding: chunked" in text:
        while True:
            size = int((await reader.readline()).strip() or b"0", 16)
            await reader.readexactly(size + 2)
            if size == 0:
                return
    for line in text.split("\r\n"):
        if line.startswith("content-length:"):
            await reader.readexactly(int(line.split(":", 1)[1]))


@contextlib.asynccontextmanager
async def hostile_server(answer: Answer | None = None) -> AsyncIterator[HostileServer]:
    fake = HostileServer(answer or Answer())
    server = await asyncio.start_server(fake._handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    fake.url = f"http://127.0.0.1:{port}"
    try:
        yield fake
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2)
