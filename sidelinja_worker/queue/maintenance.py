"""Background upkeep every worker does: rescue the jobs of dead workers, prune old jobs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from uuid import UUID

import asyncpg

from sidelinja_worker.queue import store
from sidelinja_worker.queue.db import DB_ERRORS
from sidelinja_worker.queue.settings import WorkerSettings

log = logging.getLogger("sidelinja_worker.maintenance")

PRUNE_BATCH = 1000


async def rescue_loop(
    pool: asyncpg.Pool,
    settings: WorkerSettings,
    timeout_s: float = store.STATEMENT_TIMEOUT_S,
    *,
    may_reap: Callable[[], bool] = lambda: True,
) -> None:
    """Every poll interval, puts back the jobs of workers whose lease expired: a dead worker's
    jobs are back in the queue within its lease plus one poll.

    The rescue goes GIVE_BACK_BATCH jobs a statement (store.rescue), however many rows any
    writer set running under a dead worker. A job it ends in `error` (its last attempt) still
    cancels its graph children in the same statement, ~35 µs each: a batch holding a parent of
    300,000 children outlasts the usual timeout. With that timeout fixed, the same batch timed
    out at every turn and no dead worker's job came back; a batch that times out is tried again
    with twice the time (store.longer_timeout), and a rescue that gets through starts over.
    The workers it reaped are kept till their jobs are all back, for their rows are gone.
    While `may_reap()` says no (the worker was out of reach of the database within a lease:
    Worker.may_declare_dead), it rescues nothing."""
    allowed_s = timeout_s
    dead: set[UUID] = set()
    while True:
        if not may_reap():
            await asyncio.sleep(settings.poll_interval_s)
            continue
        try:
            rescued = await store.rescue(pool, settings.lease_s, allowed_s, dead=dead)
            allowed_s = timeout_s
            if rescued:
                log.warning(
                    "rescued %d jobs from dead workers: %s",
                    len(rescued),
                    ", ".join(str(i) for i in rescued[:10]),
                )
        except TimeoutError:
            allowed_s = store.longer_timeout(allowed_s)
            log.warning("the rescue took too long; trying again with %gs", allowed_s)
        except DB_ERRORS as exc:
            log.debug("rescue skipped: %s", exc)
        await asyncio.sleep(settings.poll_interval_s)


async def prune_loop(pool: asyncpg.Pool, settings: WorkerSettings) -> None:
    """Deletes finished jobs past retention in small batches, so the table stays small.

    A prune that PostgreSQL refuses (a trigger or rule of the web app's on job_queue, a
    referencing table this role may not read) is logged and tried again next interval: it
    never ends the worker. Every worker prunes as it starts, so a refusal that ended the worker
    ended its restart too, and no job of the queue ran any more."""
    while True:
        try:
            await prune_past_retention(pool, settings.keep_completed_s, settings.keep_errors_s)
        except DB_ERRORS as exc:
            log.debug("prune skipped: %s", exc)
        except (asyncpg.PostgresError, store.PruneBlocked) as exc:
            log.error("prune refused, trying again in %gs: %s", settings.prune_interval_s, exc)
        await asyncio.sleep(settings.prune_interval_s)


async def prune_past_retention(
    conn: store.Conn,
    keep_completed_s: float,
    keep_errors_s: float,
    *,
    batch: int = PRUNE_BATCH,
    on_batch: Callable[[int], None] | None = None,
) -> int:
    """Deletes every finished job past retention, batch by batch, each batch its own statement
    (on a pool, its own transaction): jobs in graphs go only with their whole graph (the prune
    statement's rule). Each batch takes the graph jobs after those of the one before, so graphs
    that must stay whole are passed over, not taken again; it runs until a batch deletes
    nothing and no graph job is left after the last one taken. A job that another table
    references through a foreign key forbidding its deletion is kept, with its graph
    (store.prune_guard). Returns how many it deleted;
    `on_batch` gets each batch's count (the CLI's progress bar)."""
    deleted = 0
    after: store.PruneCursor | None = None
    kept: set[UUID] = set()  # graphs found kept whole: later batches pass over their jobs
    guard = await store.prune_guard(conn)
    while True:
        count, last, also_kept = await store.prune(
            conn, keep_completed_s, keep_errors_s, batch, after, kept, guard
        )
        kept.update(also_kept)
        if count == 0 and last is None:
            return deleted
        if count:
            deleted += count
            if on_batch is not None:
                on_batch(count)
        if last is not None:
            after = last
        await asyncio.sleep(0)  # let claims through between batches


# The progress bar's total: finished jobs past retention. An upper bound of what the prune
# deletes, since a graph with a job not yet past retention stays whole.
PAST_RETENTION_SQL = """
SELECT count(*) FROM job_queue
WHERE status IN ('completed', 'error', 'cancelled')
  AND completed_at < now() - make_interval(secs => $1)
  AND (status <> 'error' OR completed_at < now() - make_interval(secs => $2))
"""


async def past_retention(conn: store.Conn, keep_completed_s: float, keep_errors_s: float) -> int:
    return int(await conn.fetchval(PAST_RETENTION_SQL, keep_completed_s, keep_errors_s))
