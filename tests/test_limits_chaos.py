"""Caps and pauses under concurrency: two workers run jobs of a capped type in a capped
workspace and others, jobs that fail, retry and defer at random, while a plain-SQL writer
cancels running jobs and inserts more, or an operator pauses and resumes a type again and
again. A cap is never passed at any moment (a watcher reads the running rows all along), no
job of a paused type starts while its pause stands, and every job ends."""

from __future__ import annotations

import asyncio
import random
from uuid import UUID

import asyncpg
from pydantic import BaseModel, ConfigDict

from sidelinja_worker.queue import store
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import Defer, PermanentError, RetryJob
from sidelinja_worker.queue.registry import Registry
from tests.helpers import job_type, make_workspace, running_worker, wait_for_sql

TYPE_CAP = 3
WORKSPACE_CAP = 2
JOBS_FIRST = 300
JOBS_DURING = 100

RUNNING = """
SELECT count(*) FILTER (WHERE job_type = 'capped') AS capped,
       count(*) FILTER (WHERE workspace_id = $1) AS in_capped_workspace
FROM job_queue WHERE status = 'running'
"""


class Step(BaseModel):
    model_config = ConfigDict(frozen=True)
    ms: int
    end: str  # "ok", "fail", "retry" (its first attempt) or "defer" (its first run)


async def _step(ctx: JobContext, payload: Step) -> dict[str, bool]:
    await asyncio.sleep(payload.ms / 1000)
    first = await ctx.services.pool.fetchval(
        "SELECT NOT EXISTS (SELECT 1 FROM deferred WHERE job_id = $1)", ctx.job_id
    )
    if payload.end == "fail":
        raise PermanentError("planned failure")
    if payload.end == "retry" and ctx.attempt == 1:
        raise RetryJob("planned retry", after_s=0.01)
    if payload.end == "defer" and first:
        await ctx.services.pool.execute("INSERT INTO deferred VALUES ($1)", ctx.job_id)
        raise Defer("planned deferral", after_s=0.01)
    return {"ok": True}


REGISTRY = Registry(
    [job_type("capped", _step, payload_model=Step), job_type("free", _step, payload_model=Step)]
)


async def _insert(pool: asyncpg.Pool, workspaces: list[UUID], n: int, rng: random.Random) -> None:
    rows = [
        (
            rng.choice(workspaces),
            rng.choice(["capped", "free"]),
            {
                "ms": rng.randint(0, 12),
                "end": rng.choices(["ok", "fail", "retry", "defer"], [70, 10, 10, 10])[0],
            },
        )
        for _ in range(n)
    ]
    await pool.executemany(
        "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, $2, $3)", rows
    )


async def _watch(pool: asyncpg.Pool, capped_workspace: UUID, seen: list[tuple[int, int]]) -> None:
    """The most running jobs of the capped type and in the capped workspace, read in one
    snapshot at a time, as fast as the database answers."""
    while True:
        row = await pool.fetchrow(RUNNING, capped_workspace)
        assert row is not None
        seen.append((row["capped"], row["in_capped_workspace"]))
        await asyncio.sleep(0)


async def _chaos(pool: asyncpg.Pool, workspaces: list[UUID], rng: random.Random) -> None:
    for step in range(200):
        if step % 20 == 0:
            await _insert(pool, workspaces, JOBS_DURING // 10, rng)
        if rng.random() < 0.3:
            await pool.execute(
                "UPDATE job_queue SET cancel_requested_at = now() WHERE id = ("
                " SELECT id FROM job_queue WHERE status = 'running' ORDER BY random() LIMIT 1)"
            )
        await asyncio.sleep(0.005)


async def test_caps_hold_at_every_moment_under_failures_deferrals_and_cancels(
    pool: asyncpg.Pool, db_url: str
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    capped_ws, *others = [await make_workspace(pool, f"w{i}") for i in range(4)]
    await pool.execute("CREATE TABLE deferred (job_id uuid PRIMARY KEY)")
    async with pool.acquire() as conn:
        await store.set_type_limit(conn, "capped", TYPE_CAP)
        await store.set_workspace_limit(conn, capped_ws, WORKSPACE_CAP)
    await _insert(pool, [capped_ws, *others], JOBS_FIRST, rng)
    seen: list[tuple[int, int]] = []
    watcher = asyncio.create_task(_watch(pool, capped_ws, seen))
    try:
        async with (
            running_worker(pool, db_url, REGISTRY, max_concurrent=8, poll_interval_s=0.05),
            running_worker(pool, db_url, REGISTRY, max_concurrent=8, poll_interval_s=0.05),
        ):
            await _chaos(pool, [capped_ws, *others], rng)
            await wait_for_sql(
                pool,
                "SELECT count(*) = 0 FROM job_queue WHERE status IN ('pending', 'retry', 'running')",
                timeout_s=90,
            )
    finally:
        watcher.cancel()
    where = f"(seed {seed}, {len(seen)} reads)"
    assert len(seen) > 100, where
    # Never passed (and seen running at all: the watcher reads the rows it should).
    assert 1 <= max(c for c, _ in seen) <= TYPE_CAP, where
    assert 1 <= max(w for _, w in seen) <= WORKSPACE_CAP, where
    counts = dict(await pool.fetch("SELECT status::text, count(*) FROM job_queue GROUP BY 1"))  # type: ignore[arg-type]
    assert set(counts) <= {"completed", "error", "cancelled"}, (where, counts)
    assert sum(counts.values()) == JOBS_FIRST + JOBS_DURING, (where, counts)


async def test_a_paused_type_is_never_started_while_its_pause_stands(
    pool: asyncpg.Pool, db_url: str
) -> None:
    """Two workers drain a type an operator pauses and resumes again and again: no job of it
    starts between a pause's commit and the start of the resume that lifts it (a claim that
    began before the pause committed may still take one), and every job ends."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    workspaces = [await make_workspace(pool, f"w{i}") for i in range(2)]
    await pool.execute("CREATE TABLE deferred (job_id uuid PRIMARY KEY)")
    await _insert(pool, workspaces, JOBS_FIRST, rng)
    windows: list[tuple[object, object]] = []  # (pause committed, resume began)
    async with (
        running_worker(pool, db_url, REGISTRY, max_concurrent=8, poll_interval_s=0.05),
        running_worker(pool, db_url, REGISTRY, max_concurrent=8, poll_interval_s=0.05),
    ):
        for _ in range(15):
            await asyncio.sleep(rng.random() * 0.05)  # let some run between pauses
            async with pool.acquire() as conn:
                await store.pause_type(conn, "capped", "chaos", "test")
                paused_at = await conn.fetchval("SELECT clock_timestamp()")
                await asyncio.sleep(rng.random() * 0.1)
                resumed_at = await conn.fetchval("SELECT clock_timestamp()")
                await store.resume_type(conn, "capped", "chaos", "test")
            windows.append((paused_at, resumed_at))
        await wait_for_sql(
            pool,
            "SELECT count(*) = 0 FROM job_queue WHERE status IN ('pending', 'retry', 'running')",
            timeout_s=90,
        )
    where = f"(seed {seed})"
    started = await pool.fetch(
        "SELECT id, started_at FROM job_queue WHERE job_type = 'capped' AND started_at IS NOT NULL"
    )
    inside = [
        r["id"]
        for r in started
        for a, b in windows
        if a < r["started_at"] < b  # type: ignore[operator]
    ]
    assert not inside, (where, inside)
    assert len(started) > 50, where  # the type ran between the pauses
