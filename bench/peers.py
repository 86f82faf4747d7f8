"""The peers, each in its own fresh database and its own worker process: procrastinate 3.10
(psycopg) and PGQueuer 1.6 (asyncpg). Same measure as ours: first pickup to last completion
from each queue's own timestamps, after ANALYZE, as for sidelinja-worker's drains."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass
from typing import Any

import asyncpg
import peer_pgqueuer
import peer_procrastinate
from common import Latency, spawn, wait_until
from cpu import CpuSplit, ServerCpu, run_measured

PROCRASTINATE_CONCURRENCY = 50
PROCRASTINATE_POOL = 10  # 4 (its default) and 10 were within noise; 10 serves 50 slots better
PGQUEUER_BATCH = 50  # best of batch 25 + 50 in flight, 50 and 100 unbounded (4.1k-4.7k/s)
PGQUEUER_MAX_IN_FLIGHT = 0  # 0: unbounded; a noop job is never in flight for long
PEER_TIME_LIMIT_S = 60.0  # procrastinate drains ~200 jobs/s here: stop it, measure what it did
IDLE_SETTLE_S = 1.0


@dataclass(frozen=True)
class PeerRun:
    name: str
    settings: str
    jobs: int
    span_s: float  # first pickup to last completion, from the peer's own timestamps
    wall_s: float  # process spawn to exit
    enqueue_per_s: float  # its own bulk enqueue of the same jobs
    peak_kb: int
    stopped: bool  # stopped at PEER_TIME_LIMIT_S before the queue was empty
    cpu: CpuSplit | None = None  # its worker's run and the server, spawn to exit (PGQueuer)

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.span_s


async def run_procrastinate(url: str, n: int) -> PeerRun:
    defer_per_s = await peer_procrastinate.prepare(url, n)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("ANALYZE")
        child = await spawn(
            "peer_procrastinate.py", url, str(PROCRASTINATE_CONCURRENCY), str(PROCRASTINATE_POOL)
        )
        wall_s, report, stopped = await child.finish(PEER_TIME_LIMIT_S)
        jobs, span_s = await peer_procrastinate.drain_span(conn)
    finally:
        await conn.close()
    settings = f"concurrency {PROCRASTINATE_CONCURRENCY}, pool {PROCRASTINATE_POOL}"
    return PeerRun(
        "procrastinate 3.10", settings, jobs, span_s, wall_s, defer_per_s, report["hwm_kb"], stopped
    )


def _pgqueuer_args() -> list[str]:
    return [str(PGQUEUER_BATCH), str(PGQUEUER_MAX_IN_FLIGHT)]


class PgqueuerRuns:
    """PGQueuer in its database: drains one at a time (the caller interleaves them with ours, so
    that a slow minute of this VM falls on both), then the pickup latency."""

    def __init__(self, url: str, conn: asyncpg.Connection, server: ServerCpu | None) -> None:
        self.url = url
        self.conn = conn
        self.server = server

    @classmethod
    async def open(cls, url: str) -> PgqueuerRuns:
        await peer_pgqueuer.prepare(url)
        conn = await asyncpg.connect(url)
        return cls(url, conn, await ServerCpu.locate(conn))

    async def drain(self, n: int) -> PeerRun:
        """One drain of n fresh jobs."""
        await self.conn.execute("TRUNCATE pgqueuer, pgqueuer_log")
        enqueue_per_s = await peer_pgqueuer.enqueue(self.conn, n)
        await self.conn.execute("ANALYZE")
        wall_s, report, stopped, cpu = await self._run()
        jobs, span_s = await peer_pgqueuer.drain_span(self.conn)
        return PeerRun(
            "PGQueuer 1.6",
            f"batch {PGQUEUER_BATCH}, in flight unbounded",
            jobs,
            span_s,
            wall_s,
            enqueue_per_s,
            report["hwm_kb"],
            stopped,
            cpu,
        )

    async def drain_nothing(self) -> CpuSplit:
        """The CPU of its worker's run on an empty queue (start-up and shutdown)."""
        await self.conn.execute("TRUNCATE pgqueuer, pgqueuer_log")
        return (await self._run())[3]

    async def _run(self) -> tuple[float, dict[str, Any], bool, CpuSplit]:
        return await run_measured(
            self.conn,
            self.server,
            "peer_pgqueuer.py",
            self.url,
            *_pgqueuer_args(),
            time_limit_s=PEER_TIME_LIMIT_S,
        )

    async def latency(self, singles: int, gap_s: float) -> Latency:
        return await _pgqueuer_latency(self.conn, self.url, singles, gap_s)

    async def close(self) -> None:
        await self.conn.close()


async def _pgqueuer_latency(
    conn: asyncpg.Connection, url: str, singles: int, gap_s: float
) -> Latency:
    """Its LISTEN shares the connection with its queries, so pg_stat_activity cannot tell when
    it listens: one warm-up job, run to completion, says it is up; it is left out."""
    await conn.execute("TRUNCATE pgqueuer, pgqueuer_log")
    child = await spawn("peer_pgqueuer.py", url, *_pgqueuer_args(), "--serve")
    try:
        await peer_pgqueuer.enqueue_singles(conn, 1, 0)
        await wait_until(lambda: _all_done(conn, 1), 30, "PGQueuer's warm-up job")
        await asyncio.sleep(IDLE_SETTLE_S)
        warm_up_id = await conn.fetchval("SELECT max(job_id) FROM pgqueuer_log")
        await peer_pgqueuer.enqueue_singles(conn, singles, gap_s)
        await wait_until(lambda: _all_done(conn, singles + 1), 30, "PGQueuer's single jobs")
    finally:
        if child.proc.returncode is None:
            child.proc.send_signal(signal.SIGTERM)
        await child.finish()
    return Latency(*await peer_pgqueuer.pickup_latency_ms(conn, warm_up_id))


async def _all_done(conn: asyncpg.Connection, n: int) -> bool:
    return await peer_pgqueuer.succeeded(conn) >= n
