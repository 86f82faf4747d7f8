"""procrastinate 3.10 as a peer, in its own database: the parent applies the schema and
bulk-defers noop jobs; run as a script, this file is the worker child.

    python bench/peer_procrastinate.py URL CONCURRENCY POOL_SIZE"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

import asyncpg
import procrastinate
from procmem import print_report


def make_app(url: str, pool_size: int) -> procrastinate.App:
    connector = procrastinate.PsycopgConnector(conninfo=url, min_size=1, max_size=pool_size)
    app = procrastinate.App(connector=connector)

    @app.task(name="noop")
    async def noop() -> None:
        return None

    return app


async def prepare(url: str, n: int) -> float:
    """Applies the schema and defers n noop jobs in one batch; returns jobs/s of the defer."""
    app = make_app(url, pool_size=2)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        started = time.perf_counter()
        await app.tasks["noop"].batch_defer_async(*({} for _ in range(n)))
        return n / (time.perf_counter() - started)


async def drain_span(conn: asyncpg.Connection) -> tuple[int, float]:
    """Jobs succeeded and first 'started' to last 'succeeded' event; procrastinate's trigger
    stamps each event with now() of the statement's transaction, as our started_at is."""
    row = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE type = 'succeeded') AS done,"
        " extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')"
        "   - min(at) FILTER (WHERE type = 'started'))::float8 AS span_s"
        " FROM procrastinate_events"
    )
    return row["done"], row["span_s"]


async def run_worker(url: str, concurrency: int, pool_size: int) -> None:
    app = make_app(url, pool_size)
    async with app.open_async():
        # wait=False: exit once the queue is empty, like our --burst. Its own signal handlers
        # let the parent stop it gracefully at the time limit.
        await app.run_worker_async(concurrency=concurrency, wait=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("concurrency", type=int)
    parser.add_argument("pool_size", type=int)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # It warns that the task lives in __main__ (a deployment concern); we run it from here.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
    asyncio.run(run_worker(args.url, args.concurrency, args.pool_size))
    print_report()


if __name__ == "__main__":
    main()
