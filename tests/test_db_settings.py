"""Settings a database administrator may give the role or the database do not bend the engine:
its statements keep the isolation they are written for, and bound their own time."""

from __future__ import annotations

import asyncio
import logging
import signal
from uuid import UUID

import asyncpg
import pytest

from tests.helpers import insert_jobs, run_burst, spawn, statuses, wait_for


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


async def test_a_statement_timeout_of_the_database_s_does_not_hold_outcomes_for_ever(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A statement_timeout set on the database (or the role), shorter than one completion (here
    a trigger makes it take 0.4 s; a parent settling a big graph's children takes seconds),
    cancelled that completion at every try however long the worker allowed it, and every
    outcome buffered with it waited for ever: the burst never ended. The worker's own sessions
    run without it; the engine bounds its statements itself."""
    await pool.execute(
        "CREATE FUNCTION test_slow_completion() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN PERFORM pg_sleep(0.4); RETURN NULL; END $$;"
        " CREATE TRIGGER test_slow_completion AFTER UPDATE ON job_queue FOR EACH ROW"
        " WHEN (NEW.status = 'completed' AND NEW.payload ? 'slow')"
        " EXECUTE FUNCTION test_slow_completion()"
    )
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT $1, 'noop', CASE WHEN g = 1 THEN '{\"slow\": 1}' ELSE '{}' END::jsonb"
        " FROM generate_series(1, 20) g",
        workspace,
    )
    database = await pool.fetchval("SELECT current_database()")
    await pool.execute(f'ALTER DATABASE "{database}" SET statement_timeout = 200')
    await asyncio.wait_for(run_burst(pool, db_url, max_concurrent=5), 20)
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE status = 'completed'") == 20


async def test_an_idle_session_timeout_does_not_end_the_worker_s_idle_connections(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A worker's connections idle by design: the LISTEN connection between notifications, the
    claim pool's floor between jobs. With the database's idle_session_timeout at 0.5 s, the
    server ended them every half second: a warning, a reconnect and a slow pickup each time.
    Here every session of an idle worker must outlive that, and jobs still run."""
    database = await pool.fetchval("SELECT current_database()")
    await pool.execute(f'ALTER DATABASE "{database}" SET idle_session_timeout = 500')
    worker = spawn("run", "--poll-interval", "100ms", url=db_url)
    async with pool.acquire() as conn:  # opened before: the timeout is not its own
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) >= 3 FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name LIKE 'sidelinja-worker %'"
                " AND state = 'idle' AND state_change < now() - interval '1.5 s'"
            ),
            what="the worker's sessions idle for three times the timeout",
        )
        await insert_jobs(pool, workspace, 5, job_type_name="noop")
        await wait_for(
            lambda: conn.fetchval("SELECT count(*) = 5 FROM job_queue WHERE status = 'completed'"),
            what="the jobs run",
        )
    worker.send_signal(signal.SIGTERM)
    _, err = await asyncio.to_thread(worker.communicate, 60)
    assert worker.returncode == 0, err[-2000:]
    assert "lost" not in err and "failed" not in err, err[-2000:]
