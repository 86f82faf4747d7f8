"""Where an idle worker's pickup time goes, job by job, and where its p99 comes from.

    python bench/pickup_tail.py [--jobs 200] [--gap-ms 15] [--rounds 2] [--variants auto true]

A serving worker (bench/worker_child.py, concurrency 50, as bench/run.py's pickup row) idles in
a fresh database; one connection that stays open inserts single jobs by plain SQL, `--gap-ms`
apart, as the web app does. A bare asyncpg listener on the wake-up channel, in this process,
notes when each job's notification arrives. For each job, in ms after its created_at (the
INSERT's transaction start, server clock; this machine's clock is the server's):

- statement: the INSERT's own work, up to its RETURNING (clock_timestamp() there);
- commit: from there until the INSERT's answer reached the inserter (the commit's WAL flush,
  the notification queued, the answer sent and read);
- notified: the wake-up's arrival at the bare listener;
- pickup: started_at - created_at, the figure bench/run.py reports;
- worker: pickup - notified, the worker's own share (its wake-up, the claim's start).

Each variant is the value of the queue setting `job_events` during its rounds (the default is
"auto": no listener registered, so no status event is built): rounds run interleaved, variant
after variant, so that they share the machine's moods. Prints percentiles per phase, and the
slowest pickups with their phases."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

import asyncpg
from common import DEFAULT_URL, create_database, drop_database, listening_backends, spawn
from common import wait_until as wait
from sidelinja_bench import SERVE_CONCURRENCY, empty_queue, prepare

PHASES = ("statement", "commit", "notified", "pickup", "worker")


@dataclass(frozen=True)
class Job:
    statement: float
    commit: float
    notified: float
    pickup: float

    @property
    def worker(self) -> float:
        return self.pickup - self.notified

    def phase(self, name: str) -> float:
        return float(getattr(self, name))


async def one_round(
    url: str, conn: asyncpg.Connection, workspace: UUID, jobs: int, gap_s: float
) -> list[Job]:
    """`jobs` single INSERTs against the idle worker; each job's phases."""
    arrivals: list[float] = []
    listener = await asyncpg.connect(url)
    inserter = await asyncpg.connect(url)
    await listener.add_listener("sidelinja_job_due", lambda *_: arrivals.append(time.time()))
    rows: list[tuple[UUID, float, float, float, float]] = []
    try:
        for _ in range(jobs):
            seen = len(arrivals)
            job_id, created, returning = await inserter.fetchrow(
                "INSERT INTO job_queue (workspace_id, job_type, payload) VALUES ($1, 'noop', '{}')"
                " RETURNING id, extract(epoch FROM created_at)::float8,"
                " extract(epoch FROM clock_timestamp())::float8",
                workspace,
            )
            answered = time.time()
            deadline = time.monotonic() + 5
            while len(arrivals) == seen and time.monotonic() < deadline:
                await asyncio.sleep(0.0005)
            notified = arrivals[seen] if len(arrivals) > seen else float("nan")
            rows.append((job_id, created, returning, answered, notified))
            await asyncio.sleep(gap_s)
        await wait(
            lambda: conn.fetchval(
                "SELECT count(*) = $1 FROM job_queue WHERE status = 'completed'", jobs
            ),
            30,
            "the single jobs to finish",
        )
    finally:
        await listener.close()
        await inserter.close()
    started = dict(
        await conn.fetch(
            "SELECT id, extract(epoch FROM started_at)::float8 FROM job_queue"
            " WHERE id = ANY($1::uuid[])",
            [r[0] for r in rows],
        )
    )
    ms = 1000.0
    return [
        Job(
            (returning - created) * ms,
            (answered - returning) * ms,
            (notified - created) * ms,
            (started[job_id] - created) * ms,
        )
        for job_id, created, returning, answered, notified in rows
    ]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(variant: str, jobs: list[Job]) -> None:
    print(f"\njob_events = {variant}: {len(jobs)} jobs (ms after created_at; phases as documented)")
    print("| phase | p50 | p90 | p99 | max |")
    print("|---|---:|---:|---:|---:|")
    for name in PHASES:
        values = [j.phase(name) for j in jobs]
        print(
            f"| {name} | {statistics.median(values):.2f} | {percentile(values, 0.9):.2f} "
            f"| {percentile(values, 0.99):.2f} | {max(values):.2f} |"
        )
    slowest = sorted(jobs, key=lambda j: -j.pickup)[:5]
    print("slowest pickups: " + "; ".join(
        ", ".join(f"{n} {j.phase(n):.2f}" for n in PHASES) for j in slowest
    ))  # fmt: skip


async def main_async(args: argparse.Namespace) -> None:
    admin_url = args.database_url or os.environ.get("DATABASE_URL") or DEFAULT_URL
    load_before = os.getloadavg()[0]
    name = f"sw_pickup_tail_{os.getpid()}"
    url = await create_database(admin_url, name)
    try:
        conn = await asyncpg.connect(url)
        workspace = await prepare(conn)
        await empty_queue(conn)
        child = await spawn("worker_child.py", url, str(SERVE_CONCURRENCY), "--serve")
        try:
            await wait(lambda: _listening(conn, name), 30, "the worker to LISTEN")
            await one_round(url, conn, workspace, 20, args.gap_ms / 1000)  # warm-up, not counted
            results: dict[str, list[Job]] = {v: [] for v in args.variants}
            for _ in range(args.rounds):
                for variant in args.variants:
                    await conn.execute(
                        "UPDATE queue_settings SET value = $1::text::jsonb WHERE name = 'job_events'",
                        variant if variant in ("true", "false") else f'"{variant}"',
                    )
                    await conn.execute("DELETE FROM job_queue WHERE status = 'completed'")
                    results[variant] += await one_round(
                        url, conn, workspace, args.jobs, args.gap_ms / 1000
                    )
        finally:
            if child.proc.returncode is None:
                child.proc.send_signal(signal.SIGTERM)
            await child.finish()
        await conn.close()
    finally:
        await drop_database(admin_url, name)
    print(f"load average before: {load_before:.2f}")
    for variant, jobs in results.items():
        report(variant, jobs)


async def _listening(conn: asyncpg.Connection, dbname: str) -> bool:
    return await listening_backends(conn, dbname) > 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200, help="jobs per round")
    parser.add_argument("--gap-ms", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--variants", nargs="+", choices=["auto", "true", "false"], default=["auto", "true"]
    )
    parser.add_argument("--database-url")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
