"""A stopped worker exits although a handler's thread work never returns.

A job's timeout cancels its handler, not a thread the handler is waiting for: a blocking call
that never returns (a read from a hung network mount, a C library waiting for ever) keeps its
thread. asyncio's shutdown and the interpreter's exit wait for every thread of the pool, so
such a worker, asked to stop, never exited, and a `run --burst` never ended once its queue
was empty."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from uuid import UUID

import asyncpg

from tests.helpers import SPAWNED, Spawned, wait_for_sql

# `sidelinja-worker` with one more job type, whose thread work never ends (an hour here).
WORKER = """
import asyncio, sys, time
from sidelinja_worker.jobs import catalog
from sidelinja_worker.queue.registry import Registry
from tests.helpers import job_type

async def _stuck(ctx, payload):
    await asyncio.to_thread(time.sleep, 3600)

catalog.REGISTRY = Registry(
    [*catalog.REGISTRY.values(), job_type("stuck_thread", _stuck, timeout_s=0.5)]
)
from sidelinja_worker.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _worker(db_url: str, *args: str) -> Spawned:
    env = {**os.environ, "DATABASE_URL": db_url, "SIDELINJA_LOG_FORMAT": "text"}
    proc = Spawned([sys.executable, "-c", WORKER, *args], env)
    SPAWNED.append(proc)
    return proc


async def _stderr_at_exit(proc: Spawned, timeout_s: float = 30) -> str:
    """Waits for the process to exit (killed if it has not after `timeout_s`); its stderr."""
    try:
        _, err = await asyncio.to_thread(proc.communicate, timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
    return err


async def _stuck_job(pool: asyncpg.Pool, workspace: UUID) -> UUID:
    return await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, max_attempts)"
        " VALUES ($1, 'stuck_thread', '{}', 1) RETURNING id",
        workspace,
    )


async def test_a_burst_ends_although_a_timed_out_jobs_thread_never_returns(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Before, the burst ran its jobs and then never exited (killed here after 30 s)."""
    job = await _stuck_job(pool, workspace)
    began = time.monotonic()
    proc = _worker(db_url, "run", "--burst")
    err = await _stderr_at_exit(proc)
    assert proc.returncode == 0, err[-2000:]
    assert time.monotonic() - began < 20
    assert "1 thread(s) of handler work still running" in err, err[-2000:]
    row = await pool.fetchrow("SELECT status, error_msg FROM job_queue WHERE id = $1", job)
    assert (row["status"], row["error_msg"]) == ("error", "timed out after 0.5 s")


async def test_a_stop_signal_ends_a_worker_whose_handler_thread_never_returns(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Before, the worker said it was stopping and then waited for the thread for ever."""
    job = await _stuck_job(pool, workspace)
    proc = _worker(db_url, "run")
    await wait_for_sql(pool, "SELECT status = 'error' FROM job_queue WHERE id = $1", job)
    stopped = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    err = await _stderr_at_exit(proc)
    assert proc.returncode == 0, err[-2000:]
    assert time.monotonic() - stopped < 15
    assert await pool.fetchval("SELECT count(*) FROM job_workers") == 0
