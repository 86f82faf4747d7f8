"""Forwards job events to a SpacetimeDB reducer over its HTTP API
when SPACETIMEDB_URL is set. Best effort: a failed call is logged and dropped; it never touches
a job, and a slow SpacetimeDB never blocks the event stream (bounded queue, oldest kept).

It reads the admin event hub's LISTEN (`EventHub.payload_listeners`), whose listener lease keeps
PostgreSQL publishing while the forwarder runs; it needs no lease of its own."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import httpx

from sidelinja_worker.queue.config import Secret

log = logging.getLogger("sidelinja_worker.admin.spacetime")
QUEUE_MAX = 10_000


@dataclass(frozen=True)
class SpacetimeTarget:
    url: str  # e.g. http://127.0.0.1:3000
    database: str  # name or identity
    reducer: str = "job_event"
    token: Secret | None = None

    @property
    def call_url(self) -> str:
        return f"{self.url.rstrip('/')}/v1/database/{self.database}/call/{self.reducer}"


class SpacetimeForwarder:
    """Each notification payload (a status batch or a progress report, as published on
    `sidelinja_job_events`) becomes one reducer call with one String argument: that JSON."""

    def __init__(self, target: SpacetimeTarget, http: httpx.AsyncClient) -> None:
        self._target = target
        self._http = http
        self._queue: asyncio.Queue[str] = asyncio.Queue(QUEUE_MAX)
        self.dropped = 0

    def offer(self, payload: str) -> None:
        try:
            self._queue.put_nowait(payload)
        except asyncio.QueueFull:
            self.dropped += 1

    async def run(self) -> None:
        headers = {"content-type": "application/json"}  # checked exactly by the server
        if self._target.token is not None:
            headers["authorization"] = f"Bearer {self._target.token.reveal()}"
        while True:
            payload = await self._queue.get()
            await self._call(payload, headers)

    async def _call(self, payload: str, headers: dict[str, str]) -> None:
        try:
            response = await self._http.post(
                self._target.call_url, json=[payload], headers=headers, timeout=5.0
            )
        except httpx.HTTPError as exc:
            log.warning("SpacetimeDB call failed (%s); event dropped", type(exc).__name__)
            return
        if response.status_code != 200:  # 530: the reducer returned an error
            log.warning(
                "SpacetimeDB %s answered %d: %s; event dropped",
                self._target.reducer,
                response.status_code,
                response.text[:200],
            )
