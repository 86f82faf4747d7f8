"""A bound on how long a request may take to arrive at the admin view.

uvicorn closes a keep-alive connection left idle after a response, and nothing else: a client
that opened a connection and sent nothing, or dripped a request's head or body a byte at a
time, kept it open for as long as it liked, with a file descriptor and, for a body, the handler
waiting for it. Anyone who reaches the port can do that without a token, a few thousand times
over. Here a request's head and body must have arrived within `seconds` of the connection's
opening or of the request's first byte; past that the connection is closed (a handler waiting
for the body sees the client gone). What comes after the request, the response and a live
stream, is not bounded by it."""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from sidelinja_worker.admin.gate import REQUEST_ARRIVAL_S

# h11's states of the client's side while its request is still on the way: nothing of it read
# yet or its head in part (IDLE), or its body (SEND_BODY).
_ARRIVING = (h11.IDLE, h11.SEND_BODY)


class _BoundedH11Protocol(H11Protocol):
    arrival_s = REQUEST_ARRIVAL_S

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arrival: asyncio.TimerHandle | None = self.loop.call_later(
            self.arrival_s, self._overdue
        )

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        arriving = self.conn.their_state in _ARRIVING
        if arriving and self._arrival is None:
            self._arrival = self.loop.call_later(self.arrival_s, self._overdue)
        elif not arriving and self._arrival is not None:
            self._arrival.cancel()
            self._arrival = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._arrival is not None:
            self._arrival.cancel()
            self._arrival = None
        super().connection_lost(exc)

    def _overdue(self) -> None:
        self._arrival = None
        if self.conn.their_state in _ARRIVING:
            self.transport.close()


def bounded_h11(seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with requests bounded to arrive within `seconds`."""
    return type("BoundedH11Protocol", (_BoundedH11Protocol,), {"arrival_s": seconds})
