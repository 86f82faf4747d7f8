"""Shared test helpers: workers in-process and as real processes, and small SQL probes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from pydantic import BaseModel, ConfigDict

from sidelinja_worker.jobs.catalog import REGISTRY
from sidelinja_worker.queue.config import ServiceConfig
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.registry import JobType, Registry
from sidelinja_worker.queue.settings import WorkerSettings
from sidelinja_worker.queue.worker import Worker


class AnyPayload(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


def job_type(
    name: str,
    handler: Callable[[JobContext, Any], Awaitable[Any]],
    *,
    timeout_s: float = 60,
    payload_model: type[BaseModel] = AnyPayload,
) -> JobType:
    return JobType(
        name=name,
        handler=handler,
        payload_model=payload_model,
        default_priority=0,
        timeout_s=timeout_s,
        description="test type",
    )


async def run_burst(
    pool: asyncpg.Pool,
    url: str,
    registry: Registry = REGISTRY,
    config: ServiceConfig | None = None,
    **settings: Any,
) -> Worker:
    """Runs a worker in this process until no due job is left. `config` defaults to no outside
    services configured (the test's environment never leaks in)."""
    settings.setdefault("poll_interval_s", 0.05)
    worker = Worker(
        pool, url, registry, WorkerSettings(burst=True, **settings), config or ServiceConfig({})
    )
    await asyncio.wait_for(worker.run(), timeout=120)
    return worker


def cli(
    *args: str, url: str | None, env: dict[str, str] | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """`sidelinja-worker ARGS` as a real process."""
    full_env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    if url is not None:
        full_env["DATABASE_URL"] = url
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "sidelinja_worker", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


class Spawned:
    """A worker process whose output goes to files, not pipes: a chatty worker never blocks on
    a full pipe that the test only reads at the end."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self._out = tempfile.TemporaryFile(mode="w+")
        self._err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(args, env=env, stdout=self._out, stderr=self._err, text=True)

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        self.proc.kill()

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.proc.wait(timeout)
        self._out.seek(0)
        self._err.seek(0)
        return self._out.read(), self._err.read()


# Every process a test spawns; conftest kills the ones a failed test left running.
SPAWNED: list[Spawned] = []


def spawn(*args: str, url: str, env: dict[str, str] | None = None) -> Spawned:
    full_env = {**os.environ, "DATABASE_URL": url, **(env or {})}
    proc = Spawned([sys.executable, "-m", "sidelinja_worker", *args], full_env)
    SPAWNED.append(proc)
    return proc


async def statuses(pool: asyncpg.Pool) -> dict[str, int]:
    rows = await pool.fetch("SELECT status::text, count(*) FROM job_queue GROUP BY 1")
    return {r[0]: r[1] for r in rows}


async def insert_jobs(
    pool: asyncpg.Pool, workspace: Any, count: int, payload: str = "{}", job_type_name: str = "noop"
) -> None:
    """Plain SQL, the way the web app enqueues."""
    await pool.execute(
        "INSERT INTO job_queue (workspace_id, job_type, payload)"
        " SELECT $1, $2, $3::text::jsonb FROM generate_series(1, $4)",
        workspace,
        job_type_name,
        payload,
        count,
    )


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The stderr of a failed command, checked to be one readable line without a traceback."""
    lines = [
        ln
        for ln in proc.stderr.splitlines()
        if ln.strip() and not ln.startswith("sidelinja-worker: using")
    ]
    assert proc.returncode != 0, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    return lines[0]


async def metrics_text(port: int) -> str | None:
    """The worker's /metrics response on `port` (status line, headers and body), or None while
    nothing listens there yet."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return None
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    text = (await reader.read()).decode()
    writer.close()
    return text
