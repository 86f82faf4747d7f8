"""Crash-only supervision: an internal task of the worker that dies takes the worker down
within 5 s, with one error line naming it; the worker stops heartbeating at once and gives its
jobs back, and `run --burst` exits with code 3 saying why."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.registry import Registry
from sidelinja_worker.queue.settings import WorkerSettings
from sidelinja_worker.queue.worker import EXIT_WORKER_DIED, Worker, WorkerDied
from tests.helpers import insert_jobs, job_type, wait_for


async def _quick(ctx: JobContext, payload: Any) -> dict[str, bool]:
    return {"ok": True}


async def test_a_dead_outcome_writer_stops_the_worker_and_its_heartbeat(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, caplog: pytest.LogCaptureFixture
) -> None:
    long_started = asyncio.Event()

    async def long(ctx: JobContext, payload: Any) -> None:
        long_started.set()
        await asyncio.sleep(60)

    await insert_jobs(pool, workspace, 1, job_type_name="long")
    worker = Worker(
        pool,
        db_url,
        Registry([job_type("quick", _quick), job_type("long", long)]),
        WorkerSettings(poll_interval_s=0.05, max_concurrent=4, lease_s=3),
    )

    async def broken_flush() -> None:
        raise RuntimeError("injected fault")

    worker._writer._flush = broken_flush  # type: ignore[method-assign]
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(long_started.wait(), 10)
    caplog.clear()
    await insert_jobs(pool, workspace, 1, job_type_name="quick")  # its outcome kills the writer
    began = time.monotonic()
    with pytest.raises(WorkerDied) as died:
        await asyncio.wait_for(task, 10)
    assert time.monotonic() - began < 5
    assert died.value.task == "outcomes" and "injected fault" in str(died.value)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "'outcomes' died: RuntimeError: injected fault" in errors[0].message
    # No lease left to renew, and no job left running under the dead worker: both went back to
    # the queue at once, each with its attempt counted.
    assert await pool.fetchval("SELECT count(*) FROM job_workers") == 0
    rows = await pool.fetch("SELECT job_type, status::text, attempts, error_msg FROM job_queue")
    assert {(r[0], r[1], r[2]) for r in rows} == {("long", "retry", 1), ("quick", "retry", 1)}
    assert all("abandoned by worker" in r[3] for r in rows)


async def _run_injected(
    script: str, db_url: str, *args: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    """The CLI run by `script` (which breaks something first), and how long it took."""
    env = {**os.environ, "DATABASE_URL": db_url, "SIDELINJA_LOG_FORMAT": "text"}
    began = time.monotonic()
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc, time.monotonic() - began


INJECT = """
import sys
from sidelinja_worker.queue import worker

async def broken(pool, settings, **_):
    raise RuntimeError("injected fault")

worker.rescue_loop = broken
from sidelinja_worker.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


async def test_run_burst_reports_a_dead_task_and_exits_3(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    await insert_jobs(pool, workspace, 3)
    proc, took = await _run_injected(INJECT, db_url, "run", "--burst")
    assert took < 30
    assert proc.returncode == EXIT_WORKER_DIED, proc.stderr
    assert "internal task 'rescue' died: RuntimeError: injected fault" in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sidelinja-worker: error:") and "exiting with code 3" in last
    assert await pool.fetchval("SELECT count(*) FROM job_workers") == 0
    assert await pool.fetchval("SELECT count(*) FROM job_queue WHERE status = 'running'") == 0


STUCK = """
import asyncio, dataclasses, sys
from sidelinja_worker.jobs.catalog import REGISTRY
from sidelinja_worker.queue import worker

running = asyncio.Event()

async def stubborn(ctx, payload):
    running.set()
    while True:  # a handler that ignores its cancellation
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            pass

REGISTRY._types["noop"] = dataclasses.replace(REGISTRY["noop"], handler=stubborn)

async def broken(pool, settings, **_):
    await running.wait()
    raise RuntimeError("injected fault")

worker.rescue_loop = broken
from sidelinja_worker.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


async def test_a_handler_that_ignores_cancellation_does_not_hold_the_exit(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    await insert_jobs(pool, workspace, 1)
    proc, took = await _run_injected(STUCK, db_url, "run", "--grace", "60s")
    assert proc.returncode == EXIT_WORKER_DIED, proc.stderr
    # Start-up, the injected second, and at most DIE_WITHIN_S: not the 60 s grace, nor forever.
    assert took < 20
    died_at = next(ln for ln in proc.stderr.splitlines() if "'rescue' died" in ln)
    assert died_at and "exiting with code 3" in proc.stderr.splitlines()[-1]
    # Handed back at once, counted: the stuck handler's job is due again.
    row = await pool.fetchrow("SELECT status::text, attempts, error_msg FROM job_queue")
    assert (row[0], row[1]) == ("retry", 1) and "abandoned by worker" in row[2]


async def test_demo_reports_a_dead_task(pool: asyncpg.Pool, db_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": db_url, "SIDELINJA_LOG_FORMAT": "text"}
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", INJECT, "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == EXIT_WORKER_DIED, proc.stderr
    assert "SAMPLE" in proc.stdout  # where every sample got to
    assert "The worker stopped early: internal task 'rescue' died" in proc.stdout


async def test_a_prune_that_postgresql_refuses_does_not_end_the_worker(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, caplog: pytest.LogCaptureFixture
) -> None:
    """A trigger of the web app's that refuses every delete from job_queue: the prune fails at
    every turn. It ended the worker, and, as every worker prunes when it starts, each restart:
    no job ran any more. Now each refusal is one error line, and jobs run."""
    await pool.execute(
        """
        CREATE SEQUENCE prune_refusals;
        CREATE FUNCTION refuse_deletes() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM nextval('prune_refusals');
            RAISE EXCEPTION 'jobs are kept for the auditors';
        END $$;
        CREATE TRIGGER refuse_deletes BEFORE DELETE ON job_queue
            FOR EACH ROW EXECUTE FUNCTION refuse_deletes();
        """
    )
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, completed_at)"
        " VALUES ($1, 'quick', '{}', 'completed', now() - interval '30 days')",
        workspace,
    )
    worker = Worker(
        pool,
        db_url,
        Registry([job_type("quick", _quick)]),
        WorkerSettings(poll_interval_s=0.05, prune_interval_s=0.05, keep_completed_s=86400),
    )
    running = asyncio.create_task(worker.run())
    try:
        await wait_for(lambda: pool.fetchval("SELECT last_value >= 3 FROM prune_refusals"))
        await insert_jobs(pool, workspace, 1, job_type_name="quick")
        await wait_for(
            lambda: pool.fetchval("SELECT count(*) = 2 FROM job_queue WHERE status = 'completed'")
        )
        assert not running.done()
    finally:
        worker.request_stop()
        await asyncio.wait_for(running, 10)
    refused = [r for r in caplog.records if r.getMessage().startswith("prune refused")]
    assert refused and "jobs are kept for the auditors" in refused[0].getMessage()
