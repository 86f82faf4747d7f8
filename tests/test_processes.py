"""Several real worker processes on one queue: every job runs exactly once."""

from __future__ import annotations

import asyncio
import re
import signal
from collections import Counter
from uuid import UUID

import asyncpg

from tests.helpers import insert_jobs, spawn, statuses, wait_for_sql

DONE = re.compile(r"job ([0-9a-f-]{36}) noop completed")


async def test_three_processes_drain_2000_jobs_each_exactly_once(
    db_url: str, pool: asyncpg.Pool, workspace: UUID
) -> None:
    # debug: a line per completed job (info has only the summary)
    debug = {"SIDELINJA_LOG_LEVEL": "debug"}
    procs = [spawn("run", "--max-concurrent", "10", url=db_url, env=debug) for _ in range(3)]
    await wait_for_sql(pool, "SELECT count(*) = 3 FROM job_workers")  # all three are up and waiting
    await insert_jobs(pool, workspace, 2000)
    await wait_for_sql(pool, "SELECT count(*) = 2000 FROM job_queue WHERE status = 'completed'")
    for p in procs:
        p.send_signal(signal.SIGTERM)
    outputs = [await asyncio.to_thread(p.communicate, timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    # Each process logs every job it ran; across all of them each job appears once.
    runs = Counter(m for _, err in outputs for m in DONE.findall(err))
    ids = {str(r[0]) for r in await pool.fetch("SELECT id FROM job_queue")}
    assert set(runs) == ids and set(runs.values()) == {1}
    assert await statuses(pool) == {"completed": 2000}
    per_worker = await pool.fetch("SELECT worker_id, count(*) FROM job_queue GROUP BY 1")
    assert len(per_worker) >= 2  # the work really was shared
