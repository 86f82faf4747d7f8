"""How long one claim of 50 takes as the table grows: 10k pending, 10k pending beside 1M
finished rows, and 1M pending; for each claim statement (plain, capped, fair, fair capped).
Each claim runs in a transaction that is rolled back, so every claim sees the same queue.

Run alone, it times this checkout's statements beside another revision's in the same run
(same database, same fill, claims interleaved by variant):

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \
        .venv/bin/python bench/claim_latency.py [--compare REV] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID, uuid4

import asyncpg

from sidelinja_worker.queue import queries, store
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
    """One claim statement: its SQL and its arguments. The capped ones count running jobs of
    `noop` against a cap (set by `measure`) that never bites, as a worker with a cap runs them;
    the claim lock they take in the worker is left out (it is uncontended here)."""

    name: str
    query: str  # its block in sql/queries.sql
    sql: str
    args: tuple[object, ...] = ()  # after (worker, limit, job types)

    async def claim(self, conn: asyncpg.Connection, worker_id: UUID) -> list[ClaimedJob]:
        rows = await conn.fetch(self.sql, *self.params(worker_id))
        return [ClaimedJob(*r) for r in rows]

    def params(self, worker_id: UUID) -> tuple[object, ...]:
        return (worker_id, CLAIM_LIMIT, JOB_TYPES, *self.args)


# The plain claim is the one the flat-claim target is about; the fair one is what a worker runs
# by default (queue setting fair_workspaces, on unless turned off); the capped ones run when a
# job type of the worker's has a cap.
VARIANTS = tuple(
    Variant(name, query, QUERIES[query], (None,))
    for name, query in (
        ("plain", "claim"),
        ("capped", "claim_capped"),
        ("fair", "claim_fair"),
        ("fair capped", "claim_fair_capped"),
    )
)


def old_variants(rev: str) -> tuple[Variant, ...]:
    """The claims of revision `rev`: each algorithm's statement, or, before each had its own,
    the plain claim and the one fair statement with fairness off or on ($4)."""
    text = subprocess.run(
        ["git", "show", f"{rev}:sidelinja_worker/queue/sql/queries.sql"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    ).stdout
    old = queries.parse(text)
    if "claim_fair_capped" in old:  # a statement per algorithm, as now
        return tuple(Variant(f"{v.name} (old)", v.query, old[v.query], v.args) for v in VARIANTS)
    return (
        Variant("plain (old)", "claim", old["claim"]),
        Variant("capped (old)", "claim_fair", old["claim_fair"], (False,)),
        Variant("fair (old)", "claim_fair", old["claim_fair"], (True,)),
    )


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


async def time_all(
    conn: asyncpg.Connection, worker_id: UUID, label: str, variants: tuple[Variant, ...] = VARIANTS
) -> list[ClaimTiming]:
    return [await time_claims(conn, worker_id, v, label) for v in variants]


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
            "EXPLAIN (ANALYZE, BUFFERS) " + variant.sql, *variant.params(worker_id)
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


async def write_plans(
    conn: asyncpg.Connection, worker_id: UUID, plan_file: Path, variants: tuple[Variant, ...]
) -> str:
    """Both variants' custom and generic plans at 1M pending into `plan_file`; returns a
    one-line summary of which indexes each generic plan uses."""
    sections, summary = [], []
    for variant in variants:
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
    conn: asyncpg.Connection,
    workspace_id: UUID,
    plan_file: Path,
    variants: tuple[Variant, ...] = VARIANTS,
    large: int = LARGE,
) -> tuple[list[ClaimTiming], str]:
    """The table shapes, smallest first; returns every timing and the plan summary. The last
    three are the fair claim's hard cases: 10k pending jobs spread over 100 workspaces, each of
    which it must look at, 10k pending in one of 10,000 workspaces, where it must not look at
    the idle ones, and 10k pending over 1,000 of them, where a claim of 50 must not lock a row
    in each of the 1,000."""
    big = "1M" if large == 1_000_000 else f"{large // 1000}k"
    await conn.execute("TRUNCATE job_queue, job_workers")
    await store.set_type_limit(conn, "noop", 1_000_000)  # counted by the capped claims
    # As the worker's claim pool runs them (db.GENERIC_PLANS); reset at the end.
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    worker_id = uuid4()
    await store.register_worker(conn, worker_id, "bench", 0, JOB_TYPES, 3600)
    await fill(conn, [workspace_id], SMALL, "pending")
    timings = await time_all(conn, worker_id, variants=variants, label="10k pending")
    await fill(conn, [workspace_id], large, "completed")
    timings += await time_all(
        conn, worker_id, variants=variants, label=f"10k pending + {big} completed"
    )
    await conn.execute("TRUNCATE job_queue")
    await fill(conn, [workspace_id], large, "pending")
    timings += await time_all(conn, worker_id, variants=variants, label=f"{big} pending")
    plans = await write_plans(conn, worker_id, plan_file, variants)
    await conn.execute("TRUNCATE job_queue")
    others = [
        r[0]
        for r in await conn.fetch(
            "INSERT INTO workspaces (name) SELECT 'bench ' || g FROM generate_series(1, 99) g"
            " RETURNING id"
        )
    ]
    await fill(conn, [workspace_id, *others], SMALL, "pending")
    timings += await time_all(
        conn, worker_id, variants=variants, label="10k pending, 100 workspaces"
    )
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
    timings += await time_all(
        conn, worker_id, variants=variants, label="10k pending in 1 of 10,000 workspaces"
    )
    await conn.execute("TRUNCATE job_queue")
    await fill(conn, [workspace_id, *others[:999]], SMALL, "pending")
    timings += await time_all(
        conn, worker_id, variants=variants, label="10k pending over 1,000 busy of 10,000 workspaces"
    )
    await conn.execute("TRUNCATE job_queue")
    await conn.execute("DELETE FROM workspaces WHERE id = ANY($1::uuid[])", others)
    await store.set_type_limit(conn, "noop", None)
    await conn.execute("RESET plan_cache_mode")
    return timings, plans


async def _main(compare: str | None, quick: bool) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.common import create_database, drop_database
    from sidelinja_worker.queue import migrate
    from sidelinja_worker.queue.db import connect

    admin_url = os.environ["DATABASE_URL"]
    name = f"claim_bench_{os.getpid()}"
    url = await create_database(admin_url, name)
    try:
        conn = await connect(url)
        try:
            await migrate.apply_all(conn)
            workspace_id = await conn.fetchval(
                "INSERT INTO workspaces (name) VALUES ('bench') RETURNING id"
            )
            variants = VARIANTS + (old_variants(compare) if compare else ())
            # Interleaved by name, so old and new of one algorithm run back to back.
            variants = tuple(sorted(variants, key=lambda v: v.name))
            plan_file = Path(os.environ.get("TMPDIR", "/tmp")) / "claim_plans.txt"
            timings, plans = await measure(
                conn, workspace_id, plan_file, variants, 100_000 if quick else LARGE
            )
        finally:
            await conn.close()
    finally:
        await drop_database(admin_url, name)
    print(f"claim of {CLAIM_LIMIT}: median / p90 ms (generic plans); plans in {plan_file}")
    for label in dict.fromkeys(t.label for t in timings):
        print(f"\n{label}")
        for t in (t for t in timings if t.label == label):
            print(f"  {t.variant:<18} {t.median_ms:7.2f} / {t.p90_ms:7.2f}")
    print(f"\n{plans}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", help="a git revision whose claims to time beside these")
    parser.add_argument("--quick", action="store_true", help="100k rows instead of 1M")
    ns = parser.parse_args()
    asyncio.run(_main(ns.compare, ns.quick))
