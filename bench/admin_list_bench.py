"""Admin list page on 1,000,000 jobs, and the cost of the status-event trigger (issue 5).

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \
        .venv/bin/python bench/admin_list_bench.py [--rows 1000000] [--keep]

Fills a throwaway database (100 workspaces; 90 % completed, 4 % error, 2 % retry, 2 % pending,
1 % cancelled, 1 % running), then times the list query exactly as the admin view runs it (as
sidelinja_app under RLS, keyset pagination): first page and a page 20 pages deep, per filter.
The trigger cost is read from EXPLAIN ANALYZE of a 20,000-row status UPDATE ("Trigger ...:
time=")."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import time
from pathlib import Path
from uuid import uuid4

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import create_database, drop_database
from sidelinja_worker import migrate
from sidelinja_worker.admin import store
from sidelinja_worker.admin.store import JobFilter, Scope
from sidelinja_worker.db import SERVER_SETTINGS, connect, init_connection

FILL = """
INSERT INTO job_queue (workspace_id, job_type, payload, status, attempts, created_at,
                       completed_at, error_msg)
SELECT ws[1 + g % 100],
       (ARRAY['noop','srt_parse','whisper_transcribe','openrouter_analyze','stats_parse'])[1 + g % 5],
       jsonb_build_object('n', g),
       s, CASE WHEN s IN ('error', 'retry') THEN 3 ELSE 1 END,
       now() - make_interval(secs => g * 0.5),
       CASE WHEN s IN ('completed', 'error', 'cancelled') THEN now() - make_interval(secs => g * 0.5 - 1) END,
       CASE WHEN s IN ('error', 'retry') THEN 'HTTP 503' END
FROM generate_series($1::int, $2::int) g,
     LATERAL (SELECT (CASE WHEN g % 100 < 90 THEN 'completed' WHEN g % 100 < 94 THEN 'error'
                           WHEN g % 100 < 96 THEN 'retry' WHEN g % 100 < 98 THEN 'pending'
                           WHEN g % 100 < 99 THEN 'cancelled' ELSE 'running' END)::job_status AS s) x,
     (SELECT array_agg(id) AS ws FROM workspaces) w
"""


async def fill(url: str, rows: int) -> None:
    conn = await connect(url)
    try:
        await migrate.apply_all(conn)
        await conn.execute("INSERT INTO workspaces (name) SELECT 'w' || g FROM generate_series(1, 100) g")
        await conn.execute("ALTER TABLE job_queue DISABLE TRIGGER job_queue_insert_events")
        for start in range(1, rows + 1, 100_000):
            await conn.execute(FILL, start, min(start + 99_999, rows))
        await conn.execute("ALTER TABLE job_queue ENABLE TRIGGER job_queue_insert_events")
        await conn.execute("VACUUM ANALYZE job_queue")
    finally:
        await conn.close()


async def time_page(pool, scope: Scope, f: JobFilter, depth: int) -> float:
    """Milliseconds for the page `depth` pages in (the cursors taken from the pages before)."""
    cursor = None
    for _ in range(depth):
        async with store.scoped(pool, scope) as conn:
            page = await store.list_jobs(conn, f, cursor, store.PAGE_SIZE + 1)
        cursor = (page[store.PAGE_SIZE - 1]["sort_at"], page[store.PAGE_SIZE - 1]["id"]) \
            if len(page) > store.PAGE_SIZE else cursor
    started = time.perf_counter()
    async with store.scoped(pool, scope) as conn:
        await store.list_jobs(conn, f, cursor, store.PAGE_SIZE + 1)
    return (time.perf_counter() - started) * 1000


async def list_timings(url: str) -> None:
    # Set up as the admin app sets up its pool (custom plans for the optional filters).
    pool = await asyncpg.create_pool(url, min_size=1, max_size=2, init=init_connection,
                                     server_settings={**SERVER_SETTINGS,
                                                      "plan_cache_mode": "force_custom_plan"})
    ws = await pool.fetchval("SELECT id FROM workspaces ORDER BY name LIMIT 1")
    everyone, one = Scope(None, None), Scope(None, ws)
    cases = [("errors, all workspaces (default page)", everyone, JobFilter(status="error")),
             ("errors, one workspace token", one, JobFilter(status="error", workspace_id=ws)),
             ("errors of one type, one workspace", one,
              JobFilter(status="error", job_type="noop", workspace_id=ws)),
             ("completed, one workspace token", one, JobFilter(status="completed", workspace_id=ws)),
             ("all statuses, all workspaces", everyone, JobFilter())]
    for name, scope, f in cases:
        for depth in (0, 20):
            ms = statistics.median([await time_page(pool, scope, f, depth) for _ in range(5)])
            print(f"  {name:<40} page {depth + 1:>2}: {ms:8.1f} ms")
    await pool.close()


async def trigger_cost(url: str) -> None:
    """A claim-like UPDATE of 20,000 rows' status, rolled back each time: execution time with
    the trigger enabled and disabled, and the trigger's own time as EXPLAIN ANALYZE reports it."""
    conn = await connect(url)
    try:
        ids = await conn.fetchval("SELECT array(SELECT id FROM job_queue WHERE status = 'completed'"
                                  " LIMIT 20000)")
        runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for _ in range(7):
            for enabled in (True, False):
                runs[enabled].append(await _explain_update(conn, ids, enabled))
    finally:
        await conn.close()
    on = statistics.median(t for t, _ in runs[True])
    off = statistics.median(t for t, _ in runs[False])
    trig = statistics.median(t for _, t in runs[True])
    print(f"  20,000-row status UPDATE: {off:.0f} ms without the trigger, {on:.0f} ms with it; "
          f"trigger itself {trig:.0f} ms = {trig * 1000 / 20000:.2f} us per row")


async def _explain_update(conn, ids: list, enabled: bool) -> tuple[float, float]:
    tx = conn.transaction()
    await tx.start()
    try:
        if not enabled:
            await conn.execute("ALTER TABLE job_queue DISABLE TRIGGER job_queue_status_events")
        plan = await conn.fetch("EXPLAIN ANALYZE UPDATE job_queue SET status = 'running',"
                                " started_at = now(), attempts = attempts + 1"
                                " WHERE id = ANY($1::uuid[])", ids)
    finally:
        await tx.rollback()
    text = "\n".join(r[0] for r in plan)
    total = float(re.search(r"Execution Time: ([\d.]+)", text)[1])
    trig = re.search(r"Trigger job_queue_status_events: time=([\d.]+)", text)
    return total, float(trig[1]) if trig else 0.0


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()
    admin_url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    name = f"sw_admin_bench_{uuid4().hex[:8]}"
    url = await create_database(admin_url, name)
    try:
        started = time.perf_counter()
        await fill(url, args.rows)
        print(f"filled {args.rows:,} jobs in {time.perf_counter() - started:.0f} s")
        await list_timings(url)
        await trigger_cost(url)
    finally:
        if not args.keep:
            await drop_database(admin_url, name)


if __name__ == "__main__":
    asyncio.run(main())
