"""The fault suite: real worker processes under a supervisor loop of the test's own (it
restarts a worker that exits), while the database connections are killed, cut, held half-open
and the worker is killed with -9 in the middle of writing outcomes. Afterwards every job is
completed, none is stuck, none ran more often than at-least-once allows (a second attempt only
for the jobs a killed worker held), and no process is left behind. Each case is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import asyncpg
import pytest

from sidelinja_worker.queue.db import DB_ERRORS
from tests.helpers import (
    SPAWNED,
    Spawned,
    insert_jobs,
    kill_worker_connections,
    spawn,
    statuses,
    wait_for,
)
from tests.tcp_proxy import proxy_for

pytestmark = pytest.mark.timeout(90)  # each case is bounded; each takes well under a minute


class Fleet:
    """Worker processes kept running: one that exits is restarted (its exit code noted), the
    way a process manager would."""

    def __init__(self, pool: asyncpg.Pool, url: str, n: int, *args: str) -> None:
        self._pool = pool
        self._url = url
        self._args = ["run", "--max-concurrent", "8", "--poll-interval", "200ms", *args]
        self.procs: list[Spawned] = [spawn(*self._args, url=url) for _ in range(n)]
        self.exits: list[tuple[int, str]] = []
        self._task = asyncio.create_task(self._supervise())

    async def _supervise(self) -> None:
        while True:
            for i, proc in enumerate(self.procs):
                if proc.poll() is not None:
                    _out, err = proc.communicate()
                    self.exits.append((proc.returncode or 0, err[-3000:]))
                    self.procs[i] = spawn(*self._args, url=self._url)
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        """SIGTERM to every worker once it is up (a process killed while it starts has nothing
        to give back, and says nothing); each must exit 0, and none may be left running."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        for i, proc in enumerate(self.procs):
            if proc.poll() is not None:  # died after the supervisor's last look
                _out, err = proc.communicate()
                self.exits.append((proc.returncode or 0, err[-3000:]))
                self.procs[i] = spawn(*self._args, url=self._url)
        pids = [p.proc.pid for p in self.procs]
        await wait_for(
            lambda: self._pool.fetchval(
                "SELECT count(*) = $2 FROM job_workers WHERE pid = ANY($1::int[])", pids, len(pids)
            ),
            30,
            "every worker up before it is stopped",
        )
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        outputs = [await asyncio.to_thread(p.communicate, timeout=30) for p in self.procs]
        codes = [p.returncode for p in self.procs]
        assert codes == [0] * len(codes), ([err[-3000:] for _, err in outputs], self.exits)
        assert all(p.poll() is not None for p in SPAWNED)


async def _producer(pool: asyncpg.Pool, workspace: UUID, total: int, batch: int) -> None:
    for _ in range(total // batch):
        await insert_jobs(pool, workspace, batch, '{"sleep_ms": 1}')
        await asyncio.sleep(0.05)


async def _all_completed(pool: asyncpg.Pool, total: int, timeout_s: float) -> None:
    async def done() -> bool:
        return await statuses(pool) == {"completed": total}

    try:
        await wait_for(done, timeout_s, f"all {total} jobs completed")
    except AssertionError:
        raise AssertionError(f"{await statuses(pool)} of {total}") from None


async def test_backends_killed_again_and_again_while_two_workers_drain_and_a_producer_inserts(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    total = 2000
    fleet = Fleet(pool, db_url, 2)
    try:
        await wait_for(
            lambda: pool.fetchval("SELECT count(*) = 2 FROM job_workers"), 30, "workers up"
        )
        producer = asyncio.create_task(_producer(pool, workspace, total, 50))
        # Three rounds of "the server dropped every connection of the workers", as a restart
        # does to its clients, while jobs are running.
        for _ in range(3):
            await wait_for(
                lambda: pool.fetchval(
                    "SELECT count(*) > 0 FROM job_queue WHERE status = 'running'"
                ),
                30,
                "jobs running",
            )
            assert await kill_worker_connections(pool) > 0
        await producer
        await _all_completed(pool, total, 45)
        # Nothing was lost and nothing waited for a lease: no worker died, so no job ran twice.
        assert await pool.fetchval("SELECT max(attempts) FROM job_queue") == 1
    finally:
        await fleet.stop()
    assert fleet.exits == []


async def test_connections_held_half_open_past_the_health_interval(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """The worker's connections go silent (no reset, no answer: a dead network path) for good;
    new connections work. The statement and release bounds notice it within ~15 s (the listener
    within its 10 s health interval + 5 s), and the worker goes on with new connections."""
    proxy, via_proxy = await proxy_for(db_url)
    fleet = Fleet(pool, via_proxy, 1)
    try:
        await wait_for(lambda: pool.fetchval("SELECT count(*) = 1 FROM job_workers"), 30, "up")
        await insert_jobs(pool, workspace, 200, '{"sleep_ms": 1}')
        await wait_for(
            lambda: pool.fetchval(
                "SELECT count(*) = 200 FROM job_queue WHERE status = 'completed'"
            ),
            30,
            "first jobs done",
        )
        held = proxy.black_hole()
        assert held >= 3  # the claim pool, the shared pool and the LISTEN connection
        await insert_jobs(pool, workspace, 300, '{"sleep_ms": 1}')
        await _all_completed(pool, 500, 50)
        assert await pool.fetchval("SELECT max(attempts) FROM job_queue") == 1
    finally:
        await fleet.stop()
        proxy.release_held()
        await proxy.close()
    assert fleet.exits == []


async def test_kill_9_during_the_outcome_flush(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """The outcome writer's completion is held on a row lock the test takes, so the worker is
    killed while its flush is in flight, deterministically, with more jobs running and their
    outcomes waiting behind it."""
    total = 200
    fleet = Fleet(pool, db_url, 1, "--lease", "3s")
    blocker = None
    try:
        await wait_for(lambda: pool.fetchval("SELECT count(*) = 1 FROM job_workers"), 30, "up")
        slow = await pool.fetchval(
            "INSERT INTO job_queue (workspace_id, job_type, payload)"
            " VALUES ($1, 'noop', '{\"sleep_ms\": 1500}') RETURNING id",
            workspace,
        )
        await wait_for(
            lambda: pool.fetchval("SELECT status = 'running' FROM job_queue WHERE id = $1", slow),
            30,
            "the slow job running",
        )
        blocker = await pool.acquire()
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("SELECT 1 FROM job_queue WHERE id = $1 FOR UPDATE", slow)
        await insert_jobs(pool, workspace, total - 1, '{"sleep_ms": 100}')
        await wait_for(
            lambda: pool.fetchval(
                "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name LIKE 'sidelinja-worker %' AND wait_event_type = 'Lock'"
                " AND query LIKE '%completed%'"
            ),
            30,
            "the completion waiting on the lock",
        )
        victim = fleet.procs[0]
        victim_id = await pool.fetchval(
            "SELECT id FROM job_workers WHERE pid = $1", victim.proc.pid
        )
        victim.proc.kill()  # kill -9
        await asyncio.to_thread(victim.proc.wait, 10)
        # Counted once the worker is dead: until then it goes on claiming as its handlers end
        # (their outcomes queue behind the held flush). Its lease (3 s) keeps its rows from a
        # rescue this soon.
        held = await pool.fetchval(
            "SELECT count(*) FROM job_queue WHERE status = 'running' AND worker_id = $1", victim_id
        )
        await tx.rollback()
        await _all_completed(pool, total, 45)
        # At least once: a second attempt only for the jobs the killed worker held.
        twice = await pool.fetchval("SELECT count(*) FROM job_queue WHERE attempts > 1")
        assert await pool.fetchval("SELECT max(attempts) FROM job_queue") <= 2
        assert 0 < twice <= held
    finally:
        if blocker is not None:
            await pool.release(blocker)
        await fleet.stop()
    assert [code for code, _ in fleet.exits] == [-signal.SIGKILL]


def _restartable_cluster(db_url: str) -> list[str] | None:
    """The command that restarts the server behind `db_url`, where this machine can: root, the
    Debian cluster tools, and the cluster on 127.0.0.1:5432 (not the embedded server)."""
    target = urlsplit(db_url)
    tool = shutil.which("pg_ctlcluster")
    if os.geteuid() != 0 or tool is None or (target.hostname, target.port) != ("127.0.0.1", 5432):
        return None
    versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    if not versions:
        return None
    return [tool, "--skip-systemctl-redirect", versions[-1], "main", "restart"]


async def _despite_restarts(check: Callable[[], Awaitable[Any]]) -> Any:
    """`check()`, or False while the server is down or the test's own connection was cut."""
    try:
        return await check()
    except (*DB_ERRORS, OSError):
        return False


async def test_postgresql_restarted_twice_while_two_workers_drain_and_a_producer_inserts(
    pool: asyncpg.Pool, db_url: str, workspace: UUID
) -> None:
    """The server itself restarted, twice, mid-drain: every job completes once its workers are
    back on new connections; a job whose outcome the restart cut runs again (at-least-once), and
    no more often than that."""
    restart = _restartable_cluster(db_url)
    if restart is None:
        pytest.skip("needs root and this machine's own PostgreSQL cluster (pg_ctlcluster)")
    total = 2000
    fleet = Fleet(pool, db_url, 2, "--lease", "5s")  # a worker the restart ends is rescued soon

    async def produce() -> None:
        inserted = 0
        while inserted < total:
            try:
                # 20 ms a job: enough work that the second restart still finds jobs running
                await insert_jobs(pool, workspace, 50, '{"sleep_ms": 20}')
                inserted += 50
            except (*DB_ERRORS, OSError):
                await asyncio.sleep(0.1)  # the server is restarting: try the batch again
            await asyncio.sleep(0.05)

    try:
        await wait_for(
            lambda: pool.fetchval("SELECT count(*) = 2 FROM job_workers"), 30, "workers up"
        )
        producer = asyncio.create_task(produce())
        for _ in range(2):

            async def busy_or_done() -> bool:  # restart mid-run; once all is in, whenever
                running = await _despite_restarts(
                    lambda: pool.fetchval(
                        "SELECT count(*) > 0 FROM job_queue WHERE status = 'running'"
                    )
                )
                return bool(running) or producer.done()

            await wait_for(busy_or_done, 30, "jobs running")
            done = await asyncio.to_thread(
                subprocess.run, restart, capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, done.stderr
            await pool.expire_connections()  # the test's own connections died with the server
        await producer
        try:
            await wait_for(
                lambda: _despite_restarts(
                    lambda: pool.fetchval(
                        "SELECT count(*) >= $1 AND bool_and(status = 'completed') FROM job_queue",
                        total,
                    )
                ),
                60,
                f"all {total} jobs completed",
            )
        except AssertionError:
            await pool.expire_connections()
            raise AssertionError(f"{await statuses(pool)}; worker exits {fleet.exits}") from None
        await pool.expire_connections()
        # At least once: a job whose outcome a restart cut runs again; two restarts, two more.
        assert await pool.fetchval("SELECT max(attempts) FROM job_queue") <= 3
    finally:
        await fleet.stop()
