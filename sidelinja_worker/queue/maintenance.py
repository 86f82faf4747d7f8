"""Background upkeep every worker does: rescue the jobs of dead workers, prune old jobs."""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from sidelinja_worker.queue import store
from sidelinja_worker.queue.db import DB_ERRORS
from sidelinja_worker.queue.settings import WorkerSettings

log = logging.getLogger("sidelinja_worker.maintenance")

PRUNE_BATCH = 1000


async def rescue_loop(pool: asyncpg.Pool, settings: WorkerSettings) -> None:
    """Every poll interval, puts back the jobs of workers whose lease expired: a dead worker's
    jobs are back in the queue within its lease plus one poll."""
    while True:
        try:
            rescued = await store.rescue(pool, settings.lease_s)
            if rescued:
                log.warning(
                    "rescued %d jobs from dead workers: %s",
                    len(rescued),
                    ", ".join(str(i) for i in rescued[:10]),
                )
        except DB_ERRORS as exc:
            log.debug("rescue skipped: %s", exc)
        await asyncio.sleep(settings.poll_interval_s)


async def prune_loop(pool: asyncpg.Pool, settings: WorkerSettings) -> None:
    """Deletes finished jobs past retention in small batches, so the table stays small."""
    while True:
        try:
            while (
                await store.prune(
                    pool, settings.keep_completed_s, settings.keep_errors_s, PRUNE_BATCH
                )
                >= PRUNE_BATCH  # a batch with whole graphs in it may delete more
            ):
                await asyncio.sleep(0)  # let claims through between batches
        except DB_ERRORS as exc:
            log.debug("prune skipped: %s", exc)
        await asyncio.sleep(settings.prune_interval_s)
