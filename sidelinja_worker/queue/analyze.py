"""Keeps PostgreSQL's statistics of job_queue fresh enough for the claims' plans.

A worker prepares its claims once and runs them with generic plans (db.GENERIC_PLANS). Such a
plan is made from the table's statistics and size at its first run, and kept until the
statistics change. Made while job_queue was empty, as in a new database, the fair claim's plan
scans and sorts the whole table once per workspace with due jobs: after a bulk load of 20,000
jobs over 100 workspaces, a claim of 1,000 took ~590 ms, against ~12 ms once the table was
analyzed (one workspace: ~95 against ~8 ms). Over more workspaces and a bigger load, every
claim outlasts its statement timeout and nothing is claimed at all. Autovacuum's ANALYZE ends
this within its nap time (a minute by default), and never where autovacuum is off for the
table.

So every worker looks every CHECK_S whether the table has changed by more rows than it held
at its last ANALYZE (and by at least MIN_ROWS), and if so, and its role may, runs ANALYZE
itself, one worker at a time. New statistics invalidate every session's cached plans of
job_queue: the next claim, in every worker, is planned afresh. The threshold is far above
autovacuum's (a tenth of the table), so on a table autovacuum looks after this never runs;
it is for a table that grew from (nearly) nothing faster than autovacuum looked."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Literal

import asyncpg

from sidelinja_worker.queue import store
from sidelinja_worker.queue.db import DB_ERRORS

log = logging.getLogger("sidelinja_worker.analyze")

CHECK_S = 5.0
MIN_ROWS = 10_000  # below this, any plan claims quickly enough
ANALYZE_TIMEOUT_S = 120.0  # ANALYZE reads a sample (30,000 rows by default), not the table
WARN_EVERY_S = 3600.0  # how often a worker that may not ANALYZE says so, while it is needed

Outcome = Literal["fresh", "analyzed", "busy", "not permitted"]


async def refresh_if_stale(pool: asyncpg.Pool, min_rows: int = MIN_ROWS) -> Outcome:
    """One look: ANALYZE job_queue if its statistics are stale and this role may (the table's
    or the database's owner); "busy" when another worker is at it."""
    async with pool.acquire() as conn:
        stale, may_analyze = await store.statistics_state(conn, min_rows)
        if not stale:
            return "fresh"
        if not may_analyze:
            return "not permitted"
        if not await store.analyze_queue(conn, ANALYZE_TIMEOUT_S):
            return "busy"
    log.info("analyzed job_queue: its statistics predated most of its rows")
    return "analyzed"


async def analyze_loop(pool: asyncpg.Pool, every_s: float = CHECK_S) -> None:
    """Runs for the worker's life. A failed look is retried at the next; none kills the
    worker, as claims still work (slowly) on a stale plan, and autovacuum may yet help."""
    warned_at: float | None = None
    while True:
        try:
            outcome = await refresh_if_stale(pool)
        except (*DB_ERRORS, asyncpg.PostgresError) as exc:
            log.debug("job_queue statistics not checked: %s", exc)
        else:
            now = time.monotonic()
            if outcome == "not permitted" and (
                warned_at is None or now - warned_at >= WARN_EVERY_S
            ):
                warned_at = now
                log.warning(
                    "job_queue's statistics predate most of its rows, so claims may be planned"
                    " badly, and this worker's role may not ANALYZE it: run ANALYZE job_queue"
                    " as its owner, and check that autovacuum runs"
                )
        await asyncio.sleep(every_s)
