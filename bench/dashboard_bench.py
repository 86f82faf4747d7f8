"""The admin dashboard at the equivalent of 10 million jobs a day, without 10 million job rows.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/dashboard_bench.py

The dashboard reads only job_minute_stats (and the pending index for the queue depth), so what
its cost depends on is how many aggregate rows a day leaves: one per minute, workspace and job
type with any ended attempt, and one per minute and type for the whole queue. This fills a
throwaway database with a full day of them for 100 workspaces x 5 job types, every minute busy
(10,000,000 attempts spread over them: 720,000 workspace rows, 7,200 whole-queue rows) and 20,000
pending jobs, then times the page's database work and its rendering (median and p90 of 30), for
a platform admin and for one workspace's token (under row-level security)."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import create_database, drop_database
from sidelinja_worker.admin import dashboard, store
from sidelinja_worker.admin.store import Scope
from sidelinja_worker.admin.web import templates
from sidelinja_worker.queue import migrate
from sidelinja_worker.queue.db import connect, init_connection, server_settings
from sidelinja_worker.queue.metrics import MINUTE_BOUNDS_S

JOBS = 10_000_000
WORKSPACES = 100
TYPES = ["noop", "srt_parse", "whisper_transcribe", "openrouter_analyze", "stats_parse"]
SAMPLES = 30

FILL = """
INSERT INTO job_minute_stats (minute, workspace_id, job_type, completed, failed, run_buckets)
SELECT date_trunc('minute', now()) - make_interval(mins => m), w, t,
       $2 - $2 / 50, $2 / 50, array_fill(($2 / $3)::int, ARRAY[$3])
FROM generate_series(0, 1439) m, unnest($1::uuid[]) w, unnest($4::text[]) t
"""


async def fill(url: str) -> None:
    conn = await connect(url)
    try:
        await migrate.apply_all(conn)
        spaces = [
            r[0]
            for r in await conn.fetch(
                "INSERT INTO workspaces (name) SELECT 'w' || g FROM generate_series(1, $1) g"
                " RETURNING id",
                WORKSPACES,
            )
        ]
        per_row = -(-JOBS // (1440 * WORKSPACES * len(TYPES)))  # rounded up: at least JOBS
        buckets = len(MINUTE_BOUNDS_S) + 1
        await conn.execute(FILL, spaces, per_row, buckets, TYPES)
        await conn.execute(FILL, ["00000000-0000-0000-0000-000000000000"], per_row * WORKSPACES,
                           buckets, TYPES)  # fmt: skip
        await conn.execute(
            "INSERT INTO job_queue (workspace_id, job_type, payload)"
            " SELECT $1, 'noop', '{}' FROM generate_series(1, 20000)",
            spaces[0],
        )
        await conn.execute("VACUUM ANALYZE")
        print(
            f"{await conn.fetchval('SELECT count(*) FROM job_minute_stats'):,} aggregate rows, "
            f"{await conn.fetchval('SELECT sum(completed + failed) FROM job_minute_stats WHERE workspace_id <> $1', '00000000-0000-0000-0000-000000000000'):,} attempts"
        )
    finally:
        await conn.close()


async def time_page(pool: asyncpg.Pool, scope: Scope) -> tuple[float, float]:
    body = templates.get_template("dashboard_body.html")
    samples = []
    for _ in range(SAMPLES + 3):
        started = time.perf_counter()
        async with store.scoped(pool, scope) as conn:
            figures = await dashboard.load(conn, scope, await conn.fetchval("SELECT now()"))
        body.render(d=figures, chart=dashboard.chart, paused=set(), inf=float("inf"))
        samples.append((time.perf_counter() - started) * 1000)
    samples = samples[3:]
    return statistics.median(samples), statistics.quantiles(samples, n=10)[8]


async def main() -> None:
    admin_url = os.environ["DATABASE_URL"]
    name = f"dashboard_bench_{os.getpid()}"
    url = await create_database(admin_url, name)
    try:
        await fill(url)
        pool = await asyncpg.create_pool(
            url,
            min_size=1,
            max_size=2,
            init=init_connection,
            server_settings={**server_settings(), "plan_cache_mode": "force_custom_plan"},
        )
        try:
            ws = await pool.fetchval("SELECT id FROM workspaces WHERE name = 'w1'")
            for label, scope in (
                ("platform admin (all workspaces)", Scope(None, None)),
                ("one workspace's token (RLS)", Scope(None, ws)),
            ):
                median, p90 = await time_page(pool, scope)
                print(f"dashboard, {label}: median {median:.1f} ms, p90 {p90:.1f} ms")
        finally:
            await pool.close()
    finally:
        await drop_database(admin_url, name)


if __name__ == "__main__":
    asyncio.run(main())
