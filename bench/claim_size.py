"""How big a claim should be: drains of noop jobs by one worker process at concurrency 50 and
the CLI's default log level, with the most one claim asks for set to each size given (the
worker's CLAIM_MAX, its prefetch PREFETCH_MAX twice that), alternated in rounds whose order
rotates, so that a slow minute of a shared machine falls on every size alike:

    python bench/claim_size.py [--sizes 1000,2000,4000] [--rounds 6] [--jobs 20000]
                               [--workspaces 1] [--database-url URL]

Prints each drain and, per size, the median jobs/s (and range) and the worker's and
PostgreSQL's CPU per job. Bigger claims share each statement's costs among more jobs; the
price is how many jobs one worker holds ahead of its slots (see queue/prefetch.py)."""

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

CONCURRENCY = 50


async def measure(admin_url: str, sizes: list[int], rounds: int, n: int, workspaces: int) -> None:
    name = f"bench_{uuid4().hex[:8]}_claimsize"
    url = await create_database(admin_url, name)
    RESULTS_DIR.mkdir(exist_ok=True)
    runs: dict[int, list[tuple[float, float, float]]] = {size: [] for size in sizes}
    try:
        conn = await connect(url)
        try:
            first = await sw.prepare(conn)
            spaces = [first, *await sw.more_workspaces(conn, workspaces - 1)]
            await sw.warm_up(conn, first)
            server = await ServerCpu.locate(conn)
            for round_ in range(rounds):
                shift = round_ % len(sizes)
                for size in sizes[shift:] + sizes[:shift]:
                    await sw.empty_queue(conn)
                    since = await sw.server_now(conn)
                    await sw.enqueue(conn, spaces if workspaces > 1 else first, n)
                    await sw.refresh_statistics(conn)
                    d = await sw.drain(
                        conn, url, CONCURRENCY, since, server, "info", "--claim-max", str(size)
                    )
                    worker_us = d.cpu.client_s / d.jobs * 1e6
                    pg_us = (d.cpu.server_s or 0.0) / d.jobs * 1e6
                    runs[size].append((d.jobs_per_s, worker_us, pg_us))
                    print(
                        f"round {round_ + 1}, claims of {size:,}: {d.jobs_per_s:8,.0f} jobs/s,"
                        f" worker {worker_us:4.1f} µs/job, PostgreSQL {pg_us:4.1f} µs/job",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            await conn.close()
    finally:
        await drop_database(admin_url, name)
    print(
        f"{rounds} rounds of {n:,} noop jobs over {workspaces} workspace(s), concurrency "
        f"{CONCURRENCY}, log info; load average {os.getloadavg()[0]:.1f} at the end"
    )
    for size in sizes:
        rates = [r[0] for r in runs[size]]
        print(
            f"  claims of {size:>6,}: {statistics.median(rates):8,.0f} jobs/s "
            f"(range {min(rates):,.0f}–{max(rates):,.0f}), worker "
            f"{statistics.median(r[1] for r in runs[size]):.1f} µs/job, PostgreSQL "
            f"{statistics.median(r[2] for r in runs[size]):.1f} µs/job (start-up included)"
        )


def main() -> None:
    parser = drain_parser(__doc__)
    parser.add_argument("--sizes", default="1000,2000,4000")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--workspaces", type=int, default=1)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    asyncio.run(measure(args.database_url, sizes, args.rounds, args.jobs, args.workspaces))


if __name__ == "__main__":
    main()
