"""PGQueuer 1.6 as a peer, in its own database, on asyncpg: the parent installs the schema and
enqueues; run as a script, this file is the worker child (drain, or serve until SIGTERM).

    python bench/peer_pgqueuer.py URL BATCH_SIZE MAX_CONCURRENT [--serve]

PGQueuer deletes a finished job from its queue table; its log table keeps a row per state change
('queued', 'picked', 'successful'), each stamped with now() of its statement's transaction."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time
from datetime import timedelta

import asyncpg
from cpu import process_seconds
from pgqueuer import Job, Queries, QueueManager
from pgqueuer.types import QueueExecutionMode
from procmem import print_report

DEQUEUE_TIMEOUT = timedelta(seconds=1)  # as our poll interval: idle pickup is by NOTIFY


async def prepare(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await Queries.from_asyncpg_connection(conn).install()
    finally:
        await conn.close()


async def enqueue(conn: asyncpg.Connection, n: int) -> float:
    """n noop jobs in one batch call; returns jobs/s."""
    queries = Queries.from_asyncpg_connection(conn)
    started = time.perf_counter()
    await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
    return n / (time.perf_counter() - started)


async def drain_span(conn: asyncpg.Connection) -> tuple[int, float]:
    row = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE status = 'successful') AS done,"
        " extract(epoch FROM max(created) FILTER (WHERE status = 'successful')"
        "   - min(created) FILTER (WHERE status = 'picked'))::float8 AS span_s"
        " FROM pgqueuer_log"
    )
    return row["done"], row["span_s"]


async def enqueue_singles(conn: asyncpg.Connection, n: int, gap_s: float) -> None:
    queries = Queries.from_asyncpg_connection(conn)
    for _ in range(n):
        await queries.enqueue("noop", None)
        await asyncio.sleep(gap_s)


async def succeeded(conn: asyncpg.Connection) -> int:
    return await conn.fetchval("SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")


async def pickup_latency_ms(conn: asyncpg.Connection, after_id: int) -> tuple[int, float, float]:
    """(jobs, p50 ms, p99 ms) of 'picked' minus 'queued' for the jobs after `after_id`."""
    row = await conn.fetchrow(
        "SELECT count(*) AS n, percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP"
        "  (ORDER BY extract(epoch FROM p.created - q.created)) AS p"
        " FROM pgqueuer_log q JOIN pgqueuer_log p"
        "  ON p.job_id = q.job_id AND q.status = 'queued' AND p.status = 'picked'"
        " WHERE q.job_id > $1",
        after_id,
    )
    return row["n"], row["p"][0] * 1000, row["p"][1] * 1000


async def run_worker(url: str, batch_size: int, max_concurrent: int, serve: bool) -> float:
    """Runs PGQueuer's QueueManager; returns the CPU seconds of its run (as worker_child)."""
    conn = await asyncpg.connect(url)
    try:
        qm = QueueManager(Queries.from_asyncpg_connection(conn))

        @qm.entrypoint("noop")
        async def noop(job: Job) -> None:
            return None

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, qm.shutdown.set)
        mode = QueueExecutionMode.continuous if serve else QueueExecutionMode.drain
        started_s = process_seconds()
        await qm.run(
            dequeue_timeout=DEQUEUE_TIMEOUT,
            batch_size=batch_size,
            mode=mode,
            max_concurrent_tasks=max_concurrent or None,
        )
        return process_seconds() - started_s
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("batch_size", type=int)
    parser.add_argument("max_concurrent", type=int, help="0: unlimited")
    parser.add_argument("--serve", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    run_cpu_s = asyncio.run(run_worker(args.url, args.batch_size, args.max_concurrent, args.serve))
    print_report(run_cpu_s=run_cpu_s)


if __name__ == "__main__":
    main()
