"""The worker refreshes job_queue's statistics when they predate most of its rows, so a claim
planned while the table was empty is planned again after a bulk load (queue/analyze.py)."""

from __future__ import annotations

import asyncio
import logging
from uuid import UUID, uuid4

import asyncpg
import pytest

from sidelinja_worker.queue import analyze, store
from sidelinja_worker.queue.db import init_connection
from sidelinja_worker.queue.pools import open_claim_pool
from sidelinja_worker.queue.queries import QUERIES as Q
from tests.helpers import running_worker, wait_for, wait_for_sql

ROWS = 20_000
WORKSPACES = 20


async def _load(pool: asyncpg.Pool) -> None:
    """A bulk load by plain SQL over several workspaces, its counts flushed to the statistics
    at once (a backend otherwise reports them up to 10 s later)."""
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO workspaces (name) SELECT 'ws-' || i FROM generate_series(1, $1) i",
            WORKSPACES,
        )
        await conn.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload)"
            " SELECT w.id, 'noop', '{}' FROM workspaces w, generate_series(1, $1)",
            ROWS // WORKSPACES,
        )
        await conn.execute("SELECT pg_stat_force_next_flush()")


async def _scans_of_a_claim(pool: asyncpg.Pool, claims: asyncpg.Connection, worker: UUID) -> int:
    """Sequential scans of job_queue that one fair claim (rolled back) makes on `claims`."""

    async def seq_scans() -> int:
        n: int = await pool.fetchval(
            "SELECT seq_scan FROM pg_stat_user_tables WHERE relid = 'job_queue'::regclass"
        )
        return n

    before = await seq_scans()
    claim = claims.transaction()
    await claim.start()
    try:
        await claims.execute("SELECT pg_stat_force_next_flush()")
        jobs = await store.claim_with_limits(claims, worker, 100, ["noop"], True, False)
        assert len(jobs) == 100
    finally:
        await claim.rollback()  # its counts reach the statistics as the transaction ends
    return await seq_scans() - before


@pytest.fixture
async def quiet_table(pool: asyncpg.Pool) -> None:
    """job_queue analyzed while empty, with autovacuum off: only the worker can refresh it."""
    await pool.execute("ALTER TABLE job_queue SET (autovacuum_enabled = false)")
    await pool.execute("ANALYZE job_queue")


@pytest.mark.usefixtures("quiet_table")
async def test_a_claim_planned_on_an_empty_table_is_planned_again_after_a_bulk_load(
    pool: asyncpg.Pool, db_url: str
) -> None:
    worker = uuid4()
    await store.register_worker(pool, worker, "test", 1, ["noop"], 600)
    claim_pool = await open_claim_pool(db_url, ["noop"])
    try:
        async with claim_pool.acquire() as claims:
            # The generic plan is made now, on the empty table, and cached on this connection.
            assert await store.claim_with_limits(claims, worker, 100, ["noop"], True, False) == []
            await _load(pool)
            # That plan scans the whole table, once per workspace with due jobs.
            assert await _scans_of_a_claim(pool, claims, worker) > WORKSPACES / 2

            assert await analyze.refresh_if_stale(pool) == "analyzed"
            assert await analyze.refresh_if_stale(pool) == "fresh"
            # The new statistics invalidated the cached plan: the claim walks the indexes.
            assert await _scans_of_a_claim(pool, claims, worker) == 0
    finally:
        await claim_pool.close()


@pytest.mark.usefixtures("quiet_table")
async def test_a_small_change_or_another_worker_at_it_runs_no_analyze(
    pool: asyncpg.Pool, workspace: UUID
) -> None:
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT $1, 'noop', '{}' FROM generate_series(1, 100)",
        workspace,
    )
    await pool.execute("SELECT pg_stat_force_next_flush()")
    assert await analyze.refresh_if_stale(pool) == "fresh"
    await _load(pool)
    async with pool.acquire() as holder, holder.transaction():
        assert await holder.fetchval(Q["try_statistics_lock"])
        assert await analyze.refresh_if_stale(pool) == "busy"
    assert await analyze.refresh_if_stale(pool) == "analyzed"


@pytest.mark.usefixtures("quiet_table")
async def test_a_role_that_may_not_analyze_says_so_once(
    pool: asyncpg.Pool,
    db_url: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await _load(pool)

    async def as_app(conn: asyncpg.Connection) -> None:
        await init_connection(conn)
        await conn.execute("SET ROLE sidelinja_app")

    app_pool = await asyncpg.create_pool(db_url, min_size=1, max_size=1, init=as_app)
    assert app_pool is not None
    looks = 0
    real = analyze.refresh_if_stale

    async def counted(p: asyncpg.Pool, min_rows: int = analyze.MIN_ROWS) -> analyze.Outcome:
        nonlocal looks
        looks += 1
        return await real(p, min_rows)

    caplog.set_level(logging.WARNING, "sidelinja_worker.analyze")
    loop = None
    try:
        assert await real(app_pool) == "not permitted"
        monkeypatch.setattr(analyze, "refresh_if_stale", counted)
        loop = asyncio.create_task(analyze.analyze_loop(app_pool, every_s=0.01))
        await wait_for(lambda: looks >= 5, what="five looks")
    finally:
        if loop is not None:
            loop.cancel()
        await app_pool.close()
    warnings = [r for r in caplog.records if "may not ANALYZE" in r.getMessage()]
    assert len(warnings) == 1
    analyzed = await pool.fetchval(
        "SELECT analyze_count FROM pg_stat_user_tables WHERE relid = 'job_queue'::regclass"
    )
    assert analyzed == 1  # the fixture's own, no other


@pytest.mark.usefixtures("quiet_table")
async def test_a_worker_analyzes_the_table_it_finds_stale(pool: asyncpg.Pool, db_url: str) -> None:
    await _load(pool)
    async with running_worker(pool, db_url, max_concurrent=4):
        await wait_for_sql(
            pool,
            "SELECT analyze_count = 2 FROM pg_stat_user_tables WHERE relid = 'job_queue'::regclass",
        )
