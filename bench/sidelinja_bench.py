"""sidelinja-worker's own numbers: bulk enqueue, drain throughput per concurrency, idle memory
and pickup latency. Every drain starts from an emptied job_queue, so each run reads only its
own rows."""

from __future__ import annotations

import asyncio
import signal
import statistics
import time
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg
from common import RESULTS_DIR, Latency, listening_backends, spawn, wait_until
from cpu import CpuSplit, ServerCpu, run_measured
from procmem import Memory, read_memory

from sidelinja_worker.queue import migrate
from sidelinja_worker.queue.client import NewJob, enqueue_many

LATENCY_JOBS = 200
LATENCY_GAP_S = 0.015
IDLE_SETTLE_S = 1.0  # after the worker listens: let start-up garbage settle before reading RSS
SERVE_CONCURRENCY = 50


@dataclass(frozen=True)
class Drain:
    concurrency: int
    jobs: int
    span_s: float  # max(completed_at) - min(started_at): worker start-up excluded
    wall_s: float  # process spawn to exit: start-up, drain, shutdown
    peak_kb: int  # the worker's VmHWM at exit
    cpu: CpuSplit  # the worker's run and the server, spawn to exit
    log_level: str = "warning"  # the tuned figure; "info" is the CLI's default

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.span_s


async def prepare(conn: asyncpg.Connection) -> UUID:
    """Migrates the fresh database and returns the workspace every job belongs to."""
    await migrate.apply_all(conn)
    return await conn.fetchval("INSERT INTO workspaces (name) VALUES ('bench') RETURNING id")


async def more_workspaces(conn: asyncpg.Connection, n: int) -> list[UUID]:
    rows = await conn.fetch(
        "INSERT INTO workspaces (name) SELECT 'bench-' || i"
        " FROM generate_series(1, $1) AS i RETURNING id",
        n,
    )
    return [r[0] for r in rows]


async def empty_queue(conn: asyncpg.Connection) -> None:
    await conn.execute("TRUNCATE job_queue, job_workers")


async def enqueue(conn: asyncpg.Connection, workspace_id: UUID | list[UUID], n: int) -> float:
    """Enqueues n noop jobs in one enqueue_many call, dealt round-robin when given several
    workspaces; returns jobs/s. Building the NewJob list is the caller's work and is not timed."""
    spaces = workspace_id if isinstance(workspace_id, list) else [workspace_id]
    jobs = [NewJob(spaces[i % len(spaces)], "noop", {}) for i in range(n)]
    started = time.perf_counter()
    await enqueue_many(conn, jobs)
    return n / (time.perf_counter() - started)


async def warm_up(conn: asyncpg.Connection, workspace_id: UUID) -> None:
    """The first enqueue on a connection prepares the statement; an app's pool is warm."""
    await enqueue(conn, workspace_id, 100)
    await empty_queue(conn)


async def refresh_statistics(conn: asyncpg.Connection) -> None:
    """What autovacuum would do a while after a bulk insert; without it, the planner's picture
    of job_queue is whatever it was before the jobs arrived."""
    await conn.execute("ANALYZE job_queue")


async def server_now(conn: asyncpg.Connection) -> datetime:
    return await conn.fetchval("SELECT now()")


async def drain_span(conn: asyncpg.Connection, since: datetime) -> tuple[int, float]:
    """(jobs, max(completed_at) - min(started_at)) over the jobs created at or after `since`."""
    row = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE status = 'completed') AS done, count(*) AS total,"
        " extract(epoch FROM max(completed_at) - min(started_at))::float8 AS span_s"
        " FROM job_queue WHERE created_at >= $1",
        since,
    )
    if row["done"] != row["total"]:
        raise RuntimeError(f"only {row['done']} of {row['total']} jobs completed")
    return row["done"], row["span_s"]


async def drain(
    conn: asyncpg.Connection,
    url: str,
    concurrency: int,
    since: datetime,
    server: ServerCpu | None = None,
    log_level: str = "warning",
    *child_args: str,
) -> Drain:
    """Drains what is queued with one burst-mode worker process logging at `log_level` (at
    info, to a file in bench/results, as a worker under a process manager logs to a pipe);
    `child_args` go to worker_child.py as well."""
    log_args = ("--log-level", log_level)
    log_file = RESULTS_DIR / "worker_child.log" if log_level != "warning" else None
    wall_s, report, _, cpu = await run_measured(
        conn, server, "worker_child.py", url, str(concurrency), *log_args, *child_args,
        stderr=log_file,
    )  # fmt: skip
    jobs, span_s = await drain_span(conn, since)
    return Drain(concurrency, jobs, span_s, wall_s, report["hwm_kb"], cpu, log_level)


async def drain_nothing(conn: asyncpg.Connection, url: str, server: ServerCpu | None) -> CpuSplit:
    """The CPU of a burst worker's run on an empty queue: start-up (its connections, prepared
    statements, registration) and shutdown, which each drain's CPU includes."""
    await empty_queue(conn)
    return (await run_measured(conn, server, "worker_child.py", url, "50"))[3]


async def idle_and_latency(
    conn: asyncpg.Connection, url: str, dbname: str, workspace_id: UUID
) -> tuple[Memory, Latency, Latency]:
    """Starts a serving worker, reads its memory once it idles, then inserts single jobs by
    plain SQL, as the web app does, and measures started_at - created_at."""
    await empty_queue(conn)
    child = await spawn("worker_child.py", url, str(SERVE_CONCURRENCY), "--serve")
    try:
        await wait_until(lambda: _ready(conn, dbname), 30, "the worker to register and LISTEN")
        await asyncio.sleep(IDLE_SETTLE_S)
        idle = read_memory(child.pid)
        round_trips = await insert_singles(url, workspace_id, LATENCY_JOBS, LATENCY_GAP_S)
        await wait_until(lambda: _completed(conn, LATENCY_JOBS), 30, "the single jobs to finish")
    finally:
        if child.proc.returncode is None:
            child.proc.send_signal(signal.SIGTERM)
        await child.finish()
    return idle, await pickup_latency(conn), _percentiles(round_trips)


async def _ready(conn: asyncpg.Connection, dbname: str) -> bool:
    registered = await conn.fetchval("SELECT count(*) FROM job_workers")
    return registered > 0 and await listening_backends(conn, dbname) > 0


async def _completed(conn: asyncpg.Connection, n: int) -> bool:
    return await conn.fetchval("SELECT count(*) FROM job_queue WHERE status = 'completed'") >= n


async def insert_singles(url: str, workspace_id: UUID, n: int, gap_s: float) -> list[float]:
    """n one-row INSERTs, each its own transaction, `gap_s` apart, on a plain connection.
    Returns each INSERT's round trip as the inserter saw it (ms): the part of a pickup that is
    the insert's own commit and the machine waking up for it, before any worker is involved."""
    conn = await asyncpg.connect(url)
    round_trips = []
    try:
        for _ in range(n):
            began = time.perf_counter()
            await conn.execute(
                "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')",
                workspace_id,
            )
            round_trips.append((time.perf_counter() - began) * 1000)
            await asyncio.sleep(gap_s)
    finally:
        await conn.close()
    return round_trips


def _percentiles(ms: list[float]) -> Latency:
    ordered = sorted(ms)
    return Latency(
        len(ordered),
        statistics.median(ordered),
        ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
    )


async def pickup_latency(conn: asyncpg.Connection) -> Latency:
    row = await conn.fetchrow(
        "SELECT count(*) AS n, percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP"
        " (ORDER BY extract(epoch FROM started_at - created_at)) AS p"
        " FROM job_queue WHERE started_at IS NOT NULL"
    )
    return Latency(row["n"], row["p"][0] * 1000, row["p"][1] * 1000)
