"""What the default log level costs a drain, against logging at warning, in the same run:

    python bench/log_cost.py [--jobs 20000] [--pairs 5] [--concurrency 50] [--database-url URL]

Pairs of burst drains of N fresh noop jobs by one worker process, alternating the CLI's default
level (info, JSON lines to a file as under a process manager) and warning, so that a slow minute
of a shared machine falls on both alike; prints each pair and the medians of jobs/s and of the
worker's CPU per job. Absolute figures move with the machine's load; the ratio is the result."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
from uuid import uuid4

import sidelinja_bench as sw
from common import RESULTS_DIR, create_database, drain_parser, drop_database
from cpu import ServerCpu

from sidelinja_worker.queue.db import connect

LEVELS = ("info", "warning")


async def measure(admin_url: str, n: int, pairs: int, concurrency: int) -> None:
    name = f"bench_{uuid4().hex[:8]}_logcost"
    url = await create_database(admin_url, name)
    RESULTS_DIR.mkdir(exist_ok=True)
    try:
        conn = await connect(url)
        try:
            workspace_id = await sw.prepare(conn)
            await sw.warm_up(conn, workspace_id)
            server = await ServerCpu.locate(conn)
            runs: dict[str, list[sw.Drain]] = {level: [] for level in LEVELS}
            for i in range(pairs):
                for level in LEVELS if i % 2 == 0 else reversed(LEVELS):
                    await sw.empty_queue(conn)
                    since = await sw.server_now(conn)
                    await sw.enqueue(conn, workspace_id, n)
                    await sw.refresh_statistics(conn)
                    d = await sw.drain(conn, url, concurrency, since, server, log_level=level)
                    runs[level].append(d)
                    print(
                        f"pair {i + 1} {level:7}: {d.jobs_per_s:8,.0f} jobs/s, worker "
                        f"{d.cpu.client_s / d.jobs * 1e6:5.1f} µs/job",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            await conn.close()
    finally:
        await drop_database(admin_url, name)
    rate = {lv: statistics.median(d.jobs_per_s for d in runs[lv]) for lv in LEVELS}
    cpu = {lv: statistics.median(d.cpu.client_s / d.jobs * 1e6 for d in runs[lv]) for lv in LEVELS}
    ratios = [
        i.jobs_per_s / w.jobs_per_s for i, w in zip(runs["info"], runs["warning"], strict=True)
    ]
    print(
        f"{pairs} pairs of {n:,} noop jobs at concurrency {concurrency}, load average "
        f"{os.getloadavg()[0]:.1f} at the end\n"
        f"  info (default): {rate['info']:,.0f} jobs/s, worker {cpu['info']:.1f} µs/job\n"
        f"  warning:        {rate['warning']:,.0f} jobs/s, worker {cpu['warning']:.1f} µs/job\n"
        f"  info / warning: {rate['info'] / rate['warning'] - 1:+.1%} (medians); "
        f"median of the pairs' ratios {statistics.median(ratios) - 1:+.1%}"
    )


def main() -> None:
    parser = drain_parser(__doc__)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(measure(args.database_url, args.jobs, args.pairs, args.concurrency))


if __name__ == "__main__":
    main()
