"""Claim order, backoff, enqueue in the caller's transaction, plain-SQL jobs, --types."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest

from sidelinja_worker.queue import client, store
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.pools import open_claim_pool
from sidelinja_worker.queue.queries import QUERIES as Q
from sidelinja_worker.queue.registry import Registry
from tests.helpers import insert_jobs, job_type, make_workspace, run_burst, statuses


async def _worker_row(pool: asyncpg.Pool) -> UUID:
    worker_id = uuid4()
    await store.register_worker(pool, worker_id, "test", 0, None, 60)
    return worker_id


async def test_claim_takes_priority_then_oldest_and_skips_future(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    rows = [  # (label, priority, scheduled_for offset in seconds)
        ("low-old", 0, -30),
        ("high-new", 10, -1),
        ("high-old", 10, -20),
        ("mid", 5, -10),
        ("future-high", 100, 3600),
    ]
    for label, priority, offset in rows:
        await pool.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload, priority, scheduled_for)"
            " VALUES ($1, 'noop', jsonb_build_object('label', $2::text), $3,"
            " now() + make_interval(secs => $4))",
            workspace,
            label,
            priority,
            offset,
        )
    worker_id = await _worker_row(pool)
    order = []
    for _ in range(5):
        claimed = await store.claim(pool, worker_id, 1, ["noop"])
        order += [job.payload["label"] for job in claimed]
    assert order == ["high-old", "high-new", "mid", "low-old"]
    running = await pool.fetchrow(
        "SELECT status::text, started_at IS NOT NULL AS started, attempts, worker_id"
        " FROM job_queue WHERE payload->>'label' = 'mid'"
    )
    assert tuple(running) == ("running", True, 1, worker_id)


async def test_backoff_is_30_60_120_then_error(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    job_id = await client.enqueue(pool, workspace, "noop", {"fail": "upstream 503"}, max_attempts=4)
    delays = []
    for attempt in range(1, 5):
        await run_burst(pool, db_url)
        row = await store.get_job(pool, job_id)
        assert row is not None
        last = row["errors"]
        assert len(last) == attempt and last[-1]["message"] == "upstream 503"
        if attempt < 4:
            assert row["status"] == "retry" and row["attempts"] == attempt
            delays.append(
                await pool.fetchval(
                    "SELECT scheduled_for - (errors->-1->>'at')::timestamptz FROM job_queue WHERE id = $1",
                    job_id,
                )
            )
            # Time travel instead of sleeping: make the retry due now.
            await pool.execute("UPDATE job_queue SET scheduled_for = now() WHERE id = $1", job_id)
        else:
            assert row["status"] == "error" and row["attempts"] == 4
            assert row["error_msg"] == "upstream 503" and row["completed_at"] is not None
    assert delays == [timedelta(seconds=30), timedelta(seconds=60), timedelta(seconds=120)]


async def test_enqueue_joins_the_callers_transaction(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    async with pool.acquire() as conn:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await client.enqueue(conn, workspace, "noop", {"n": 1})
                raise RuntimeError("the caller's change failed")
        async with conn.transaction():
            kept = await client.enqueue(conn, workspace, "noop", {"n": 2})
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 1
    await run_burst(pool, db_url)
    row = await store.get_job(pool, kept)
    assert row is not None and row["status"] == "completed" and row["result"] == {"n": 2}


async def test_enqueue_many_in_one_call_keeps_order_and_defaults(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    jobs = [client.NewJob(workspace, "noop", {"i": i}) for i in range(500)]
    jobs.append(client.NewJob(workspace, "research_clip", {"text": "x"}))
    jobs.append(client.NewJob(workspace, "noop", {"i": "late"}, priority=7, delay_s=600))
    ids = await client.enqueue_many(pool, jobs)
    rows = {
        r["id"]: r
        for r in await pool.fetch(
            "SELECT id, payload, priority, scheduled_for - created_at AS wait FROM job_queue"
        )
    }
    assert [rows[i]["payload"] for i in ids[:500]] == [{"i": i} for i in range(500)]
    assert rows[ids[500]]["priority"] == 10  # the platform's default for research_clip
    assert rows[ids[501]]["priority"] == 7 and rows[ids[501]]["wait"] == timedelta(seconds=600)


async def test_plain_sql_insert_is_a_complete_job(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    job_id = await pool.fetchval(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " VALUES ($1, 'noop', '{\"hei\": \"verden\"}') RETURNING id",
        workspace,
    )
    await run_burst(pool, db_url)
    row = await store.get_job(pool, job_id)
    assert row is not None
    assert (row["status"], row["result"], row["attempts"]) == ("completed", {"hei": "verden"}, 1)
    assert row["started_at"] <= row["completed_at"]


async def test_types_restricts_what_a_worker_claims(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    async def ok(ctx: JobContext, payload: Any) -> str:
        return ctx.job_type

    registry = Registry([job_type("light", ok), job_type("heavy", ok)])
    for name in ("light", "heavy", "light"):
        await pool.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, $2, '{}')",
            workspace,
            name,
        )
    await run_burst(pool, db_url, registry, job_types=("light",))
    rows = await pool.fetch("SELECT job_type, status::text FROM job_queue ORDER BY job_type")
    assert [tuple(r) for r in rows] == [
        ("heavy", "pending"),
        ("light", "completed"),
        ("light", "completed"),
    ]


async def test_concurrency_bound_holds(pool: asyncpg.Pool, db_url: str, workspace: UUID) -> None:
    now_running = 0
    peak = 0

    async def slow(ctx: JobContext, payload: Any) -> None:
        nonlocal now_running, peak
        now_running += 1
        peak = max(peak, now_running)
        await asyncio.sleep(0.02)
        now_running -= 1

    registry = Registry([job_type("slow", slow)])
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT $1, 'slow', '{}' FROM generate_series(1, 50)",
        workspace,
    )
    await run_burst(pool, db_url, registry, max_concurrent=3)
    assert await statuses(pool) == {"completed": 50}
    assert peak == 3  # never more than 3, and the bound was actually reached


async def test_bulk_enqueue_by_copy_keeps_order_defaults_and_transaction(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    jobs = [client.NewJob(workspace, "research_clip", {"i": i}) for i in range(300)]
    async with pool.acquire() as conn:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await client.enqueue_many(conn, jobs)
                raise RuntimeError("rolled back")
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 0
    ids = await client.enqueue_many(pool, jobs)
    rows = {
        r["id"]: r
        for r in await pool.fetch(
            "SELECT id, payload, priority, status::text, attempts, max_attempts,"
            " scheduled_for = created_at AS default_schedule FROM job_queue"
        )
    }
    assert [rows[i]["payload"]["i"] for i in ids] == list(range(300))
    assert {
        (r["priority"], r["status"], r["attempts"], r["max_attempts"], r["default_schedule"])
        for r in rows.values()
    } == {(10, "pending", 0, 3, True)}


async def test_claim_pool_connections_come_prepared_and_claim_nothing(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    """Each connection of a worker's claim pool has the claims and the completion parsed and
    planned before its first job (a first use cost that job ~5 ms of pickup), and preparing
    them touches no job, even with a live worker and a due job in the table."""
    await insert_jobs(pool, workspace, 1)
    await _worker_row(pool)
    hot = [Q["claim"], Q["claim_fair"], store.COMPLETE_QUIET]
    queue_pool = await open_claim_pool(db_url, ["noop"])
    try:
        async with queue_pool.acquire() as first, queue_pool.acquire() as second:
            for conn in (first, second):
                rows = await conn.fetch(
                    "SELECT statement, generic_plans FROM pg_prepared_statements"
                )
                planned = {r["statement"]: r["generic_plans"] for r in rows}
                assert all(planned.get(sql, 0) >= 1 for sql in hot), planned
    finally:
        await queue_pool.close()
    assert await pool.fetchval("SELECT attempts FROM job_queue WHERE status = 'pending'") == 0
    assert await statuses(pool) == {"pending": 1}


async def test_unique_keys_are_unique_per_workspace(pool: asyncpg.Pool, workspace: UUID) -> None:
    other = await make_workspace(pool, "other")
    key = "stats_parse:next"
    mine = await client.enqueue(pool, workspace, "noop", unique_key=key, delay_s=3600)
    # Another workspace's job with the same key is its own job, not blocked by ours...
    theirs = await client.enqueue(pool, other, "noop", unique_key=key, delay_s=3600)
    assert theirs != mine
    # ...and within each workspace the key still dedupes, through the client and plain SQL.
    assert await client.enqueue(pool, workspace, "noop", unique_key=key) == mine
    assert await client.enqueue(pool, other, "noop", unique_key=key) == theirs
    both = await client.enqueue_many(
        pool,
        [
            client.NewJob(workspace, "noop", unique_key=key),
            client.NewJob(other, "noop", unique_key=key),
        ],
    )
    assert both == [mine, theirs]
    inserted = await pool.fetchval(
        "WITH i AS (INSERT INTO job_queue (workspace_id, job_type, payload, unique_key)"
        " VALUES ($1, 'noop', '{}', $2) ON CONFLICT DO NOTHING RETURNING id)"
        " SELECT count(*) FROM i",
        other,
        key,
    )
    assert inserted == 0
    with pytest.raises(asyncpg.UniqueViolationError, match="idx_job_queue_unique_key"):
        await pool.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload, unique_key)"
            " VALUES ($1, 'noop', '{}', $2)",
            workspace,
            key,
        )
    assert await pool.fetchval("SELECT count(*) FROM job_queue") == 2
