"""Benchmark plumbing: throwaway databases, worker child processes, waiting on conditions."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg

# Where the benchmarks create their throwaway databases when neither --database-url nor
# DATABASE_URL says otherwise: the machine's own PostgreSQL.
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def drain_parser(doc: str, jobs: int = 20_000) -> argparse.ArgumentParser:
    """The arguments every drain benchmark takes: --jobs per drain and --database-url (an
    admin URL, DATABASE_URL by default); the script adds its own."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=jobs)
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_URL), help="admin URL"
    )
    return parser


BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
STOP_TIMEOUT_S = 60.0  # a SIGTERMed child finishes its running jobs and writes outcomes


def with_database(url: str, name: str) -> str:
    return urlsplit(url)._replace(path=f"/{name}").geturl()


async def create_database(admin_url: str, name: str) -> str:
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return with_database(admin_url, name)


async def drop_database(admin_url: str, name: str) -> None:
    admin = await asyncpg.connect(admin_url)
    try:
        # FORCE: a child killed mid-run may still hold a connection.
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def wait_until(
    check: Callable[[], Awaitable[bool]], timeout_s: float, what: str, interval_s: float = 0.02
) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout_s:g}s waiting for {what}")
        await asyncio.sleep(interval_s)


async def listening_backends(conn: asyncpg.Connection, dbname: str) -> int:
    """Backends of `dbname` whose last statement was a LISTEN: a worker's wake-up connection."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND query ILIKE 'LISTEN%'",
            dbname,
        )
    )


@dataclass(frozen=True)
class Latency:
    """Pickup latency of single jobs inserted into an idle queue, server clock on both ends."""

    jobs: int
    p50_ms: float
    p99_ms: float


@dataclass
class Child:
    """A worker child process started by `spawn`; `started` is for the wall time."""

    proc: asyncio.subprocess.Process
    started: float

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def finish(self, time_limit_s: float = 600.0) -> tuple[float, dict[str, Any], bool]:
        """Waits for exit, sending SIGTERM once `time_limit_s` has passed since spawn.
        Returns (wall seconds since spawn, the child's JSON report, whether it was stopped)."""
        remaining_s = max(self.started + time_limit_s - time.perf_counter(), 0.1)
        communicate = asyncio.ensure_future(self.proc.communicate())
        done, _ = await asyncio.wait([communicate], timeout=remaining_s)
        stopped = not done
        if stopped:
            self.proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(communicate, STOP_TIMEOUT_S)
        wall_s = time.perf_counter() - self.started
        if self.proc.returncode != 0:
            raise RuntimeError(f"child {self.proc.pid} exited {self.proc.returncode}")
        lines = out.decode().strip().splitlines()
        return wall_s, json.loads(lines[-1]), stopped


async def spawn(script: str, *args: str, stderr: Path | None = None) -> Child:
    """Runs bench/`script` with this Python; its stderr goes to ours (warnings stay visible),
    or appended to the file `stderr` (a worker logging at info: a file, as under a process
    manager, so the log's cost is counted without flooding the terminal)."""
    started = time.perf_counter()
    err = open(stderr, "ab") if stderr is not None else None  # closed below, once spawned
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(BENCH_DIR / script),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
        )
    finally:
        if err is not None:
            err.close()  # the child holds its own copy
    return Child(proc, started)
