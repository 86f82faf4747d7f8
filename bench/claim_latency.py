"""How long one claim of 50 takes as the table grows: 10k pending, 10k pending beside 1M
finished rows, and 1M pending. Each claim runs in a transaction that is rolled back, so every
claim sees the same queue."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID, uuid4

import asyncpg

from sidelinja_worker import store
from sidelinja_worker.queries import QUERIES

CLAIM_LIMIT = 50
SAMPLES = 50
WARM_UP = 10  # past asyncpg's prepare and PostgreSQL's switch to a generic plan (5 runs)
SMALL = 10_000
LARGE = 1_000_000

# One statement per fill: jobs spread over the last hours, so the index order is real work.
FILL = """
INSERT INTO job_queue (workspace_id, job_type, payload, status, created_at, scheduled_for,
                       started_at, completed_at, attempts)
SELECT $1, 'noop', '{}'::jsonb, $3::job_status, t, t,
       CASE WHEN $3 = 'completed' THEN t END, CASE WHEN $3 = 'completed' THEN t END,
       CASE WHEN $3 = 'completed' THEN 1 ELSE 0 END
FROM (SELECT now() - make_interval(secs => g / 100.0) AS t
      FROM generate_series(1, $2) AS g) AS s
"""


@dataclass(frozen=True)
class ClaimTiming:
    label: str
    median_ms: float
    p90_ms: float


async def fill(conn: asyncpg.Connection, workspace_id: UUID, n: int, status: str) -> None:
    await conn.execute(FILL, workspace_id, n, status)
    await conn.execute("VACUUM ANALYZE job_queue")


async def time_claims(conn: asyncpg.Connection, worker_id: UUID, label: str) -> ClaimTiming:
    samples = []
    for i in range(WARM_UP + SAMPLES):
        tx = conn.transaction()
        await tx.start()
        try:
            started = time.perf_counter()
            claimed = await store.claim(conn, worker_id, CLAIM_LIMIT, ["noop"])
            elapsed_ms = (time.perf_counter() - started) * 1000
        finally:
            await tx.rollback()
        if len(claimed) != CLAIM_LIMIT:
            raise RuntimeError(f"claim returned {len(claimed)} jobs, expected {CLAIM_LIMIT}")
        if i >= WARM_UP:
            samples.append(elapsed_ms)
    deciles = statistics.quantiles(samples, n=10)
    return ClaimTiming(label, statistics.median(samples), deciles[8])


async def explain(conn: asyncpg.Connection, worker_id: UUID, generic: bool) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of the claim, rolled back; `generic` forces the plan that a
    prepared statement gets after five runs, which is the one the worker's pool uses."""
    tx = conn.transaction()
    await tx.start()
    try:
        if generic:
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        rows = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + QUERIES["claim"],
                                worker_id, CLAIM_LIMIT, ["noop"])
    finally:
        await tx.rollback()
    return "\n".join(r[0] for r in rows)


def plan_summary(plan: str) -> str:
    pending = "idx_job_queue_pending" in plan
    pkey = "job_queue_pkey" in plan
    seq = "Seq Scan on job_queue" in plan
    return (f"idx_job_queue_pending: {'yes' if pending else 'NO'}, "
            f"primary key: {'yes' if pkey else 'NO'}, seq scan of job_queue: {'YES' if seq else 'no'}")


async def measure(conn: asyncpg.Connection, workspace_id: UUID,
                  plan_file: Path) -> tuple[list[ClaimTiming], str]:
    """The three table shapes, smallest first; writes the 1M plans to `plan_file` and returns
    a one-line summary of the generic one."""
    await conn.execute("TRUNCATE job_queue, job_workers")
    worker_id = uuid4()
    await store.register_worker(conn, worker_id, "bench", 0, ["noop"], 3600)
    timings = []
    await fill(conn, workspace_id, SMALL, "pending")
    timings.append(await time_claims(conn, worker_id, "10k pending"))
    await fill(conn, workspace_id, LARGE, "completed")
    timings.append(await time_claims(conn, worker_id, "10k pending + 1M completed"))
    await conn.execute("TRUNCATE job_queue")
    await fill(conn, workspace_id, LARGE, "pending")
    timings.append(await time_claims(conn, worker_id, "1M pending"))
    custom = await explain(conn, worker_id, generic=False)
    generic = await explain(conn, worker_id, generic=True)
    plan_file.write_text(f"-- claim of {CLAIM_LIMIT}, 1M pending, custom plan\n{custom}\n\n"
                         f"-- same, generic plan (what a reused prepared statement runs)\n"
                         f"{generic}\n")
    return timings, f"custom plan: {plan_summary(custom)}; generic plan: {plan_summary(generic)}"
