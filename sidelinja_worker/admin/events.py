"""Live job events: one LISTEN on `sidelinja_job_events` per app, fanned out to the open pages
(Server-Sent Events), each page getting only the workspaces its token may see."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import orjson

from sidelinja_worker.admin.store import Scope

log = logging.getLogger("sidelinja_worker.admin")
CHANNEL = "sidelinja_job_events"
KEEPALIVE_S = 15.0
QUEUE_MAX = 1000


def explode(payload: str) -> list[dict[str, Any]]:
    """One event per job: a status batch `{..., "ids": [...], "attempts": [...]}` becomes one
    event per id; a progress report is already one event."""
    data = orjson.loads(payload)
    if "ids" not in data:
        return [data]
    common = {k: v for k, v in data.items() if k not in ("ids", "attempts")}
    return [
        {**common, "id": job_id, "attempts": n}
        for job_id, n in zip(data["ids"], data["attempts"], strict=True)
    ]


class EventHub:
    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: asyncpg.Connection | None = None
        self._subscribers: dict[asyncio.Queue[dict[str, Any]], Scope] = {}
        # Called with every raw payload (the SpacetimeDB forwarder); must not block.
        self.payload_listeners: list[Callable[[str], None]] = []

    async def start(self) -> None:
        self._conn = await asyncpg.connect(self._url)
        await self._conn.add_listener(CHANNEL, self._on_notify)

    async def stop(self) -> None:
        if self._conn is not None:
            await self._conn.close()

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        for listener in self.payload_listeners:
            listener(payload)
        try:
            events = explode(payload)
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a malformed %s payload", CHANNEL)
            return
        for queue, scope in self._subscribers.items():
            for event in events:
                if scope.allows(event.get("workspace_id", "")) and not queue.full():
                    queue.put_nowait(event)

    async def stream(
        self, scope: Scope, still_valid: Callable[[], Awaitable[bool]] | None = None
    ) -> AsyncIterator[bytes]:
        """SSE frames for one page until it goes away, or its token is revoked (checked at each
        keepalive); a comment now and then keeps proxies from closing an idle stream."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUE_MAX)
        self._subscribers[queue] = scope
        try:
            yield b"retry: 2000\n: connected\n\n"
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    if still_valid is not None and not await still_valid():
                        return
                    yield b": keepalive\n\n"
                    continue
                yield b"data: " + orjson.dumps(event) + b"\n\n"
        finally:
            del self._subscribers[queue]
