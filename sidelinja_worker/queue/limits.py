"""The worker's cached view of the limits in the database, and the shared rate limiter.

Limits live in tables (job_type_limits, workspace_limits, rate_limits, queue_settings); a
trigger notifies `sidelinja_limits_changed` and every worker re-reads them, so a change applies
at once (within RELOAD_MIN_S) without a restart. The cache is also re-read every `refresh_s`,
for lost notifications."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import asyncpg

from sidelinja_worker.queue import store
from sidelinja_worker.queue.backoff import RETRY_MAX_S, clamp_s
from sidelinja_worker.queue.db import DB_ERRORS
from sidelinja_worker.queue.errors import Defer

log = logging.getLogger("sidelinja_worker.limits")

NO_LIMITS = store.Limits(type_caps={}, workspace_capped=False, fair=True)
# The least time between two reads of the limits. A notification is a hint any role may send,
# as fast as it likes; read once per notification, a stream of them made every worker query the
# limit tables back to back.
RELOAD_MIN_S = 0.1


class LimitsCache:
    def __init__(
        self,
        pool: asyncpg.Pool,
        refresh_s: float = 5.0,
        job_types: Sequence[str] | None = None,
    ) -> None:
        """`job_types`: the types whose caps are read (None: every type's)."""
        self.current = NO_LIMITS
        self._pool = pool
        self._job_types = job_types
        self._refresh_s = refresh_s
        self._changed = asyncio.Event()

    def changed(self) -> None:
        self._changed.set()

    async def load(self) -> None:
        self.current = await store.limits(self._pool, self._job_types)

    async def run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self._refresh_s):
                    await self._changed.wait()
            except TimeoutError:
                pass
            self._changed.clear()
            try:
                await self.load()
            except DB_ERRORS as exc:
                log.debug("limits not refreshed: %s", exc)
            # A change notified meanwhile leaves the event set: it is read right after this.
            await asyncio.sleep(RELOAD_MIN_S)

    def capped(self, job_types: Sequence[str]) -> bool:
        """Whether a claim for these types must count running jobs against a cap."""
        lim = self.current
        return lim.workspace_capped or self.type_capped(job_types)

    def type_capped(self, job_types: Sequence[str]) -> bool:
        """Whether any of these types has a cap (the claim must rank jobs per type)."""
        return any(t in self.current.type_caps for t in job_types)


class RateLimiter:
    """Spaces out calls to an outside service across every worker: one statement per call,
    asked of the database every time, so a pause set by another worker's 429 a millisecond ago
    holds here too (a cached "no limit" could not promise that; an outside call takes far longer
    than the statement). A wait longer than `max_wait_s` defers the job instead of holding a
    worker slot. `margin_s` widens the window, for calls that reach the service sooner after
    their grant than others did: 20 per minute becomes 20 per 60.5 s."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        margin_s: float = 0.5,
        max_wait_s: float = 10.0,
    ) -> None:
        self._pool = pool
        self._margin_s = margin_s
        self._max_wait_s = max_wait_s

    async def acquire(self, key: str) -> None:
        while True:
            granted, wait_s = await store.rate_acquire(self._pool, key, self._margin_s)
            if granted:
                return
            if wait_s > self._max_wait_s:
                raise Defer(f"{key} is rate-limited for {wait_s:.0f} s", after_s=wait_s)
            await asyncio.sleep(wait_s)

    async def pause(self, key: str, seconds: float) -> None:
        """A 429 with Retry-After: every worker holds its calls to `key` for `seconds`, at most
        RETRY_MAX_S (a NaN or negative pause is none)."""
        seconds = clamp_s(seconds, RETRY_MAX_S, 0.0) or 0.0
        if seconds <= 0:
            return
        await store.rate_pause(self._pool, key, seconds)
        log.warning("%s answered 429: all workers pause it for %.0f s", key, seconds)
