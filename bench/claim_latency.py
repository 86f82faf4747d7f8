"""How long one claim of 50 takes as the table grows: 10k pending, 10k pending beside 1M
finished rows, and 1M pending; for the plain and the fair claim. Each claim runs in a
transaction that is rolled back, so every claim sees the same queue."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID, uuid4

import asyncpg

from sidelinja_worker.queue import store
from sidelinja_worker.queue.jobs import ClaimedJob
from sidelinja_worker.queue.queries import QUERIES

CLAIM_LIMIT = 50
JOB_TYPES = ["noop"]
SAMPLES = 50
WARM_UP = 10  # past asyncpg's prepare and PostgreSQL's switch to a generic plan (5 runs)
SMALL = 10_000
LARGE = 1_000_000

# One statement per fill: jobs spread over the last hours, so the index order is real work.
FILL = """
INSERT INTO job_queue (workspace_id, job_type, payload, status, created_at, scheduled_for,
                       started_at, completed_at, attempts)
SELECT ($1::uuid[])[1 + g % cardinality($1::uuid[])], 'noop', '{}'::jsonb, $3::job_status, t, t,
       CASE WHEN $3 = 'completed' THEN t END, CASE WHEN $3 = 'completed' THEN t END,
       CASE WHEN $3 = 'completed' THEN 1 ELSE 0 END
FROM (SELECT g, now() - make_interval(secs => g / 100.0) AS t
      FROM generate_series(1, $2) AS g) AS s
"""


@dataclass(frozen=True)
class Variant:
    """One of the worker's claim statements: how to call it and how to EXPLAIN it."""

    name: str
    query: str  # its block in sql/queries.sql
    fair: bool | None  # None: `store.claim`; else `store.claim_with_limits(fair=...)`

    async def claim(self, conn: asyncpg.Connection, worker_id: UUID) -> list[ClaimedJob]:
        if self.fair is None:
            return await store.claim(conn, worker_id, CLAIM_LIMIT, JOB_TYPES)
        return await store.claim_with_limits(
            conn, worker_id, CLAIM_LIMIT, JOB_TYPES, fair=self.fair, capped=False
        )

    def params(self, worker_id: UUID) -> tuple[object, ...]:
        base = (worker_id, CLAIM_LIMIT, JOB_TYPES)
        return base if self.fair is None else (*base, self.fair)


# The plain claim is the one the issue names; the fair one is what a worker runs by default
# (queue setting fair_workspaces, on unless turned off).
VARIANTS = (Variant("plain", "claim", None), Variant("fair", "claim_fair", True))


@dataclass(frozen=True)
class ClaimTiming:
    label: str
    variant: str
    median_ms: float
    p90_ms: float


async def fill(conn: asyncpg.Connection, workspace_ids: list[UUID], n: int, status: str) -> None:
    """n jobs dealt round-robin to the workspaces."""
    await conn.execute(FILL, workspace_ids, n, status)
    await conn.execute("VACUUM ANALYZE job_queue")


async def time_claims(
    conn: asyncpg.Connection, worker_id: UUID, variant: Variant, label: str
) -> ClaimTiming:
    samples = []
    for i in range(WARM_UP + SAMPLES):
        tx = conn.transaction()
        await tx.start()
        try:
            started = time.perf_counter()
            claimed = await variant.claim(conn, worker_id)
            elapsed_ms = (time.perf_counter() - started) * 1000
        finally:
            await tx.rollback()
        if len(claimed) != CLAIM_LIMIT:
            raise RuntimeError(
                f"{variant.name} claim returned {len(claimed)} jobs, expected {CLAIM_LIMIT}"
            )
        if i >= WARM_UP:
            samples.append(elapsed_ms)
    deciles = statistics.quantiles(samples, n=10)
    return ClaimTiming(label, variant.name, statistics.median(samples), deciles[8])


async def time_all(conn: asyncpg.Connection, worker_id: UUID, label: str) -> list[ClaimTiming]:
    return [await time_claims(conn, worker_id, v, label) for v in VARIANTS]


async def explain(
    conn: asyncpg.Connection, worker_id: UUID, variant: Variant, generic: bool
) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of the claim, rolled back; `generic` forces the plan that a
    prepared statement gets after five runs, which is the one the worker's pool uses."""
    tx = conn.transaction()
    await tx.start()
    try:
        if generic:
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        rows = await conn.fetch(
            "EXPLAIN (ANALYZE, BUFFERS) " + QUERIES[variant.query], *variant.params(worker_id)
        )
    finally:
        await tx.rollback()
    return "\n".join(r[0] for r in rows)


def plan_summary(plan: str) -> str:
    indexes = [
        name
        for name in ("idx_job_queue_pending", "idx_job_queue_workspace_pending", "job_queue_pkey")
        if name in plan
    ]
    seq = "Seq Scan on job_queue" in plan
    return f"{', '.join(indexes) or 'no index'}{'; SEQ SCAN of job_queue' if seq else ''}"


async def write_plans(conn: asyncpg.Connection, worker_id: UUID, plan_file: Path) -> str:
    """Both variants' custom and generic plans at 1M pending into `plan_file`; returns a
    one-line summary of which indexes each generic plan uses."""
    sections, summary = [], []
    for variant in VARIANTS:
        for generic in (False, True):
            plan = await explain(conn, worker_id, variant, generic)
            kind = "generic plan (a reused prepared statement)" if generic else "custom plan"
            sections.append(
                f"-- {variant.name} claim ({variant.query}) of {CLAIM_LIMIT}, "
                f"1M pending, {kind}\n{plan}\n"
            )
            if generic:
                summary.append(f"{variant.name}: {plan_summary(plan)}")
    plan_file.write_text("\n".join(sections))
    return "; ".join(summary)


async def measure(
    conn: asyncpg.Connection, workspace_id: UUID, plan_file: Path
) -> tuple[list[ClaimTiming], str]:
    """The table shapes, smallest first; returns every timing and the plan summary. The last
    three are the fair claim's hard cases: 10k pending jobs spread over 100 workspaces, each of
    which it must look at, 10k pending in one of 10,000 workspaces, where it must not look at
    the idle ones, and 10k pending over 1,000 of them, where a claim of 50 must not lock a row
    in each of the 1,000."""
    await conn.execute("TRUNCATE job_queue, job_workers")
    # As the worker's claim pool runs them (db.GENERIC_PLANS); reset at the end.
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    worker_id = uuid4()
    await store.register_worker(conn, worker_id, "bench", 0, JOB_TYPES, 3600)
    await fill(conn, [workspace_id], SMALL, "pending")
    timings = await time_all(conn, worker_id, "10k pending")
    await fill(conn, [workspace_id], LARGE, "completed")
    timings += await time_all(conn, worker_id, "10k pending + 1M completed")
    await conn.execute("TRUNCATE job_queue")
    await fill(conn, [workspace_id], LARGE, "pending")
    timings += await time_all(conn, worker_id, "1M pending")
    plans = await write_plans(conn, worker_id, plan_file)
    await conn.execute("TRUNCATE job_queue")
    others = [
        r[0]
        for r in await conn.fetch(
            "INSERT INTO workspaces (name) SELECT 'bench ' || g FROM generate_series(1, 99) g"
            " RETURNING id"
        )
    ]
    await fill(conn, [workspace_id, *others], SMALL, "pending")
    timings += await time_all(conn, worker_id, "10k pending, 100 workspaces")
    await conn.execute("TRUNCATE job_queue")
    # A platform of many workspaces, one busy: the idle ones must cost the fair claim nothing.
    others += [
        r[0]
        for r in await conn.fetch(
            "INSERT INTO workspaces (name) SELECT 'bench idle ' || g FROM generate_series(1, 9900) g"
            " RETURNING id"
        )
    ]
    await fill(conn, [workspace_id], SMALL, "pending")
    timings += await time_all(conn, worker_id, "10k pending in 1 of 10,000 workspaces")
    await conn.execute("TRUNCATE job_queue")
    await fill(conn, [workspace_id, *others[:999]], SMALL, "pending")
    timings += await time_all(conn, worker_id, "10k pending over 1,000 busy of 10,000 workspaces")
    await conn.execute("TRUNCATE job_queue")
    await conn.execute("DELETE FROM workspaces WHERE id = ANY($1::uuid[])", others)
    await conn.execute("RESET plan_cache_mode")
    return timings, plans
