"""The claim statements, one per algorithm: each one's plan, the statement the worker picks,
and the one clock ("now") every claim reads, injectable here."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from uuid import UUID, uuid4

import asyncpg
import pytest

from sidelinja_worker.queue import store
from sidelinja_worker.queue.queries import QUERIES, parse
from tests.helpers import insert_jobs, make_workspace

CLAIMS = ("claim", "claim_capped", "claim_fair", "claim_fair_capped")

# The indexes each claim must reach job_queue through (and never a sequential scan of it).
PLAN_INDEXES = {
    "claim": {"idx_job_queue_pending"},
    "claim_capped": {"idx_job_queue_pending"},
    "claim_fair": {"idx_job_queue_workspace_pending"},
    "claim_fair_capped": {"idx_job_queue_workspace_pending"},
}


async def _worker(pool: asyncpg.Pool, job_types: list[str]) -> UUID:
    worker_id = uuid4()
    await store.register_worker(pool, worker_id, "test", 1, job_types, 60)
    return worker_id


def test_the_worker_picks_one_statement_per_algorithm() -> None:
    assert store.claim_statement(fair=False, type_capped=False) == "claim"
    assert store.claim_statement(fair=False, type_capped=True) == "claim_capped"
    assert store.claim_statement(fair=True, type_capped=False) == "claim_fair"
    assert store.claim_statement(fair=True, type_capped=True) == "claim_fair_capped"


def test_each_claim_is_short_enough_to_read_at_once() -> None:
    """A screenful of SQL each (the single statement they replace was 186 lines)."""
    for name in CLAIMS:
        sql = [ln for ln in QUERIES[name].splitlines() if not ln.lstrip().startswith("--")]
        assert len(sql) <= 110, name


@pytest.mark.parametrize("name", CLAIMS)
async def test_each_claims_generic_plan_uses_its_index(
    pool: asyncpg.Pool, workspace: UUID, name: str
) -> None:
    """The plan the worker's claim pool runs (a generic plan, as db.GENERIC_PLANS sets), over
    20,000 finished jobs and a few thousand pending ones in several workspaces: the claim reaches
    job_queue through its index, never a sequential scan, and never reads `workspaces`. Nor
    does it read the pauses whole: it looks its types up by key (an operator's 100,000 pauses
    of other types made a claim of 50 take 12 ms, where it takes 1)."""
    spaces = [workspace] + [await make_workspace(pool, f"w{i}") for i in range(4)]
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, status, completed_at)"
        " SELECT $1, 'noop', '{}', 'completed', now() FROM generate_series(1, 20000)",
        workspace,
    )
    for ws in spaces:
        await insert_jobs(pool, ws, 500)
    await pool.execute(
        "INSERT INTO job_type_pauses (job_type) SELECT 'other ' || i FROM generate_series(1, 10000) i"
    )
    await pool.execute("ANALYZE job_queue")
    await pool.execute("ANALYZE job_type_pauses")
    worker_id = await _worker(pool, ["noop"])
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await conn.execute(
            f"PREPARE c (uuid, integer, text[], timestamptz) AS {QUERIES[name].rstrip(';')}"
        )
        plan = "\n".join(
            r[0]
            for r in await conn.fetch(
                f"EXPLAIN (ANALYZE) EXECUTE c('{worker_id}', 50, ARRAY['noop'], NULL)"
            )
        )
        assert "$4" in plan or "$3" in plan, plan  # generic: the parameters are not inlined
        claimed = await conn.fetchval("SELECT count(*) FROM job_queue WHERE status = 'running'")
    assert claimed == 50, plan
    assert "Seq Scan on job_queue" not in plan, plan
    assert "on workspaces" not in plan, plan
    pause_scans = [ln for ln in plan.splitlines() if "Seq Scan on job_type_pauses" in ln]
    assert all("never executed" in ln for ln in pause_scans), plan  # only for a claim of all types
    assert "Tid Scan on job_queue" in plan, plan  # the UPDATE reads the locked versions by ctid
    for index in PLAN_INDEXES[name]:
        assert index in plan, plan


@pytest.mark.parametrize("name", CLAIMS)
async def test_every_claim_reads_the_one_injected_clock(
    pool: asyncpg.Pool, workspace: UUID, name: str
) -> None:
    """A job scheduled an hour ahead is not due now, and is due to a claim whose `now` is two
    hours ahead; the claim stamps `started_at` and measures the wait by that same clock."""
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload, scheduled_for)"
        " VALUES ($1, 'noop', '{}', now() + interval '1 hour')",
        workspace,
    )
    worker_id = await _worker(pool, ["noop"])
    fair, capped = name.startswith("claim_fair"), name.endswith("capped")
    if capped:
        await store.set_type_limit(pool, "noop", 5)

    async def take(now: object) -> list[store.ClaimedJob]:
        async with pool.acquire() as conn:
            if name == "claim":
                return await store.claim(conn, worker_id, 10, ["noop"], now=now)  # type: ignore[arg-type]
            return await store.claim_with_limits(
                conn,
                worker_id,
                10,
                ["noop"],
                fair,
                capped,
                now=now,  # type: ignore[arg-type]
            )

    assert await take(None) == []
    # The lease is read by the same clock: renew it past the injected time.
    await pool.execute(
        "UPDATE job_workers SET expires_at = now() + interval '3 hours' WHERE id = $1", worker_id
    )
    db_now = await pool.fetchval("SELECT now()")
    later = db_now + timedelta(hours=2)
    got = await take(later)
    assert len(got) == 1
    assert 3500 < got[0].waited_s < 3700
    assert await pool.fetchval("SELECT started_at FROM job_queue") == later


async def test_a_lease_that_lapses_by_the_injected_clock_claims_nothing(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    await insert_jobs(pool, workspace, 2)
    worker_id = await _worker(pool, ["noop"])  # a lease of 60 s
    later = await pool.fetchval("SELECT now() + interval '2 minutes'")
    for name in CLAIMS:
        async with pool.acquire() as conn:
            rows = await conn.fetch(QUERIES[name], worker_id, 10, ["noop"], later)
        assert rows == [], name


@pytest.mark.parametrize("name", ["claim_fair", "claim_fair_capped"])
async def test_equal_age_heads_are_not_won_by_the_same_workspace(
    pool: asyncpg.Pool, name: str
) -> None:
    """Jobs inserted by one statement are all as old as each other. A busy workspace (the
    lowest id, so first wherever the claim finds workspaces in id order) with 100 of them and
    19 workspaces with one each: twenty claims of one job give the busy one a share near its
    round-robin one (1 of 20), not every claim, as a tie settled in found order would."""
    busy = UUID(int=1)
    spaces = [busy] + [UUID(int=i) for i in range(2, 21)]
    await pool.execute(
        "INSERT INTO workspaces (id, name) SELECT w, w::text FROM unnest($1::uuid[]) AS w", spaces
    )
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT w, 'noop', '{}'::jsonb FROM unnest($1::uuid[]) AS w"
        " UNION ALL SELECT $2, 'noop', '{}' FROM generate_series(1, 99)",
        spaces,
        busy,
    )
    if name == "claim_fair_capped":
        await pool.execute(
            "INSERT INTO job_type_limits (job_type, max_running) VALUES ('noop', 50)"
        )
    worker_id = await _worker(pool, ["noop"])
    served = []
    for _ in range(20):
        rows = await pool.fetch(QUERIES[name], worker_id, 1, ["noop"], None)
        served += [r["workspace_id"] for r in rows]
    assert len(served) == 20
    # Drawn fairly, the busy workspace gets ~2.5 of 20 on average, and 10 or more (or fewer
    # than 11 workspaces served) never happened in 200,000 simulated runs of the draw.
    assert served.count(busy) < 10, served.count(busy)
    assert len(set(served)) >= 11


def test_fragments_are_included_and_never_statements() -> None:
    """The claims share their SET and RETURNING lists as fragments (`-- name: _x`), so a fix
    to what a claim computes from a row is made once for every algorithm."""
    blocks = parse(
        "-- name: _tail\nRETURNING id;\n\n-- name: one\nUPDATE t SET a = 1\n-- include: _tail\n"
    )
    assert blocks == {"one": "UPDATE t SET a = 1\nRETURNING id;"}
    for name in CLAIMS:
        assert "least(attempts, 32766) + 1" in QUERIES[name]
        assert "isfinite(scheduled_for)" in QUERIES[name]
        assert "-- include:" not in QUERIES[name]


async def test_rows_updated_by_others_while_claims_run_are_claimed_once_and_never_lost(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    """The claims update the row versions they locked, by ctid. Meanwhile another writer keeps
    updating due rows (the web app changing priorities), so a row's version can move between a
    claim's snapshot and its lock: such a row must be left due for a later claim. Four
    claimers, one per statement, race the writer: every job is claimed exactly once, by the
    worker its claim returned it to, with one attempt, and none is left behind."""
    spaces = [workspace, await make_workspace(pool, "w1"), await make_workspace(pool, "w2")]
    for ws in spaces:
        await insert_jobs(pool, ws, 1000)
    total = 3000
    claimed: dict[UUID, UUID] = {}
    duplicates: list[UUID] = []
    writes = 0
    done = False

    async def claimer(fair: bool, capped: bool) -> None:
        worker_id = await _worker(pool, ["noop"])
        async with pool.acquire() as conn:
            for _ in range(2000):
                jobs = await store.claim_with_limits(conn, worker_id, 37, ["noop"], fair, capped)
                for job in jobs:
                    if job.id in claimed:
                        duplicates.append(job.id)
                    claimed[job.id] = worker_id
                if not jobs and len(claimed) >= total:
                    return

    async def writer() -> None:
        nonlocal writes
        async with pool.acquire() as conn:
            while not done:
                await conn.execute(
                    "UPDATE job_queue SET priority = (random() * 2)::int"
                    " WHERE id IN (SELECT id FROM job_queue WHERE status = 'pending'"
                    "              ORDER BY random() LIMIT 25)"
                )
                writes += 1

    churn = asyncio.create_task(writer())
    try:
        await asyncio.gather(
            *(claimer(fair, capped) for fair in (False, True) for capped in (False, True))
        )
    finally:
        done = True
        await churn
    assert writes > 0
    assert duplicates == []
    assert len(claimed) == total
    rows = await pool.fetch("SELECT id, status::text, attempts, worker_id FROM job_queue")
    assert {(r["status"], r["attempts"]) for r in rows} == {("running", 1)}
    assert {r["id"]: r["worker_id"] for r in rows} == claimed
