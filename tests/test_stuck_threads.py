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
import threading
import time
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from sidelinja_worker.queue import threads
from sidelinja_worker.queue import worker as worker_module
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.registry import Registry
from sidelinja_worker.queue.settings import WorkerSettings
from sidelinja_worker.queue.worker import Worker, WorkerDied
from tests.helpers import SPAWNED, Spawned, job_type, wait_for_sql

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


async def test_a_worker_whose_jobs_left_too_many_threads_stuck_ends_itself(
    pool: asyncpg.Pool,
    db_url: str,
    workspace: UUID,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each of these jobs leaves three threads blocked after its timeout. Before, the worker
    went on with its pool shrinking: once the stuck threads passed the pool's spare ones,
    every job that needed a thread waited for one until its own timeout, and the worker
    looked alive throughout. Now, past the spare threads, it dies (exit 3 from `run`) and its
    jobs go back as for any death."""
    monkeypatch.setattr(worker_module, "THREAD_STUCK_S", 0.5)
    release = threading.Event()

    async def stuck(ctx: JobContext, payload: Any) -> None:
        await asyncio.gather(*(asyncio.to_thread(release.wait) for _ in range(3)))

    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, max_attempts)"
        " SELECT $1, 'stuck', '{}', 1 FROM generate_series(1, 4)",
        workspace,
    )
    worker = Worker(
        pool,
        db_url,
        Registry([job_type("stuck", stuck, timeout_s=0.3)]),
        WorkerSettings(poll_interval_s=0.05, max_concurrent=2),
    )
    try:
        with pytest.raises(WorkerDied) as died:
            await asyncio.wait_for(worker.run(), 30)
        assert died.value.task == "threads"
        stuck_threads = int(
            str(died.value).split("threads are held by work of jobs that ended")[0].split()[-1]
        )
        assert stuck_threads > 8, str(died.value)
        assert await pool.fetchval("SELECT array_agg(DISTINCT status::text) FROM job_queue") == [
            "error"
        ]
        assert await pool.fetchval("SELECT count(*) FROM job_workers") == 0
    finally:
        release.set()


def test_only_the_workers_own_work_for_jobs_it_no_longer_runs_is_left_behind() -> None:
    """Several workers may share a loop and its pool (tests run several): another worker's
    work, or the engine's own, is never counted as this one's left behind."""
    pool = threads.CountingPool(4, "test")
    release = threading.Event()
    for owner in (("me", "ended"), ("me", "running"), ("other", "ended"), None):
        token = threads.OWNER.set(owner)
        try:
            pool.submit(release.wait)
        finally:
            threads.OWNER.reset(token)
    assert pool.busy == 4

    def gone(owner: object) -> bool:
        return isinstance(owner, tuple) and owner[0] == "me" and owner[1] != "running"

    assert pool.left_behind(gone, 0) == 1
    release.set()
    pool.shutdown(wait=True)
    assert pool.busy == 0 and pool.left_behind(gone, 0) == 0
