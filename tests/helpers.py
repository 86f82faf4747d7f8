"""Shared test helpers: workers in-process and as real processes, and small SQL probes."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import asyncpg
from pydantic import BaseModel, ConfigDict

from sidelinja_worker.jobs.catalog import REGISTRY
from sidelinja_worker.queue import migrate
from sidelinja_worker.queue.config import ServiceConfig
from sidelinja_worker.queue.context import JobContext
from sidelinja_worker.queue.db import connect
from sidelinja_worker.queue.registry import JobType, Registry
from sidelinja_worker.queue.settings import WorkerSettings
from sidelinja_worker.queue.worker import Worker


def with_database(url: str, name: str) -> str:
    return urlsplit(url)._replace(path=f"/{name}").geturl()


async def create_database(admin_url: str, name: str, template: str | None = None) -> str:
    """A new database on the server of `admin_url` (a copy of `template`, if given); its URL."""
    admin = await asyncpg.connect(admin_url)
    try:
        copy = f' TEMPLATE "{template}"' if template else ""
        await admin.execute(f'CREATE DATABASE "{name}"{copy}')
    finally:
        await admin.close()
    return with_database(admin_url, name)


async def create_template(admin_url: str, name: str) -> None:
    """A migrated database to copy: CREATE DATABASE ... TEMPLATE is much faster than migrating
    every test's database."""
    conn = await connect(await create_database(admin_url, name))
    try:
        await migrate.apply_all(conn)
    finally:
        await conn.close()


async def drop_database(admin_url: str, name: str) -> None:
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


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


@contextlib.asynccontextmanager
async def running_worker(
    pool: asyncpg.Pool,
    url: str,
    registry: Registry = REGISTRY,
    config: ServiceConfig | None = None,
    **settings: Any,
) -> AsyncIterator[Worker]:
    """A worker running in this process for the length of the block; asked to stop at its end,
    and waited for."""
    worker = Worker(pool, url, registry, WorkerSettings(**settings), config or ServiceConfig({}))
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.request_stop()
        await task


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
        self._output: tuple[str, str] | None = None
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

    def stderr_so_far(self) -> str:
        """What the running process has written to stderr yet. pread leaves the file offset,
        which the child shares, where it is."""
        fd = self._err.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Waits for the exit; its stdout and stderr. The files are read once and closed (an
        open file left to the garbage collector is a ResourceWarning, an error in this suite)."""
        self.proc.wait(timeout)
        if self._output is None:
            for f in (self._out, self._err):
                f.seek(0)
            self._output = (self._out.read(), self._err.read())
            self._out.close()
            self._err.close()
        return self._output


# Every process a test spawns; conftest kills the ones a failed test left running.
SPAWNED: list[Spawned] = []


def spawn(*args: str, url: str, env: dict[str, str] | None = None) -> Spawned:
    full_env = {**os.environ, "DATABASE_URL": url, **(env or {})}
    proc = Spawned([sys.executable, "-m", "sidelinja_worker", *args], full_env)
    SPAWNED.append(proc)
    return proc


async def wait_for(
    probe: Callable[[], object], timeout_s: float = 30, what: str = "", interval_s: float = 0.02
) -> None:
    """Polls `probe()` (plain or async) until it returns something true; fails the test with
    `what` once `timeout_s` has passed. Tests wait on the state they need, never a fixed time."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        assert time.monotonic() < deadline, f"not in {timeout_s:g} s: {what or probe}"
        await asyncio.sleep(interval_s)


async def wait_for_sql(pool: asyncpg.Pool, sql: str, *args: Any, timeout_s: float = 60) -> None:
    """Waits until the query's single value is true."""
    await wait_for(lambda: pool.fetchval(sql, *args), timeout_s, sql)


async def kill_worker_connections(pool: asyncpg.Pool) -> int:
    """Ends every connection the workers hold to this database, as a server restart does to its
    clients; returns how many, once the workers are back at work (a job completed since, or
    none is left): the next round of kills then hits the new connections."""
    killed: int = await pool.fetchval(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE application_name LIKE 'sidelinja-worker %' AND datname = current_database()"
    )
    # A killed connection commits nothing more: every completion counted later is a new one.
    done = await pool.fetchval("SELECT count(*) FROM job_queue WHERE status = 'completed'")
    await wait_for_sql(
        pool,
        "SELECT count(*) FILTER (WHERE status = 'completed') > $1"
        " OR coalesce(bool_and(status = 'completed'), true) FROM job_queue",
        done,
    )
    return killed


async def make_workspace(pool: asyncpg.Pool, name: str = "test") -> UUID:
    workspace: UUID = await pool.fetchval(
        "INSERT INTO workspaces (name) VALUES ($1) RETURNING id", name
    )
    return workspace


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
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        return (await reader.read()).decode()
    finally:
        writer.close()
        await writer.wait_closed()


async def rows_read(conn: asyncpg.Connection) -> int:
    """Rows of job_queue and job_dependencies this transaction has read, by any scan."""
    return await conn.fetchval(
        "SELECT sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0))::int"
        " FROM pg_stat_xact_user_tables WHERE relname IN ('job_queue', 'job_dependencies')"
    )


async def chain(pool: asyncpg.Pool, workspace: UUID, depth: int) -> list[UUID]:
    """A chain of `depth` jobs, each the child of the one before, in one plain-SQL statement;
    each created a millisecond after its parent, as if enqueued one after another (the cycle
    check looks among jobs created at one instant only)."""
    rows = await pool.fetch(
        "WITH jobs AS (INSERT INTO job_queue (workspace_id, job_type, payload, created_at)"
        " SELECT $1, 'noop', jsonb_build_object('n', n), now() + n * interval '1 millisecond'"
        " FROM generate_series(1, $2) n"
        " RETURNING id, (payload->>'n')::int AS n),"
        " edges AS (INSERT INTO job_dependencies (parent_id, child_id)"
        " SELECT p.id, c.id FROM jobs p JOIN jobs c ON c.n = p.n + 1)"
        " SELECT id FROM jobs ORDER BY n",
        workspace,
        depth,
    )
    return [r["id"] for r in rows]


async def contend_unique_key(pool: asyncpg.Pool, workspace: UUID, key: str) -> None:
    """Makes `key` unresolvable for the client: two statement triggers stand in for writers
    that keep making and finishing its holder, one adding a holder before each insert into
    job_queue, the other finishing it after, so every insert finds the key held and every
    look-up after it finds no holder."""
    await pool.execute(
        "CREATE FUNCTION test_hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF pg_trigger_depth() = 1 THEN"
        "  INSERT INTO job_queue (workspace_id, job_type, payload, unique_key)"
        f"  VALUES ('{workspace}', 'noop', '{{}}', '{key}');"
        " END IF; RETURN NULL; END $$;"
        " CREATE FUNCTION test_finish() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF pg_trigger_depth() = 1 THEN"
        "  UPDATE job_queue SET status = 'completed', completed_at = now()"
        f"  WHERE unique_key = '{key}' AND status = 'pending';"
        " END IF; RETURN NULL; END $$;"
        " CREATE TRIGGER test_hold BEFORE INSERT ON job_queue"
        " FOR EACH STATEMENT EXECUTE FUNCTION test_hold();"
        " CREATE TRIGGER test_finish AFTER INSERT ON job_queue"
        " FOR EACH STATEMENT EXECUTE FUNCTION test_finish()"
    )
