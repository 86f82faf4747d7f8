"""Settings a database administrator may give the role or the database do not bend the engine:
its statements keep the isolation they are written for."""

from __future__ import annotations

import asyncio
import logging
from uuid import UUID

import asyncpg
import pytest

from tests.helpers import insert_jobs, run_burst, statuses


@pytest.mark.parametrize("isolation", ["serializable", "repeatable read"])
async def test_a_stricter_default_isolation_costs_the_workers_no_failed_statement(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    isolation: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the database's default isolation SERIALIZABLE, three workers draining 3,000 jobs
    had 6-13 claims and outcome writes fail and retried (REPEATABLE READ: ~1): the engine's
    statements are written for READ COMMITTED (SKIP LOCKED, a recheck of a row another
    transaction changed) and now run so whatever the default."""
    database = await pool.fetchval("SELECT current_database()")
    await pool.execute(
        f"ALTER DATABASE \"{database}\" SET default_transaction_isolation = '{isolation}'"
    )
    await insert_jobs(pool, workspace, 3000, job_type_name="noop")
    await asyncio.gather(*(run_burst(pool, db_url, max_concurrent=20) for _ in range(3)))
    assert await statuses(pool) == {"completed": 3000}
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert failures == []
