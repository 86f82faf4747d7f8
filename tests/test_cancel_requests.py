"""A cancel requested of a running job holds whatever becomes of the run: a job whose worker
dies or stops past its lease, whose worker hands it on as an internal task died, loses track of
it, or gives it back (a deferral, a stop past the grace period) ends `cancelled`. It never goes
back to the queue, where the next claim cleared the request and ran the job again."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

import asyncpg

from sidelinja_worker.queue import store
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import Defer
from sidelinja_worker.queue.registry import Registry
from tests.helpers import job_type, run_burst, running_worker, wait_for

RAN: list[UUID] = []


async def _record(ctx: JobContext, payload: Any) -> None:
    RAN.append(ctx.job_id)


REGISTRY = Registry([job_type("task", _record)])


async def _running_cancelled(
    pool: asyncpg.Pool, workspace: UUID, worker_id: UUID, *, expires: str
) -> UUID:
    """A job running under `worker_id` (a worker row expiring at `expires`, SQL), whose cancel
    was requested the documented way by plain SQL, and a plain child of it."""
    await pool.execute(
        "INSERT INTO job_workers (id, hostname, pid, expires_at)"
        f" VALUES ($1, 'elsewhere', 1, {expires})",
        worker_id,
    )
    job_id = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, worker_id, attempts,"
        " started_at, cancel_requested_at) VALUES ($1, 'task', '{}', 'running', $2, 1, now(),"
        " now()) RETURNING id",
        workspace,
        worker_id,
    )
    child = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status)"
        " VALUES ($1, 'task', '{}', 'waiting') RETURNING id",
        workspace,
    )
    await pool.execute(
        "INSERT INTO job_dependencies (parent_id, child_id) VALUES ($1, $2)", job_id, child
    )
    return job_id


async def _ended_cancelled(pool: asyncpg.Pool, job_id: UUID) -> None:
    row = await pool.fetchrow(
        "SELECT status::text, completed_at IS NOT NULL AS done, error_msg FROM job_queue"
        " WHERE id = $1",
        job_id,
    )
    assert (row["status"], row["done"]) == ("cancelled", True), dict(row)
    children = await pool.fetch(
        "SELECT j.status::text FROM job_queue j JOIN job_dependencies d ON d.child_id = j.id"
        " WHERE d.parent_id = $1",
        job_id,
    )
    assert [c[0] for c in children] == ["cancelled"]
    assert job_id not in RAN


async def test_a_dead_worker_s_job_whose_cancel_was_requested_is_cancelled_not_run_again(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    job_id = await _running_cancelled(pool, workspace, uuid4(), expires="now() - interval '1 s'")
    async with running_worker(pool, db_url, REGISTRY, poll_interval_s=0.05):
        await wait_for(
            lambda: pool.fetchval(
                "SELECT completed_at IS NOT NULL FROM job_queue WHERE id = $1", job_id
            )
        )
    await _ended_cancelled(pool, job_id)


async def test_a_job_handed_on_by_a_failing_worker_whose_cancel_was_requested_is_cancelled(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    worker_id = uuid4()
    job_id = await _running_cancelled(pool, workspace, worker_id, expires="now() + interval '1 h'")
    assert await store.abandon_worker(pool, worker_id, "its claim loop died") == [job_id]
    await _ended_cancelled(pool, job_id)


async def test_a_job_its_worker_never_got_whose_cancel_was_requested_is_cancelled(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """Running under a live worker that does not know it (a claim's answer lost on the way):
    the heartbeat gives it back, and a requested cancel ends it."""
    async with running_worker(pool, db_url, REGISTRY, lease_s=1.0) as worker:
        await wait_for(lambda: pool.fetchval("SELECT count(*) = 1 FROM job_workers"))
        await pool.execute("DELETE FROM job_workers WHERE id <> $1", worker.id)
        job_id = await _running_cancelled(
            pool, workspace, uuid4(), expires="now() + interval '1 h'"
        )
        await pool.execute("UPDATE job_queue SET worker_id = $1 WHERE id = $2", worker.id, job_id)
        await wait_for(
            lambda: pool.fetchval("SELECT status <> 'running' FROM job_queue WHERE id = $1", job_id)
        )
    await _ended_cancelled(pool, job_id)


async def test_a_job_deferred_after_its_cancel_was_requested_is_cancelled(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """A handler that defers (a rate limit, a resource held elsewhere) after the cancel was
    requested, before the worker read the request: the give-back ends the job instead."""

    async def defer(ctx: JobContext, payload: Any) -> None:
        if ctx.attempt > 1:
            RAN.append(ctx.job_id)
        await ctx.services.pool.execute(
            "UPDATE job_queue SET cancel_requested_at = now() WHERE id = $1", ctx.job_id
        )
        raise Defer("the service is busy", after_s=0.01)

    job_id = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'task', '{}')"
        " RETURNING id",
        workspace,
    )
    await run_burst(pool, db_url, Registry([job_type("task", defer)]))
    row = await pool.fetchrow("SELECT status::text, attempts FROM job_queue WHERE id = $1", job_id)
    assert tuple(row) == ("cancelled", 1)
    assert job_id not in RAN
