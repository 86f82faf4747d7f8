"""The admin list on 1,000,000 jobs, and what its event trigger and index cost writes.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \
        .venv/bin/python bench/admin_list_bench.py [--rows 1000000] [--keep | --reuse NAME]

Fills a throwaway database (100 workspaces of ~10,000 jobs and one of 60; 90 % completed,
4 % error, 2 % retry, 2 % pending, 1 % cancelled, 1 % running; one job every 0.5 s back over 5.8
days; then 20,000 pending jobs in one bulk enqueue), then times the list exactly as the admin
view runs it (as sidelinja_app under RLS, keyset pagination): first page and a page 20 pages
deep, for each status, all statuses, and type, workspace and time filters. Then what writers
pay: the status-event trigger (EXPLAIN ANALYZE of a 20,000-row status UPDATE, "Trigger ...:
time=") and the admin list's pending index (enqueue, claim, completion). --keep leaves the
database; --reuse NAME times one kept before (migrated to this checkout and vacuumed first; a
fresh fill is the comparable number)."""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from uuid import uuid4

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import create_database, drop_database, with_database
from sidelinja_worker.admin import store
from sidelinja_worker.admin.store import Cursor, JobFilter, Scope
from sidelinja_worker.queue import migrate
from sidelinja_worker.queue.client import NewJob, enqueue_many
from sidelinja_worker.queue.db import connect, init_connection, server_settings

# Status from g % 100, type and workspace from g / 100: independent of each other, so every
# workspace has jobs of every status and type (with workspace and status both g % 100, the
# first workspace had only completed jobs and its error pages were empty).
FILL = """
INSERT INTO job_queue (workspace_id, job_type, payload, status, attempts, created_at,
                       completed_at, error_msg)
SELECT ws[1 + (g / 500) % 100],
       (ARRAY['noop','srt_parse','whisper_transcribe','openrouter_analyze',
              'stats_parse'])[1 + (g / 100) % 5],
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

# A workspace with 60 completed jobs, one an hour: most workspaces of a platform are small, and
# no index finds a workspace's completed jobs without passing everyone else's.
SMALL = """
WITH w AS (INSERT INTO workspaces (name) VALUES ('small') RETURNING id)
INSERT INTO job_queue (workspace_id, job_type, payload, status, attempts, created_at, completed_at)
SELECT w.id, 'noop', '{}', 'completed', 1, now() - g * interval '1 hour',
       now() - g * interval '1 hour' + interval '1 s'
FROM w, generate_series(1, 60) g
"""


async def fill(url: str, rows: int) -> None:
    conn = await connect(url)
    try:
        await migrate.apply_all(conn)
        await conn.execute(
            "INSERT INTO workspaces (name) SELECT 'w' || g FROM generate_series(1, 100) g"
        )
        await conn.execute("ALTER TABLE job_queue DISABLE TRIGGER job_queue_insert_events")
        for start in range(1, rows + 1, 100_000):
            await conn.execute(FILL, start, min(start + 99_999, rows))
        await conn.execute(SMALL)
        # The newest pending jobs: one bulk enqueue (as bench/run.py's), so they share one
        # created_at and pending pages sort a batch of 20,000 by id.
        w1 = await conn.fetchval("SELECT id FROM workspaces WHERE name = 'w1'")
        await enqueue_many(conn, [NewJob(w1, "noop", {"n": i}) for i in range(20_000)])
        await conn.execute("ALTER TABLE job_queue ENABLE TRIGGER job_queue_insert_events")
        await conn.execute("VACUUM ANALYZE job_queue")
    finally:
        await conn.close()


async def time_page(pool, scope: Scope, f: JobFilter, depth: int) -> tuple[float, int]:
    """Milliseconds for the page `depth` pages in (the cursors taken from the pages before), or
    for the last page if there are fewer; and that page's number."""
    cursor, number = None, 1
    for _ in range(depth):
        async with store.scoped(pool, scope) as conn:
            page = await store.list_jobs(conn, f, cursor, store.PAGE_SIZE + 1)
        last = page[store.PAGE_SIZE - 1] if len(page) > store.PAGE_SIZE else None
        cursor = Cursor(last["status"], last["sort_at"], last["id"]) if last else cursor
        number += last is not None
    started = time.perf_counter()
    async with store.scoped(pool, scope) as conn:
        await store.list_jobs(conn, f, cursor, store.PAGE_SIZE + 1)
    return (time.perf_counter() - started) * 1000, number


async def list_timings(url: str) -> None:
    # Set up as the admin app sets up its pool (custom plans for the optional filters).
    pool = await asyncpg.create_pool(
        url,
        min_size=1,
        max_size=2,
        init=init_connection,
        server_settings={**server_settings(), "plan_cache_mode": "force_custom_plan"},
    )
    ws = await pool.fetchval("SELECT id FROM workspaces WHERE name = 'w1'")
    small_ws = await pool.fetchval("SELECT id FROM workspaces WHERE name = 'small'")
    small = Scope(None, small_ws)
    now = await pool.fetchval("SELECT now()")
    day = {"time_from": now - timedelta(days=3), "time_to": now - timedelta(days=2)}
    everyone, one = Scope(None, None), Scope(None, ws)
    cases = [
        ("errors, all workspaces (default page)", everyone, JobFilter(status="error")),
        ("errors, one workspace token", one, JobFilter(status="error", workspace_id=ws)),
        (
            "errors of one type, one workspace",
            one,
            JobFilter(status="error", job_type="noop", workspace_id=ws),
        ),
        ("errors of one day, all workspaces", everyone, JobFilter(status="error", **day)),
        ("retry, all workspaces", everyone, JobFilter(status="retry")),
        ("cancelled, one workspace token", one, JobFilter(status="cancelled", workspace_id=ws)),
        ("pending, all workspaces", everyone, JobFilter(status="pending")),
        ("pending, one workspace token", one, JobFilter(status="pending", workspace_id=ws)),
        ("running, all workspaces", everyone, JobFilter(status="running")),
        ("running, one workspace token", one, JobFilter(status="running", workspace_id=ws)),
        ("completed, all workspaces", everyone, JobFilter(status="completed")),
        ("completed, one workspace token", one, JobFilter(status="completed", workspace_id=ws)),
        (
            "completed of one type and day",
            everyone,
            JobFilter(status="completed", job_type="noop", **day),
        ),
        ("all statuses, all workspaces", everyone, JobFilter()),
        ("all statuses, one workspace token", one, JobFilter(workspace_id=ws)),
        (
            "all statuses of one type, one workspace",
            one,  # page 21: the bulk enqueue
            JobFilter(job_type="noop", workspace_id=ws),
        ),
        ("all statuses of one type and day", everyone, JobFilter(job_type="noop", **day)),
        (
            "completed, the 60-job workspace's token",
            small,
            JobFilter(status="completed", workspace_id=small_ws),
        ),
        ("all statuses, the 60-job workspace's token", small, JobFilter(workspace_id=small_ws)),
    ]
    for name, scope, f in cases:
        for depth in (0, 20):
            runs = [await time_page(pool, scope, f, depth) for _ in range(5)]
            ms = statistics.median(t for t, _ in runs)
            print(f"  {name:<44} page {runs[0][1]:>2}: {ms:8.1f} ms")
    await pool.close()


async def trigger_cost(url: str) -> None:
    """A claim-like UPDATE of 20,000 rows' status, rolled back each time: execution time with
    the trigger enabled and disabled, and the trigger's own time as EXPLAIN ANALYZE reports it."""
    conn = await connect(url)
    try:
        ids = await conn.fetchval(
            "SELECT array(SELECT id FROM job_queue WHERE status = 'completed' LIMIT 20000)"
        )
        runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for _ in range(7):
            for enabled in (True, False):
                runs[enabled].append(await _explain_update(conn, ids, enabled))
    finally:
        await conn.close()
    on = statistics.median(t for t, _ in runs[True])
    off = statistics.median(t for t, _ in runs[False])
    trig = statistics.median(t for _, t in runs[True])
    print(
        f"  20,000-row status UPDATE: {off:.0f} ms without the trigger, {on:.0f} ms with it; "
        f"trigger itself {trig:.0f} ms = {trig * 1000 / 20000:.2f} us per row"
    )


async def _explain_update(conn, ids: list, enabled: bool) -> tuple[float, float]:
    tx = conn.transaction()
    await tx.start()
    try:
        if not enabled:
            await conn.execute("ALTER TABLE job_queue DISABLE TRIGGER job_queue_status_events")
        plan = await conn.fetch(
            "EXPLAIN ANALYZE UPDATE job_queue SET status = 'running',"
            " started_at = now(), attempts = attempts + 1"
            " WHERE id = ANY($1::uuid[])",
            ids,
        )
    finally:
        await tx.rollback()
    text = "\n".join(r[0] for r in plan)
    total = float(re.search(r"Execution Time: ([\d.]+)", text)[1])
    trig = re.search(r"Trigger job_queue_status_events: time=([\d.]+)", text)
    return total, float(trig[1]) if trig else 0.0


# The admin list's pending index as migration 0013 makes it, and 0011's shape it replaced.
PENDING_INDEXES = {
    "0013 (created_at DESC, id DESC)": "idx_job_queue_admin_pending_by_id",
    "0011 (created_at DESC)": "bench_pending_by_time",
}
# A claim (pending -> running) of 20,000 jobs and a completion of the 10,000 running ones.
UPDATES = {
    "claim": "UPDATE job_queue SET status = 'running', started_at = now(), attempts = attempts + 1,"
    " worker_id = gen_random_uuid() WHERE id IN (SELECT id FROM job_queue"
    " WHERE status = 'pending' LIMIT 20000)",
    "complete": "UPDATE job_queue SET status = 'completed', completed_at = now(), result = '{}'"
    " WHERE status = 'running'",
}


async def index_cost(url: str) -> None:
    """What the pending index costs writers. Enqueue: `enqueue_many` of 20,000 noop jobs (as
    bench/run.py's bulk enqueue, in a transaction rolled back) with no pending index and with
    each shape, in shuffled order, 15 times; medians of wall time and of the server backend's
    CPU time (from /proc, when the server runs on this machine: steadier than wall time on busy
    cores). Claim and completion (rolled back): how much the index grew, 0 kB when PostgreSQL
    never writes it."""
    conn = await connect(url)
    try:
        await conn.execute(
            "CREATE INDEX bench_pending_by_time ON job_queue"
            " (created_at DESC) WHERE status = 'pending'"
        )
        # Both freshly built: the shipped one, grown by the fill's million inserts, has
        # half-empty pages that a new index has not, and compared 20-30 % dearer for it.
        await conn.execute("REINDEX INDEX idx_job_queue_admin_pending_by_id")
        ws = await conn.fetchval("SELECT id FROM workspaces WHERE name = 'w2'")
        runs: dict[str, list[tuple[float, float]]] = {"none": []}
        runs |= {k: [] for k in PENDING_INDEXES}
        for _ in range(15):
            for name in random.sample(list(runs), len(runs)):
                runs[name].append(await _enqueue(conn, ws, PENDING_INDEXES.get(name)))
                await conn.execute("VACUUM job_queue")
        for name, results in runs.items():
            wall, cpu = (statistics.median(r[i] for r in results) for i in range(2))
            print(
                f"  enqueue 20,000, pending index {name:<32} {wall:4.0f} ms,"
                f" backend CPU {cpu:4.0f} ms"
            )
        await conn.execute("DROP INDEX bench_pending_by_time")
        for name, sql in UPDATES.items():
            rows, grew = await _update(conn, sql)
            print(f"  {name:<8} {rows:,}: idx_job_queue_admin_pending_by_id grew {grew // 1024} kB")
    finally:
        await conn.close()


def backend_cpu_ms(pid: int) -> float:
    """User + system CPU time of a server process, or NaN if it is not on this machine."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


async def _enqueue(conn, ws, kept: str | None) -> tuple[float, float]:
    tx = conn.transaction()
    await tx.start()
    try:
        for index in PENDING_INDEXES.values():
            if index != kept:
                await conn.execute(f"DROP INDEX {index}")
        jobs = [NewJob(ws, "noop", {"bench": i}) for i in range(20_000)]
        cpu, started = backend_cpu_ms(conn.get_server_pid()), time.perf_counter()
        await enqueue_many(conn, jobs)
        wall = (time.perf_counter() - started) * 1000
        return wall, backend_cpu_ms(conn.get_server_pid()) - cpu
    finally:
        await tx.rollback()


async def _update(conn, sql: str) -> tuple[int, int]:
    """Rows the statement changed and how many bytes the pending index grew; rolled back."""
    size = "SELECT pg_relation_size('idx_job_queue_admin_pending_by_id')"
    tx = conn.transaction()
    await tx.start()
    try:
        before = await conn.fetchval(size)
        rows = int((await conn.execute(sql)).split()[-1])
        return rows, await conn.fetchval(size) - before
    finally:
        await tx.rollback()


async def reuse(url: str) -> None:
    """Times a kept database, migrated and vacuumed first: this checkout's indexes, and no dead
    entries left by the write-cost runs."""
    conn = await connect(url)
    try:
        await migrate.apply_all(conn)
        await conn.execute("VACUUM ANALYZE job_queue")
    finally:
        await conn.close()
    await list_timings(url)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument(
        "--reuse", metavar="NAME", help="time a database kept by --keep instead of filling one"
    )
    args = parser.parse_args()
    admin_url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    if args.reuse:
        await reuse(with_database(admin_url, args.reuse))
        return
    name = f"sw_admin_bench_{uuid4().hex[:8]}"
    url = await create_database(admin_url, name)
    try:
        started = time.perf_counter()
        await fill(url, args.rows)
        print(f"filled {args.rows:,} jobs in {time.perf_counter() - started:.0f} s")
        await list_timings(url)
        await trigger_cost(url)
        print("what the pending index costs writers:")
        await index_cost(url)
    finally:
        if args.keep:
            print(f"kept database {name}")
        else:
            await drop_database(admin_url, name)


if __name__ == "__main__":
    asyncio.run(main())
