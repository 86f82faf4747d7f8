"""The admin search at 1,000,000 jobs: id prefix, payload field, and both with the other filters.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/search_bench.py

Fills a throwaway database as bench/admin_list_bench.py does (1M jobs over ~5.8 days, payload
{"n": g}), then times the first page of each search exactly as the admin view runs it (as the
platform admin role, custom plans), median and p90 of 15. A payload search with no start time
reads one day back (admin/forms.py PAYLOAD_WINDOW): there is no index on payloads, the window
bounds the rows read."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.admin_list_bench import fill
from bench.common import create_database, drop_database
from sidelinja_worker.admin import forms, store
from sidelinja_worker.admin.store import Scope
from sidelinja_worker.queue.db import init_connection, server_settings

SAMPLES = 15


async def time_search(pool: asyncpg.Pool, params: dict[str, str]) -> tuple[float, float, int]:
    scope = Scope(None, None)
    samples, found = [], 0
    for _ in range(SAMPLES + 2):
        f = forms.job_filter(params, scope)
        started = time.perf_counter()
        async with store.scoped(pool, scope) as conn:
            rows = await store.list_jobs(conn, f, None, store.PAGE_SIZE + 1)
        samples.append((time.perf_counter() - started) * 1000)
        found = len(rows)
    samples = samples[2:]
    return statistics.median(samples), statistics.quantiles(samples, n=10)[8], found


async def main() -> None:
    admin_url = os.environ["DATABASE_URL"]
    name = f"search_bench_{os.getpid()}"
    url = await create_database(admin_url, name)
    try:
        await fill(url, 1_000_000)
        pool = await asyncpg.create_pool(
            url,
            min_size=1,
            max_size=2,
            init=init_connection,
            server_settings={**server_settings(), "plan_cache_mode": "force_custom_plan"},
        )
        try:
            some_id = str(
                await pool.fetchval("SELECT id FROM job_queue WHERE status = 'error' LIMIT 1")
            )
            recent_n = await pool.fetchval(
                "SELECT payload->>'n' FROM job_queue WHERE status = 'completed'"
                " AND created_at > now() - interval '2 hours' LIMIT 1"
            )
            cases = {
                "id prefix (8 hex), all statuses": {"status": "all", "id": some_id[:8]},
                "id prefix (4 hex), errors": {"status": "error", "id": some_id[:4]},
                f"payload n={recent_n}, all statuses (last day)": {
                    "status": "all", "payload": f"n={recent_n}"},
                f"payload n={recent_n}, completed, type noop (last day)": {
                    "status": "completed", "type": "noop", "payload": f"n={recent_n}"},
                "payload n=-1 (no match), all statuses (last day)": {
                    "status": "all", "payload": "n=-1"},
            }  # fmt: skip
            for label, params in cases.items():
                median, p90, found = await time_search(pool, params)
                print(f"{label}: median {median:.1f} ms, p90 {p90:.1f} ms ({found} rows)")
        finally:
            await pool.close()
    finally:
        await drop_database(admin_url, name)


if __name__ == "__main__":
    asyncio.run(main())
