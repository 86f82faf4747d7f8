"""One sidelinja-worker in its own process, as `sidelinja-worker --log-level LEVEL run` builds
it. Prints its memory as JSON on exit.

    python bench/worker_child.py URL CONCURRENCY [--serve] [--log-level info] [--extra-types a,b]
                                 [--claim-max N]

Without --serve it runs in burst mode (drains, exits); with it, it runs until SIGTERM.
Poll interval 1 s, so that an idle worker is woken by LISTEN/NOTIFY, not by polling. The log
level defaults to warning (the tuned figure); `--log-level info` is the CLI's default, with its
handler and format (JSON lines, as when stderr is a file or a pipe). `--extra-types` registers
copies of noop under other names (a type to cap in a mixed workload). `--claim-max` sets the
most one claim asks for (the worker's CLAIM_MAX, its prefetch PREFETCH_MAX twice that), for
bench/claim_size.py."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from dataclasses import replace

from cpu import process_seconds
from procmem import print_report

from sidelinja_worker.jobs import noop
from sidelinja_worker.jobs.catalog import REGISTRY
from sidelinja_worker.queue import logs, prefetch
from sidelinja_worker.queue.db import create_pool
from sidelinja_worker.queue.gctune import tune_for_serving
from sidelinja_worker.queue.registry import Registry
from sidelinja_worker.queue.settings import WorkerSettings
from sidelinja_worker.queue.worker import Worker

POOL_SIZE = 5  # what `sidelinja-worker run` opens (commands.cmd_run)


async def run(url: str, concurrency: int, burst: bool, extra_types: list[str]) -> tuple[int, float]:
    """(jobs claimed, CPU seconds of Worker.run: start-up imports and the pool excluded)."""
    registry = REGISTRY
    if extra_types:
        copies = [replace(noop.JOB_TYPE, name=name) for name in extra_types]
        registry = Registry([*REGISTRY.values(), *copies])
    pool = await create_pool(url, max_size=POOL_SIZE)
    try:
        settings = WorkerSettings(max_concurrent=concurrency, poll_interval_s=1.0, burst=burst)
        worker = Worker(pool, url, registry, settings)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.request_stop)
        tune_for_serving()  # as `sidelinja-worker run` does
        started_s = process_seconds()
        await worker.run()
        return worker.claimed_total, process_seconds() - started_s
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("concurrency", type=int)
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--extra-types", default="", help="comma-separated noop copies")
    parser.add_argument("--claim-max", type=int, help="the most one claim asks for")
    args = parser.parse_args()
    if args.claim_max:
        prefetch.CLAIM_MAX = args.claim_max
        prefetch.PREFETCH_MAX = 2 * args.claim_max
    # As cli.main configures it.
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    logs.setup()
    extra = [t for t in args.extra_types.split(",") if t]
    claimed, run_cpu_s = asyncio.run(
        run(args.url, args.concurrency, burst=not args.serve, extra_types=extra)
    )
    print_report(claimed=claimed, run_cpu_s=run_cpu_s)


if __name__ == "__main__":
    main()
