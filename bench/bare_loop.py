"""The yardstick: a bare batched loop on the seed's own table. One asyncio
process claims B jobs per statement (`FOR UPDATE SKIP LOCKED` CTE, `UPDATE ... WHERE id =
ANY(ARRAY(...))`, generic plans), runs each as an asyncio task, and completes them in one
`unnest` statement on a second connection while the next claim is on the wire. No leases,
retries, limits, fairness, events, metrics or payload validation: the ceiling for what a
batched Python worker can drain on this machine, which was measured at ~22,000 jobs/s
(B=50), ~28,000 (B=200) and 35,000-40,000 (B=1,000) when it was written."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson
from cpu import CpuSplit, ServerCpu, process_seconds

from sidelinja_worker.queue import migrate

BATCHES = (200, 1000)

# The seed's schema exactly as the first migration writes it: workspaces and
# job_queue with its one partial index, none of the later migrations' triggers or indexes.
SEED_SCHEMA = next(m.sql for m in migrate.shipped_migrations() if m.version == 1)
WORKSPACE = "INSERT INTO workspaces (name) VALUES ('bare loop') RETURNING id"
FILL = (
    "INSERT INTO job_queue (workspace_id, job_type, payload)"
    " SELECT $1, 'noop', '{}' FROM generate_series(1, $2)"
)
CLAIM = """
UPDATE job_queue
SET status = 'running', started_at = now(), attempts = attempts + 1
WHERE id = ANY(ARRAY(
    SELECT id FROM job_queue
    WHERE status IN ('pending', 'retry') AND scheduled_for <= now()
    ORDER BY priority DESC, scheduled_for
    LIMIT $1
    FOR UPDATE SKIP LOCKED))
RETURNING id, job_type, payload
"""
COMPLETE = """
UPDATE job_queue j
SET status = 'completed', result = r.result, completed_at = now()
FROM unnest($1::uuid[], $2::jsonb[]) AS r(id, result)
WHERE j.id = r.id
"""
SPAN = (
    "SELECT count(*), extract(epoch FROM max(completed_at) - min(started_at))::float8"
    " FROM job_queue WHERE status = 'completed'"
)
GENERIC_PLANS = {"plan_cache_mode": "force_generic_plan"}


@dataclass(frozen=True)
class BareRun:
    batch: int
    jobs: int
    span_s: float  # max(completed_at) - min(started_at), as for the worker's drains
    cpu: CpuSplit  # the loop alone: its connections were open before, and stay open after

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.span_s


async def noop(payload: Any) -> Any:
    return payload


async def drain(url: str, n: int, batch: int, server: ServerCpu | None = None) -> BareRun:
    """Fills the seed table at `url` (created on first use) with n noop jobs and drains them."""
    setup = await asyncpg.connect(url)
    try:
        if not await setup.fetchval("SELECT to_regclass('job_queue') IS NOT NULL"):
            await setup.execute(SEED_SCHEMA)
        await setup.execute("TRUNCATE job_queue, workspaces")
        await setup.execute(FILL, await setup.fetchval(WORKSPACE), n)
        await setup.execute("ANALYZE job_queue")
        claimer = await asyncpg.connect(url, server_settings=GENERIC_PLANS)
        completer = await asyncpg.connect(url, server_settings=GENERIC_PLANS)
        try:
            server_before_s = server.seconds() if server else 0.0
            client_before_s = process_seconds()
            await _loop(claimer, completer, batch)
            cpu = CpuSplit(
                process_seconds() - client_before_s,
                server.seconds() - server_before_s if server else None,
            )
        finally:
            await claimer.close()
            await completer.close()
        jobs, span_s = await setup.fetchrow(SPAN)
        if jobs != n:
            raise RuntimeError(f"bare loop completed {jobs} of {n} jobs")
        return BareRun(batch, jobs, span_s, cpu)
    finally:
        await setup.close()


async def _loop(claimer: asyncpg.Connection, completer: asyncpg.Connection, batch: int) -> None:
    writing: asyncio.Future[Any] | None = None
    claiming = asyncio.ensure_future(claimer.fetch(CLAIM, batch))
    while rows := await claiming:
        claiming = asyncio.ensure_future(claimer.fetch(CLAIM, batch))
        results = await asyncio.gather(
            *(asyncio.create_task(noop(orjson.loads(r[2]))) for r in rows)
        )
        if writing is not None:
            await writing
        writing = asyncio.ensure_future(
            completer.execute(
                COMPLETE, [r[0] for r in rows], [orjson.dumps(x).decode() for x in results]
            )
        )
    if writing is not None:
        await writing
