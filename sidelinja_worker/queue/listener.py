"""The LISTEN connection: wakes the worker on new due jobs and on cancel requests.

asyncpg tells us when the connection closes; a connection that dies silently (a dropped network,
a pooler) is caught by a health query every `health_interval_s`. While it is down the worker
keeps polling; on reconnect it claims at once, for anything inserted while nobody listened."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from uuid import UUID

import asyncpg

from sidelinja_worker.queue.db import (
    DB_ERRORS,
    init_connection,
    redact,
    server_settings,
)
from sidelinja_worker.queue.pools import WORKER_SESSIONS

log = logging.getLogger("sidelinja_worker.listener")

DUE_CHANNEL = "sidelinja_job_due"
CANCEL_CHANNEL = "sidelinja_job_cancel"
LIMITS_CHANNEL = "sidelinja_limits_changed"
HEALTH_TIMEOUT_S = 5.0
RECONNECT_MAX_S = 10.0


class Listener:
    def __init__(
        self,
        url: str,
        on_due: Callable[[], None],
        on_cancel: Callable[[UUID], None],
        on_limits: Callable[[], None],
        health_interval_s: float = 10.0,
    ) -> None:
        self._url = url
        self._on_due = on_due
        self._on_cancel = on_cancel
        self._on_limits = on_limits
        self._health_interval_s = health_interval_s
        self.connected = asyncio.Event()

    async def run(self) -> None:
        """Listens until cancelled, reconnecting with backoff."""
        delay = 0.1
        while True:
            try:
                await self._listen_once()
                delay = 0.1
            except DB_ERRORS as exc:
                log.warning(
                    "LISTEN connection to %s lost (%s); polling until it is back",
                    redact(self._url),
                    exc,
                )
            self.connected.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)

    async def _listen_once(self) -> None:
        conn = await asyncpg.connect(
            self._url, server_settings={**server_settings(), **WORKER_SESSIONS}
        )
        lost = asyncio.Event()
        try:
            await init_connection(conn)
            conn.add_termination_listener(lambda _conn: lost.set())
            await conn.add_listener(DUE_CHANNEL, self._due)
            await conn.add_listener(CANCEL_CHANNEL, self._cancel)
            await conn.add_listener(LIMITS_CHANNEL, self._limits)
            self.connected.set()
            self._on_due()  # whatever arrived while nobody listened
            self._on_limits()
            while not lost.is_set():
                try:
                    async with asyncio.timeout(self._health_interval_s):
                        await lost.wait()
                except TimeoutError:
                    async with asyncio.timeout(HEALTH_TIMEOUT_S):
                        await conn.execute("SELECT 1")
            log.warning("LISTEN connection closed by the server")
        finally:
            self.connected.clear()
            conn.terminate()

    def _due(self, _conn: object, _pid: int, _channel: str, _payload: str) -> None:
        self._on_due()

    def _limits(self, _conn: object, _pid: int, _channel: str, _payload: str) -> None:
        self._on_limits()

    def _cancel(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            job_id = UUID(payload)
        except ValueError:
            # Any role may send any payload, as fast as it likes: no warning per notice.
            log.debug("ignoring a cancel notification with a bad job id: %r", payload[:80])
            return
        self._on_cancel(job_id)
