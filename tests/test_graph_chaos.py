"""Job graphs under concurrency: two workers run random graphs while plain-SQL writers insert
more graphs, cancel queued and running jobs and retry failed ones, the way the web app does
(docs/sql-contract.md, docs/workflows.md). Whatever the interleaving, no job runs before its
parents allow it, none is left waiting, and every cancellation names a parent that failed.
Before a parent put back in the queue held its released children again, about one run in
four found a `run_anyway` child claimed while its retried parent was due again; with lost
connections, one in eight then found one claimed while its parent, cancelled by a failed
grandparent and brought back by the grandparent's retry, waited (the deterministic cases are
in test_workflows.py: test_a_parent_put_back_in_the_queue_holds_its_released_children_again,
test_a_job_brought_back_from_cancelled_holds_its_released_children_again)."""

from __future__ import annotations

import asyncio
import random
from uuid import UUID, uuid4

import asyncpg
import pytest
from pydantic import BaseModel, ConfigDict

from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import PermanentError, RetryJob
from sidelinja_worker.queue.registry import Registry
from tests.helpers import job_type, running_worker, wait_for_sql

GRAPHS_FIRST = 60  # inserted before the workers start
GRAPHS_DURING = 30  # inserted while they run, among the cancels and retries
CHAOS_STEPS = 300
KILLS = 5  # rounds of ended worker connections, in the run with kills

# The parents a job may not run before (unfinished ones, and failed ones on a plain edge), as
# the job starts, and when it was claimed.
RECORD_RUN = """
INSERT INTO probe_runs (job_id, attempt, started_at, blocking)
SELECT $1, $2, (SELECT started_at FROM job_queue WHERE id = $1), ARRAY(
    SELECT p.id
    FROM job_dependencies d
    JOIN job_queue p ON p.id = d.parent_id
    WHERE d.child_id = $1
      AND NOT (p.status = 'completed' OR (d.run_anyway AND p.status IN ('error', 'cancelled'))))
"""


class ProbePayload(BaseModel):
    model_config = ConfigDict(frozen=True)
    mode: str


async def _probe(ctx: JobContext, payload: ProbePayload) -> dict[str, bool]:
    """Records each run with the parents that should have held it, then does as told."""
    await ctx.services.pool.execute(RECORD_RUN, ctx.job_id, ctx.attempt)
    await asyncio.sleep(random.random() * 0.004)  # work, so runs and chaos interleave
    if payload.mode == "fail":
        raise PermanentError("planned failure")
    if payload.mode == "flaky" and ctx.attempt == 1:
        raise RetryJob("planned retry", after_s=0.01)
    return {"ok": True}


REGISTRY = Registry([job_type("probe", _probe, payload_model=ProbePayload)])


async def _insert_graph(pool: asyncpg.Pool, workspace: UUID, rng: random.Random) -> None:
    """A random DAG of 2-10 jobs (edges only forward in a random order), in one transaction."""
    ids = [uuid4() for _ in range(rng.randint(2, 10))]
    modes = rng.choices(["ok", "fail", "flaky"], weights=[70, 15, 15], k=len(ids))
    edges = [
        (ids[i], ids[j], rng.random() < 0.3)
        for j in range(len(ids))
        for i in range(j)
        if rng.random() < 0.35
    ]
    async with pool.acquire() as conn, conn.transaction():
        await conn.executemany(
            "INSERT INTO job_queue (id, workspace_id, job_type, payload, max_attempts)"
            " VALUES ($1, $2, 'probe', $3, 3)",
            [(i, workspace, {"mode": m}) for i, m in zip(ids, modes, strict=True)],
        )
        if edges:
            await conn.executemany(
                "INSERT INTO job_dependencies (parent_id, child_id, run_anyway)"
                " VALUES ($1, $2, $3)",
                edges,
            )


async def _chaos(pool: asyncpg.Pool, workspace: UUID, rng: random.Random, kills: bool) -> None:
    """The web app's writes, as its docs give them, at random among the running graphs; with
    `kills`, every worker connection ended now and then, as a server restart ends them."""
    retried: dict[UUID, int] = {}
    for step in range(CHAOS_STEPS):
        if step % (CHAOS_STEPS // GRAPHS_DURING) == 0:
            await _insert_graph(pool, workspace, rng)
        if kills and step % (CHAOS_STEPS // KILLS) == CHAOS_STEPS // KILLS // 2:
            await pool.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name LIKE 'sidelinja-worker %' AND datname = current_database()"
            )
        row = await pool.fetchrow(
            "SELECT id, status::text FROM job_queue TABLESAMPLE BERNOULLI (20) LIMIT 1"
        )
        if row is None:
            continue
        job_id, status = row["id"], row["status"]
        roll = rng.random()
        if status == "error" and retried.get(job_id, 0) < 2 and roll < 0.7:
            retried[job_id] = retried.get(job_id, 0) + 1
            await pool.execute(
                "UPDATE job_queue SET status = 'pending', attempts = 0, scheduled_for = now()"
                " WHERE id = $1 AND status = 'error'",
                job_id,
            )
            # Committed by now: a claim that started before this may have taken its released
            # children (nothing takes back a start); one that started after may not.
            await pool.execute(
                "INSERT INTO put_back (job_id, committed_by) VALUES ($1, clock_timestamp())", job_id
            )
        elif status in ("pending", "retry") and roll < 0.08:
            await pool.execute(
                "UPDATE job_queue SET status = 'cancelled', completed_at = now()"
                " WHERE id = $1 AND status IN ('pending', 'retry')",
                job_id,
            )
        elif status == "running" and roll < 0.08:
            await pool.execute(
                "UPDATE job_queue SET cancel_requested_at = now() WHERE id = $1", job_id
            )
        await asyncio.sleep(0)


@pytest.mark.parametrize("kills", [False, True], ids=["writers", "writers and lost connections"])
async def test_random_graphs_under_cancels_and_retries_keep_every_rule(
    pool: asyncpg.Pool, db_url: str, workspace: UUID, kills: bool
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    await pool.execute(
        "CREATE TABLE probe_runs (job_id uuid, attempt int, started_at timestamptz,"
        " blocking uuid[]);"
        " CREATE TABLE put_back (job_id uuid, committed_by timestamptz)"
    )
    for _ in range(GRAPHS_FIRST):
        await _insert_graph(pool, workspace, rng)
    async with (
        running_worker(pool, db_url, REGISTRY, max_concurrent=6, poll_interval_s=0.05),
        running_worker(pool, db_url, REGISTRY, max_concurrent=6, poll_interval_s=0.05),
    ):
        await _chaos(pool, workspace, rng, kills)
        await wait_for_sql(
            pool,
            "SELECT count(*) = 0 FROM job_queue"
            " WHERE status IN ('pending', 'retry', 'waiting', 'running')",
            timeout_s=90,
        )
    where = f"(seed {seed})"
    # No run while a parent should have held it, but where the claim raced a put-back of
    # that parent or of a job above it (which brings the parent back): it started before the
    # put-back had committed.
    early = await pool.fetch(
        """
        SELECT r.job_id, r.attempt, r.blocking FROM probe_runs r
        WHERE cardinality(r.blocking) > 0 AND NOT EXISTS (
            WITH RECURSIVE above(id) AS (
                SELECT unnest(r.blocking)
                UNION
                SELECT d.parent_id FROM job_dependencies d JOIN above a ON d.child_id = a.id)
            SELECT 1 FROM put_back b JOIN above a ON a.id = b.job_id
            WHERE b.committed_by > r.started_at)
        """
    )
    assert not early, (where, early)
    # Every cancellation by a parent names a parent of its own that failed or was cancelled.
    wrong = await pool.fetch(
        """
        SELECT c.id, c.cancelled_by, p.status::text AS parent_status
        FROM job_queue c
        LEFT JOIN job_dependencies d ON d.child_id = c.id AND d.parent_id = c.cancelled_by
        LEFT JOIN job_queue p ON p.id = c.cancelled_by
        WHERE c.cancelled_by IS NOT NULL
          AND (d.child_id IS NULL OR p.status NOT IN ('error', 'cancelled'))
        """
    )
    assert not wrong, (where, wrong)
    # A completed job had every plain-edge parent completed; one whose parents all allowed it
    # was not cancelled by a parent; every completed job ran.
    blocked_done = await pool.fetch(
        "SELECT id FROM job_queue j WHERE status = 'completed'"
        " AND EXISTS (SELECT 1 FROM job_dependencies d JOIN job_queue p ON p.id = d.parent_id"
        "  WHERE d.child_id = j.id AND NOT d.run_anyway AND p.status <> 'completed')"
    )
    assert not blocked_done, (where, blocked_done)
    allowed_cancelled = await pool.fetch(
        "SELECT id FROM job_queue j WHERE cancelled_by IS NOT NULL"
        " AND NOT EXISTS (SELECT 1 FROM job_dependencies d JOIN job_queue p ON p.id = d.parent_id"
        "  WHERE d.child_id = j.id"
        "  AND NOT (p.status = 'completed' OR (d.run_anyway AND p.status IN ('error', 'cancelled'))))"
    )
    assert not allowed_cancelled, (where, allowed_cancelled)
    unrun = await pool.fetchval(
        "SELECT count(*) FROM job_queue j WHERE status = 'completed'"
        " AND NOT EXISTS (SELECT 1 FROM probe_runs r WHERE r.job_id = j.id)"
    )
    assert unrun == 0, where
    counts = dict(
        await pool.fetch("SELECT status::text, count(*) FROM job_queue GROUP BY 1")  # type: ignore[arg-type]
    )
    assert counts.get("completed", 0) > 100 and counts.get("cancelled", 0) > 0, (where, counts)
