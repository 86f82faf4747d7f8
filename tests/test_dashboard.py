"""The dashboard: per-minute aggregates the workers keep (job_minute_stats), read back by the
admin page, each workspace seeing its own numbers only."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest

from sidelinja_worker.queue import metrics
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.errors import PermanentError
from sidelinja_worker.queue.metrics import ALL_WORKSPACES
from sidelinja_worker.queue.registry import Registry
from tests.admin_fixtures import admin_fixture, token_for  # noqa: F401 (fixture)
from tests.helpers import insert_jobs, job_type, make_workspace, run_burst, wait_for


async def _ok(_ctx: JobContext, _payload: Any) -> None:
    return None


async def _broken(_ctx: JobContext, _payload: Any) -> None:
    raise PermanentError("broken on purpose")


REGISTRY = Registry([job_type("ok", _ok), job_type("broken", _broken)])


async def _two_workspaces(pool: asyncpg.Pool, db_url: str) -> tuple[UUID, UUID]:
    a = await make_workspace(pool, "Alfa")
    b = await make_workspace(pool, "Beta")
    await insert_jobs(pool, a, 5, job_type_name="ok")
    await insert_jobs(pool, a, 2, job_type_name="broken")
    await insert_jobs(pool, b, 3, job_type_name="ok")
    await run_burst(pool, db_url, REGISTRY)  # its last counts are written as it stops
    return a, b


async def test_workers_keep_per_minute_aggregates_per_workspace_and_in_all(
    pool: asyncpg.Pool, db_url: str
) -> None:
    a, b = await _two_workspaces(pool, db_url)
    rows = await pool.fetch(
        "SELECT workspace_id, job_type, sum(completed) AS c, sum(failed) AS f,"
        " sum((SELECT sum(n) FROM unnest(run_buckets) n)) AS runs"
        " FROM job_minute_stats GROUP BY 1, 2"
    )
    got = {(r["workspace_id"], r["job_type"]): (r["c"], r["f"], r["runs"]) for r in rows}
    assert got == {
        (a, "ok"): (5, 0, 5),
        (a, "broken"): (0, 2, 0),
        (b, "ok"): (3, 0, 3),
        (ALL_WORKSPACES, "ok"): (8, 0, 8),
        (ALL_WORKSPACES, "broken"): (0, 2, 0),
    }
    # Row-level security: a web role confined to Beta reads Beta's rows only (not the totals).
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT set_config('sidelinja.workspace_id', $1, true)", str(b))
        await conn.execute("SET LOCAL ROLE sidelinja_app")
        seen = await conn.fetch("SELECT DISTINCT workspace_id FROM job_minute_stats")
    assert [r[0] for r in seen] == [b]


async def test_the_dashboard_shows_each_token_its_own_numbers(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    a, b = await _two_workspaces(pool, db_url)
    await insert_jobs(pool, b, 4, job_type_name="ok")  # waiting

    async def figures(*scope: str) -> dict[str, str]:
        headers = {"authorization": f"Bearer {token_for(db_url, *scope)}"}
        async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
            page = (await http.get("/admin/dashboard")).text
        assert "<svg" in page and "<script" not in page.split("<main>")[1]
        return {
            k: page.split(f'id="{k}">', 1)[1].split("<", 1)[0]
            for k in ("completed-hour", "failed-hour", "depth")
        }

    assert await figures("--all") == {"completed-hour": "8", "failed-hour": "2", "depth": "4"}
    assert await figures("--workspace", str(a)) == {
        "completed-hour": "5",
        "failed-hour": "2",
        "depth": "0",
    }
    assert await figures("--workspace", str(b)) == {
        "completed-hour": "3",
        "failed-hour": "0",
        "depth": "4",
    }


async def test_run_time_buckets_written_by_hand_keep_the_dashboard_up(
    pool: asyncpg.Pool, db_url: str, admin: str
) -> None:
    """The worker writes every bucket count, but the table's owner may write a NULL, a negative
    or a count that sums past an integer: a NULL was a 500 for the workspace's token, an
    overflowing sum one for every token. Each sum counts as 0 to 2^31-1."""
    a = await make_workspace(pool)
    await pool.execute(
        "INSERT INTO job_minute_stats (minute, workspace_id, job_type, run_buckets)"
        " SELECT date_trunc('minute', now()) - make_interval(mins => i), $1, t, b"
        " FROM generate_series(0, 1) i, (VALUES ('nulls', '{NULL,1}'::int[]),"
        " ('huge', '{2147483647,1}'), ('negative', '{-5,1}')) v(t, b)",
        a,
    )
    headers = {"authorization": f"Bearer {token_for(db_url, '--workspace', str(a))}"}
    async with httpx.AsyncClient(base_url=admin, headers=headers) as http:
        page = await http.get("/admin/dashboard")
    assert page.status_code == 200, page.text[:300]
    assert page.text.count("<tr data-type=") == 3


async def test_minutes_that_cannot_be_written_are_kept_within_a_bound(
    pool: asyncpg.Pool,
    workspace: UUID,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A flush that PostgreSQL refuses for good (here a trigger of the web app's) kept every
    minute's rows for ever: one per minute, workspace and type, gigabytes a day on a busy
    queue, and only a debug line said so. Now the rows past retention and the oldest beyond
    the bound are dropped, and a warning says why."""
    monkeypatch.setattr(metrics, "MINUTE_PENDING_MAX", 100)
    await pool.execute(
        "CREATE FUNCTION refuse_stats() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN RAISE EXCEPTION 'no stats here'; END$$;"
        " CREATE TRIGGER refuse_stats BEFORE INSERT ON job_minute_stats"
        " FOR EACH ROW EXECUTE FUNCTION refuse_stats()"
    )
    now = time.time() // 60 * 60
    row = [1, 0] + [0] * (len(metrics.MINUTE_BOUNDS_S) + 1)
    minutes = [now - 60 * i for i in range(300)] + [now - 3 * 86400 - 60 * i for i in range(10)]
    metrics._MINUTES.clear()
    metrics._MINUTES.update({(m, workspace, "noop"): list(row) for m in minutes})
    try:
        with pytest.raises(asyncpg.RaiseError, match="no stats here"):
            await metrics.flush_minutes(pool)
        assert len(metrics._MINUTES) == 100  # all 310 before
        assert min(k[0] for k in metrics._MINUTES) == now - 60 * 99  # the newest kept
        flusher = asyncio.create_task(metrics.minute_loop(pool, every_s=0.01))
        await wait_for(lambda: "cannot be written" in caplog.text, 10)
        flusher.cancel()
        assert "no stats here" in caplog.text
    finally:
        metrics._MINUTES.clear()
