"""The seed's worker loop, literally: per job one transaction that claims one row with
FOR UPDATE SKIP LOCKED, marks it running, runs the handler and marks it completed. Three slots,
one asyncpg connection each (the seed's --max-concurrent 3), on the same job_queue table."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import asyncpg

SLOTS = 3

CLAIM_ONE = """
SELECT id, job_type, payload
FROM job_queue
WHERE status IN ('pending', 'retry') AND scheduled_for <= now()
ORDER BY priority DESC, scheduled_for
LIMIT 1
FOR UPDATE SKIP LOCKED
"""
MARK_RUNNING = "UPDATE job_queue SET status = 'running', started_at = now() WHERE id = $1"
MARK_DONE = (
    "UPDATE job_queue SET status = 'completed', result = $2::jsonb, completed_at = now()"
    " WHERE id = $1"
)


@dataclass(frozen=True)
class BaselineRun:
    jobs: int
    wall_s: float


async def noop(payload: str) -> str:
    return payload


async def _slot(conn: asyncpg.Connection) -> int:
    done = 0
    while True:
        async with conn.transaction():
            job = await conn.fetchrow(CLAIM_ONE)
            if job is None:
                return done
            await conn.execute(MARK_RUNNING, job["id"])
            result = await noop(job["payload"])
            await conn.execute(MARK_DONE, job["id"], result)
        done += 1


async def drain(url: str) -> BaselineRun:
    """Runs the slots until the queue is empty. Wall time excludes connecting."""
    conns = [await asyncpg.connect(url) for _ in range(SLOTS)]
    try:
        started = time.perf_counter()
        counts = await asyncio.gather(*(_slot(c) for c in conns))
        return BaselineRun(sum(counts), time.perf_counter() - started)
    finally:
        for conn in conns:
            await conn.close()
