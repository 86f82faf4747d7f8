"""An operator's controls: pausing a job type cluster-wide (SQL, CLI), draining one worker."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest

from sidelinja_worker.queue import store
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.queries import QUERIES
from sidelinja_worker.queue.registry import Registry
from sidelinja_worker.queue.settings import WorkerSettings
from sidelinja_worker.queue.worker import Worker
from tests.helpers import cli, insert_jobs, job_type, run_burst, statuses
from tests.test_claims import CLAIMS


async def _until(pool: asyncpg.Pool, sql: str, *args: Any, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not await pool.fetchval(sql, *args):
        assert time.monotonic() < deadline, sql
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("name", CLAIMS)
async def test_every_claim_skips_a_type_paused_in_sql(
    pool: asyncpg.Pool, workspace: UUID, name: str
) -> None:
    """The documented plain-SQL pause: the paused type's jobs stay pending, the other type's
    are claimed; the documented DELETE lets them be claimed again."""
    await insert_jobs(pool, workspace, 3, job_type_name="slow")
    await insert_jobs(pool, workspace, 2, job_type_name="fast")
    await pool.execute(
        "INSERT INTO job_type_pauses (job_type, paused_by, reason)"
        " VALUES ('slow', 'ops', 'GPU host down')"
    )
    worker_id = uuid4()
    await store.register_worker(pool, worker_id, "test", 1, ["slow", "fast"], 60)
    got = await pool.fetch(QUERIES[name], worker_id, 10, ["slow", "fast"], None)
    assert sorted(r["job_type"] for r in got) == ["fast", "fast"]
    await pool.execute("DELETE FROM job_type_pauses WHERE job_type = 'slow'")
    got = await pool.fetch(QUERIES[name], worker_id, 10, ["slow", "fast"], None)
    assert sorted(r["job_type"] for r in got) == ["slow"] * 3


async def test_pause_and_resume_from_the_cli_are_audited_and_explained(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    job_id = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')"
        " RETURNING id",
        workspace,
    )
    refused = cli("pause", "noop", url=db_url)
    assert refused.returncode == 2 and "--reason" in refused.stderr
    done = cli("pause", "noop", "--reason", "bad deploy", "--by", "alice", url=db_url)
    assert done.returncode == 0, done.stderr
    listed = cli("pause", url=db_url)
    assert "noop: paused" in listed.stdout and "alice" in listed.stdout, listed.stdout
    assert "1 job waiting" in listed.stdout
    why = cli("jobs", "why", str(job_id), url=db_url)
    assert "job type noop is paused cluster-wide (by alice" in why.stdout, why.stdout
    assert "bad deploy" in why.stdout
    # A burst worker leaves the paused type's job pending and ends.
    await run_burst(pool, db_url, job_types=("noop",))
    assert await statuses(pool) == {"pending": 1}
    done = cli("resume", "noop", "--reason", "fixed", "--by", "bob", url=db_url)
    assert done.returncode == 0 and "resumed noop" in done.stdout, done.stderr
    await run_burst(pool, db_url, job_types=("noop",))
    assert await statuses(pool) == {"completed": 1}
    audit = await pool.fetch("SELECT action, detail FROM admin_audit ORDER BY id")
    assert [(a["action"], a["detail"]["by"], a["detail"]["reason"]) for a in audit] == [
        ("pause", "alice", "bad deploy"),
        ("resume", "bob", "fixed"),
    ]
    assert cli("pause", "no_such_type", "--reason", "x", url=db_url).returncode == 2


async def test_a_drained_worker_finishes_its_jobs_and_takes_no_more(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Drain is read at the heartbeat: the job the worker runs completes, jobs enqueued after
    the drain stay pending while it is alive, and clearing the drain lets it claim again."""
    release = asyncio.Event()

    async def slow(_ctx: JobContext, _payload: Any) -> None:
        await release.wait()

    registry = Registry([job_type("slow", slow), job_type("fast", _quick)])
    worker = Worker(
        pool,
        db_url,
        registry,
        WorkerSettings(lease_s=0.6, poll_interval_s=0.05, max_concurrent=2),
    )
    run = asyncio.create_task(worker.run())
    try:
        await insert_jobs(pool, workspace, 1, job_type_name="slow")
        await _until(pool, "SELECT count(*) = 1 FROM job_queue WHERE status = 'running'")
        row = await pool.fetchrow("SELECT version, concurrency FROM job_workers")
        assert row["concurrency"] == 2 and row["version"]
        assert await store.drain_worker(pool, worker.id, "ops")
        deadline = time.monotonic() + 10
        while not worker.draining:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await insert_jobs(pool, workspace, 3, job_type_name="fast")
        release.set()
        await _until(pool, "SELECT count(*) = 1 FROM job_queue WHERE status = 'completed'")
        await asyncio.sleep(0.5)  # a few heartbeats and claim turns: still nothing new taken
        assert await statuses(pool) == {"completed": 1, "pending": 3}
        assert await store.drain_worker(pool, worker.id, "ops", drain=False)
        await _until(pool, "SELECT count(*) = 4 FROM job_queue WHERE status = 'completed'")
    finally:
        worker.request_stop()
        release.set()
        await asyncio.wait_for(run, 30)


async def _quick(_ctx: JobContext, _payload: Any) -> None:
    return None
