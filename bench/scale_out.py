"""Scale-out: several worker processes against one PostgreSQL, and a mixed workload like
Sidelinja's. One command:

    python bench/scale_out.py [--jobs 20000] [--processes 1 2 4] [--rounds 2] [--database-url URL]

Part 1, for 1, 2 and 4 worker processes (each `worker_child.py` at concurrency 50 and the CLI's
default log level, info, logging JSON lines to bench/results/scale_out.log), started and idle,
then N noop jobs dealt over 10 workspaces in one insert, drained; in rounds (1, 2, 4, 1, 2, 4,
...: a slow minute of a shared machine falls on every count alike). jobs/s = N /
(max(completed_at) - min(started_at)); CPU per job from /proc, from the insert to the last
completion: the backends of the benchmark's database (so a test suite on the same server is not
counted, and neither are the WAL writer, checkpointer and autovacuum) and the worker processes.
Then, with the same processes idle, pickup: 200 single plain-SQL INSERTs 15 ms apart on one open
connection, p50/p99 of started_at - created_at.

Part 2, the mixed workload (`--mixed-processes`, default 2, at concurrency 50 each): 1,000
workspaces; a backlog of `--mixed-jobs` jobs (default 4,000) dealt over them unevenly (workspace
k gets a share proportional to 1/k, so a few are busy and most have none or one), 90 % noop
sleeping 50-500 ms (a call to a service), 2 % long (5-10 s) and 8 % of a type capped at
`--cap` running jobs cluster-wide with `sidelinja-worker limits type capped N` (a copy of noop
under the name "capped", sleeping 100 ms); and, while the backlog drains, a producer inserting
one job a time (`--live-rate` a second, default 40) in the workspaces that have no backlog.
Reported: throughput (backlog and live jobs / span), pickup p50/p99 of the live jobs (a quiet
workspace's job while the queue is busy), the most capped jobs seen running at once, and the
fairness error: of the first half of the backlog's noop starts, the share that went to another
workspace than round-robin across workspaces would have given it (0 = exactly fair; total
variation distance between the started counts and the water-filling ideal).

Prints a markdown report and writes it to bench/results/scale_out.md. About 2 minutes."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID, uuid4

import asyncpg
import sidelinja_bench as sw
from common import (
    DEFAULT_URL,
    RESULTS_DIR,
    Child,
    Latency,
    create_database,
    drop_database,
    listening_backends,
    spawn,
    wait_until,
)
from cpu import cpu_seconds

from sidelinja_worker.queue.db import connect

CONCURRENCY = 50
SPREAD_WORKSPACES = 10
MIXED_WORKSPACES = 1000
LOG_FILE = RESULTS_DIR / "scale_out.log"
CAPPED = "capped"
SLOW_PICKUP_MS = 500  # longer than any short job runs: a live job that waited on something else


@dataclass(frozen=True)
class ScaleRun:
    processes: int
    jobs: int
    span_s: float
    server_s: float | None
    workers_s: float

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.span_s


def say(line: str) -> None:
    print(f"[scale-out {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


async def start_workers(url: str, n: int, *extra: str) -> list[Child]:
    return [
        await spawn(
            "worker_child.py",
            url,
            str(CONCURRENCY),
            "--log-level",
            "info",
            *extra,
            stderr=LOG_FILE,
        )
        for _ in range(n)
    ]


async def stop_workers(children: list[Child]) -> list[dict[str, object]]:
    for child in children:
        if child.proc.returncode is None:
            child.proc.send_signal(signal.SIGTERM)
    return [(await child.finish())[1] for child in children]


async def wait_ready(conn: asyncpg.Connection, dbname: str, processes: int) -> None:
    async def ready() -> bool:
        registered = await conn.fetchval("SELECT count(*) FROM job_workers")
        return registered >= processes and await listening_backends(conn, dbname) >= processes

    await wait_until(ready, 60, "the workers to register and LISTEN")


async def backend_seconds(conn: asyncpg.Connection) -> dict[int, float]:
    """CPU seconds of each backend of this database but `conn`'s own. Other databases' work on
    the same server (a test suite beside the benchmark) is not counted; nor are the server's
    background processes (WAL writer, checkpointer, autovacuum)."""
    pids = await conn.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
    )
    out = {}
    for r in pids:
        try:
            out[r["pid"]] = cpu_seconds(r["pid"])
        except (OSError, ValueError):
            pass  # gone meanwhile
    return out


async def drain(
    conn: asyncpg.Connection,
    url: str,
    dbname: str,
    spaces: list[UUID],
    n: int,
    processes: int,
) -> ScaleRun:
    """Serving workers, idle and listening; then N jobs in one insert; CPU of this database's
    backends and of the workers from the insert's commit to the last completion."""
    await sw.empty_queue(conn)
    children = await start_workers(url, processes, "--serve")
    try:
        await wait_ready(conn, dbname, processes)
        await asyncio.sleep(sw.IDLE_SETTLE_S)
        before = await backend_seconds(conn)
        workers_before = sum(cpu_seconds(c.pid) for c in children)
        since = await sw.server_now(conn)
        # ANALYZE in the enqueue's transaction: the workers' cached generic plans, made on an
        # empty table, are replanned with the jobs in the statistics (as run.py's ANALYZE
        # after its enqueue), and no claim runs before.
        async with conn.transaction():
            await sw.enqueue(conn, spaces, n)
            await sw.refresh_statistics(conn)

        async def done() -> bool:
            return (
                await conn.fetchval("SELECT count(*) FROM job_queue WHERE status = 'completed'")
                >= n
            )

        await wait_until(done, 300, "the drain", interval_s=0.01)
        after = await backend_seconds(conn)
        workers_s = sum(cpu_seconds(c.pid) for c in children) - workers_before
    finally:
        await stop_workers(children)
    server_s = sum(s - before.get(pid, 0.0) for pid, s in after.items())
    jobs, span_s = await sw.drain_span(conn, since)
    return ScaleRun(processes, jobs, span_s, server_s, workers_s)


async def idle_pickup(
    conn: asyncpg.Connection, url: str, dbname: str, workspace_id: UUID, processes: int
) -> Latency:
    """Pickup of single plain-SQL inserts with `processes` idle workers listening."""
    await sw.empty_queue(conn)
    children = await start_workers(url, processes, "--serve")
    try:
        await wait_ready(conn, dbname, processes)
        await asyncio.sleep(sw.IDLE_SETTLE_S)
        await sw.insert_singles(url, workspace_id, sw.LATENCY_JOBS, sw.LATENCY_GAP_S)

        async def done() -> bool:
            return (
                await conn.fetchval("SELECT count(*) FROM job_queue WHERE status = 'completed'")
                >= sw.LATENCY_JOBS
            )

        await wait_until(done, 30, "the single jobs to finish")
    finally:
        await stop_workers(children)
    return await sw.pickup_latency(conn)


# -- the mixed workload ------------------------------------------------------------------------


@dataclass(frozen=True)
class Mixed:
    processes: int
    backlog: int
    live: int
    span_s: float
    live_pickup: Latency
    capped_max_running: int
    cap: int
    fairness_error: float
    long_jobs: int
    slow_pickups: int  # live jobs picked up after more than SLOW_PICKUP_MS

    @property
    def jobs_per_s(self) -> float:
        return (self.backlog + self.live) / self.span_s


def backlog_rows(spaces: list[UUID], n: int, rng: random.Random) -> list[tuple[UUID, str, str]]:
    """(workspace, job_type, payload) for n jobs, workspace k with weight 1/k."""
    weights = [1 / (k + 1) for k in range(len(spaces))]
    rows = []
    for ws in rng.choices(spaces, weights, k=n):
        r = rng.random()
        if r < 0.02:
            rows.append((ws, "noop", f'{{"sleep_ms": {rng.randint(5000, 10000)}}}'))
        elif r < 0.10:
            rows.append((ws, CAPPED, '{"sleep_ms": 100}'))
        else:
            rows.append((ws, "noop", f'{{"sleep_ms": {rng.randint(50, 500)}}}'))
    return rows


def fairness_error(counts: dict[UUID, int], started: dict[UUID, int]) -> float:
    """Total variation distance between `started` (per workspace) and the water-filling ideal
    for as many starts: every workspace gets min(its backlog, level), one level for all."""
    total = sum(started.values())
    if not total:
        return 0.0
    level = _water_level(sorted(counts.values()), total)
    off = sum(abs(started.get(ws, 0) - min(c, level)) for ws, c in counts.items())
    return off / (2 * total)


def _water_level(sizes: list[int], total: int) -> float:
    """The level L with sum(min(size, L)) = total, `sizes` ascending."""
    remaining = float(total)
    for i, size in enumerate(sizes):
        left = len(sizes) - i
        if size * left >= remaining:
            return remaining / left
        remaining -= size
    return float(sizes[-1])


async def set_cap(url: str, cap: int) -> None:
    env = {**os.environ, "DATABASE_URL": url}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "sidelinja_worker", "limits", "type", CAPPED, str(cap)],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"limits type {CAPPED} {cap} failed: {done.stderr}")


async def mixed(
    conn: asyncpg.Connection,
    url: str,
    dbname: str,
    n: int,
    processes: int,
    cap: int,
    live_rate: float,
) -> Mixed:
    rng = random.Random(7)
    await sw.empty_queue(conn)
    spaces = await sw.more_workspaces(conn, MIXED_WORKSPACES)
    await set_cap(url, cap)
    rows = backlog_rows(spaces, n, rng)
    since = await sw.server_now(conn)
    await conn.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT w, t, p::jsonb FROM unnest($1::uuid[], $2::text[], $3::text[]) AS r(w, t, p)",
        [ws for ws, _, _ in rows],
        [jt for _, jt, _ in rows],
        [p for _, _, p in rows],
    )
    backlog_at = await conn.fetchval("SELECT max(created_at) FROM job_queue")
    await sw.refresh_statistics(conn)
    backlog_ws = {ws for ws, _, _ in rows}
    quiet = [ws for ws in spaces if ws not in backlog_ws]
    children = await start_workers(url, processes, "--serve", "--extra-types", CAPPED)
    await wait_ready(conn, dbname, processes)  # the backlog starts draining now
    stop = asyncio.Event()
    capped_seen = [0]

    async def watch_cap() -> None:
        watcher = await asyncpg.connect(url)
        try:
            while not stop.is_set():
                running = await watcher.fetchval(
                    "SELECT count(*) FROM job_queue WHERE job_type = $1 AND status = 'running'",
                    CAPPED,
                )
                capped_seen[0] = max(capped_seen[0], running)
                await asyncio.sleep(0.05)
        finally:
            await watcher.close()

    async def produce() -> list[UUID]:
        producer = await asyncpg.connect(url)
        ids = []
        try:
            while not stop.is_set():
                ids.append(
                    await producer.fetchval(
                        "INSERT INTO job_queue (workspace_id, job_type, payload)"
                        " VALUES ($1, 'noop', $2::text::jsonb) RETURNING id",
                        rng.choice(quiet),
                        f'{{"sleep_ms": {rng.randint(50, 500)}}}',
                    )
                )
                await asyncio.sleep(1 / live_rate)
        finally:
            await producer.close()
        return ids

    watcher = asyncio.create_task(watch_cap())
    producer = asyncio.create_task(produce())
    try:
        await wait_until(
            lambda: _backlog_done(conn, backlog_at), 300, "the backlog to drain", interval_s=0.2
        )
        stop.set()
        live_ids = await producer
        await wait_until(
            lambda: _done(conn, live_ids), 60, "the live jobs to finish", interval_s=0.1
        )
    finally:
        stop.set()
        await asyncio.gather(watcher, producer, return_exceptions=True)
        await stop_workers(children)
    row = await conn.fetchrow(
        "SELECT extract(epoch FROM max(completed_at) - min(started_at))::float8 AS span_s"
        " FROM job_queue WHERE created_at >= $1",
        since,
    )
    live = await conn.fetch(
        "SELECT extract(epoch FROM started_at - created_at)::float8 * 1000 AS ms"
        " FROM job_queue WHERE id = ANY($1::uuid[])",
        live_ids,
    )
    ms = sorted(r["ms"] for r in live)
    slow = sum(1 for m in ms if m > SLOW_PICKUP_MS)
    pickup = Latency(len(ms), statistics.median(ms), ms[min(len(ms) - 1, round(0.99 * len(ms)))])
    return Mixed(
        processes,
        len(rows),
        len(live_ids),
        row["span_s"],
        pickup,
        capped_seen[0],
        cap,
        await _fairness(conn, since, set(live_ids)),
        sum(1 for _, jt, p in rows if jt == "noop" and json.loads(p)["sleep_ms"] >= 5000),
        slow,
    )


async def _backlog_done(conn: asyncpg.Connection, backlog_at: datetime) -> bool:
    left = await conn.fetchval(
        "SELECT count(*) FROM job_queue WHERE created_at <= $1"
        " AND status NOT IN ('completed', 'error', 'cancelled')",
        backlog_at,
    )
    return left == 0


async def _done(conn: asyncpg.Connection, ids: list[UUID]) -> bool:
    left = await conn.fetchval(
        "SELECT count(*) FROM job_queue WHERE id = ANY($1::uuid[]) AND status <> 'completed'",
        ids,
    )
    return left == 0


async def _fairness(conn: asyncpg.Connection, since: datetime, live: set[UUID]) -> float:
    """Over the backlog's noop jobs: the first half of their starts against the ideal."""
    rows = await conn.fetch(
        "SELECT id, workspace_id, started_at FROM job_queue"
        " WHERE created_at >= $1 AND job_type = 'noop' ORDER BY started_at, id",
        since,
    )
    backlog = [r for r in rows if r["id"] not in live]
    counts: dict[UUID, int] = {}
    for r in backlog:
        counts[r["workspace_id"]] = counts.get(r["workspace_id"], 0) + 1
    started: dict[UUID, int] = {}
    for r in backlog[: len(backlog) // 2]:
        started[r["workspace_id"]] = started.get(r["workspace_id"], 0) + 1
    return fairness_error(counts, started)


# -- the whole run -----------------------------------------------------------------------------


async def run_all(admin_url: str, args: argparse.Namespace) -> str:
    name = f"bench_{uuid4().hex[:8]}_scale"
    url = await create_database(admin_url, name)
    RESULTS_DIR.mkdir(exist_ok=True)
    load_before = os.getloadavg()[0]
    try:
        conn = await connect(url)
        try:
            workspace_id = await sw.prepare(conn)
            await sw.warm_up(conn, workspace_id)
            spaces = await sw.more_workspaces(conn, SPREAD_WORKSPACES)
            runs: list[ScaleRun] = []
            for round_ in range(1, args.rounds + 1):
                for p in args.processes:
                    say(f"round {round_}: {p} worker processes drain {args.jobs:,} jobs")
                    runs.append(await drain(conn, url, name, spaces, args.jobs, p))
            pickups = {}
            for p in args.processes:
                say(f"pickup with {p} idle worker processes")
                pickups[p] = await idle_pickup(conn, url, name, workspace_id, p)
            say(
                f"mixed workload: {args.mixed_jobs:,} backlog jobs over {MIXED_WORKSPACES:,} "
                f"workspaces, {args.mixed_processes} processes, live jobs at {args.live_rate}/s"
            )
            mix = await mixed(
                conn, url, name, args.mixed_jobs, args.mixed_processes, args.cap, args.live_rate
            )
        finally:
            await conn.close()
    finally:
        await drop_database(admin_url, name)
    return report(args, runs, pickups, mix, load_before, os.getloadavg()[0])


def report(
    args: argparse.Namespace,
    runs: list[ScaleRun],
    pickups: dict[int, Latency],
    mix: Mixed,
    load_before: float,
    load_after: float,
) -> str:
    lines = [
        f"# Scale-out, {time.strftime('%Y-%m-%d %H:%M')} UTC, {os.cpu_count()} cores",
        "",
        f"Drains of {args.jobs:,} noop jobs over {SPREAD_WORKSPACES} workspaces, each process "
        f"at concurrency {CONCURRENCY}, log info; medians of {args.rounds}. CPU per job: this "
        "database's PostgreSQL backends, and the worker processes, insert to last completion. "
        "Pickup: "
        f"{sw.LATENCY_JOBS} single INSERTs {sw.LATENCY_GAP_S * 1000:.0f} ms apart, idle workers.",
        "",
        "| processes | jobs/s (range) | PostgreSQL µs/job | workers µs/job | pickup p50 / p99 |",
        "|---:|---:|---:|---:|---:|",
    ]
    for p in args.processes:
        mine = [r for r in runs if r.processes == p]
        rates = sorted(r.jobs_per_s for r in mine)
        server = [r.server_s / r.jobs * 1e6 for r in mine if r.server_s is not None]
        workers = statistics.median(r.workers_s / r.jobs * 1e6 for r in mine)
        pg = f"{statistics.median(server):.1f}" if server else "n/a"
        lat = pickups[p]
        lines.append(
            f"| {p} | {statistics.median(rates):,.0f} ({rates[0]:,.0f}–{rates[-1]:,.0f}) | "
            f"{pg} | {workers:.1f} | {lat.p50_ms:.1f} / {lat.p99_ms:.1f} ms |"
        )
    lines += [
        "",
        f"Mixed workload: {mix.processes} processes at concurrency {CONCURRENCY}; "
        f"{mix.backlog:,} backlog jobs over {MIXED_WORKSPACES:,} workspaces (weight 1/k), "
        f"{mix.long_jobs} of them long (5–10 s), 8 % capped at {mix.cap}; {mix.live} live jobs "
        f"at {args.live_rate}/s in quiet workspaces.",
        "",
        "| measure | result |",
        "|---|---:|",
        f"| throughput (backlog + live jobs / span) | {mix.jobs_per_s:,.0f} jobs/s "
        f"over {mix.span_s:.1f} s |",
        f"| pickup of live jobs under load, p50 / p99 | {mix.live_pickup.p50_ms:.1f} / "
        f"{mix.live_pickup.p99_ms:.1f} ms ({mix.slow_pickups} of {mix.live} over "
        f"{SLOW_PICKUP_MS} ms) |",
        f"| most capped jobs running at once (cap {mix.cap}) | {mix.capped_max_running} |",
        f"| fairness error, first half of the backlog's noop starts | {mix.fairness_error:.1%} |",
        "",
        f"Load average {load_before:.1f} before, {load_after:.1f} after"
        + (" (the machine was busy: compare rows of this run only)" if load_before > 1 else ""),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mixed-jobs", type=int, default=4000)
    parser.add_argument("--mixed-processes", type=int, default=2)
    parser.add_argument("--cap", type=int, default=4)
    parser.add_argument("--live-rate", type=float, default=40.0)
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_URL), help="admin URL"
    )
    args = parser.parse_args()
    text = asyncio.run(run_all(args.database_url, args))
    (RESULTS_DIR / "scale_out.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
