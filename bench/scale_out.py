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
workspaces, jobs dealt over them unevenly (workspace k with weight 1/k, so a few are busy and
most have none or one): 90 % noop sleeping 50-500 ms (a call to a service), 2 % long (5-10 s)
and 8 % of a type capped at `--cap` running jobs cluster-wide with `sidelinja-worker limits
type capped N` (a copy of noop under the name "capped", sleeping 100 ms). First a steady load:
`--steady-rate` jobs a second (default 120, about half of what 100 slots run of this mix) for
`--steady-s` seconds, a small plain-SQL INSERT every 100 ms from one open connection; pickup
p50/p99 of those jobs is the pickup under load. Then a backlog of `--mixed-jobs` (default 4,000)
in one INSERT: its throughput, and the fairness error: of the first half of the backlog's noop
starts, the share that went to another workspace than round-robin across workspaces would have
given it (0 = exactly fair: the total variation distance between the started counts and the
water-filling ideal), and the same backlog again with `limits fair off` for comparison. The
most capped jobs seen running at once is sampled every 50 ms.

Prints a markdown report and writes it to bench/results/scale_out.md. About 3 minutes.
`--mixed-only` runs part 2 alone and only prints it (a quick before/after of the fair claim)."""

from __future__ import annotations

import argparse
import asyncio
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
    RESULTS_DIR,
    Child,
    Latency,
    create_database,
    drain_parser,
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
TICK_S = 0.1  # the steady producer inserts this often
SLOW_PICKUP_MS = 500  # longer than any short job runs: a job that waited for a slot


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
    cap: int
    steady_jobs: int
    steady_rate: float  # jobs/s offered
    steady_pickup: Latency
    slow_pickups: int  # steady jobs picked up after more than SLOW_PICKUP_MS
    backlog: int
    backlog_span_s: float
    fairness_error: float
    capped_max_running: int
    fairness_error_off: float  # the same backlog again with `limits fair off`

    @property
    def backlog_per_s(self) -> float:
        return self.backlog / self.backlog_span_s


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


async def limits(url: str, *args: str) -> None:
    """`sidelinja-worker limits ARGS`, as an operator sets them."""
    env = {**os.environ, "DATABASE_URL": url}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "sidelinja_worker", "limits", *args],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"limits {' '.join(args)} failed: {done.stderr}")


async def set_cap(url: str, cap: int) -> None:
    await limits(url, "type", CAPPED, str(cap))


async def set_fair(url: str, on: bool) -> None:
    await limits(url, "fair", "on" if on else "off")


async def mixed(conn: asyncpg.Connection, url: str, dbname: str, args: argparse.Namespace) -> Mixed:
    """Serving workers; first a steady load (pickup under load), then a backlog dealt unevenly
    over the workspaces at once (throughput, fairness); the capped type watched throughout."""
    rng = random.Random(7)
    await sw.empty_queue(conn)
    spaces = await sw.more_workspaces(conn, MIXED_WORKSPACES)
    await set_cap(url, args.cap)
    children = await start_workers(url, args.mixed_processes, "--serve", "--extra-types", CAPPED)
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

    watcher = asyncio.create_task(watch_cap())
    try:
        await wait_ready(conn, dbname, args.mixed_processes)
        say(f"mixed: steady load, {args.steady_rate:g} jobs/s for {args.steady_s:g} s")
        steady_ids = await _steady(url, spaces, args.steady_rate, args.steady_s, rng)
        await wait_until(lambda: _done(conn, steady_ids), 120, "the steady jobs", interval_s=0.1)
        say(f"mixed: a backlog of {args.mixed_jobs:,} jobs at once")
        rows = backlog_rows(spaces, args.mixed_jobs, rng)
        backlog_ids = await _insert(conn, rows)
        await wait_until(lambda: _done(conn, backlog_ids), 300, "the backlog", interval_s=0.1)
        say("mixed: the same backlog with fairness off, for comparison")
        await set_fair(url, False)
        again_ids = await _insert(conn, rows)
        await wait_until(lambda: _done(conn, again_ids), 300, "the backlog", interval_s=0.1)
        await set_fair(url, True)
    finally:
        stop.set()
        await asyncio.gather(watcher, return_exceptions=True)
        await stop_workers(children)
    ms = [
        r["ms"]
        for r in await conn.fetch(
            "SELECT extract(epoch FROM started_at - created_at)::float8 * 1000 AS ms"
            " FROM job_queue WHERE id = ANY($1::uuid[]) ORDER BY 1",
            steady_ids,
        )
    ]
    span_s = await conn.fetchval(
        "SELECT extract(epoch FROM max(completed_at) - min(started_at))::float8"
        " FROM job_queue WHERE id = ANY($1::uuid[])",
        backlog_ids,
    )
    return Mixed(
        processes=args.mixed_processes,
        cap=args.cap,
        steady_jobs=len(steady_ids),
        steady_rate=args.steady_rate,
        steady_pickup=Latency(
            len(ms), statistics.median(ms), ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
        ),
        slow_pickups=sum(1 for m in ms if m > SLOW_PICKUP_MS),
        backlog=len(backlog_ids),
        backlog_span_s=span_s,
        fairness_error=await _fairness(conn, backlog_ids),
        capped_max_running=capped_seen[0],
        fairness_error_off=await _fairness(conn, again_ids),
    )


async def _insert(conn: asyncpg.Connection, rows: list[tuple[UUID, str, str]]) -> list[UUID]:
    """One plain-SQL INSERT of `rows`, as the web app enqueues; their ids."""
    return [
        r[0]
        for r in await conn.fetch(
            "INSERT INTO job_queue (workspace_id, job_type, payload)"
            " SELECT w, t, p::jsonb FROM unnest($1::uuid[], $2::text[], $3::text[]) AS r(w, t, p)"
            " RETURNING id",
            [ws for ws, _, _ in rows],
            [jt for _, jt, _ in rows],
            [p for _, _, p in rows],
        )
    ]


async def _steady(
    url: str, spaces: list[UUID], rate: float, seconds: float, rng: random.Random
) -> list[UUID]:
    """Jobs of the mixed kinds at `rate` a second for `seconds`, from one open connection, a
    small insert every TICK_S."""
    producer = await asyncpg.connect(url)
    ids: list[UUID] = []
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        owed = 0.0
        while loop.time() - started < seconds:
            owed += rate * TICK_S
            n, owed = int(owed), owed - int(owed)
            if n:
                ids += await _insert(producer, backlog_rows(spaces, n, rng))
            await asyncio.sleep(TICK_S)
    finally:
        await producer.close()
    return ids


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


async def _fairness(conn: asyncpg.Connection, backlog: list[UUID]) -> float:
    """Over the backlog's noop jobs: the first half of their starts against the ideal."""
    rows = await conn.fetch(
        "SELECT workspace_id FROM job_queue WHERE id = ANY($1::uuid[]) AND job_type = 'noop'"
        " ORDER BY started_at, id",
        backlog,
    )
    counts: dict[UUID, int] = {}
    for r in rows:
        counts[r["workspace_id"]] = counts.get(r["workspace_id"], 0) + 1
    started: dict[UUID, int] = {}
    for r in rows[: len(rows) // 2]:
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
            mix = await mixed(conn, url, name, args)
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
        f"Mixed workload: {mix.processes} processes at concurrency {CONCURRENCY}, "
        f"{MIXED_WORKSPACES:,} workspaces (weight 1/k); jobs 90 % noop sleeping 50–500 ms, "
        f"2 % 5–10 s, 8 % a type capped at {mix.cap}. Steady: {mix.steady_rate:g} jobs/s offered "
        f"for {args.steady_s:g} s ({mix.steady_jobs:,} jobs). Backlog: {mix.backlog:,} jobs "
        "inserted at once.",
        "",
        "| measure | result |",
        "|---|---:|",
        f"| pickup under the steady load, p50 / p99 | {mix.steady_pickup.p50_ms:.1f} / "
        f"{mix.steady_pickup.p99_ms:.1f} ms ({mix.slow_pickups} of {mix.steady_jobs:,} over "
        f"{SLOW_PICKUP_MS} ms) |",
        f"| backlog throughput | {mix.backlog_per_s:,.0f} jobs/s over {mix.backlog_span_s:.1f} s |",
        f"| fairness error, first half of the backlog's noop starts | {mix.fairness_error:.1%} "
        f"(the same backlog with `limits fair off`: {mix.fairness_error_off:.1%}) |",
        f"| most capped jobs running at once (cap {mix.cap}) | {mix.capped_max_running} |",
        "",
        f"Load average {load_before:.1f} before, {load_after:.1f} after"
        + (" (the machine was busy: compare rows of this run only)" if load_before > 1 else ""),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = drain_parser(__doc__)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mixed-jobs", type=int, default=4000)
    parser.add_argument("--mixed-processes", type=int, default=2)
    parser.add_argument("--cap", type=int, default=4)
    parser.add_argument("--steady-rate", type=float, default=120.0, help="jobs/s offered")
    parser.add_argument("--steady-s", type=float, default=15.0)
    parser.add_argument(
        "--mixed-only",
        action="store_true",
        help="part 2 alone (printed, not written to scale_out.md): to compare two commits",
    )
    args = parser.parse_args()
    if args.mixed_only:
        args.processes = []
    text = asyncio.run(run_all(args.database_url, args))
    if not args.mixed_only:
        (RESULTS_DIR / "scale_out.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
