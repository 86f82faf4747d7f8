"""Where the worker's own CPU goes while it drains: py-spy on one worker process.

    python bench/profile_drain.py [--jobs 200000] [--database-url URL]

Queues `--jobs` noop jobs in a throwaway database, then runs worker_child.py (the benchmark's
worker at concurrency 50, burst mode) under `py-spy record` and prints the functions that hold
the most of its samples in its event loop (start-up imports left out), by their own time and
grouped by package. The raw stacks go to bench/results/drain_profile.txt. Needs py-spy (the
bench extra) and the right to ptrace a child (root, or a kernel.yama.ptrace_scope of 0 or 1).
PostgreSQL's side of the same drain: bench/pg_instructions.py."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
from collections import Counter
from uuid import uuid4

import sidelinja_bench as sw
from common import BENCH_DIR, DEFAULT_URL, RESULTS_DIR, create_database, drop_database

from sidelinja_worker.queue.db import connect

SAMPLE_RATE = 1000  # per second
# A frame of every sample taken in the event loop: the worker's run (its tasks' stacks start
# there, not under Worker.run), and not the imports before it.
IN_LOOP = "BaseEventLoop._run_once ("
IDLE = ("EpollSelector.select (",)  # waiting in epoll: not CPU
TOP = 25


async def queue_jobs(url: str, n: int) -> None:
    conn = await connect(url)
    try:
        workspace_id = await sw.prepare(conn)
        await sw.enqueue(conn, workspace_id, n)
        await sw.refresh_statistics(conn)
    finally:
        await conn.close()


def record(url: str, out: str) -> None:
    py_spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(py_spy):
        sys.exit("py-spy not found: pip install -e '.[bench]'")
    subprocess.run(
        [
            py_spy,
            "record",
            "--rate",
            str(SAMPLE_RATE),
            "--format",
            "raw",
            "--output",
            out,
            "--",
            sys.executable,
            str(BENCH_DIR / "worker_child.py"),
            url,
            "50",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def summarise(raw_file: str) -> str:
    own: Counter[str] = Counter()
    by_package: Counter[str] = Counter()
    total = 0
    with open(raw_file, encoding="utf-8") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            if not any(IN_LOOP in frame for frame in frames) or frames[-1].startswith(IDLE):
                continue
            n = int(count)
            total += n
            own[frames[-1]] += n
            by_package[_package(frames[-1])] += n
    if not total:
        return "no samples in the event loop"
    lines = [f"{total:,} samples of CPU in the worker's event loop, by own time:", ""]
    lines += [f"{n / total:6.1%}  {frame}" for frame, n in own.most_common(TOP)]
    lines += ["", "by package:", ""]
    lines += [f"{n / total:6.1%}  {package}" for package, n in by_package.most_common()]
    return "\n".join(lines)


def _package(frame: str) -> str:
    """`sidelinja_worker/executor.py` -> `sidelinja_worker.executor`; the stdlib and
    site-packages by their top-level name."""
    where = frame[frame.rfind("(") + 1 :].split(":")[0]
    parts = where.split("/")
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1]
    if parts[0] == "sidelinja_worker":
        return ".".join(parts[:2]).removesuffix(".py")
    return parts[0].removesuffix(".py") if len(parts) > 1 else "(python)"


async def run(admin_url: str, jobs: int) -> str:
    name = f"bench_profile_{uuid4().hex[:8]}"
    url = await create_database(admin_url, name)
    try:
        await queue_jobs(url, jobs)
        RESULTS_DIR.mkdir(exist_ok=True)
        raw = str(RESULTS_DIR / "drain_profile.txt")
        await asyncio.to_thread(record, url, raw)
        return summarise(raw)
    finally:
        await drop_database(admin_url, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or DEFAULT_URL)
    args = parser.parse_args()
    print(asyncio.run(run(args.database_url, args.jobs)))


if __name__ == "__main__":
    main()
